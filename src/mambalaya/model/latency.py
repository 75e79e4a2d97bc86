"""The latency model of a mapping on an architecture (DESIGN.md §5).

Per Einsum, the operations of :mod:`mambalaya.einsum.stats` go to the unit that runs them:

* the MACs of a GEMM (an Einsum reducing against a weight) go to the **2D array**:
  ``macs / (rows x cols)`` cycles;
* every other arithmetic operation (adds, multiplies, divides, max, and the MACs of
  reductions over activations: RMSNorm's sum of squares, the conv, the C readout) goes to the
  **1D mode** of the array, one operation per lane per cycle, or to the vector unit when the
  array has no 1D mode;
* each unary function goes to the **multi-function units**: ``ops x cost_cycles / mfu_units``;
  with no MFU, it costs ``unary_cost_pe_ops`` elementwise operations instead.

The array runs one mode at a time, so its 2D and 1D cycles add up; the MFUs (and a separate
vector unit) run beside it when ``overlap_compute_units``. An Einsum's compute time is
``max(array, mfu, vector)`` cycles (their sum without overlap) over the clock; its memory time
is its off-chip bytes over the bandwidth.

A group's compute is the same sum over all its Einsums (every unit is shared by the group's
pipeline); its memory time is the group's traffic (:mod:`mambalaya.model.traffic`) over the
bandwidth. With ``overlap_compute_and_memory`` the group takes ``max(compute, memory)`` plus a
**wind-up**: one step's share of the smaller of the two, which the first step cannot hide (0 for
a one-step group, so an unfused layer is exactly ``sum max(comp, mem)``), plus
``pipeline_wind_up_cycles`` per Einsum to fill the tile pipeline of a group that runs in more
than one step. Without overlap it is the sum. A one-step group (an unfused Einsum, ``ideal``)
pays no wind-up: ``ideal`` is the speed of light.

Per-Einsum rows split a group's latency in proportion to each Einsum's ``max(comp, mem)``;
traffic is attributed to the Einsum that reads (first reader in the group) or writes it. An
Einsum's ``comp_latency`` and ``mem_latency`` are its own demands. Compute utilisation is the
busy fraction of the units at their peak rate (``comp / latency``), memory utilisation
``traffic / bandwidth / latency``; the Einsums of one fused group run as one pipeline, so their
rows carry the group's utilisations (a single Einsum's group is its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import einsum_ops
from mambalaya.fusion.mapping import FusionGroup, Mapping
from mambalaya.model.traffic import GroupTraffic, group_traffic

ELEMENTWISE_OPS = ("add", "mul", "div", "max")


class ComputeLike(Protocol):  # the fields of mambalaya.arch.spec.ComputeSpec used here
    array_rows: int
    array_cols: int
    one_d_mode: bool
    one_d_lanes: int | None
    one_d_ops_per_lane_per_cycle: float
    vector_lanes: int
    mfu_units: int
    unary_cost_cycles: dict[str, float]
    unary_cost_pe_ops: dict[str, float]
    overlap_compute_units: bool
    pipeline_wind_up_cycles: float


@dataclass(frozen=True)
class UnitCycles:
    array_2d: float = 0.0
    array_1d: float = 0.0
    vector: float = 0.0
    mfu: float = 0.0

    def __add__(self, other: "UnitCycles") -> "UnitCycles":
        return UnitCycles(
            self.array_2d + other.array_2d, self.array_1d + other.array_1d, self.vector + other.vector, self.mfu + other.mfu
        )

    def total(self, overlap: bool) -> float:
        array = self.array_2d + self.array_1d
        return max(array, self.vector, self.mfu) if overlap else array + self.vector + self.mfu


def _elementwise_rate(compute: Any) -> tuple[str, float]:
    """Where elementwise work runs and at how many operations per cycle."""
    if compute.one_d_mode:
        lanes = compute.one_d_lanes or compute.array_rows * compute.array_cols
        return "array_1d", lanes * compute.one_d_ops_per_lane_per_cycle
    if compute.vector_lanes:
        return "vector", float(compute.vector_lanes)
    return "array_1d", float(compute.array_rows * compute.array_cols)


def einsum_cycles(compute: Any, ops: dict[str, int], kind: str) -> UnitCycles:
    """Cycles each unit spends on one Einsum's operations."""
    where, rate = _elementwise_rate(compute)
    pes = compute.array_rows * compute.array_cols
    cycles = {"array_2d": 0.0, "array_1d": 0.0, "vector": 0.0, "mfu": 0.0}
    elementwise = sum(ops.get(k, 0) for k in ELEMENTWISE_OPS)
    macs = ops.get("mac", 0)
    if kind == "gemm":
        cycles["array_2d"] += macs / pes
    else:
        elementwise += macs
    for fn, n in ops.items():
        if fn == "mac" or fn in ELEMENTWISE_OPS:
            continue
        mfu_cost = compute.unary_cost_cycles.get(fn, 0.0)
        if mfu_cost and compute.mfu_units:
            cycles["mfu"] += n * mfu_cost / compute.mfu_units
        elif not mfu_cost:  # neg, square, abs, relu: one elementwise operation
            elementwise += n
        else:  # no MFU: the function costs this many elementwise operations
            elementwise += n * compute.unary_cost_pe_ops.get(fn, 1.0)
    cycles[where] += elementwise / rate
    return UnitCycles(**cycles)


@dataclass(frozen=True)
class EinsumLatency:
    einsum: str
    fusion_group: str
    kind: str
    ops: dict[str, int]
    cycles: UnitCycles
    total_traffic: float  # bytes attributed to this Einsum
    comp_latency: float  # s
    mem_latency: float  # s
    final_latency: float  # s: its share of the group's latency
    compute_util: float
    mem_util: float


@dataclass(frozen=True)
class GroupLatency:
    group: str
    einsums: tuple[str, ...]
    steps: int
    traffic: GroupTraffic
    comp_latency: float
    mem_latency: float
    wind_up: float
    latency: float


@dataclass(frozen=True)
class LayerLatency:
    arch: str
    mapping: str
    cascade: str
    einsums: tuple[EinsumLatency, ...]
    groups: tuple[GroupLatency, ...]
    n_layers: int
    batch: int
    positions: int
    bandwidth: float

    @property
    def latency_s(self) -> float:
        return sum(g.latency for g in self.groups)

    @property
    def offchip_bytes(self) -> float:
        return sum(g.traffic.total_bytes for g in self.groups)

    @property
    def comp_s(self) -> float:
        """Compute time of the layer: each group's units working at their peak rates."""
        return sum(g.comp_latency for g in self.groups)

    @property
    def compute_util(self) -> float:
        return self.comp_s / self.latency_s if self.latency_s else 0.0

    @property
    def mem_util(self) -> float:
        return self.offchip_bytes / self.bandwidth / self.latency_s if self.latency_s else 0.0

    @property
    def model_latency_s(self) -> float:
        return self.n_layers * self.latency_s

    @property
    def tokens_per_s(self) -> float:
        """Tokens processed per second by the whole model (batch x positions per pass)."""
        return self.batch * self.positions / self.model_latency_s if self.latency_s else 0.0


def group_compute_s(arch: Any, cascade: Cascade, group: FusionGroup) -> float:
    """Seconds the group's units need for its operations (no memory)."""
    total = UnitCycles()
    for name in group.einsums:
        e = cascade.einsum(name)
        total = total + einsum_cycles(arch.compute, einsum_ops(cascade, e), cascade.kind(e))
    return total.total(arch.compute.overlap_compute_units) / arch.clock_hz


def group_latency(arch: Any, cascade: Cascade, group: FusionGroup, traffic: GroupTraffic | None = None) -> tuple[GroupLatency, list[EinsumLatency]]:
    """Latency of one group and the per-Einsum split."""
    compute = arch.compute
    clock = arch.clock_hz
    bw = arch.memory.offchip_bandwidth_bytes_per_s
    overlap_units = compute.overlap_compute_units
    traffic = traffic or group_traffic(cascade, group)
    per = []
    total_cycles = UnitCycles()
    for name in group.einsums:
        e = cascade.einsum(name)
        ops = einsum_ops(cascade, e)
        cyc = einsum_cycles(compute, ops, cascade.kind(e))
        total_cycles = total_cycles + cyc
        per.append((name, cascade.kind(e), ops, cyc))
    comp = total_cycles.total(overlap_units) / clock
    mem = traffic.total_bytes / bw
    fill = compute.pipeline_wind_up_cycles * len(group.einsums) / clock if traffic.steps > 1 else 0.0
    if arch.memory.overlap_compute_and_memory:
        wind = (min(comp, mem) / traffic.steps if traffic.steps > 1 else 0.0) + fill
        latency = max(comp, mem) + wind
    else:
        wind = fill
        latency = comp + mem + wind
    # attribute traffic: reads to the first reader in the group, writes to the producer
    attributed = {name: 0.0 for name in group.einsums}
    for t, b in traffic.read_bytes.items():
        reader = next(
            (n for n in group.einsums if t in cascade.einsum(n).input_tensors or t in cascade.initial_reads(cascade.einsum(n))),
            group.einsums[0],
        )
        attributed[reader] += b
    for t, b in traffic.write_bytes.items():
        attributed[t] += b
    weights = [max(cyc.total(overlap_units) / clock, attributed[name] / bw) for name, _, _, cyc in per]
    total_weight = sum(weights)
    group_comp_util = comp / latency if latency else 0.0
    group_mem_util = mem / latency if latency else 0.0
    rows = []
    for (name, kind, ops, cyc), w in zip(per, weights):
        share = latency * (w / total_weight) if total_weight else latency / len(per)
        rows.append(
            EinsumLatency(
                einsum=name,
                fusion_group=group.name,
                kind=kind,
                ops=ops,
                cycles=cyc,
                total_traffic=attributed[name],
                comp_latency=cyc.total(overlap_units) / clock,
                mem_latency=attributed[name] / bw,
                final_latency=share,
                compute_util=group_comp_util,
                mem_util=group_mem_util,
            )
        )
    return GroupLatency(group.name, group.einsums, traffic.steps, traffic, comp, mem, wind, latency), rows


def layer_latency(arch: Any, cascade: Cascade, mapping: Mapping, *, n_layers: int = 1) -> LayerLatency:
    """Latency of one layer under a (checked) mapping, and its per-Einsum rows in cascade order."""
    groups, rows = [], []
    for g in mapping.groups:
        gl, er = group_latency(arch, cascade, g)
        groups.append(gl)
        rows.extend(er)
    order = {e.name: n for n, e in enumerate(cascade.einsums)}
    rows.sort(key=lambda r: order[r.einsum])
    batch = cascade.size("B") if "B" in cascade.ranks else 1
    positions = cascade.size("I") if "I" in cascade.ranks else 1
    return LayerLatency(
        arch=arch.name,
        mapping=mapping.name,
        cascade=cascade.name,
        einsums=tuple(rows),
        groups=tuple(groups),
        n_layers=n_layers,
        batch=batch,
        positions=positions,
        bandwidth=arch.memory.offchip_bandwidth_bytes_per_s,
    )


def latency_rows(result: LayerLatency) -> list[dict[str, Any]]:
    """The per-Einsum table: einsum, fusion_group, total_traffic, final_latency, mem_latency,
    comp_latency, compute_util, mem_util, plus a ``total`` row."""
    rows = [
        {
            "einsum": r.einsum,
            "fusion_group": r.fusion_group,
            "total_traffic": r.total_traffic,
            "final_latency": r.final_latency,
            "mem_latency": r.mem_latency,
            "comp_latency": r.comp_latency,
            "compute_util": r.compute_util,
            "mem_util": r.mem_util,
        }
        for r in result.einsums
    ]
    rows.append(
        {
            "einsum": "total",
            "fusion_group": f"{len(result.groups)} groups",
            "total_traffic": result.offchip_bytes,
            "final_latency": result.latency_s,
            "mem_latency": result.offchip_bytes / result.bandwidth,
            "comp_latency": result.comp_s,
            "compute_util": result.compute_util,
            "mem_util": result.mem_util,
        }
    )
    return rows
