"""Quantities with units in arch specs: byte sizes ("50MiB", "24 MB"), bandwidths ("2039 GB/s")
and clocks ("1.75 GHz"), read exactly (decimal prefixes are powers of 1000, binary ones of
1024; a plain number is in the base unit)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

#: Upper bound of every integer field, so that derived floats stay exact and finite.
MAX_INT = 2**53




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


