"""Printing counts: every digit shown is a digit the number has.

Byte, bit and cycle counts are float64 in the cost model (exact integers up to 2^53). Below
that they print in full with thousands separators; above it, a float no longer holds every
digit, so they print with the 15 significant digits it does hold (``1.25000084217940e+25``)
instead of a long integer whose last digits are rounding noise.
"""

from __future__ import annotations

import math

#: The largest integer below which every float64 integer is exact.
EXACT_FLOAT_LIMIT = 2.0**53


def whole(value: float | int) -> str:
    """A count: ``12,345,678`` while exact, else 15 significant digits."""
    if isinstance(value, int) or abs(value) < EXACT_FLOAT_LIMIT:
        return f"{value:,.0f}" if not isinstance(value, int) else f"{value:,}"
    return f"{value:.15g}"


def milliseconds(seconds: float) -> str:
    """A latency in ms: four decimals from 0.1 ms up to a million ms, 7 significant digits above,
    and 3 significant digits below 0.1 ms, so a short latency is never rounded away to 0."""
    ms = seconds * 1e3
    if abs(ms) >= 1e6:
        return f"{ms:.7g}"
    return f"{ms:.4f}" if abs(ms) >= 0.1 or ms == 0 else f"{ms:.3g}"


def rate(value: float) -> str:
    """A rate (tokens/s, ...): a whole number with thousands separators from 1,000 up, else 3
    significant digits (``0.000412``), so a slow rate is never rounded away to 0."""
    if not math.isfinite(value):
        return str(value)
    decimals = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    return f"{value:,.{decimals}f}"
