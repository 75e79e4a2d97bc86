"""The energy model: actions a mapping implies, times the energy of each action.

Per Einsum (the rows of :func:`mambalaya.cost.latency.layer_latency`), the actions are

* **DRAM** bits: the off-chip bytes attributed to it (its first reads in its group, its writes);
* **buffer** reads and writes in bits (:func:`mambalaya.cost.buffer.group_buffer_accesses`):
  its operands and results at tile granularity, and the fills and drains of its DRAM bytes;
  energy per bit at the arch's buffer size, scaled from the reference size given in the spec
  (``(size / reference) ** buffer_size_exponent``);
* **staging** levels (``memory.levels``, :mod:`mambalaya.arch.levels`): each DRAM byte is
  written into every staging level and read out of it, at that level's size by the same rule;
* **arithmetic**: its MACs (on whichever unit runs them) and elementwise operations (adds,
  multiplies, divides, maxima, the cheap unary functions, and the functions a design without
  MFUs evaluates as ``unary_cost_pe_ops`` elementwise operations), at the Einsum's width: the
  widest of its operands and result (a float32 state makes the arithmetic float32);
* **MFU** results of each nonlinear function it evaluates on the multi-function units;
* **registers**: each MAC or elementwise operation reads two operands and writes one result
  in its PE's registers, ``3 x width`` bits.

Operations count every run of the Einsum (a loop over a rank it lacks recomputes it).

The spec's energies are given at ``technology.reference_node_nm``; every on-chip action
(arithmetic, MFU, registers, buffer) is scaled by ``technology.energy_scale`` to the design's
node, DRAM not (its energy is spent in the DRAM dies). **Leakage**: the design's static power
(:func:`mambalaya.cost.area.leakage_w`, from its area) over each Einsum's share of the
latency. Average power is the energy over the latency; a design with a ``power_budget_w``
flags a result above it (:mod:`mambalaya.experiments.evaluate`), and its throttled latency
is the dynamic energy over the budget less leakage, where that is longer
(:attr:`LayerEnergy.throttled_latency_s`). A budget at or below the leakage cannot be met at
any speed: the energy of such a design is refused (:func:`check_budget_above_leakage`), as
is any energy figure that is not finite (:func:`~mambalaya.cost.latency.require_finite`).
The energy-delay product is the model's energy per pass times its latency per pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambalaya.arch.keys import dynamic_energy_key
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import einsum_ops
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.fusion.mapping import FusionGroup, Mapping
from mambalaya.cost.area import leakage_w
from mambalaya.cost.buffer import group_buffer_accesses
from mambalaya.cost.latency import EinsumLatency, LayerLatency, attributed_bytes, group_runs, require_finite
from mambalaya.cost.traffic import group_traffic
from mambalaya.cost.spatial import ELEMENTWISE_OPS

ACTIONS = ("dram_bits", "buffer_read_bits", "buffer_write_bits", "register_bits", "macs", "elementwise_ops")


@dataclass(frozen=True)
class EinsumActions:
    einsum: str
    width_bits: int
    dram_bits: float
    buffer_read_bits: float
    buffer_write_bits: float
    register_bits: float
    macs: float
    elementwise_ops: float
    mfu_results: dict[str, float]


@dataclass(frozen=True)
class EinsumEnergy:
    einsum: str
    fusion_group: str
    actions: EinsumActions
    dram_pj: float
    buffer_pj: float
    register_pj: float
    mac_pj: float
    elementwise_pj: float
    mfu_pj: float
    leakage_pj: float = 0.0
    staging_pj: float = 0.0

    @property
    def total_pj(self) -> float:
        return (self.dram_pj + self.staging_pj + self.buffer_pj + self.register_pj + self.mac_pj + self.elementwise_pj
                + self.mfu_pj + self.leakage_pj)


class PowerBudgetError(MambalayaError):
    """A design's power budget is at or below its leakage: no speed meets it."""


def check_budget_above_leakage(arch_name: str, budget_w: float | None, leakage_w: float, cores: int = 1) -> None:
    """A design's power budget must exceed its leakage power, which it draws whatever it runs:
    at or below it no latency, however long, meets the budget (the throttled latency would be
    infinite). A :class:`PowerBudgetError` names both. ``cores``: a multi-core chip's budget,
    shared by that many cores of ``leakage_w`` each (the threshold is the chip's, not a core's)."""
    total_w = cores * leakage_w
    if budget_w is not None and budget_w <= total_w:
        shared = (f", shared by its {cores} cores, is at or below their leakage ({cores} x {leakage_w:.4g} W = "
                  if cores > 1 else " is not above the design's leakage power (")
        raise PowerBudgetError(
            f"arch {arch_name!r}: power_budget_w ({budget_w:g} W){shared}{total_w:.4g} W: "
            "technology.logic_leakage_w_per_mm2 over its logic area plus technology.sram_leakage_w_per_mib over its "
            f"SRAM), which it draws at any speed, so no latency meets the budget; give a budget above {total_w:.4g} W, "
            "or none")


#: The figures of a layer's energy that reports, tables and stores read.
ENERGY_FIGURES = ("total_pj", "layer_j", "model_j", "per_token_j", "average_power_w", "throttled_latency_s", "edp_js",
                  "leakage_w")


@dataclass(frozen=True)
class LayerEnergyTotals:
    """A layer's energy as a total (``total_pj``), and the figures derived from it and its latency.
    Made only for a budget above the leakage (:func:`check_budget_above_leakage`), and every
    figure is checked finite (:func:`~mambalaya.cost.latency.require_finite`)."""

    arch: str
    mapping: str
    total_pj: float
    n_layers: int
    batch: int
    positions: int
    latency_s: float  # of one layer
    leakage_w: float = 0.0
    power_budget_w: float | None = None

    def __post_init__(self) -> None:
        check_budget_above_leakage(self.arch, self.power_budget_w, self.leakage_w)
        require_finite({name: getattr(self, name) for name in ENERGY_FIGURES},
                       what=f"the energy of a layer ({self.n_layers} layers, batch {self.batch}, {self.positions} "
                            f"positions) on arch {self.arch!r} under mapping {self.mapping}")

    @property
    def layer_j(self) -> float:
        return self.total_pj * 1e-12

    @property
    def model_j(self) -> float:
        return self.n_layers * self.layer_j

    @property
    def per_token_j(self) -> float:
        """Energy of the whole model per token processed (batch x positions per pass)."""
        return self.model_j / (self.batch * self.positions)

    @property
    def average_power_w(self) -> float:
        """Energy over latency: the layers run one after another, so a layer's is the model's."""
        return self.layer_j / self.latency_s if self.latency_s else 0.0

    @property
    def throttled_latency_s(self) -> float:
        """The layer's latency held to the power budget: a design that cannot draw more runs
        slower, its dynamic energy spread over the time t where dynamic power plus leakage is the
        budget, ``t = dynamic / (budget - leakage)`` (leakage is drawn for the longer time too),
        where that is longer than the latency. A budget at or below the leakage is refused when
        the energy is made (:func:`check_budget_above_leakage`)."""
        if not self.power_budget_w:
            return self.latency_s
        dynamic_j = self.layer_j - self.leakage_w * self.latency_s
        return max(self.latency_s, dynamic_j / (self.power_budget_w - self.leakage_w))

    @property
    def edp_js(self) -> float:
        """Energy-delay product of one pass of the model (J x s)."""
        return self.model_j * self.n_layers * self.latency_s


@dataclass(frozen=True)
class LayerEnergy(LayerEnergyTotals):
    """A layer's energy with its per-Einsum rows (``total_pj`` is their sum, in their order)."""

    einsums: tuple[EinsumEnergy, ...] = ()

    def by_component_j(self) -> dict[str, float]:
        """Energy by action; ``staging`` only on a design with staging levels."""
        keys = ("dram_pj", "staging_pj", "buffer_pj", "register_pj", "mac_pj", "elementwise_pj", "mfu_pj", "leakage_pj")
        found = {k.removesuffix("_pj"): sum(getattr(e, k) for e in self.einsums) * 1e-12 for k in keys}
        if not any(e.staging_pj for e in self.einsums):
            del found["staging"]
        return found


def einsum_width_bits(cascade: Cascade, name: str) -> int:
    """The width the Einsum computes at: the widest of its operands and result (a declared mask
    is no operand: kernels make it from the indices, :attr:`~mambalaya.einsum.ir.TensorSpec.stored_bytes_per_element`)."""
    e = cascade.einsum(name)
    return max([cascade.tensors[name].bits] + [cascade.tensors[t].bits for t in e.input_tensors
                                               if cascade.tensors[t].mask is None])


def _arithmetic(arch: Any, ops: dict[str, int], runs: float) -> tuple[float, float, dict[str, float]]:
    """(MACs, elementwise operations, MFU results per function) of ``runs`` runs of an Einsum."""
    compute = arch.compute
    macs = float(ops.get("mac", 0)) * runs
    elementwise = float(sum(ops.get(k, 0) for k in ELEMENTWISE_OPS))
    mfu: dict[str, float] = {}
    for fn, n in ops.items():
        if fn == "mac" or fn in ELEMENTWISE_OPS:
            continue
        unit, cost = compute.unary_cost(fn)  # the latency's rule (mambalaya.arch.spec.ComputeSpec.unary_cost)
        if unit == "mfu":
            mfu[fn] = n * runs
        else:
            elementwise += n * cost
    return macs, elementwise * runs, mfu


def einsum_actions(arch: Any, cascade: Cascade, row: EinsumLatency) -> EinsumActions:
    """The actions one Einsum of a layer's latency result performs (see the module doc)."""
    return _actions(arch, cascade, row.einsum, row.ops, row.runs, row.total_traffic, row.buffer_read_bytes,
                    row.buffer_write_bytes)


def _actions(arch: Any, cascade: Cascade, name: str, ops: dict[str, int], runs: Any, dram_bytes: float,
             buffer_read_bytes: float, buffer_write_bytes: float) -> EinsumActions:
    width = einsum_width_bits(cascade, name)
    macs, elementwise, mfu = _arithmetic(arch, ops, runs)
    return EinsumActions(
        einsum=name,
        width_bits=width,
        dram_bits=8 * dram_bytes,
        buffer_read_bits=8 * buffer_read_bytes,
        buffer_write_bits=8 * buffer_write_bytes,
        register_bits=3 * width * (macs + elementwise),
        macs=macs,
        elementwise_ops=elementwise,
        mfu_results=mfu,
    )


def compute_energy_pj(arch: Any, cascade: Cascade, name: str, ops: dict[str, int], runs: float = 1.0) -> float:
    """Arithmetic, MFU and register energy of ``runs`` runs of one Einsum (no data movement)."""
    spec = require_energy(arch)
    width = einsum_width_bits(cascade, name)
    macs, elementwise, mfu = _arithmetic(arch, ops, runs)
    return node_scale(arch) * (_mac_pj(arch, spec, macs, width, name) + _elementwise_pj(arch, spec, elementwise, width, name)
                               + _mfu_pj(arch, spec, mfu, name) + 3 * width * (macs + elementwise) * spec.register_pj_per_bit)


def node_scale(arch: Any) -> float:
    """The factor from the spec's energies to the design's node (1 without a technology section)."""
    return arch.technology.energy_scale if getattr(arch, "technology", None) is not None else 1.0


def _mac_pj(arch: Any, spec: Any, macs: float, width: int, einsum: str) -> float:
    return macs * _per_op(spec.mac_pj, width, "mac_pj", arch, einsum) if macs else 0.0


def _elementwise_pj(arch: Any, spec: Any, ops: float, width: int, einsum: str) -> float:
    return ops * _per_op(spec.elementwise_pj, width, "elementwise_pj", arch, einsum) if ops else 0.0


def _mfu_pj(arch: Any, spec: Any, results: dict[str, float], einsum: str) -> float:
    total = 0.0
    for fn, n in results.items():
        if fn not in spec.mfu_pj:
            raise SpecError(
                f"arch {arch.name!r}: energy.mfu_pj.{fn} is missing, and Einsum {einsum} evaluates {fn} on the MFUs "
                f"(entries: {', '.join(sorted(spec.mfu_pj)) or 'none'}); add it with its source"
            )
        total += n * spec.mfu_pj[fn]
    return total


def movement_pj_per_byte(arch: Any) -> tuple[float, float, float]:
    """(DRAM, buffer read, buffer write) energy per byte on ``arch``, the buffer's at the design's node."""
    spec = require_energy(arch)
    size, scale = arch.memory.onchip_buffer_bytes, node_scale(arch)
    return (8 * spec.dram_pj_per_bit, 8 * scale * spec.buffer_pj_per_bit(size, write=False),
            8 * scale * spec.buffer_pj_per_bit(size, write=True))


def staging_pj_per_byte(arch: Any) -> float:
    """Energy per off-chip byte spent in the staging levels (a write and a read in each, at its
    size and the design's node); 0 without staging levels."""
    spec = require_energy(arch)
    scale = node_scale(arch)
    return sum(8 * scale * (spec.buffer_pj_per_bit(level.capacity_bytes, write=False)
                            + spec.buffer_pj_per_bit(level.capacity_bytes, write=True))
               for level in arch.memory.levels.values())


def _per_op(table: dict[int, float], width: int, field: str, arch: Any, einsum: str) -> float:
    if width not in table:
        raise SpecError(
            f"arch {arch.name!r}: energy.{field} has no entry for {width}-bit operations, which Einsum {einsum} "
            f"performs (entries: {', '.join(str(w) for w in sorted(table)) or 'none'}); add energy.{field}.{width} with its source"
        )
    return table[width]


def einsum_energy(arch: Any, cascade: Cascade, row: EinsumLatency, static_w: float | None = None) -> EinsumEnergy:
    """Energy of one Einsum's actions on ``arch`` (which must have an ``energy`` section), at the
    design's node, with the design's leakage (``static_w``, default :func:`leakage_w`) over the
    Einsum's share of its group's latency."""
    static_w = leakage_w(arch) if static_w is None else static_w
    return _energy_of(arch, einsum_actions(arch, cascade, row), row.fusion_group, static_w * row.final_latency * 1e12)


def _energy_of(arch: Any, a: EinsumActions, fusion_group: str, leakage_pj: float) -> EinsumEnergy:
    spec = require_energy(arch)
    dram, buf_read, buf_write = movement_pj_per_byte(arch)
    scale = node_scale(arch)
    return EinsumEnergy(
        einsum=a.einsum,
        fusion_group=fusion_group,
        actions=a,
        dram_pj=a.dram_bits / 8 * dram,
        staging_pj=a.dram_bits / 8 * staging_pj_per_byte(arch),
        buffer_pj=a.buffer_read_bits / 8 * buf_read + a.buffer_write_bits / 8 * buf_write,
        register_pj=scale * a.register_bits * spec.register_pj_per_bit,
        mac_pj=scale * _mac_pj(arch, spec, a.macs, a.width_bits, a.einsum),
        elementwise_pj=scale * _elementwise_pj(arch, spec, a.elementwise_ops, a.width_bits, a.einsum),
        mfu_pj=scale * _mfu_pj(arch, spec, a.mfu_results, a.einsum),
        leakage_pj=leakage_pj,
    )


def group_dynamic_pj(arch: Any, cascade: Cascade, group: FusionGroup) -> float:
    """The dynamic energy of one group's actions (every member's energy but leakage, as
    :func:`einsum_energy` counts it): no latency enters it, so it is memoised on the cascade
    per group and per the arch fields it reads (:func:`~mambalaya.arch.keys.dynamic_energy_key`;
    a sweep costs the same groups at many bandwidths)."""
    memo = cascade.__dict__.setdefault("_group_dynamic_pj_memo", {})
    key = (dynamic_energy_key(arch), group.einsums, group.loops, group.halo, group.resident)
    hit = memo.get(key)
    if hit is None:
        traffic = group_traffic(cascade, group, named=False)  # only its bytes are read
        dram, buf_reads, buf_writes = attributed_bytes(cascade, group, traffic,
                                                       group_buffer_accesses(cascade, group, traffic))
        hit = memo[key] = sum(
            _energy_of(arch, _actions(arch, cascade, name, einsum_ops(cascade, cascade.einsum(name)), runs, dram[name],
                                      buf_reads[name], buf_writes[name]), group.name, 0.0).total_pj
            for name, runs in zip(group.einsums, group_runs(cascade, group))
        )
    return hit


def layer_energy_totals(arch: Any, cascade: Cascade, mapping: Mapping, result: LayerLatency) -> LayerEnergyTotals:
    """The totals of :func:`layer_energy` without its per-Einsum rows (sweeps): each group's
    dynamic energy (:func:`group_dynamic_pj`) plus the design's leakage over the layer's
    latency, which is what the rows' leakage shares sum to. ``result`` may be costed with or
    without its rows; the totals equal :func:`layer_energy`'s up to the order of summation."""
    dynamic_pj = sum(group_dynamic_pj(arch, cascade, g) for g in mapping.groups)
    static_w = leakage_w(arch)
    return LayerEnergyTotals(arch.name, result.mapping, dynamic_pj + static_w * result.latency_s * 1e12,
                             result.n_layers, result.batch, result.positions, result.latency_s, static_w,
                             arch.power_budget_w)


def require_energy(arch: Any) -> Any:
    if getattr(arch, "energy", None) is None:
        raise SpecError(f"arch {arch.name!r} has no energy section: energy needs per-action energies (see the README's energy model)")
    return arch.energy


def layer_energy(arch: Any, cascade: Cascade, result: LayerLatency) -> LayerEnergy:
    """Energy of a layer's latency result (same mapping, same actions)."""
    static_w = leakage_w(arch)
    rows = tuple(einsum_energy(arch, cascade, r, static_w) for r in result.einsums)
    return LayerEnergy(arch.name, result.mapping, sum(e.total_pj for e in rows), result.n_layers, result.batch,
                       result.positions, result.latency_s, static_w, arch.power_budget_w, einsums=rows)


@dataclass(frozen=True)
class ModelEnergy:
    """A whole model's energy from one :class:`LayerEnergyTotals` per layer type (a Mamba model
    has one; a hybrid one per layer type, each with its ``n_layers``). The layers run one after
    another, so the model's energy and time are the sums over its layers; the power budget holds
    at every moment, so each layer type is throttled on its own
    (:attr:`LayerEnergyTotals.throttled_latency_s`) and the model's throttled time is their sum.
    For one layer type every figure equals that type's own."""

    parts: tuple[LayerEnergyTotals, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a model's energy needs at least one layer type")
        first = self.parts[0]
        if any((p.arch, p.batch, p.positions) != (first.arch, first.batch, first.positions) for p in self.parts):
            raise ValueError("a model's layer types are on one design, at one batch and one number of positions")

    @property
    def model_j(self) -> float:
        return sum(p.model_j for p in self.parts)

    @property
    def model_latency_s(self) -> float:
        return sum(p.n_layers * p.latency_s for p in self.parts)

    @property
    def n_layers(self) -> int:
        return sum(p.n_layers for p in self.parts)

    @property
    def per_token_j(self) -> float:
        """Energy of the whole model per token processed (batch x positions per pass)."""
        return self.model_j / (self.parts[0].batch * self.parts[0].positions)

    @property
    def average_power_w(self) -> float:
        return self.model_j / self.model_latency_s if self.model_latency_s else 0.0

    @property
    def edp_js(self) -> float:
        """Energy-delay product of one pass of the model (J x s)."""
        return self.model_j * self.model_latency_s

    @property
    def leakage_w(self) -> float:
        return self.parts[0].leakage_w

    @property
    def power_budget_w(self) -> float | None:
        return self.parts[0].power_budget_w

    @property
    def over_power_budget(self) -> bool:
        """Whether any layer type draws more than the budget on average (it is then throttled,
        even where the model's average is within it)."""
        budget = self.power_budget_w
        return budget is not None and any(p.average_power_w > budget for p in self.parts)

    @property
    def throttled_model_latency_s(self) -> float:
        return sum(p.n_layers * p.throttled_latency_s for p in self.parts)

    def by_component_j(self) -> dict[str, float]:
        """The model's energy by action (each layer type's one-layer breakdown times its layers)."""
        out: dict[str, float] = {}
        for p in self.parts:
            if isinstance(p, LayerEnergy):
                for key, joules in p.by_component_j().items():
                    out[key] = out.get(key, 0.0) + p.n_layers * joules
        return out


def energy_rows(energy: LayerEnergy) -> list[dict[str, Any]]:
    """The per-Einsum energy table (pJ), plus a ``total`` row."""
    cols = ("dram_pj", "staging_pj", "buffer_pj", "register_pj", "mac_pj", "elementwise_pj", "mfu_pj", "leakage_pj")
    rows = [
        {"einsum": e.einsum, "fusion_group": e.fusion_group, "width_bits": e.actions.width_bits,
         **{c: getattr(e, c) for c in cols}, "total_pj": e.total_pj}
        for e in energy.einsums
    ]
    total = {c: sum(r[c] for r in rows) for c in (*cols, "total_pj")}
    rows.append({"einsum": "total", "fusion_group": "", "width_bits": "", **total})
    return rows


__all__ = [
    "ENERGY_FIGURES",
    "ModelEnergy",
    "PowerBudgetError",
    "check_budget_above_leakage",
    "EinsumActions",
    "EinsumEnergy",
    "LayerEnergy",
    "LayerEnergyTotals",
    "compute_energy_pj",
    "einsum_actions",
    "einsum_energy",
    "einsum_width_bits",
    "energy_rows",
    "group_dynamic_pj",
    "layer_energy",
    "layer_energy_totals",
    "movement_pj_per_byte",
    "node_scale",
    "staging_pj_per_byte",
    "require_energy",
]
