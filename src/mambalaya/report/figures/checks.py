"""Is a figure's table drawable? Each check returns the column as the figure needs it or raises a
:class:`~mambalaya.errors.MambalayaError` naming the figure, the column and the offending rows."""

from __future__ import annotations

import math
import re
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mambalaya.errors import MambalayaError


def checked_table(df: object, columns: Sequence[str], what: str) -> pd.DataFrame:
    """``df`` with a fresh index, after checking it is a non-empty DataFrame with ``columns``."""
    if not isinstance(df, pd.DataFrame):
        raise MambalayaError(f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MambalayaError(
            f"{what}: the table has no column {', '.join(map(repr, missing))}; it needs the columns "
            f"{', '.join(columns)} (it has {', '.join(map(str, df.columns)) or 'none'})"
        )
    if df.empty:
        raise MambalayaError(f"{what}: the table is empty; there is nothing to plot")
    return df.reset_index(drop=True)


def rows_text(df: pd.DataFrame, bad: np.ndarray, keys: Sequence[str], col: str) -> str:
    idx = np.flatnonzero(bad)
    shown = []
    def plain(v: object) -> object:
        return v.item() if isinstance(v, np.generic) else v

    for i in idx[:3]:
        ident = ", ".join(f"{k}={plain(df.at[i, k])!r}" for k in keys if k in df.columns)
        shown.append(f"row {i} ({ident}{', ' if ident else ''}{col}={plain(df.at[i, col])!r})")
    more = f" and {len(idx) - 3} more" if len(idx) > 3 else ""
    return "; ".join(shown) + more


def numbers(
    df: pd.DataFrame,
    col: str,
    what: str,
    keys: Sequence[str],
    *,
    positive: bool = False,
    nonnegative: bool = False,
    hint: str = "",
) -> np.ndarray:
    """Column ``col`` as floats, all finite (and positive / non-negative if asked)."""
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values)
    need = "finite numbers"
    if positive:
        bad |= ~(values > 0)
        need = "finite positive numbers"
    elif nonnegative:
        bad |= ~(values >= 0)
        need = "finite non-negative numbers"
    if bad.any():
        raise MambalayaError(
            f"{what}: column {col!r} must hold {need}{hint}; bad value in {rows_text(df, bad, keys, col)}"
        )
    return values


def labels(df: pd.DataFrame, col: str, what: str) -> list[str]:
    """Column ``col`` as strings; missing values are an error."""
    missing = df[col].isna().to_numpy()
    if missing.any():
        raise MambalayaError(f"{what}: column {col!r} has missing values in row(s) {list(np.flatnonzero(missing)[:5])}")
    return [str(v) for v in df[col]]


def positive_scalar(value: object, name: str, what: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MambalayaError(f"{what}: {name} must be a positive number, got {value!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise MambalayaError(f"{what}: {name} must be a positive number, got {value!r}")
    return x


def ordered(values: Iterable[str], preferred: Sequence[str] = ()) -> list[str]:
    """Distinct values: those in ``preferred`` first (in that order), then the rest as they come."""
    seen = list(dict.fromkeys(values))
    first = [p for p in preferred if p in seen]
    return first + [v for v in seen if v not in first]


def published_items(published: Mapping[str, float] | None, what: str) -> list[tuple[str, str, float, str]]:
    """(left, right, value, key) of each ``"<left> vs <right>"`` key of ``published``."""
    if not published:
        return []
    out = []
    for key, value in published.items():
        parts = re.split(r"\s+vs\.?\s+", str(key).strip(), maxsplit=1)
        if len(parts) != 2 or not all(parts):
            raise MambalayaError(
                f"{what}: published key {key!r} is not of the form '<phase or model> vs <baseline>', "
                "e.g. 'prefill vs marca-ideal'"
            )
        out.append((parts[0], parts[1], positive_scalar(value, f"published[{key!r}]", what), str(key)))
    return out


def match_rows(name: str, choices: Sequence[str], key: str, what: str, noun: str) -> str:
    for c in choices:
        if c.casefold() == name.casefold():
            return c
    raise MambalayaError(
        f"{what}: published key {key!r} names {noun} {name!r}, which is not in the table "
        f"(it has {', '.join(map(repr, choices))})"
    )
