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
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mambalaya.einsum.ir import UNARY_FUNCTIONS as IR_UNARY_FUNCTIONS
from mambalaya.errors import SpecError
from mambalaya.arch.kernels import KernelSpec
from mambalaya.specio import FieldProblem

#: Unary functions the cost model knows: those of the Einsum IR, as counted by
#: :mod:`mambalaya.einsum.stats`.
UNARY_FUNCTIONS: tuple[str, ...] = IR_UNARY_FUNCTIONS

#: Documented default MFU costs (cycles of one MFU per result). Functions at 0 run as one
#: elementwise operation on the 1D mode / vector unit instead of an MFU. The non-zero values
#: are assumptions (a pipelined MFU evaluating exp/log/sqrt/rsqrt in one pass, sigmoid/tanh/
#: SiLU in two, softplus = log1p(exp(.)) plus a max in four); shipped specs spell them out.
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
    "relu": 0.0,
}

MAPPING_NAMES: tuple[str, ...] = ("unfused", "ssm-ri", "stitched", "optimal", "ideal")
FUSION_CLASSES: tuple[str, ...] = ("RI", "RSb", "RSp", "RD")

#: Upper bound of every integer field, so that derived floats stay exact and finite.
MAX_INT = 2**53

MappingName = Literal["unfused", "ssm-ri", "stitched", "optimal", "ideal"]
FusionClass = Literal["RI", "RSb", "RSp", "RD"]


# ---------------------------------------------------------------------------------------------
# quantities with units


_BYTE_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "kB": 10**3,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_BANDWIDTH_UNITS: dict[str, int] = {f"{u}/s": m for u, m in _BYTE_UNITS.items() if u}
_BANDWIDTH_UNITS[""] = 1
_HZ_UNITS: dict[str, int] = {"": 1, "Hz": 1, "kHz": 10**3, "KHz": 10**3, "MHz": 10**6, "GHz": 10**9}

_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z/]*)\s*$")


def _parse_quantity(value: str, units: dict[str, int], what: str) -> Decimal:
    m = _QUANTITY.match(value)
    if not m:
        raise ValueError(f"cannot read {value!r} as {what} (a number optionally followed by one of: {_unit_list(units)})")
    number, unit = m.groups()
    if unit not in units:
        raise ValueError(f"unknown unit {unit!r} in {value!r} (use one of: {_unit_list(units)})")
    try:
        amount = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the regex admits only decimal numbers
        raise ValueError(f"cannot read {value!r} as {what}") from None
    if amount and amount.adjusted() > 30:
        raise ValueError(f"is too large (got {value if len(value) <= 40 else value[:37] + '...'!r})")
    return amount * units[unit]


def _unit_list(units: dict[str, int]) -> str:
    return ", ".join(u for u in units if u)


def _parse_float_quantity(value: Any, units: dict[str, int], what: str) -> Any:
    if isinstance(value, str):
        return float(_parse_quantity(value, units, what))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        raise ValueError(f"is too large (got an integer of {len(str(abs(value)))} digits)")
    return value


def _parse_byte_count(value: Any) -> Any:
    if isinstance(value, str):
        amount = _parse_quantity(value, _BYTE_UNITS, "a byte size")
    elif isinstance(value, float) and value == value and abs(value) != float("inf"):
        amount = Decimal(value)
    else:
        return value  # ints pass; bools, None, nan and other types fail the strict int check
    if amount != amount.to_integral_value():
        raise ValueError(f"must be a whole number of bytes (got {value!r})")
    return int(amount)


# ---------------------------------------------------------------------------------------------
# models


_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_INT)]


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
    one_d_ops_per_lane_per_cycle: float = Field(
        1.0, gt=0, description="Elementwise operations one lane completes per cycle in 1D mode (ops/lane/cycle)."
    )
    vector_lanes: NonNegativeInt = Field(
        0,
        description=(
            "Elementwise operations per cycle of a separate vector unit (e.g. a GPU's CUDA cores). It "
            "runs elementwise work when one_d_mode is false and adds to the 1D mode's throughput when "
            "both exist (peak elementwise rate = 1D lanes * ops/lane + vector lanes). 0: no vector unit."
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
    unary_cost_cycles: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_UNARY_COST_CYCLES),
        description=(
            "Cycles of one MFU per result, for each unary function (exp, log, sqrt, rsqrt, silu, "
            "softplus, sigmoid, tanh, neg, square, abs, relu). 0 means the function is a plain "
            "elementwise operation (one op on the 1D mode / vector unit, not an MFU). Entries given "
            "override the documented defaults (exp/log/sqrt/rsqrt 1, silu/sigmoid/tanh 2, softplus 4, "
            "neg/square/abs/relu 0)."
        ),
    )
    unary_cost_pe_ops: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description=(
            "Cost of one result in elementwise PE operations when no MFU is available (e.g. exp 8: a "
            "polynomial or bit-trick approximation). Used only when mfu_units is 0, and then required "
            "for every function whose unary_cost_cycles entry is non-zero."
        ),
    )
    dataflows: tuple[Literal["weight-stationary", "output-stationary", "input-stationary", "roofline"], ...] = Field(
        ("weight-stationary",),
        description=(
            "The dataflows the 2D array supports (mambalaya.model.spatial), each naming the operand "
            "held in the PEs during a fold (weight-, output- or input-stationary); the model runs "
            "each contraction in the fastest of them, the first listed being the array's native one. "
            "Or ['roofline']: an ideal macs / (rows * cols) with no spatial quantisation (a GPU's "
            "tensor cores), which cannot be combined with another. A single name is a one-entry list. "
            "Default weight-stationary, the dataflow of TPU v1 (Jouppi et al., ISCA 2017)."
        ),
    )
    dataflow_switch_cycles: float = Field(
        0.0,
        ge=0,
        description=(
            "Cycles to reconfigure the array to a dataflow other than its first and back, charged "
            "per step of every Einsum that runs in one (0 for an array with one dataflow)."
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
    pipeline_wind_up_cycles: float = Field(
        0.0,
        ge=0,
        description="Fixed cycles added per fused-group step to fill and drain the pipeline between its Einsums.",
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
        for name in value:
            if name not in UNARY_FUNCTIONS:
                raise FieldProblem(name, f"unknown unary function (known: {', '.join(UNARY_FUNCTIONS)})")
        return value

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
        """Elementwise operations per cycle: the 1D mode plus the vector unit."""
        return self.one_d_ops_per_cycle + float(self.vector_lanes)


class MemorySpec(BaseModel):
    """The on-chip buffer and the off-chip (DRAM/HBM) interface."""

    model_config = _CONFIG

    onchip_buffer_bytes: PositiveInt = Field(
        description=(
            "Capacity of the on-chip buffer holding the tiles of a fused group (bytes). YAML may say "
            "'50MiB', '24 MB', ...; a mapping is legal only if its live tiles fit."
        )
    )
    offchip_bandwidth_bytes_per_s: float = Field(
        gt=0,
        description="Off-chip (DRAM/HBM) bandwidth in bytes per second. YAML may say '2039 GB/s', '3.35TB/s', ...",
    )
    onchip_bandwidth_bytes_per_cycle: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description=(
            "Bytes per cycle the on-chip buffer delivers (reads and writes together, "
            "mambalaya.model.onchip): a group takes at least its buffer accesses over this "
            "bandwidth. None: unbounded (the buffer never limits)."
        ),
    )
    overlap_compute_and_memory: bool = Field(
        True,
        description=(
            "Double buffering: a group's latency is max(compute, memory) when true, compute + memory "
            "when false."
        ),
    )

    @field_validator("onchip_buffer_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return _parse_byte_count(value)

    @field_validator("offchip_bandwidth_bytes_per_s", mode="before")
    @classmethod
    def _bandwidth(cls, value: Any) -> Any:
        return _parse_float_quantity(value, _BANDWIDTH_UNITS, "a bandwidth")


class MappingPolicy(BaseModel):
    """Which mapping the design runs and which fusion edge classes it can fuse."""

    model_config = _CONFIG

    default: MappingName = Field(
        description=(
            "The mapping this design runs: unfused (every Einsum alone: the algorithmic minimum of "
            "traffic), ssm-ri (RI fusion of the SSM region only), stitched (greedy stitching), optimal "
            "(least-traffic search) or ideal (one group, unbounded buffer: a lower bound)."
        )
    )
    fusion_classes: list[FusionClass] = Field(
        description=(
            "Edge classes the design can fuse (RI, RSb, RSp, RD). Checked against default: unfused "
            "fuses none ([]), ssm-ri exactly [RI], stitched and optimal must include RI, ideal fuses "
            "every class."
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
        if self.default in ("stitched", "optimal") and "RI" not in classes:
            raise FieldProblem("fusion_classes", f"must include RI for the {self.default} mapping (got {shown})")
        if self.default == "ideal" and set(classes) != set(FUSION_CLASSES):
            raise FieldProblem(
                "fusion_classes", f"must list every class ({', '.join(FUSION_CLASSES)}) for the ideal mapping (got {shown})"
            )
        return self


PicoJoules = Annotated[float, Field(ge=0)]


class EnergySpec(BaseModel):
    """Energy per action (mambalaya.model.energy), each value with its source in ``sources``.

    Arithmetic energies are per operation at a width in bits (the widest of the Einsum's
    operands and result); an Einsum at a width the tables lack is an error naming the table.
    The buffer's energies are per bit at ``buffer_reference_bytes`` and scale with the buffer's
    size as ``(size / reference) ** buffer_size_exponent``."""

    model_config = _CONFIG

    dram_pj_per_bit: PicoJoules = Field(description="Energy of moving one bit to or from off-chip memory (pJ/bit).")
    buffer_read_pj_per_bit: PicoJoules = Field(description="On-chip buffer read energy per bit at buffer_reference_bytes (pJ/bit).")
    buffer_write_pj_per_bit: PicoJoules = Field(description="On-chip buffer write energy per bit at buffer_reference_bytes (pJ/bit).")
    buffer_reference_bytes: Annotated[int, Field(gt=0, le=MAX_INT)] = Field(
        description="The buffer size the buffer energies are given at (bytes; YAML may say '1MiB')."
    )
    buffer_size_exponent: Annotated[float, Field(ge=0, le=2)] = Field(
        0.5, description="Exponent of the buffer energy's growth with size (0.5: energy per bit grows as the square root of the size)."
    )
    register_pj_per_bit: PicoJoules = Field(
        description="PE-local register access per bit; each MAC or elementwise operation reads two operands and writes one result at its width (pJ/bit)."
    )
    mac_pj: dict[int, PicoJoules] = Field(description="Energy of one multiply-accumulate by width in bits (pJ).")
    elementwise_pj: dict[int, PicoJoules] = Field(description="Energy of one add, multiply, divide or max by width in bits (pJ).")
    mfu_pj: dict[str, PicoJoules] = Field(
        default_factory=dict,
        description="Energy of one result of each nonlinear function on an MFU (pJ); needed for every function the cascade evaluates on an MFU.",
    )

    @field_validator("buffer_reference_bytes", mode="before")
    @classmethod
    def _reference_bytes(cls, value: Any) -> Any:
        return _parse_byte_count(value)

    @field_validator("mac_pj", "elementwise_pj", mode="before")
    @classmethod
    def _width_keys(cls, value: Any) -> Any:
        """Widths written as text (a JSON round trip turns 16 into "16") are read as integers."""
        if isinstance(value, dict):
            return {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v for k, v in value.items()}
        return value

    @field_validator("mfu_pj")
    @classmethod
    def _known_functions(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name not in UNARY_FUNCTIONS:
                raise FieldProblem(name, f"unknown unary function (known: {', '.join(UNARY_FUNCTIONS)})")
        return value

    def buffer_pj_per_bit(self, size_bytes: float, write: bool) -> float:
        """Buffer energy per bit for a buffer of ``size_bytes``."""
        base = self.buffer_write_pj_per_bit if write else self.buffer_read_pj_per_bit
        return base * (size_bytes / self.buffer_reference_bytes) ** self.buffer_size_exponent


class ArchSpec(BaseModel):
    """One accelerator (or GPU roofline) for the latency model."""

    model_config = _CONFIG

    name: str = Field(min_length=1, description="Short name of the architecture, printed in reports.")
    description: str = Field("", description="One or two sentences on what this spec models.")
    clock_hz: float = Field(gt=0, description="Clock frequency in Hz. YAML may say '1.75 GHz', '1000 MHz', ...")
    compute: ComputeSpec = Field(description="The compute units.")
    memory: MemorySpec = Field(description="The on-chip buffer and off-chip bandwidth.")
    bits_per_element: PositiveInt = Field(
        16, description="Datatype width of activations and weights (bits per element)."
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
    power_budget_w: float | None = Field(
        None,
        gt=0,
        description=(
            "The design's power budget in watts (the reference part's TDP): a result whose average "
            "power (energy over latency) exceeds it is flagged. None: no budget stated."
        ),
    )
    kernels: KernelSpec | None = Field(
        None,
        description=(
            "For a GPU: the launch floor of a kernel and the fractions of peak compute and bandwidth "
            "kernels reach (mambalaya.arch.kernels); None: an ideal accelerator at its peak rates."
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
        return _parse_float_quantity(value, _HZ_UNITS, "a frequency")

    @model_validator(mode="after")
    def _sources_name_fields(self) -> ArchSpec:
        known = set(field_paths())
        for key in self.sources:
            if key not in known:
                where = f"sources.{key}" if re.fullmatch(r"[\w.\-]+", key) else f"sources[{key!r}]"
                raise FieldProblem(where, "names no field of the spec (keys are field paths such as compute.array_rows)")
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
                                         "energy": EnergySpec, "kernels": KernelSpec}


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


_SPEC_KEYS: dict[int, tuple[BaseModel, str]] = {}
_SPEC_KEYS_KEPT = 4096


def spec_key(spec: BaseModel) -> str:
    """A value key of a (frozen) spec section, for memos shared by equal specs: two designs, or
    two sweep points, with equal ``compute`` sections share every compute-only result. Computed
    once per object (held, so its ``id`` is not reused while it is kept; at most 4096 kept)."""
    hit = _SPEC_KEYS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_SPEC_KEYS) >= _SPEC_KEYS_KEPT:
            _SPEC_KEYS.clear()
        hit = (spec, f"{type(spec).__name__}:{spec.model_dump_json()}")
        _SPEC_KEYS[id(spec)] = hit
    return hit[1]
