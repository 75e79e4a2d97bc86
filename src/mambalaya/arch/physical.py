"""The physical sections of an arch spec: energy per action (``energy``), the technology node
and leakage (``technology``) and the area of each component (``area``).

Energies and areas are given at a reference node (Horowitz's 45 nm table for the shipped
designs) and scaled to the design's node by the factors in ``technology``, each with its source
in the spec's ``sources`` (:mod:`mambalaya.cost.area` and :mod:`mambalaya.cost.energy` apply
them). DRAM energy is not scaled: it is spent mostly inside the DRAM dies.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mambalaya.arch.quantities import AREA_UM2_RANGE, MAX_INT, PICOJOULES_RANGE, parse_byte_count
from mambalaya.einsum.ir import UNARY_FUNCTIONS
from mambalaya.specio import FieldProblem

_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def known_unary_names(table: dict[str, float]) -> dict[str, float]:
    """A table keyed by unary function, refused with the first name the IR does not know."""
    for name in table:
        if name not in UNARY_FUNCTIONS:
            raise FieldProblem(name, f"unknown unary function (known: {', '.join(UNARY_FUNCTIONS)})")
    return table


def _width_keys(value: Any) -> Any:
    """Widths written as text (a JSON round trip turns 16 into "16") are read as integers; a
    width given twice that way (``16`` and ``"16"``) is refused, not the later one kept."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, entry in value.items():
        width = int(key) if isinstance(key, str) and key.strip().isascii() and key.strip().isdigit() else key
        if width in out:
            raise FieldProblem(str(key), f"width {width} is given twice ({key!r} and {width!r}); give it once")
        if isinstance(width, int) and not isinstance(width, bool) and width < 1:
            raise FieldProblem(str(key), f"width {width} is no width: a table's keys are widths in bits, 1 or more")
        out[width] = entry
    return out


#: An energy per action in picojoules, in its documented range (``PICOJOULES_RANGE``).
PicoJoules = Annotated[float, Field(ge=0), PICOJOULES_RANGE.validator()]
#: An area per unit or per bit in square micrometres (``AREA_UM2_RANGE``), zero refused.
SquareMicrons = Annotated[float, Field(gt=0), AREA_UM2_RANGE.validator()]


class EnergySpec(BaseModel):
    """Energy per action (mambalaya.cost.energy), each value with its source in ``sources``.

    Arithmetic energies are per operation at a width in bits (the widest of the Einsum's
    operands and result); an Einsum at a width the tables lack is an error naming the table.
    The buffer's energies are per bit at ``buffer_reference_bytes`` and scale with the buffer's
    size as ``(size / reference) ** buffer_size_exponent``. Every energy is in PICOJOULES_RANGE:
    0 to 1e6 pJ (1 uJ) per action, so actions times energies stay finite."""

    model_config = _CONFIG

    dram_pj_per_bit: PicoJoules = Field(
        description="Energy of moving one bit to or from off-chip memory (pJ/bit). " + PICOJOULES_RANGE.note)
    buffer_read_pj_per_bit: PicoJoules = Field(
        description="On-chip buffer read energy per bit at buffer_reference_bytes (pJ/bit). " + PICOJOULES_RANGE.note)
    buffer_write_pj_per_bit: PicoJoules = Field(
        description="On-chip buffer write energy per bit at buffer_reference_bytes (pJ/bit). " + PICOJOULES_RANGE.note)
    buffer_reference_bytes: Annotated[int, Field(gt=0, le=MAX_INT)] = Field(
        description="The buffer size the buffer energies are given at (bytes; YAML may say '1MiB')."
    )
    buffer_size_exponent: Annotated[float, Field(ge=0, le=2)] = Field(
        0.5, description="Exponent of the buffer energy's growth with size (0.5: energy per bit grows as the square root of the size)."
    )
    register_pj_per_bit: PicoJoules = Field(
        description="PE-local register access per bit; each MAC or elementwise operation reads two operands and writes one "
                    "result at its width (pJ/bit). " + PICOJOULES_RANGE.note
    )
    mac_pj: dict[int, PicoJoules] = Field(
        description="Energy of one multiply-accumulate by width in bits (pJ). " + PICOJOULES_RANGE.note)
    elementwise_pj: dict[int, PicoJoules] = Field(
        description="Energy of one add, multiply, divide or max by width in bits (pJ). " + PICOJOULES_RANGE.note)
    mfu_pj: dict[str, PicoJoules] = Field(
        default_factory=dict,
        description="Energy of one result of each nonlinear function on an MFU (pJ); needed for every function the cascade "
                    "evaluates on an MFU. " + PICOJOULES_RANGE.note,
    )

    @field_validator("buffer_reference_bytes", mode="before")
    @classmethod
    def _reference_bytes(cls, value: Any) -> Any:
        return parse_byte_count(value)

    @field_validator("mac_pj", "elementwise_pj", mode="before")
    @classmethod
    def _widths(cls, value: Any) -> Any:
        return _width_keys(value)

    @field_validator("mfu_pj")
    @classmethod
    def _known_functions(cls, value: dict[str, float]) -> dict[str, float]:
        return known_unary_names(value)

    def buffer_pj_per_bit(self, size_bytes: float, write: bool) -> float:
        """Buffer energy per bit for a buffer of ``size_bytes``."""
        base = self.buffer_write_pj_per_bit if write else self.buffer_read_pj_per_bit
        return base * (size_bytes / self.buffer_reference_bytes) ** self.buffer_size_exponent




class TechnologySpec(BaseModel):
    """The design's technology node and what it does to energy, area and leakage."""

    model_config = _CONFIG

    node_nm: float = Field(gt=0, le=1000, description="The design's technology node in nm (a process's marketing name: 4 for TSMC 4N).")
    reference_node_nm: float = Field(
        gt=0, le=1000, description="The node the spec's energies (energy.*) and logic areas (area.*) are given at, in nm."
    )
    energy_scale: float = Field(
        gt=0, le=100,
        description=(
            "Factor from the reference node's dynamic energy per action to the design node's: applied to every "
            "on-chip action (arithmetic, MFUs, registers, buffer), not to DRAM."
        ),
    )
    area_scale: float = Field(
        gt=0, le=100, description="Factor from the reference node's logic area to the design node's (PEs, MFUs, lanes, registers)."
    )
    logic_leakage_w_per_mm2: float = Field(
        ge=0, le=100, description="Static power of logic at the design node, watts per mm^2 of logic area, drawn for the whole latency."
    )
    sram_leakage_w_per_mib: float = Field(
        ge=0, le=100, description="Static power of the on-chip buffer's SRAM at the design node, watts per MiB, drawn for the whole latency."
    )


class AreaSpec(BaseModel):
    """Area per component: logic at the reference node (scaled by ``technology.area_scale``),
    SRAM per bit at the design node (bitcells do not follow logic scaling)."""

    model_config = _CONFIG

    mac_um2: dict[int, SquareMicrons] = Field(
        description="Area of one PE's multiply-accumulate unit by width in bits, at the reference node (um^2). "
                    + AREA_UM2_RANGE.note
    )
    elementwise_um2: dict[int, SquareMicrons] = Field(
        default_factory=dict,
        description="Area of one vector lane (a multiplier and adder) by width in bits, at the reference node (um^2); "
                    "needed with vector lanes. " + AREA_UM2_RANGE.note,
    )
    mfu_um2: Annotated[float, AREA_UM2_RANGE.validator()] = Field(
        ge=0, description="Area of one multi-function unit at the reference node (um^2). " + AREA_UM2_RANGE.note)
    register_um2_per_bit: SquareMicrons = Field(
        description="Area of a PE's register file per bit at the reference node (um^2). " + AREA_UM2_RANGE.note)
    sram_um2_per_bit: SquareMicrons = Field(
        description="Area of the on-chip buffer per bit at the design node, periphery included (um^2). " + AREA_UM2_RANGE.note)
    overhead_fraction: float = Field(
        0.0, ge=0, le=10,
        description="Control, interconnect and everything else, as a fraction of the components' sum (0: the components alone).",
    )

    @field_validator("mac_um2", "elementwise_um2", mode="before")
    @classmethod
    def _widths(cls, value: Any) -> Any:
        return _width_keys(value)


__all__ = ["AreaSpec", "EnergySpec", "TechnologySpec"]
