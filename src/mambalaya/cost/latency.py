"""The latency model of a mapping on an architecture (DESIGN.md §5).

Per Einsum, the operations of :mod:`mambalaya.einsum.stats` go to the unit that runs them, and
:mod:`mambalaya.cost.spatial` maps its ranks onto that unit's spatial dimensions:

* the MACs of a contraction the array can run (a GEMM with a weight, or a matrix product of
  two activations) go to the **2D array** in the best of its dataflows: folds of the
  stationary operand, each streaming ``T`` vectors, the utilisation following from
  ceil-division of the mapped extents by the array's rows and columns (or the ideal
  ``macs / (rows x cols)`` with ``dataflows: [roofline]``);
* every other arithmetic operation (adds, multiplies, divides, max, and the MACs of dot
  products over activations: RMSNorm's sum of squares, the conv, Mamba-1's C readout) goes to
  the **1D mode** of the array, or to the vector unit when the array has no 1D mode, its
  points spread over the lanes (a recurrence's positions in time);
* each unary function goes to the **multi-function units**: ``ops x cost_cycles / mfu_units``;
  with no MFU, it costs ``unary_cost_pe_ops`` elementwise operations instead.

A group runs every Einsum once per step over the step's tiles, so an Einsum's cycles are summed
over the group's step shapes; a select-runner runs once along its select ranks
(:func:`~mambalaya.fusion.mapping.select_ranks`), so its shapes leave their loops out
(:func:`einsum_shapes`). The array runs one mode at a time, so its 2D and 1D cycles add
up; the MFUs (and a separate vector unit) run beside it when ``overlap_compute_units``. An
Einsum's compute time is ``max(array, mfu, vector)`` cycles (their sum without overlap) over
the clock; its memory time is its off-chip bytes over the bandwidth; its on-chip time is its
buffer bytes (:func:`mambalaya.cost.buffer.group_buffer_accesses`) over the on-chip
bandwidth, when the arch gives one.

A group's compute is the same sum over all its Einsums (every unit is shared by the group's
pipeline), and on a GPU spec with a scan rate (``kernels.scan_sm_cycles_per_step``) at least its
elementwise recurrences' element-steps at that rate (:func:`scan_floor_s`: a block-parallel
scan kernel waits on each step, far below the lanes' peak); its memory time is the group's
traffic (:mod:`mambalaya.cost.traffic`) over the bandwidth. With ``overlap_compute_and_memory``
the group takes the largest of compute, memory and on-chip time (its ``bound``) plus a **wind-up**: one step's share of the smaller of compute
and memory, which the first step cannot hide (0 for a one-step group, so an unfused layer
whose Einsums each fit the buffer in one step is ``sum max(comp, mem, onchip)``), plus ``pipeline_wind_up_cycles`` per Einsum to fill
the tile pipeline of a group that runs in more than one step. Without overlap it is compute
plus memory (at least the on-chip time). A one-step group (an unfused Einsum, ``ideal``) pays
no wind-up: ``ideal`` is the speed of light.

Per-Einsum rows split a group's latency in proportion to each Einsum's largest demand;
traffic is attributed to the Einsum that reads (first reader in the group) or writes it. An
Einsum's ``comp_latency``, ``mem_latency`` and ``onchip_latency`` are its own demands. Compute
utilisation is the busy fraction of the units (``comp / latency``), memory utilisation
``traffic / bandwidth / latency``, spatial utilisation the share of the PEs its mapping fills;
the Einsums of one fused group run as one pipeline, so their rows carry the group's
utilisations and bound (a single Einsum's group is its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from mambalaya.arch.kernels import compute_hz, min_group_s, offchip_bytes_per_s, scan_seconds_per_step
from mambalaya.arch.keys import latency_key, spec_key
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Einsum, rank_of_variable
from mambalaya.einsum.routing import einsum_scale
from mambalaya.einsum.stats import einsum_ops
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.fusion.mapping import FusionGroup, Mapping, einsum_loops
from mambalaya.cost.spatial import SpatialMapping, StepShape, einsum_runs, einsum_unit_cycles, step_shapes
from mambalaya.cost.buffer import BufferAccesses, group_buffer_accesses
from mambalaya.cost.traffic import GroupTraffic, group_traffic, shared_traffic

class ComputeLike(Protocol):  # the fields of mambalaya.arch.spec.ComputeSpec used here
    array_rows: int
    array_cols: int
    dataflows: tuple[str, ...]
    dataflow_switch_cycles: float
    gemm_in_1d_mode: bool
    stationary_double_buffered: bool
    one_d_mode: bool
    one_d_lanes: int | None
    one_d_ops_per_lane_per_cycle: float
    vector_lanes: int
    mfu_units: int
    overlap_compute_units: bool
    pipeline_wind_up_cycles: float

    def unary_cost(self, fn: str) -> tuple[str, float]: ...  # where a function's result runs, at what cost


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


def einsum_cycles(compute: Any, cascade: Cascade, einsum: Einsum, shapes: list[StepShape] | None = None) -> tuple[UnitCycles, SpatialMapping]:
    """Cycles each unit spends on one Einsum over the given step shapes (default: one step
    over the whole iteration space, i.e. unfused), and its spatial mapping."""
    shapes = shapes if shapes is not None else [StepShape(1, {})]
    memo = cascade.__dict__.setdefault("_einsum_cycles_memo", {})
    key = (spec_key(compute), einsum.name, tuple((sh.count, tuple(sorted(sh.extents.items()))) for sh in shapes))
    hit = memo.get(key)
    if hit is None:
        cyc, mapping = einsum_unit_cycles(compute, cascade, einsum, einsum_ops(cascade, einsum), shapes)
        assert mapping is not None
        hit = (UnitCycles(**{k: float(v) for k, v in cyc.items()}), mapping)
        memo[key] = hit
    return hit


@dataclass(frozen=True)
class EinsumLatency:
    einsum: str
    fusion_group: str
    kind: str
    ops: dict[str, int]
    cycles: UnitCycles
    total_traffic: float  # off-chip bytes attributed to this Einsum
    comp_latency: float  # s
    mem_latency: float  # s
    final_latency: float  # s: its share of the group's latency
    compute_util: float
    mem_util: float
    spatial: SpatialMapping = SpatialMapping("none", "roofline")
    buffer_read_bytes: float = 0.0  # on-chip buffer bytes this Einsum reads (its operands, the drain of what it writes off-chip)
    buffer_write_bytes: float = 0.0  # on-chip buffer bytes it writes (its results, the fill of what it reads off-chip)
    runs: float = 1.0  # times its iteration space runs (more than 1 when a fused loop recomputes it)
    onchip_latency: float = 0.0  # s: buffer_read_write_bytes over the on-chip bandwidth
    bound: str = "compute"  # what limits its group: compute, offchip or onchip

    @property
    def buffer_read_write_bytes(self) -> float:
        """On-chip buffer bytes read and written by this Einsum (with its fills and drains): the
        buffer's traffic, not its capacity (``memory.onchip_buffer_bytes``, a mapping's
        ``buffer_bytes``)."""
        return self.buffer_read_bytes + self.buffer_write_bytes

    @property
    def spatial_mapping(self) -> str:
        return self.spatial.label

    @property
    def spatial_util(self) -> float:
        return self.spatial.spatial_util


BOUNDS = ("compute", "offchip", "onchip", "launch")


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
    buffer: BufferAccesses | None = None
    onchip_latency: float = 0.0
    floor_s: float = 0.0  # the kernel floor of a GPU spec (0 on an accelerator)

    @property
    def bound(self) -> str:
        """Which of compute, off-chip or on-chip bandwidth takes longest in this group, or
        ``launch`` when the group (a GPU kernel) takes its floor and nothing longer."""
        if self.floor_s and self.latency <= self.floor_s * (1 + 1e-12):
            return "launch"
        return BOUNDS[max(range(3), key=lambda k: (self.comp_latency, self.mem_latency, self.onchip_latency)[k])]


class NonFiniteResult(MambalayaError):
    """A figure of a result is infinite or not a number: the inputs are outside the range the
    model computes in. Never printed or stored as a number (:func:`require_finite`)."""


def require_finite(figures: dict[str, Any], *, what: str) -> None:
    """The one guard of every result mambalaya prints or stores: each numeric figure of
    ``figures`` (name -> value) is finite, or a :class:`NonFiniteResult` names the first that is
    not and ``what`` (the result and the inputs it was computed from). Text and None pass."""
    for name, value in figures.items():
        if isinstance(value, (str, bool)) or value is None:
            continue
        if not math.isfinite(value):
            raise NonFiniteResult(
                f"{what}: {name} came out as {value!r}, not a finite number, so it is not reported; the inputs are "
                "outside the range the model computes in (a spec's fields are range-checked when it is read: this is a "
                "workload too large for them, or a combination no single range catches); shrink the workload "
                "(batch, sequence length, layers) or bring the design's rates closer to real hardware")


#: The figures of a layer's latency result that reports, tables and stores read.
LAYER_FIGURES = ("latency_s", "model_latency_s", "offchip_bytes", "comp_s", "compute_util", "mem_util", "onchip_s",
                 "buffer_read_write_bytes", "spatial_util", "tokens_per_s", "bandwidth")
#: The figures of its per-Einsum rows (checked through their sums: one that is not finite makes it so).
EINSUM_FIGURES = ("final_latency", "comp_latency", "mem_latency", "onchip_latency", "total_traffic", "compute_util",
                  "mem_util")


@dataclass(frozen=True)
class LayerLatency:
    """A layer's latency under a mapping: its groups, the per-Einsum rows (none when costed
    without them) and the totals. Every figure is checked finite when it is made
    (:func:`require_finite`), so no result that reaches a table, a report or a store is ``inf``."""

    arch: str
    mapping: str
    cascade: str
    einsums: tuple[EinsumLatency, ...]
    groups: tuple[GroupLatency, ...]
    n_layers: int
    batch: int
    positions: int
    bandwidth: float

    def __post_init__(self) -> None:
        figures = {name: getattr(self, name) for name in LAYER_FIGURES}
        figures.update({f"the Einsums' {name}": sum(getattr(r, name) for r in self.einsums) for name in EINSUM_FIGURES})
        require_finite(figures, what=self.inputs_text())

    def inputs_text(self) -> str:
        """What this result was computed from, as errors name it."""
        return (f"layer {self.cascade} ({self.n_layers} layers, batch {self.batch}, {self.positions} positions) on arch "
                f"{self.arch!r} under mapping {self.mapping}")

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
    def onchip_s(self) -> float:
        """On-chip buffer time of the layer: each group's buffer bytes over its bandwidth."""
        return sum(g.onchip_latency for g in self.groups)

    @property
    def buffer_read_write_bytes(self) -> float:
        """On-chip buffer bytes the layer's groups read and write: traffic, not capacity."""
        return sum(g.buffer.total_bytes for g in self.groups if g.buffer is not None)

    @property
    def spatial_util(self) -> float:
        """MAC-weighted spatial utilisation of the 2D array over the layer's GEMMs (1.0 without any)."""
        macs = [(r.ops.get("mac", 0), r.spatial_util) for r in self.einsums if r.spatial.unit == "array_2d"]
        total = sum(m for m, _ in macs)
        return sum(m * u for m, u in macs) / total if total else 1.0

    @property
    def bound(self) -> str:
        """What limits the layer: the bound of the groups holding most of its latency."""
        share = {b: 0.0 for b in BOUNDS}
        for g in self.groups:
            share[g.bound] += g.latency
        return max(BOUNDS, key=lambda b: share[b])

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


def group_shapes(cascade: Cascade, group: FusionGroup) -> list[StepShape]:
    """The shapes of the group's steps (:func:`~mambalaya.cost.spatial.step_shapes`)."""
    return step_shapes({r: cascade.size(r) for r in cascade.ranks}, [(lp.rank, lp.tile) for lp in group.loops])


def einsum_shapes(cascade: Cascade, group: FusionGroup, einsum: str) -> list[StepShape]:
    """The shapes of the steps Einsum ``einsum`` of the group runs in: the group's, but for a
    select-runner, which runs once along its select ranks
    (:func:`~mambalaya.fusion.mapping.einsum_loops`), without their loops."""
    loops = einsum_loops(cascade, group, einsum)
    if loops == group.loops:
        return group_shapes(cascade, group)
    return step_shapes({r: cascade.size(r) for r in cascade.ranks}, [(lp.rank, lp.tile) for lp in loops])


def group_cycles(arch: Any, cascade: Cascade, group: FusionGroup) -> tuple[UnitCycles, list[tuple[Einsum, UnitCycles, SpatialMapping]]]:
    """The units' cycles of every Einsum of the group over its steps (spatial mappings
    included), and their sum. Memoised on the cascade per compute section (by value)."""
    memo = cascade.__dict__.setdefault("_group_cycles_memo", {})
    key = (spec_key(arch.compute), group.einsums, group.loops)
    if key not in memo:
        shapes = group_shapes(cascade, group)
        total = UnitCycles()
        per = []
        for name in group.einsums:
            e = cascade.einsum(name)
            own = shapes if einsum_loops(cascade, group, name) == group.loops else einsum_shapes(cascade, group, name)
            cyc, spatial = einsum_cycles(arch.compute, cascade, e, own)
            total = total + cyc
            per.append((e, cyc, spatial))
        memo[key] = (total, per)
    return memo[key]


def onchip_seconds(arch: Any, buffer_read_write_bytes: Any, offchip_bytes: Any = 0.0) -> Any:
    """Seconds the on-chip levels need (scalars or arrays over tilings): the buffer's for
    ``buffer_read_write_bytes`` (0 when its bandwidth is unbounded) or, when longer, a staging level's
    (:mod:`mambalaya.arch.levels`) for the ``offchip_bytes`` that pass through it."""
    bw = arch.memory.buffer_bandwidth_bytes_per_cycle
    seconds = 0.0 * buffer_read_write_bytes if bw is None else buffer_read_write_bytes / (bw * arch.clock_hz)
    for level in arch.memory.levels.values():
        seconds = _max(seconds, offchip_bytes / (level.bytes_per_cycle * arch.clock_hz))
    return seconds


def onchip_level_seconds(arch: Any, buffer_read_write_bytes: float, offchip_bytes: float) -> dict[str, float]:
    """Each on-chip level's seconds for one group: ``buffer`` and every staging level by name."""
    bw = arch.memory.buffer_bandwidth_bytes_per_cycle
    found = {"buffer": 0.0 if bw is None else buffer_read_write_bytes / (bw * arch.clock_hz)}
    for name, level in arch.memory.levels.items():
        found[name] = offchip_bytes / (level.bytes_per_cycle * arch.clock_hz)
    return found


def layer_level_seconds(arch: Any, result: "LayerLatency") -> dict[str, float]:
    """Each on-chip level's time summed over a layer's groups (``buffer``, then every staging
    level by name): the time each level alone would need, whichever bounds each group."""
    total: dict[str, float] = {}
    for g in result.groups:
        buffer_read_write_bytes = g.buffer.total_bytes if g.buffer is not None else 0.0
        for name, s in onchip_level_seconds(arch, buffer_read_write_bytes, g.traffic.total_bytes).items():
            total[name] = total.get(name, 0.0) + s
    return total


def combine(arch: Any, comp: Any, mem: Any, onchip: Any, steps: Any, n_einsums: int) -> tuple[Any, Any]:
    """(latency, wind-up) of a group from its compute, off-chip and on-chip seconds (scalars or
    arrays over tilings): the largest of the three plus the wind-up with overlap, else the sum
    of compute and memory (the buffer still bounds it from below)."""
    multi = steps > 1
    fill = arch.compute.pipeline_wind_up_cycles * n_einsums / arch.clock_hz * multi
    if arch.memory.overlap_compute_and_memory:
        slowest = _max3(comp, mem, onchip)
        smaller = _min(comp, mem)
        wind = smaller / _max1(steps) * multi + fill
        return _floor(arch, slowest + wind), wind
    return _floor(arch, _max(comp + mem, onchip) + fill), fill


def _floor(arch: Any, latency: Any) -> Any:
    """A group is one kernel: no shorter than the spec's kernel floor (none on an accelerator)."""
    floor = min_group_s(arch)
    if not floor:
        return latency
    return max(latency, floor) if isinstance(latency, float) else np.maximum(latency, floor)


def _max3(a: Any, b: Any, c: Any) -> Any:
    return _max(_max(a, b), c)


def _max(a: Any, b: Any) -> Any:
    return max(a, b) if isinstance(a, float) and isinstance(b, float) else np.maximum(a, b)


def _min(a: Any, b: Any) -> Any:
    return min(a, b) if isinstance(a, float) and isinstance(b, float) else np.minimum(a, b)


def _max1(steps: Any) -> Any:
    return max(steps, 1) if isinstance(steps, (int, float)) else np.maximum(steps, 1)


def scan_steps(cascade: Cascade, einsum: Einsum) -> float:
    """The element-steps of ``einsum`` if it is an elementwise recurrence (each element made by
    one lane from its inputs and its own earlier value: it reduces nothing and contracts no
    state, as the selective scan's ``H = AD * H[i-1] + BX``) along a rank on which some step
    waits on another, else 0 (a decode step's single update is no scan): its iteration space,
    times the share of it that runs (:func:`~mambalaya.einsum.routing.einsum_scale`)."""
    along = cascade.recurrence(einsum)
    if along is None or einsum.reduced_variables or cascade.contracted_state_ranks(einsum):
        return 0.0
    if cascade.size(along[0]) <= along[1]:  # no step waits on another (a decode step's one update)
        return 0.0
    points = math.prod(cascade.size(rank_of_variable(v)) for v in einsum.output_variables)
    return float(points * einsum_scale(cascade, einsum.name))


def scan_floor_s(arch: Any, cascade: Cascade, einsums: tuple[str, ...]) -> float:
    """Seconds a GPU needs at least for a group of ``einsums``: its elementwise recurrences'
    element-steps (:func:`scan_steps`) at the spec's scan rate
    (:func:`~mambalaya.arch.kernels.scan_seconds_per_step`); 0 without one."""
    per_step = scan_seconds_per_step(arch)
    if not per_step:
        return 0.0
    memo = cascade.__dict__.setdefault("_scan_steps_memo", {})  # the search asks per pick, per group
    steps = memo.get(einsums)
    if steps is None:
        steps = memo[einsums] = sum(scan_steps(cascade, cascade.einsum(n)) for n in einsums)
    return per_step * steps


def _group_times(arch: Any, cascade: Cascade, group: FusionGroup, traffic: GroupTraffic,
                 buffer_read_write_bytes: float) -> tuple[float, float, float, float, float]:
    """(compute, off-chip, on-chip, latency, wind-up) seconds of one group."""
    comp = group_compute_s(arch, cascade, group)
    mem = traffic.total_bytes / offchip_bytes_per_s(arch)
    onchip = float(onchip_seconds(arch, buffer_read_write_bytes, traffic.total_bytes))
    latency, wind = combine(arch, comp, mem, onchip, traffic.steps, len(group.einsums))
    return comp, mem, onchip, float(latency), float(wind)


def group_compute_s(arch: Any, cascade: Cascade, group: FusionGroup, array_share: float = 1.0) -> float:
    """Seconds the group's compute units take: their cycles (:func:`group_cycles`, units
    overlapping or in series as the spec says) at the kernels' clock, and at least its scan
    kernels' floor (:func:`scan_floor_s`). ``array_share``: the share of the 2D array's peak its
    contractions run at (a kernel issuing an older MMA instruction,
    :func:`~mambalaya.arch.kernels.array_share`); its cycles grow by its inverse."""
    total, _ = group_cycles(arch, cascade, group)
    if array_share != 1.0:
        total = replace(total, array_2d=total.array_2d / array_share)
    return max(total.total(arch.compute.overlap_compute_units) / compute_hz(arch),
               scan_floor_s(arch, cascade, group.einsums))


def group_totals(arch: Any, cascade: Cascade, group: FusionGroup, traffic: GroupTraffic | None = None) -> GroupLatency:
    """One group's latency and its terms, as :func:`group_latency` reports them, without its
    per-Einsum split; the buffer's accesses are counted only where an on-chip bandwidth makes
    them matter (``buffer`` is None otherwise). Without ``traffic`` (then the group's own,
    :func:`group_traffic`), memoised on the cascade per architecture (by value) and group: a
    search verifies the groups it chose, and the layer's latency costs them again."""
    if traffic is not None:
        return _group_totals(arch, cascade, group, traffic)
    hit = _memoised_totals(arch, cascade, group)
    if hit.group != group.name:
        hit = replace(hit, group=group.name, traffic=group_traffic(cascade, group))
    return hit


def _memoised_totals(arch: Any, cascade: Cascade, group: FusionGroup) -> GroupLatency:
    """:func:`group_totals` of the group's own traffic, memoised, under the name of the equal
    group met first."""
    memo = cascade.__dict__.setdefault("_group_totals_memo", {})
    key = (latency_key(arch), group.einsums, group.loops, group.halo, group.resident)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _group_totals(arch, cascade, group, group_traffic(cascade, group))
    return hit


def _group_totals(arch: Any, cascade: Cascade, group: FusionGroup, traffic: GroupTraffic) -> GroupLatency:
    buffer = None
    if arch.memory.buffer_bandwidth_bytes_per_cycle is not None:  # (staging levels need the traffic only)
        buffer = group_buffer_accesses(cascade, group, traffic)
    comp, mem, onchip, latency, wind = _group_times(arch, cascade, group, traffic,
                                                    0.0 if buffer is None else buffer.total_bytes)
    return GroupLatency(group.name, group.einsums, traffic.steps, traffic, comp, mem, wind, latency, buffer, onchip,
                        min_group_s(arch))


def group_seconds(arch: Any, cascade: Cascade, group: FusionGroup, traffic: GroupTraffic | None = None) -> float:
    """The latency of one group, as :func:`group_latency` reports it (the search's inner loop)."""
    if traffic is not None:
        return _group_totals(arch, cascade, group, traffic).latency
    return _memoised_totals(arch, cascade, group).latency


def group_latency(arch: Any, cascade: Cascade, group: FusionGroup,
                  traffic: GroupTraffic | None = None) -> tuple[GroupLatency, list[EinsumLatency]]:
    """Latency of one group and the per-Einsum split."""
    clock = compute_hz(arch)
    bw = offchip_bytes_per_s(arch)
    overlap_units = arch.compute.overlap_compute_units
    traffic = traffic or group_traffic(cascade, group)
    buffer = group_buffer_accesses(cascade, group, traffic)
    _, per = group_cycles(arch, cascade, group)
    runs = group_runs(cascade, group)
    comp, mem, onchip, latency, wind = _group_times(arch, cascade, group, traffic, buffer.total_bytes)
    attributed, buf_reads, buf_writes = attributed_bytes(cascade, group, traffic, buffer)
    on_bytes = {name: buf_reads[name] + buf_writes[name] for name in group.einsums}
    own_comp = {e.name: max(cyc.total(overlap_units) / clock, scan_floor_s(arch, cascade, (e.name,)))
                for e, cyc, _ in per}
    weights = [
        max(own_comp[e.name], attributed[e.name] / bw, float(onchip_seconds(arch, on_bytes[e.name], attributed[e.name])))
        for e, cyc, _ in per
    ]
    total_weight = sum(weights)
    group_comp_util = comp / latency if latency else 0.0
    group_mem_util = mem / latency if latency else 0.0
    gl = GroupLatency(group.name, group.einsums, traffic.steps, traffic, comp, mem, wind, latency, buffer, onchip,
                      min_group_s(arch))
    rows = []
    for (e, cyc, spatial), w, e_runs in zip(per, weights, runs):
        share = latency * (w / total_weight) if total_weight else latency / len(per)
        rows.append(
            EinsumLatency(
                einsum=e.name,
                fusion_group=group.name,
                kind=cascade.kind(e),
                ops=einsum_ops(cascade, e),
                cycles=cyc,
                total_traffic=attributed[e.name],
                comp_latency=own_comp[e.name],
                mem_latency=attributed[e.name] / bw,
                final_latency=share,
                compute_util=group_comp_util,
                mem_util=group_mem_util,
                spatial=spatial,
                buffer_read_bytes=buf_reads[e.name],
                buffer_write_bytes=buf_writes[e.name],
                runs=e_runs,
                onchip_latency=float(onchip_seconds(arch, on_bytes[e.name], attributed[e.name])),
                bound=gl.bound,
            )
        )
    return gl, rows


def attributed_bytes(cascade: Cascade, group: FusionGroup, traffic: GroupTraffic,
                     buffer: BufferAccesses) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per Einsum of the group: its off-chip bytes (each tensor's reads go to its first reader
    in the group, writes to the producer), its buffer reads and its buffer writes (its own
    operands and results, plus the fills of what it reads off chip and the drains of what it
    writes off chip)."""
    dram_reads = {name: 0.0 for name in group.einsums}
    for t, b in traffic.read_bytes.items():
        reader = next(
            (n for n in group.einsums if t in cascade.einsum(n).input_tensors or t in cascade.initial_reads(cascade.einsum(n))),
            group.einsums[0],
        )
        dram_reads[reader] += b
    attributed = {name: dram_reads[name] + traffic.write_bytes.get(name, 0.0) for name in group.einsums}
    buf_reads = {name: buffer.einsum_read_bytes[name] + traffic.write_bytes.get(name, 0.0) for name in group.einsums}
    buf_writes = {name: buffer.einsum_write_bytes[name] + dram_reads[name] for name in group.einsums}
    return attributed, buf_reads, buf_writes


def group_runs(cascade: Cascade, group: FusionGroup) -> list[Any]:
    """How many times each member's iteration space runs over the group's steps
    (:func:`~mambalaya.cost.spatial.einsum_runs`), in the group's order; memoised on the
    cascade per group (no architecture in it): a sweep costs the same groups at many points."""
    memo = cascade.__dict__.setdefault("_group_runs_memo", {})
    key = (group.einsums, group.loops)
    if key not in memo:
        memo[key] = [einsum_runs(cascade, cascade.einsum(n), einsum_shapes(cascade, group, n)) for n in group.einsums]
    return memo[key]


def layer_latency(arch: Any, cascade: Cascade, mapping: Mapping, *, n_layers: int = 1,
                  per_einsum: bool = True, dram_share: dict[str, float] | None = None) -> LayerLatency:
    """Latency of one layer under a (checked) mapping, and its per-Einsum rows in cascade order.
    With ``per_einsum=False`` (sweeps), the groups only (:func:`group_totals`): every total of
    the layer but the buffer bytes and the spatial utilisation, which need the rows. With
    ``dram_share`` (one core of a multi-core chip, :mod:`mambalaya.cost.cores`), each tensor's
    off-chip bytes are that share of its own (:func:`~mambalaya.cost.traffic.shared_traffic`)."""
    if getattr(arch, "cores", None) is not None:
        raise SpecError(f"{arch.name} is a multi-core design ({arch.cores.count} cores): a layer is costed on one of its "
                        "cores, each core's part (mambalaya evaluate and compare, or core_design() and the devices' "
                        "strategies in Python), not on the whole chip as one array")
    groups, rows = [], []
    for g in mapping.groups:
        traffic = None if dram_share is None else shared_traffic(group_traffic(cascade, g), dram_share)
        if not per_einsum:
            groups.append(group_totals(arch, cascade, g, traffic))
            continue
        gl, er = group_latency(arch, cascade, g, traffic)
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
        bandwidth=offchip_bytes_per_s(arch),
    )


def latency_rows(result: LayerLatency) -> list[dict[str, Any]]:
    """The per-Einsum table: einsum, fusion_group, total_traffic, final_latency, mem_latency,
    comp_latency, group_compute_util, group_mem_util, spatial_mapping, spatial_util,
    buffer_read_write_bytes, onchip_latency, group_bound, plus a ``total`` row (the layer's, all
    groups'). The ``group_`` columns are the Einsum's fused group's (its Einsums run as one
    pipeline; they were named as if the Einsum's own, where an Einsum's ``comp_latency``, its own
    demand, may exceed its ``final_latency``, its share of the group's time: the group runs its
    MFU work beside its array work). An Einsum alone in its group that is
    compute-bound although its unit runs it in one pass (every point on a lane at once, each
    doing its few operations; at most one cycle on the array or the MFUs) is marked ``compute
    (one pass)``: a tiny Einsum whose bytes move in less than a pass, an artefact of whole
    cycles rather than a finding."""
    members: dict[str, int] = {}
    for r in result.einsums:
        members[r.fusion_group] = members.get(r.fusion_group, 0) + 1

    def bound(r: EinsumLatency) -> str:
        c, sp = r.cycles, r.spatial
        one_pass = (c.array_2d <= 1.0 and c.mfu <= 1.0
                    and (sp.unit not in ("array_1d", "vector") or (not sp.streamed and sp.dataflow != "roofline")))
        return "compute (one pass)" if r.bound == "compute" and members[r.fusion_group] == 1 and one_pass else r.bound

    rows = [
        {
            "einsum": r.einsum,
            "fusion_group": r.fusion_group,
            "total_traffic": r.total_traffic,
            "final_latency": r.final_latency,
            "mem_latency": r.mem_latency,
            "comp_latency": r.comp_latency,
            "group_compute_util": r.compute_util,
            "group_mem_util": r.mem_util,
            "spatial_mapping": r.spatial_mapping,
            "spatial_util": r.spatial_util,
            "buffer_read_write_bytes": r.buffer_read_write_bytes,
            "onchip_latency": r.onchip_latency,
            "group_bound": bound(r),
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
            "group_compute_util": result.compute_util,
            "group_mem_util": result.mem_util,
            "spatial_mapping": "",
            "spatial_util": result.spatial_util,
            "buffer_read_write_bytes": result.buffer_read_write_bytes,
            "onchip_latency": result.onchip_s,
            "group_bound": result.bound,
        }
    )
    return rows
