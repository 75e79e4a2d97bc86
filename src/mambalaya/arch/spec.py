"""Architecture specs: the hardware a latency model of Mamba layers runs on.

An :class:`ArchSpec` is a frozen pydantic model read from YAML (see
:func:`mambalaya.arch.load_arch`). Every number the latency model uses lives here, never in
code: the PE array and its 1D (elementwise) mode, the multi-function units (MFUs) for
nonlinear functions and their per-op costs, the on-chip buffer, the off-chip bandwidth, the
datatype width and the mapping the design runs. Field names carry their units
(``clock_hz``, ``onchip_buffer_bytes``, ``offchip_bandwidth_bytes_per_s``, ...).

Human-friendly quantities are accepted in YAML and converted on load: byte sizes such as
``"50MiB"`` or ``"24 MB"``, bandwidths such as ``"2039 GB/s"`` and clocks such as
``"1.75 GHz"``. Decimal prefixes (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB,
GiB, TiB) powers of 1024. Plain numbers are taken in the base unit (bytes, bytes/s, Hz).

Validation problems are raised by pydantic; :func:`mambalaya.arch.arch_from_dict` turns them
into one-paragraph :class:`~mambalaya.errors.SpecError` messages naming the field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mambalaya.einsum.ir import UNARY_FUNCTIONS as IR_UNARY_FUNCTIONS
from mambalaya.errors import SpecError
from mambalaya.arch.kernels import KernelSpec
from mambalaya.arch.system import CoresSpec, SystemSpec
from mambalaya.arch.levels import StagingLevel, check_capacities, check_level_names
from mambalaya.arch.physical import AreaSpec, EnergySpec, TechnologySpec, known_unary_names
from mambalaya.arch.quantities import (BANDWIDTH_UNITS, BYTE_UNITS, HZ_UNITS, BYTES_PER_CYCLE_RANGE,  # noqa: F401
                                       CLOCK_RANGE, MAX_ELEMENT_BITS, MAX_INT, OFFCHIP_BANDWIDTH_RANGE, OPS_PER_LANE_RANGE,
                                       OVERHEAD_CYCLES_RANGE, POWER_BUDGET_RANGE, UNARY_CYCLES_RANGE, UNARY_PE_OPS_RANGE,
                                       parse_byte_count, parse_float_quantity)
from mambalaya.specio import FieldProblem

#: Unary functions the cost model knows: those of the Einsum IR, as counted by
#: :mod:`mambalaya.einsum.stats`.
UNARY_FUNCTIONS: tuple[str, ...] = IR_UNARY_FUNCTIONS

#: Documented default MFU costs (cycles of one MFU per result). Functions at 0 run as one
#: elementwise operation on the 1D mode / vector unit instead of an MFU. The non-zero values
#: are assumptions (a pipelined MFU evaluating exp/log/sqrt/rsqrt in one pass, sigmoid/tanh/
#: SiLU/GELU in two, softplus = log1p(exp(.)) plus a max in four); shipped specs spell them out.
DEFAULT_UNARY_COST_CYCLES: dict[str, float] = {
    "exp": 1.0,
    "log": 1.0,
    "sqrt": 1.0,
    "rsqrt": 1.0,
    "silu": 2.0,
    "softplus": 4.0,
    "sigmoid": 2.0,
    "tanh": 2.0,
    "neg": 0.0,
    "square": 0.0,
    "abs": 0.0,
    "step": 0.0,
    "relu": 0.0,
    # Assumption: gelu = 0.5*x*(1 + erf(x/sqrt(2))) as one MFU function like SiLU (x times a
    # sigmoid-shaped function): an erf pass plus the multiply, 2 cycles; range 1-4 (erf by a
    # polynomial or rational approximation of several steps).
    "gelu": 2.0,
}

MAPPING_NAMES: tuple[str, ...] = ("unfused", "ssm-ri", "stitched", "optimal", "optimal-convex", "ideal")
FUSION_CLASSES: tuple[str, ...] = ("RI", "RSb", "RSp", "RD")


MappingName = Literal["unfused", "ssm-ri", "stitched", "optimal", "optimal-convex", "ideal"]
FusionClass = Literal["RI", "RSb", "RSp", "RD"]


# ---------------------------------------------------------------------------------------------
# models


_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_INT)]
#: Bytes per cycle of an on-chip port (the buffer's, a PE's registers'), in its documented range.
BytesPerCycle = Annotated[float, Field(gt=0), BYTES_PER_CYCLE_RANGE.validator()]


class ComputeSpec(BaseModel):
    """The compute units: a 2D PE array (optionally switching to a 1D elementwise mode), an
    optional separate vector unit and multi-function units (MFUs) for nonlinear functions."""

    model_config = _CONFIG

    array_rows: PositiveInt = Field(
        description="Rows of the 2D PE array (PEs). In 2D mode every PE does one multiply-accumulate per cycle."
    )
    array_cols: PositiveInt = Field(description="Columns of the 2D PE array (PEs).")
    one_d_mode: bool = Field(
        True,
        description=(
            "Whether the PE array switches to a 1D mode for elementwise work (maps, scans, reductions "
            "without a product). The 2D and 1D modes share the same PEs, so their work never overlaps."
        ),
    )
    one_d_lanes: Annotated[int, Field(gt=0, le=MAX_INT)] | None = Field(
        None,
        description=(
            "Lanes (PEs) active in 1D mode; None means every PE (array_rows * array_cols). Must not "
            "exceed array_rows * array_cols; only meaningful when one_d_mode is true."
        ),
    )
    one_d_ops_per_lane_per_cycle: Annotated[float, OPS_PER_LANE_RANGE.validator()] = Field(
        1.0, gt=0, description="Elementwise operations one lane completes per cycle in 1D mode (ops/lane/cycle). "
                               + OPS_PER_LANE_RANGE.note
    )
    vector_lanes: NonNegativeInt = Field(
        0,
        description=(
            "Elementwise operations per cycle of a separate vector unit (e.g. a GPU's CUDA cores), which "
            "runs the elementwise work of a design without a 1D mode (one_d_mode false). The model runs "
            "elementwise work on one unit, so a design with a 1D mode has none (0)."
        ),
    )
    mfu_units: NonNegativeInt = Field(
        0,
        description=(
            "Multi-function units evaluating nonlinear functions (exp, log, SiLU, ...), each producing "
            "one result every unary_cost_cycles[fn] cycles. 0: nonlinear functions run on the "
            "elementwise units at unary_cost_pe_ops[fn] operations each."
        ),
    )
    unary_cost_cycles: dict[str, Annotated[float, Field(ge=0), UNARY_CYCLES_RANGE.validator()]] = Field(
        default_factory=lambda: dict(DEFAULT_UNARY_COST_CYCLES),
        description=(
            "Cycles of one MFU per result, for each unary function (exp, log, sqrt, rsqrt, silu, "
            "softplus, sigmoid, tanh, gelu, neg, square, abs, relu). 0 means the function is a plain "
            "elementwise operation (one op on the 1D mode / vector unit, not an MFU). Entries given "
            "override the documented defaults (exp/log/sqrt/rsqrt 1, silu/sigmoid/tanh/gelu 2, softplus 4, "
            "neg/square/abs/relu 0). " + UNARY_CYCLES_RANGE.note
        ),
    )
    unary_cost_pe_ops: dict[str, Annotated[float, Field(gt=0), UNARY_PE_OPS_RANGE.validator()]] = Field(
        default_factory=dict,
        description=(
            "Cost of one result in elementwise PE operations when no MFU is available (e.g. exp 8: a "
            "polynomial or bit-trick approximation). Used only when mfu_units is 0, and then required "
            "for every function whose unary_cost_cycles entry is non-zero. " + UNARY_PE_OPS_RANGE.note
        ),
    )
    dataflows: tuple[Literal["weight-stationary", "output-stationary", "input-stationary", "roofline"], ...] = Field(
        ("weight-stationary",),
        description=(
            "The dataflows the 2D array supports (mambalaya.cost.spatial), each naming the operand "
            "held in the PEs during a fold (weight-, output- or input-stationary); the model runs "
            "each contraction in the fastest of them, the first listed being the array's native one. "
            "Or ['roofline']: an ideal macs / (rows * cols) with no spatial quantisation (a GPU's "
            "tensor cores), which cannot be combined with another. A single name is a one-entry list. "
            "Default weight-stationary, the dataflow of TPU v1 (Jouppi et al., ISCA 2017)."
        ),
    )
    dataflow_switch_cycles: Annotated[float, OVERHEAD_CYCLES_RANGE.validator()] = Field(
        0.0,
        ge=0,
        description=(
            "Cycles to reconfigure the array to a dataflow other than its first and back, charged "
            "per step of every Einsum that runs in one (0 for an array with one dataflow). " + OVERHEAD_CYCLES_RANGE.note
        ),
    )
    stationary_double_buffered: bool = Field(
        True,
        description=(
            "Whether the array loads the next fold's stationary tile while the current fold computes "
            "(TPU v1's double-buffered weights, Jouppi et al., ISCA 2017): a fold takes T cycles (the "
            "vectors it streams) and the load is on-chip traffic. False: every fold loads, fills and "
            "drains alone, 2r + c + T - 2 cycles for the r rows and c columns it uses (SCALE-Sim, "
            "Samajdar et al., ISPASS 2020)."
        ),
    )
    gemm_in_1d_mode: bool = Field(
        False,
        description=(
            "Whether GEMM-like Einsums (products reduced over a rank) may also run in 1D mode, e.g. "
            "matrix-vector products during generation. False: they always use the 2D array."
        ),
    )
    overlap_compute_units: bool = Field(
        True,
        description=(
            "Whether the work of a fused group on distinct units (2D array, MFUs, vector unit) overlaps "
            "(pipelined: the group's compute time is the slowest unit's) or serialises (the sum). "
            "2D-mode and 1D-mode work always serialise: they share the PEs."
        ),
    )
    pipeline_wind_up_cycles: Annotated[float, OVERHEAD_CYCLES_RANGE.validator()] = Field(
        0.0,
        ge=0,
        description="Fixed cycles added per fused-group step to fill and drain the pipeline between its Einsums. "
                    + OVERHEAD_CYCLES_RANGE.note,
    )

    @model_validator(mode="before")
    @classmethod
    def _dataflow_renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "dataflow" in data:
            raise FieldProblem(
                "dataflow",
                "was renamed to compute.dataflows, the list of dataflows the array supports (e.g. "
                f"dataflows: [{data['dataflow']}]); the model runs each contraction in the fastest of them",
            )
        return data

    @field_validator("dataflows", mode="before")
    @classmethod
    def _one_dataflow_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (value,)
        return tuple(value) if isinstance(value, list) else value

    @field_validator("dataflows")
    @classmethod
    def _dataflows_combine(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must list at least one dataflow")
        if len(set(value)) != len(value):
            raise ValueError(f"lists a dataflow twice ({', '.join(value)})")
        if "roofline" in value and len(value) > 1:
            raise ValueError("roofline is an ideal array and cannot be combined with another dataflow")
        return value

    @field_validator("unary_cost_cycles", mode="before")
    @classmethod
    def _merge_default_costs(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {**DEFAULT_UNARY_COST_CYCLES, **value}
        return value

    @field_validator("unary_cost_cycles", "unary_cost_pe_ops")
    @classmethod
    def _known_unary_names(cls, value: dict[str, float]) -> dict[str, float]:
        return known_unary_names(value)

    @model_validator(mode="after")
    def _consistent(self) -> ComputeSpec:
        pes = self.array_rows * self.array_cols
        if self.one_d_lanes is not None:
            if not self.one_d_mode:
                raise FieldProblem("one_d_lanes", "is set but one_d_mode is false (remove it or enable one_d_mode)")
            if self.one_d_lanes > pes:
                raise FieldProblem(
                    "one_d_lanes",
                    f"must be <= array_rows * array_cols = {self.array_rows} * {self.array_cols} = {pes} "
                    f"(got {self.one_d_lanes})",
                )
        if self.one_d_mode and self.vector_lanes:  # (accepted once: area and leakage, and no speed)
            raise FieldProblem(
                "vector_lanes",
                f"is {self.vector_lanes} but one_d_mode is true: the model runs elementwise work in the array's 1D "
                "mode alone (a vector unit beside it is not modelled, so it would add area and leakage and no "
                "speed); set it to 0, or one_d_mode to false to run elementwise work on the vector unit",
            )
        if not self.one_d_mode and self.vector_lanes == 0:
            raise FieldProblem(
                "vector_lanes",
                "must be > 0 when one_d_mode is false: otherwise no unit can run elementwise work (got 0)",
            )
        if self.gemm_in_1d_mode and not self.one_d_mode:
            raise FieldProblem("gemm_in_1d_mode", "is true but one_d_mode is false")
        if self.mfu_units == 0:
            missing = [
                fn for fn in UNARY_FUNCTIONS if self.unary_cost_cycles[fn] > 0 and fn not in self.unary_cost_pe_ops
            ]
            if missing:
                raise FieldProblem(
                    "unary_cost_pe_ops",
                    "mfu_units is 0, so every function with a non-zero MFU cost needs its cost in "
                    f"elementwise operations here; missing: {', '.join(missing)}",
                )
        return self

    # derived ------------------------------------------------------------------------------
    def unary_cost(self, fn: str) -> tuple[str, float]:
        """Where one result of the function ``fn`` runs and what it costs there: ``("mfu",
        cycles)`` on the MFUs, for a function with a cycle cost (``unary_cost_cycles``) on a design
        with MFUs; ``("elementwise", ops)`` otherwise, ``unary_cost_pe_ops`` operations for such a
        function on a design without MFUs, one for a function of no cycle cost (neg, square, abs,
        relu, or a function the table does not list). The one rule the latency and the energy read."""
        cycles = self.unary_cost_cycles.get(fn, 0.0)
        if cycles and self.mfu_units:
            return "mfu", cycles
        if not cycles:
            return "elementwise", 1.0
        return "elementwise", self.unary_cost_pe_ops.get(fn, 1.0)

    @property
    def pe_count(self) -> int:
        """PEs in the 2D array."""
        return self.array_rows * self.array_cols

    @property
    def one_d_lanes_effective(self) -> int:
        """Lanes active in 1D mode (0 without a 1D mode)."""
        if not self.one_d_mode:
            return 0
        return self.pe_count if self.one_d_lanes is None else self.one_d_lanes

    @property
    def macs_per_cycle(self) -> float:
        """Multiply-accumulates per cycle of the 2D array."""
        return float(self.pe_count)

    @property
    def one_d_ops_per_cycle(self) -> float:
        """Elementwise operations per cycle of the 1D mode (0 without one)."""
        return self.one_d_lanes_effective * self.one_d_ops_per_lane_per_cycle

    @property
    def elementwise_ops_per_cycle(self) -> float:
        """Elementwise operations per cycle of the unit that runs them: the 1D mode, or the vector
        unit on a design without one (they never both exist)."""
        return self.one_d_ops_per_cycle if self.one_d_mode else float(self.vector_lanes)


class MemorySpec(BaseModel):
    """The on-chip buffer and the off-chip (DRAM/HBM) interface."""

    model_config = _CONFIG

    onchip_buffer_bytes: PositiveInt = Field(
        description=(
            "Capacity of the on-chip buffer holding the tiles of a fused group (bytes). YAML may say "
            "'50MiB', '24 MB', ...; a mapping is legal only if its live tiles fit."
        )
    )
    offchip_bandwidth_bytes_per_s: Annotated[float, OFFCHIP_BANDWIDTH_RANGE.validator()] = Field(
        gt=0,
        description="Off-chip (DRAM/HBM) bandwidth in bytes per second. YAML may say '2039 GB/s', '3.35TB/s', ... "
                    + OFFCHIP_BANDWIDTH_RANGE.note,
    )
    onchip_bandwidth_bytes_per_cycle: BytesPerCycle | None = Field(
        None,
        description=(
            "Bytes per cycle the on-chip buffer delivers (reads and writes together, "
            "mambalaya.cost.latency): a group takes at least its buffer accesses over this "
            "bandwidth. None: unbounded (the buffer never limits). " + BYTES_PER_CYCLE_RANGE.note
        ),
    )
    onchip_banks: PositiveInt | None = Field(
        None,
        description=(
            "Banks of the on-chip buffer. With onchip_bank_port_bytes it sets the buffer's bandwidth "
            "(banks x port bytes per cycle, every bank accessed once per cycle); or "
            "onchip_bandwidth_bytes_per_cycle gives the figure itself, never both (a --set, sweep or "
            "sensitivity end of one form nulls the other)."
        ),
    )
    onchip_bank_port_bytes: PositiveInt | None = Field(
        None, description="Bytes one bank of the on-chip buffer reads or writes per cycle (its port width)."
    )
    pe_local_bytes: PositiveInt | None = Field(
        None,
        description=(
            "The innermost level: storage per PE or lane (register file or scratchpad), in bytes. "
            "Every MAC or elementwise operation reads its two operands from it and writes its result "
            "to it; it must be smaller than the on-chip buffer."
        ),
    )
    pe_local_bytes_per_cycle: BytesPerCycle | None = Field(
        None,
        description=(
            "Bytes per cycle one PE's local storage delivers; at least one operation's three operands "
            "at the design width (the model does not slow a PE by its register ports, so less is refused). "
            + BYTES_PER_CYCLE_RANGE.note
        ),
    )
    offchip_capacity_bytes: PositiveInt | None = Field(
        None, description="Capacity of the off-chip memory (DRAM/HBM) in bytes; must exceed every on-chip level. Every "
                          "evaluation checks the model's weights, states and KV cache fit (mambalaya.cost.capacity).")
    levels: dict[str, StagingLevel] = Field(
        default_factory=dict,
        description=(
            "On-chip staging levels between DRAM and the on-chip buffer, by name, outermost first (a GPU's L2 "
            "in front of its shared memory): each passes every off-chip byte and bounds a group by those bytes "
            "over its bandwidth (mambalaya.arch.levels). Empty: DRAM feeds the buffer directly."
        ),
    )
    overlap_compute_and_memory: bool = Field(
        True,
        description=(
            "Double buffering: a group's latency is max(compute, memory) when true, compute + memory "
            "when false."
        ),
    )

    @field_validator("onchip_buffer_bytes", "pe_local_bytes", "offchip_capacity_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return value if value is None else parse_byte_count(value)

    @model_validator(mode="after")
    def _levels_consistent(self) -> MemorySpec:
        banked = (self.onchip_banks is not None, self.onchip_bank_port_bytes is not None)
        if banked[0] != banked[1]:
            missing, given = ("onchip_bank_port_bytes", "onchip_banks") if banked[0] else ("onchip_banks", "onchip_bank_port_bytes")
            raise FieldProblem(missing, f"is missing while {given} is given: the buffer's bandwidth is banks x port bytes "
                                        "per cycle, so give both (or neither, and onchip_bandwidth_bytes_per_cycle)")
        if banked[0] and self.onchip_bandwidth_bytes_per_cycle is not None:
            raise FieldProblem("onchip_bandwidth_bytes_per_cycle",
                               f"= {self.onchip_bandwidth_bytes_per_cycle:g} is given beside onchip_banks = "
                               f"{self.onchip_banks} and onchip_bank_port_bytes = {self.onchip_bank_port_bytes}: the "
                               "buffer's bandwidth is one or the other, and the figure would leave the banks unread "
                               "(a --set or sweep of them would change nothing); give one (null the other)")
        check_level_names(self.levels)
        check_capacities(self.levels, self.onchip_buffer_bytes, self.offchip_capacity_bytes)
        return self

    @property
    def buffer_bandwidth_bytes_per_cycle(self) -> float | None:
        """The on-chip buffer's bandwidth: the given figure, or banks x port bytes; None: unbounded."""
        if self.onchip_bandwidth_bytes_per_cycle is not None:
            return self.onchip_bandwidth_bytes_per_cycle
        if self.onchip_banks is not None and self.onchip_bank_port_bytes is not None:
            return float(self.onchip_banks * self.onchip_bank_port_bytes)
        return None

    @field_validator("offchip_bandwidth_bytes_per_s", mode="before")
    @classmethod
    def _bandwidth(cls, value: Any) -> Any:
        return parse_float_quantity(value, BANDWIDTH_UNITS, "a bandwidth")


class MappingPolicy(BaseModel):
    """Which mapping the design runs and which fusion edge classes it can fuse."""

    model_config = _CONFIG

    default: MappingName = Field(
        description=(
            "The mapping this design runs: unfused (every Einsum alone: the algorithmic minimum of "
            "traffic), ssm-ri (RI fusion of the SSM region only), stitched (greedy stitching), optimal "
            "(least-traffic search), optimal-convex (the same over every connected convex group) or ideal (one group, unbounded buffer: a lower bound)."
        )
    )
    fusion_classes: list[FusionClass] = Field(
        description=(
            "Edge classes the design can fuse (RI, RSb, RSp, RD), as the paper labels each design. Checked "
            "against default, which decides what is fused: unfused fuses none ([]), ssm-ri is [RI] (Geens et "
            "al.'s fine-grained fusion of the SSM region), and stitched, optimal and ideal list every class "
            "(their searches fuse any edge the fusion rules allow; a search limited to some classes is not "
            "modelled, and such a list is refused)."
        )
    )

    @model_validator(mode="after")
    def _consistent(self) -> MappingPolicy:
        classes = self.fusion_classes
        shown = "[" + ", ".join(classes) + "]"
        dup = sorted({c for c in classes if classes.count(c) > 1})
        if dup:
            raise FieldProblem("fusion_classes", f"lists {', '.join(dup)} more than once (got {shown})")
        if self.default == "unfused" and classes:
            raise FieldProblem("fusion_classes", f"must be [] for the unfused mapping, which fuses nothing (got {shown})")
        if self.default == "ssm-ri" and classes != ["RI"]:
            raise FieldProblem("fusion_classes", f"must be [RI] for the ssm-ri mapping (got {shown})")
        if self.default in ("stitched", "optimal", "optimal-convex", "ideal") and set(classes) != set(FUSION_CLASSES):
            # the searches fuse every edge their rules allow, whatever its class: a design limited to
            # some classes is not modelled, so such a list is refused rather than silently searched past
            raise FieldProblem(
                "fusion_classes", f"must list every class ({', '.join(FUSION_CLASSES)}) for the {self.default} mapping, "
                f"which fuses any edge its rules allow; a search limited to some classes is not modelled (got {shown})"
            )
        return self


class ArchSpec(BaseModel):
    """One accelerator (or GPU roofline) for the latency model."""

    model_config = _CONFIG

    name: str = Field(min_length=1, description="Short name of the architecture, printed in reports.")
    description: str = Field("", description="One or two sentences on what this spec models.")
    clock_hz: Annotated[float, CLOCK_RANGE.validator()] = Field(
        gt=0, description="Clock frequency in Hz. YAML may say '1.75 GHz', '1000 MHz', ... " + CLOCK_RANGE.note)
    compute: ComputeSpec = Field(description="The compute units.")
    memory: MemorySpec = Field(description="The on-chip buffer and off-chip bandwidth.")
    bits_per_element: Annotated[int, Field(gt=0, le=MAX_ELEMENT_BITS)] = Field(
        16,
        description=(
            f"Datatype width of activations and weights (bits per element). Range 1 to {MAX_ELEMENT_BITS}: the "
            "widths a precision policy may give a tensor, up to IEEE double precision."
        ),
    )
    precision: str = Field(
        "uniform",
        min_length=1,
        description=(
            "The precision policy that sets each tensor's width (a shipped policy such as 'uniform' or "
            "'reference-kernels', or a policy YAML file); its 'design' widths are bits_per_element."
        ),
    )
    mappings: MappingPolicy = Field(description="The mapping the design runs and the edge classes it can fuse.")
    energy: EnergySpec | None = Field(
        None, description="Energy per action (DRAM, buffer, registers, arithmetic, MFU functions); None: no energy model."
    )
    technology: TechnologySpec | None = Field(
        None,
        description=(
            "The design's technology node and the factors that scale the spec's energies and logic areas "
            "to it, with leakage; None: energies and areas as given, no leakage."
        ),
    )
    area: AreaSpec | None = Field(None, description="Area per component (mambalaya.cost.area); None: no area model.")
    power_budget_w: Annotated[float, Field(gt=0), POWER_BUDGET_RANGE.validator()] | None = Field(
        None,
        description=(
            "The design's power budget in watts (the reference part's TDP): a result whose average "
            "power (energy over latency) exceeds it is flagged. None: no budget stated. It must exceed the "
            "design's leakage power (checked where energy is computed, mambalaya.cost.energy), which no "
            "speed avoids. " + POWER_BUDGET_RANGE.note
        ),
    )
    kernels: KernelSpec | None = Field(
        None,
        description=(
            "For a GPU: the launch floor of a kernel and the fractions of peak compute and bandwidth "
            "kernels reach (mambalaya.arch.kernels); None: an ideal accelerator at its peak rates."
        ),
    )
    system: SystemSpec | None = Field(
        None,
        description=(
            "How several devices of this design are joined (mambalaya.arch.system): link bandwidth, latency "
            "and energy, and the default device count; None: the design runs on one device only."
        ),
    )
    cores: CoresSpec | None = Field(
        None,
        description=(
            "A multi-core design (mambalaya.arch.system.CoresSpec): its cores, each with the compute and on-chip "
            "memory sections above, joined by a network on chip, sharing the off-chip memory; None: one core."
        ),
    )
    sources: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Where each value comes from (a paper, a datasheet, an assumption and why), keyed by field "
            "path ('clock_hz', 'compute.array_rows', 'compute.unary_cost_cycles.exp') or by a section "
            "('compute') covering its fields. Printed in reports."
        ),
    )

    @field_validator("clock_hz", mode="before")
    @classmethod
    def _clock(cls, value: Any) -> Any:
        return parse_float_quantity(value, HZ_UNITS, "a frequency")

    @model_validator(mode="after")
    def _sources_name_fields(self) -> ArchSpec:
        known = set(field_paths())
        for name in self.memory.levels:  # a level's fields, by its name
            known |= {f"memory.levels.{name}"} | {f"memory.levels.{name}.{f}" for f in StagingLevel.model_fields}
        for key in self.sources:
            if key not in known:
                where = f"sources.{key}" if re.fullmatch(r"[\w.\-]+", key) else f"sources[{key!r}]"
                raise FieldProblem(where, "names no field of the spec (keys are field paths such as compute.array_rows)")
        return self

    @model_validator(mode="after")
    def _cores_or_system(self) -> ArchSpec:
        if self.cores is not None and self.system is not None:
            raise FieldProblem("cores", "a multi-core design joins its cores by the network on chip; a system section "
                                        "(several such chips) with it is not modelled")
        return self

    @model_validator(mode="after")
    def _pe_level_fits(self) -> ArchSpec:
        mem = self.memory
        if mem.pe_local_bytes is not None and mem.pe_local_bytes >= mem.onchip_buffer_bytes:
            raise FieldProblem(
                "memory.pe_local_bytes",
                f"({mem.pe_local_bytes} bytes per PE) is not smaller than the on-chip buffer that feeds it "
                f"(memory.onchip_buffer_bytes, {mem.onchip_buffer_bytes}): a level must be larger than the one inside it",
            )
        if mem.pe_local_bytes is None and self.energy is not None:  # (null was accepted: no register area
            raise FieldProblem(                                         # or leakage, their energy still charged)
                "memory.pe_local_bytes",
                "is not given, but the energy section charges every operation's two operands and result to the PE "
                "registers (energy.register_pj_per_bit): give their size, which their area and leakage need",
            )
        need = 3 * self.bits_per_element / 8
        if mem.pe_local_bytes is not None and mem.pe_local_bytes < need:  # (1 byte was once accepted: a smaller area)
            raise FieldProblem(
                "memory.pe_local_bytes",
                f"({mem.pe_local_bytes}) cannot hold one operation's two operands and result at {self.bits_per_element} "
                f"bits ({need:g} bytes); the PE registers hold at least those",
            )
        if mem.pe_local_bytes_per_cycle is not None and mem.pe_local_bytes_per_cycle < need:
            raise FieldProblem(
                "memory.pe_local_bytes_per_cycle",
                f"({mem.pe_local_bytes_per_cycle:g}) is below one operation's two operands and result at "
                f"{self.bits_per_element} bits ({need:g} bytes per cycle); the model runs one operation per PE per cycle",
            )
        return self

    # derived ------------------------------------------------------------------------------
    @property
    def bytes_per_element(self) -> float:
        """Bytes per element (bits_per_element / 8)."""
        return self.bits_per_element / 8

    @property
    def peak_macs_per_s(self) -> float:
        """Multiply-accumulates per second of the 2D array."""
        return self.compute.macs_per_cycle * self.clock_hz

    @property
    def peak_elementwise_ops_per_s(self) -> float:
        """Elementwise operations per second: 1D-mode lanes plus vector lanes, times the clock."""
        return self.compute.elementwise_ops_per_cycle * self.clock_hz

    @property
    def peak_bandwidth(self) -> float:
        """Off-chip bandwidth in bytes per second."""
        return self.memory.offchip_bandwidth_bytes_per_s

    @property
    def ridge_point_ops_per_byte(self) -> float:
        """Roofline ridge point: 2 * peak MAC/s (ops, a MAC being two) per byte/s of bandwidth."""
        return 2 * self.peak_macs_per_s / self.peak_bandwidth

    def unary_ops_per_s(self, fn: str) -> float:
        """Results per second of unary function ``fn`` on this architecture.

        A function whose MFU cost is 0 runs as one elementwise operation; otherwise it runs on the
        MFUs (``mfu_units / cycles`` per cycle) or, without MFUs, on the elementwise units at
        ``unary_cost_pe_ops[fn]`` operations per result.
        """
        c = self.compute
        if fn not in UNARY_FUNCTIONS:
            raise SpecError(f"unknown unary function {fn!r} (known: {', '.join(UNARY_FUNCTIONS)})")
        cycles = c.unary_cost_cycles[fn]
        if cycles == 0:
            return self.peak_elementwise_ops_per_s
        if c.mfu_units > 0:
            return c.mfu_units / cycles * self.clock_hz
        return self.peak_elementwise_ops_per_s / c.unary_cost_pe_ops[fn]


_SECTIONS: dict[str, type[BaseModel]] = {"compute": ComputeSpec, "memory": MemorySpec, "mappings": MappingPolicy,
                                         "energy": EnergySpec, "kernels": KernelSpec, "technology": TechnologySpec,
                                         "area": AreaSpec, "system": SystemSpec, "cores": CoresSpec}


def field_paths() -> list[str]:
    """Every field path a ``sources`` key may name: sections, their fields and the unary entries."""
    paths: list[str] = []
    for name in ArchSpec.model_fields:
        if name == "sources":
            continue
        paths.append(name)
        if name in _SECTIONS:
            for sub in _SECTIONS[name].model_fields:
                paths.append(f"{name}.{sub}")
    for table in ("unary_cost_cycles", "unary_cost_pe_ops"):
        paths.extend(f"compute.{table}.{fn}" for fn in UNARY_FUNCTIONS)
    return paths
