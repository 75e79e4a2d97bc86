"""What the figures share: the one-column size and font sizes, an Einsum kind's colour and legend,
a new figure on the Agg canvas, its title, axes style and legend, and how times are shown."""

from __future__ import annotations

import math
import textwrap
from typing import Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mambalaya.report.style import CATEGORY_STYLE, KIND_CATEGORY, text_width_in


# Sizes: a single column of a two-column paper is about 3.4 inches wide.
COLUMN_IN = 3.4
TITLE_PT, AXIS_PT, TICK_PT, LEGEND_PT, NOTE_PT, NAME_PT = 8.5, 7.5, 6.5, 6.5, 6.0, 5.5

#: Legend text of each kind category (the diagram's texts are too long for a column).
KIND_LEGEND: dict[str, str] = {
    "gemm": "GEMM",
    "recurrent": "recurrent",
    "window": "window",
    "reduction": "reduction",
    "elementwise": "elementwise",
    "unary": "unary",
}
UNKNOWN_KIND_COLOUR = "#d9d9d9"
EDGE_COLOUR = "#444444"


def kind_colour(kind: str) -> str:
    """Face colour of an Einsum of ``kind``, as in the cascade diagram (grey if unknown)."""
    category = KIND_CATEGORY.get(str(kind))
    return CATEGORY_STYLE[category][0] if category else UNKNOWN_KIND_COLOUR


def kind_handles(kinds: Iterable[str]) -> list:
    """A legend entry per kind category present, in the diagram's order; unknown kinds after."""
    kinds = list(dict.fromkeys(map(str, kinds)))
    present = {KIND_CATEGORY[k] for k in kinds if k in KIND_CATEGORY}
    handles: list = [
        Patch(facecolor=CATEGORY_STYLE[c][0], edgecolor=EDGE_COLOUR, linewidth=0.5, label=KIND_LEGEND.get(c, c))
        for c in CATEGORY_STYLE
        if c in present
    ]
    handles += [
        Patch(facecolor=UNKNOWN_KIND_COLOUR, edgecolor=EDGE_COLOUR, linewidth=0.5, label=k)
        for k in kinds
        if k not in KIND_CATEGORY
    ]
    return handles


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    fig.get_layout_engine().set(w_pad=0.03, h_pad=0.03, wspace=0.02, hspace=0.04)
    return fig


def _wrap(text: str, width_in: float, size: float, weight: str = "bold") -> str:
    """``text`` wrapped into lines at most ``width_in`` inches wide."""
    if not text or text_width_in(text, size, weight) <= width_in:
        return text
    for chars in range(len(text), 10, -1):
        lines = textwrap.wrap(text, chars)
        if all(text_width_in(line, size, weight) <= width_in for line in lines):
            return "\n".join(lines)
    return "\n".join(textwrap.wrap(text, 10))


def figure_title(fig: Figure, title: str) -> None:
    if title:
        fig.suptitle(_wrap(title, fig.get_figwidth() - 0.1, TITLE_PT), fontsize=TITLE_PT, fontweight="bold")


def style_axes(ax) -> None:
    ax.set_axisbelow(True)  # grid lines under everything drawn
    ax.tick_params(labelsize=TICK_PT, length=2.5, width=0.6, pad=1.5)
    ax.tick_params(which="minor", length=1.5, width=0.4)
    for spine in ax.spines.values():
        spine.set_linewidth(0.6)
    ax.xaxis.label.set_size(AXIS_PT)
    ax.yaxis.label.set_size(AXIS_PT)


def legend_below(fig: Figure, handles: list, *, ncol: int | None = None) -> None:
    """A legend under the axes, with as many columns as fit the figure's width."""
    if not handles:
        return
    if ncol is None:
        # The most columns that fit; matplotlib fills the columns top to bottom, left to right.
        widths = [text_width_in(h.get_label(), LEGEND_PT, "normal") + 0.29 for h in handles]
        room = fig.get_figwidth() - 0.15
        ncol = 1
        for n in range(len(handles), 0, -1):
            rows = math.ceil(len(handles) / n)
            columns = [widths[i : i + rows] for i in range(0, len(widths), rows)]
            if sum(max(c) for c in columns) <= room:
                ncol = len(columns)
                break
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=ncol,
        fontsize=LEGEND_PT,
        frameon=False,
        handlelength=1.4,
        handletextpad=0.4,
        columnspacing=0.9,
        borderaxespad=0.2,
    )


def time_unit(span_s: float) -> tuple[str, float]:
    """(unit, seconds per unit) so that ``span_s`` reads as a number between 1 and 1000."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if span_s >= scale:
            return unit, scale
    return "ns", 1e-9


def fmt_time(seconds: float, unit: str, scale: float) -> str:
    value = seconds / scale
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
