"""Tornado charts of a sensitivity study: how far each assumption moves one ratio."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mambalaya.errors import MambalayaError

LOW_COLOUR = "#4e79a7"
HIGH_COLOUR = "#f28e2b"
PUBLISHED_COLOUR = "#d62728"
COLUMNS = ("assumption", "end", "value", "ratio", "ours", "base")


def _value_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _labels_by_side(ends: list, base: float) -> dict[int, list[str]]:
    """Each end's value label on the side of the base its bar extends to (+1 right, -1 left);
    an end at the base goes opposite the other end; ends on one side share one label."""
    sides: dict[int, list[str]] = {}
    for n, (end, _) in enumerate(ends):
        v = float(end.ours)
        if v != base:
            side = 1 if v > base else -1
        else:
            others = [float(e.ours) for m, (e, _) in enumerate(ends) if m != n and float(e.ours) != base]
            side = -1 if others and others[0] > base else 1
        sides.setdefault(side, []).append(_value_text(end.value))
    return sides


def tornado_figure(rows: pd.DataFrame, ratio: str, *, published: float | None = None, title: str = "") -> Figure:
    """One horizontal bar per assumption from the ratio at its low value to the ratio at its
    high value, around the base ratio (vertical line), widest swing on top; the published value
    as a dashed line. ``rows``: the ``sensitivity.csv`` rows (assumption, end, value, ratio, ours,
    base)."""
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise MambalayaError(f"tornado figure: the rows lack column(s) {', '.join(missing)}")
    df = rows[rows.ratio == ratio]
    if df.empty:
        raise MambalayaError(f"tornado figure: no rows for ratio {ratio!r}")
    base = float(df.base.iloc[0])
    bars = []
    for name, g in df.groupby("assumption", sort=False):
        ends = {r.end: r for r in g.itertuples()}
        lo, hi = ends.get("low"), ends.get("high")
        vals = [float(x.ours) for x in (lo, hi) if x is not None and math.isfinite(float(x.ours))]
        if not vals:
            continue
        bars.append((max(vals + [base]) - min(vals + [base]), name, lo, hi))
    bars.sort(key=lambda b: b[0])
    height = 1.2 + 0.28 * len(bars)
    fig = Figure(figsize=(5.2, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, (_, name, lo, hi) in enumerate(bars):
        ends = [(e, c) for e, c in ((lo, LOW_COLOUR), (hi, HIGH_COLOUR)) if e is not None and math.isfinite(float(e.ours))]
        for end, colour in ends:
            ax.barh(y, float(end.ours) - base, left=base, color=colour, height=0.6)
        for side, labels in _labels_by_side(ends, base).items():
            x = max(float(e.ours) for e, _ in ends) if side > 0 else min(float(e.ours) for e, _ in ends)
            ax.annotate(" / ".join(labels), (x if side * (x - base) > 0 else base, y), xytext=(3 * side, 0),
                        textcoords="offset points", ha="left" if side > 0 else "right", va="center", fontsize=6)
    ax.set_yticks(range(len(bars)), [b[1] for b in bars], fontsize=7)
    ax.axvline(base, color="black", linewidth=0.8)
    handles = [Patch(color=LOW_COLOUR, label="low value"), Patch(color=HIGH_COLOUR, label="high value"),
               Line2D([], [], color="black", linewidth=0.8, label=f"base {base:.2f}×")]
    if published is not None:
        ax.axvline(published, color=PUBLISHED_COLOUR, linestyle="--", linewidth=0.9)
        handles.append(Line2D([], [], color=PUBLISHED_COLOUR, linestyle="--", label=f"published {published:g}×"))
    ax.set_xlabel("ratio (×)", fontsize=7)
    ax.tick_params(labelsize=6.5)
    ax.margins(x=0.18)
    fig.legend(handles=handles, fontsize=6, loc="outside lower center", ncol=len(handles), frameon=False)
    if title:
        fig.suptitle(title, fontsize=8, fontweight="bold")
    return fig


__all__ = ["tornado_figure"]
