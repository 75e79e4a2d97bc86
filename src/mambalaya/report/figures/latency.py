"""Where does each design's layer latency go? Horizontal bars per design, split by Einsum."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.checks import labels, numbers, ordered, checked_table
from mambalaya.report.figures.style import (
    COLUMN_IN,
    NAME_PT,
    NOTE_PT,
    fmt_time,
    kind_handles,
    legend_below,
    new_figure,
    style_axes,
    time_unit,
    figure_title,
    kind_colour,
)
from mambalaya.report.style import text_width_in


def latency_breakdown_figure(df: pd.DataFrame, *, title: str) -> Figure:
    """Horizontal stacked bars of each design's latency split by Einsum, coloured by kind.

    ``df`` has columns ``design``, ``einsum``, ``kind`` and ``final_latency_s`` (seconds,
    non-negative; an Einsum fused into another may have 0). Designs are drawn top to bottom
    in order of appearance, Einsums left to right in order of appearance; a segment is named
    when the name fits.
    """
    what = "latency breakdown figure"
    data = checked_table(df, ("design", "einsum", "kind", "final_latency_s"), what)
    lat = numbers(data, "final_latency_s", what, ("design", "einsum"), nonnegative=True)
    design_col, names, kinds = (labels(data, c, what) for c in ("design", "einsum", "kind"))
    designs = ordered(design_col)
    totals = {d: sum(v for dd, v in zip(design_col, lat) if dd == d) for d in designs}
    longest = max(totals.values())
    if longest <= 0:
        raise MambalayaError(f"{what}: every latency is zero; there is nothing to plot")
    unit, scale = time_unit(longest)

    fig = new_figure(COLUMN_IN, 1.15 + 0.36 * len(designs))
    ax = fig.add_subplot()
    style_axes(ax)
    ax.grid(True, axis="x", color="#e6e6e6", linewidth=0.5, zorder=0)
    bar_h = 0.62
    segments = []
    for row, d in enumerate(designs):
        left = 0.0
        for n, k, v, dd in zip(names, kinds, lat, design_col):
            if dd != d or v <= 0:
                continue
            width = v / scale
            ax.barh(row, width, bar_h, left=left, color=kind_colour(k), edgecolor="white", linewidth=0.4, zorder=2)
            segments.append((row, left, width, n))
            left += width
        ax.text(left + longest / scale * 0.01, row, fmt_time(totals[d], unit, scale), ha="left", va="center",
                fontsize=NOTE_PT, zorder=4)  # fmt: skip
    ax.set_yticks(range(len(designs)), designs)
    ax.set_ylim(len(designs) - 0.4, -0.6)
    ax.set_xlim(0, longest / scale * 1.16)
    ax.set_xlabel(f"latency ({unit})")
    figure_title(fig, title)
    legend_below(fig, kind_handles(kinds))

    fig.draw_without_rendering()
    pos = ax.get_position()
    per_in = (ax.get_xlim()[1] - ax.get_xlim()[0]) / (pos.width * fig.get_figwidth())
    for row, left, width, n in segments:
        if text_width_in(n, NAME_PT) + 0.03 <= width / per_in:
            ax.text(left + width / 2, row, n, ha="center", va="center", fontsize=NAME_PT, zorder=4)
    return fig
