"""Quantities with units in arch specs: byte sizes ("50MiB", "24 MB"), bandwidths ("2039 GB/s")
and clocks ("1.75 GHz"), read exactly (decimal prefixes are powers of 1000, binary ones of
1024; a plain number is in the base unit)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import AfterValidator

#: Upper bound of every integer field, so that derived floats stay exact and finite.
MAX_INT = 2**53


@dataclass(frozen=True)
class PhysicalRange:
    """The documented range of a numeric spec field, ``low`` to ``high`` (inclusive) in the
    field's unit, and why: a value outside it describes no hardware the model is meant for, and
    every range is chosen so that the figures derived from a spec (cycles over the clock, bytes
    over a bandwidth, actions times an energy, energy over a budget) stay finite.

    ``note`` is the sentence a field's description ends with; :meth:`validator` is the pydantic
    check that refuses a value outside the range, naming it (``must be from 1 kHz to 100 GHz
    ...; got 1e-300 Hz``). It runs after the field's own type and sign checks."""

    low: float
    high: float
    shown: str  # the range in words with units, "1 kHz to 100 GHz"
    why: str
    unit: str = ""

    @property
    def note(self) -> str:
        return f"Range {self.shown}: {self.why}."

    def check(self, value: Any) -> Any:
        """``value`` (None passes), or a ValueError naming the range."""
        if value is not None and not self.low <= value <= self.high:
            unit = f" {self.unit}" if self.unit else ""
            raise ValueError(f"must be from {self.shown} ({self.why}); got {value:g}{unit}")
        return value

    def validator(self) -> AfterValidator:
        return AfterValidator(self.check)


#: The widest element a design or a precision policy may give (bits): IEEE double precision.
MAX_ELEMENT_BITS = 64

CLOCK_RANGE = PhysicalRange(
    1e3, 1e11, "1 kHz to 100 GHz",
    "from the slowest clock of a digital design worth modelling to above what any transistor switches at; "
    "cycles become seconds at this rate", "Hz")
OFFCHIP_BANDWIDTH_RANGE = PhysicalRange(
    1e6, 1e15, "1 MB/s to 1 PB/s",
    "from a serial flash chip to about 300 times an H100's HBM3; off-chip bytes become seconds at this rate", "B/s")
BYTES_PER_CYCLE_RANGE = PhysicalRange(
    0.125, 1e12, "0.125 (one bit) to 1e12 bytes per cycle",
    "from a one-bit port to far beyond any SRAM's width; on-chip bytes become cycles at this rate", "B/cycle")
OPS_PER_LANE_RANGE = PhysicalRange(
    1e-3, 1e3, "0.001 to 1000 operations per lane per cycle",
    "from a lane needing a thousand cycles per operation to one doing a thousand per cycle")
UNARY_CYCLES_RANGE = PhysicalRange(
    0, 1e6, "0 to a million cycles per result",
    "0 runs the function as one elementwise operation; a million is far above any iterative approximation")
UNARY_PE_OPS_RANGE = PhysicalRange(
    1e-3, 1e6, "0.001 to a million elementwise operations per result",
    "far around the few to tens of operations a polynomial or bit-trick approximation takes")
OVERHEAD_CYCLES_RANGE = PhysicalRange(
    0, 1e9, "0 to a billion cycles",
    "a fixed per-step overhead; a billion cycles is a second at 1 GHz, far above any pipeline fill or reconfiguration")
PICOJOULES_RANGE = PhysicalRange(
    0, 1e6, "0 to 1e6 pJ (1 uJ) per action",
    "0 makes the action free; 1 uJ is five orders of magnitude above a DRAM access per bit, so actions times "
    "energies stay finite", "pJ")
AREA_UM2_RANGE = PhysicalRange(
    0, 1e6, "0 to 1e6 um^2 (1 mm^2) per unit or bit",
    "far above any MAC, lane, MFU or bitcell at any node, so counts times areas stay finite", "um^2")
POWER_BUDGET_RANGE = PhysicalRange(
    1e-6, 1e9, "1 uW to 1 GW",
    "from a sensor node to a whole data centre; a result's throttled latency is its energy over the budget "
    "less the design's leakage, which must stay below the budget", "W")
KERNEL_FLOOR_RANGE = PhysicalRange(
    0, 1.0, "0 to 1 s", "a kernel launch takes microseconds; a second is far above any dispatch overhead", "s")
KERNEL_FRACTION_RANGE = PhysicalRange(
    1e-3, 1.0, "0.001 to 1",
    "a fraction of peak; below a thousandth a kernel is not described by its peak rates at all")


BYTE_UNITS: dict[str, int] = {
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
BANDWIDTH_UNITS: dict[str, int] = {f"{u}/s": m for u, m in BYTE_UNITS.items() if u}
BANDWIDTH_UNITS[""] = 1
HZ_UNITS: dict[str, int] = {"": 1, "Hz": 1, "kHz": 10**3, "KHz": 10**3, "MHz": 10**6, "GHz": 10**9}

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


def parse_float_quantity(value: Any, units: dict[str, int], what: str) -> Any:
    if isinstance(value, str):
        return float(_parse_quantity(value, units, what))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        raise ValueError(f"is too large (got an integer of {len(str(abs(value)))} digits)")
    return value


def parse_byte_count(value: Any) -> Any:
    if isinstance(value, str):
        amount = _parse_quantity(value, BYTE_UNITS, "a byte size")
    elif isinstance(value, float) and value == value and abs(value) != float("inf"):
        amount = Decimal(value)
    else:
        return value  # ints pass; bools, None, nan and other types fail the strict int check
    if amount != amount.to_integral_value():
        raise ValueError(f"must be a whole number of bytes (got {value!r})")
    return int(amount)


