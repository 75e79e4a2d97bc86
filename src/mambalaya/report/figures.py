"""The evaluation figures of the Mambalaya paper, drawn from plain tables.

Each function takes a :class:`pandas.DataFrame` with the columns its docstring names, checks
it, and returns a :class:`matplotlib.figure.Figure` (Agg canvas) sized for one column of a
two-column paper; :func:`save_figure` writes it as PNG and SVG. The experiment modules compute
the numbers; nothing here models hardware.

Conventions shared by every figure:

* quantities are in SI base units: seconds, bytes, operations per second, bytes per second;
  utilisations are fractions in [0, 1]. The figures choose display units (µs or ms, GB, ...);
* Einsums are coloured by kind with the colours of the cascade diagram
  (:data:`mambalaya.report.diagram.CATEGORY_STYLE`);
* bad input (no rows, a missing column, a value that cannot be drawn) raises
  :class:`~mambalaya.errors.MambalayaError` naming the figure, the column and offending rows;
* legends sit outside the axes, so they never hide data.

Nothing here touches pyplot or matplotlib's global state.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from mambalaya.errors import MambalayaError
from mambalaya.report.diagram import _KIND_CATEGORY, CATEGORY_STYLE, PNG_DPI, _text_width

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

#: Mapping order of the traffic figure; other mappings follow in order of appearance.
MAPPING_ORDER: tuple[str, ...] = ("unfused", "ssm-ri", "stitched", "optimal", "ideal")
#: Phase order of the speedup figure.
PHASE_ORDER: tuple[str, ...] = ("prefill", "generation", "decode")

#: Line/bar colours of the baselines (others cycle through BASELINE_CYCLE).
BASELINE_COLOURS: dict[str, str] = {"marca-ideal": "#1f77b4", "geens-ideal": "#d62728"}
BASELINE_CYCLE: tuple[str, ...] = ("#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
BASELINE_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P")

#: Marker per roofline series, in order of appearance.
SERIES_MARKERS: tuple[str, ...] = ("o", "^", "s", "D", "v", "P", "X")

#: Qualitative colours of the tensors in the traffic figure; "other" is grey.
TENSOR_COLOURS: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#f1ce63", "#86bcb6", "#d37295",
)  # fmt: skip
OTHER_COLOUR = "#bdbdbd"

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


# ----------------------------------------------------------------------------------------------
# checking input
# ----------------------------------------------------------------------------------------------


def _table(df: object, columns: Sequence[str], what: str) -> pd.DataFrame:
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


def _rows_text(df: pd.DataFrame, bad: np.ndarray, keys: Sequence[str], col: str) -> str:
    idx = np.flatnonzero(bad)
    shown = []
    def plain(v: object) -> object:
        return v.item() if isinstance(v, np.generic) else v

    for i in idx[:3]:
        ident = ", ".join(f"{k}={plain(df.at[i, k])!r}" for k in keys if k in df.columns)
        shown.append(f"row {i} ({ident}{', ' if ident else ''}{col}={plain(df.at[i, col])!r})")
    more = f" and {len(idx) - 3} more" if len(idx) > 3 else ""
    return "; ".join(shown) + more


def _numbers(
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
            f"{what}: column {col!r} must hold {need}{hint}; bad value in {_rows_text(df, bad, keys, col)}"
        )
    return values


def _labels(df: pd.DataFrame, col: str, what: str) -> list[str]:
    """Column ``col`` as strings; missing values are an error."""
    missing = df[col].isna().to_numpy()
    if missing.any():
        raise MambalayaError(f"{what}: column {col!r} has missing values in row(s) {list(np.flatnonzero(missing)[:5])}")
    return [str(v) for v in df[col]]


def _positive_scalar(value: object, name: str, what: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MambalayaError(f"{what}: {name} must be a positive number, got {value!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise MambalayaError(f"{what}: {name} must be a positive number, got {value!r}")
    return x


def _ordered(values: Iterable[str], preferred: Sequence[str] = ()) -> list[str]:
    """Distinct values: those in ``preferred`` first (in that order), then the rest as they come."""
    seen = list(dict.fromkeys(values))
    first = [p for p in preferred if p in seen]
    return first + [v for v in seen if v not in first]


def _published_items(published: Mapping[str, float] | None, what: str) -> list[tuple[str, str, float, str]]:
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
        out.append((parts[0], parts[1], _positive_scalar(value, f"published[{key!r}]", what), str(key)))
    return out


def _match(name: str, choices: Sequence[str], key: str, what: str, noun: str) -> str:
    for c in choices:
        if c.casefold() == name.casefold():
            return c
    raise MambalayaError(
        f"{what}: published key {key!r} names {noun} {name!r}, which is not in the table "
        f"(it has {', '.join(map(repr, choices))})"
    )


# ----------------------------------------------------------------------------------------------
# styling
# ----------------------------------------------------------------------------------------------


def kind_colour(kind: str) -> str:
    """Face colour of an Einsum of ``kind``, as in the cascade diagram (grey if unknown)."""
    category = _KIND_CATEGORY.get(str(kind))
    return CATEGORY_STYLE[category][0] if category else UNKNOWN_KIND_COLOUR


def _kind_handles(kinds: Iterable[str]) -> list:
    """A legend entry per kind category present, in the diagram's order; unknown kinds after."""
    kinds = list(dict.fromkeys(map(str, kinds)))
    present = {_KIND_CATEGORY[k] for k in kinds if k in _KIND_CATEGORY}
    handles: list = [
        Patch(facecolor=CATEGORY_STYLE[c][0], edgecolor=EDGE_COLOUR, linewidth=0.5, label=KIND_LEGEND.get(c, c))
        for c in CATEGORY_STYLE
        if c in present
    ]
    handles += [
        Patch(facecolor=UNKNOWN_KIND_COLOUR, edgecolor=EDGE_COLOUR, linewidth=0.5, label=k)
        for k in kinds
        if k not in _KIND_CATEGORY
    ]
    return handles


def baseline_colours(baselines: Sequence[str]) -> dict[str, str]:
    """Colour of each baseline: fixed for the paper's baselines, cycled for others."""
    out: dict[str, str] = {}
    spare = iter(BASELINE_CYCLE * (1 + len(baselines) // len(BASELINE_CYCLE)))
    for b in baselines:
        out[b] = BASELINE_COLOURS.get(b) or next(spare)
    return out


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    fig.get_layout_engine().set(w_pad=0.03, h_pad=0.03, wspace=0.02, hspace=0.04)
    return fig


def _wrap(text: str, width_in: float, size: float, weight: str = "bold") -> str:
    """``text`` wrapped into lines at most ``width_in`` inches wide."""
    if not text or _text_width(text, size, weight) <= width_in:
        return text
    for chars in range(len(text), 10, -1):
        lines = textwrap.wrap(text, chars)
        if all(_text_width(line, size, weight) <= width_in for line in lines):
            return "\n".join(lines)
    return "\n".join(textwrap.wrap(text, 10))


def _title(fig: Figure, title: str) -> None:
    if title:
        fig.suptitle(_wrap(title, fig.get_figwidth() - 0.1, TITLE_PT), fontsize=TITLE_PT, fontweight="bold")


def _style_axes(ax) -> None:
    ax.set_axisbelow(True)  # grid lines under everything drawn
    ax.tick_params(labelsize=TICK_PT, length=2.5, width=0.6, pad=1.5)
    ax.tick_params(which="minor", length=1.5, width=0.4)
    for spine in ax.spines.values():
        spine.set_linewidth(0.6)
    ax.xaxis.label.set_size(AXIS_PT)
    ax.yaxis.label.set_size(AXIS_PT)


def _legend_below(fig: Figure, handles: list, *, ncol: int | None = None) -> None:
    """A legend under the axes, with as many columns as fit the figure's width."""
    if not handles:
        return
    if ncol is None:
        # The most columns that fit; matplotlib fills the columns top to bottom, left to right.
        widths = [_text_width(h.get_label(), LEGEND_PT, "normal") + 0.29 for h in handles]
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


def _time_unit(span_s: float) -> tuple[str, float]:
    """(unit, seconds per unit) so that ``span_s`` reads as a number between 1 and 1000."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if span_s >= scale:
            return unit, scale
    return "ns", 1e-9


def _fmt_time(seconds: float, unit: str, scale: float) -> str:
    value = seconds / scale
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def _fmt_rate(value: float, unit: str) -> str:
    """``value`` with an SI prefix: 2.29e14 ops/s -> '229 Tops/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _fmt_ratio(value: float) -> str:
    return f"{value:.3g}×"


def _pow2_axis(ax, values: np.ndarray) -> None:
    """A log2 x axis with ticks labelled 2^k at the powers of two spanned by ``values``."""
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(values.min())), math.ceil(math.log2(values.max()))
    step = max(1, math.ceil((hi - lo + 1) / 10))
    ax.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(lo, hi + 1, step)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"$2^{{{round(math.log2(x))}}}$" if x > 0 else ""))
    pad = 2.0**0.3
    ax.set_xlim(2.0**lo / pad, 2.0**hi * pad)


def _fit_xticklabels(fig: Figure, ax) -> None:
    """Slant the x tick labels if, laid out, any two of them touch."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    if any(a.x1 + 2 > b.x0 for a, b in zip(boxes, boxes[1:])):
        for t in ax.get_xticklabels():
            t.set_rotation(25)
            t.set_ha("right")
            t.set_rotation_mode("anchor")


# ----------------------------------------------------------------------------------------------
# 1. roofline (Figure 2a)
# ----------------------------------------------------------------------------------------------


def roofline_figure(
    points: pd.DataFrame,
    *,
    peak_ops_per_s: float,
    peak_elementwise_ops_per_s: float,
    bandwidth_bytes_per_s: float,
    title: str,
) -> Figure:
    """Log-log roofline of a cascade's Einsums (the paper's Figure 2a).

    ``points`` has one row per (Einsum, series) with columns ``einsum``, ``kind``, ``series``
    (e.g. "unfused", "ideal fusion"), ``intensity_ops_per_byte`` (operations per off-chip byte)
    and ``performance_ops_per_s`` (achieved operations per second), both positive. The roof is
    ``min(bandwidth × intensity, peak)`` for the 2D array (``peak_ops_per_s``, GEMMs) and for
    the 1D array (``peak_elementwise_ops_per_s``, dashed). Markers are coloured by kind and
    shaped by series; each Einsum is labelled once, at its point of the first series. An arrow
    runs from an Einsum's point in the origin series ("unfused" if present, else the first
    series) to its point in every other series.
    """
    what = "roofline figure"
    cols = ("einsum", "kind", "series", "intensity_ops_per_byte", "performance_ops_per_s")
    df = _table(points, cols, what)
    peak2d = _positive_scalar(peak_ops_per_s, "peak_ops_per_s", what)
    peak1d = _positive_scalar(peak_elementwise_ops_per_s, "peak_elementwise_ops_per_s", what)
    bw = _positive_scalar(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", what)
    keys = ("einsum", "series")
    log_hint = " (a log-log plot cannot show zero; leave such Einsums out)"
    x = _numbers(df, "intensity_ops_per_byte", what, keys, positive=True, hint=log_hint)
    y = _numbers(df, "performance_ops_per_s", what, keys, positive=True, hint=log_hint)
    names, kinds, series = (_labels(df, c, what) for c in ("einsum", "kind", "series"))
    order = _ordered(series)
    origin = next((s for s in order if s.casefold() == "unfused"), order[0])
    order = [origin] + [s for s in order if s != origin]

    fig = _new_figure(COLUMN_IN, 3.45)
    ax = fig.add_subplot()
    _style_axes(ax)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(peak2d, peak1d)
    ridges = (peak2d / bw, peak1d / bw)
    xlo = min(x.min(), min(ridges) / 10) / 2.5
    xhi = max(x.max(), max(ridges)) * 4
    ylo = min(y.min(), bw * xlo) / 2.5
    yhi = top * 3.5
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(ylo, yhi)
    ax.xaxis.set_major_locator(LogLocator(base=10, numticks=12))
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=12))
    ax.set_xlabel("operational intensity (ops/byte)")
    ax.set_ylabel("performance (ops/s)")
    ax.grid(True, which="major", color="#e6e6e6", linewidth=0.5, zorder=0)

    xs = np.geomspace(xlo, xhi, 512)
    ax.plot(xs, np.minimum(bw * xs, peak2d), color="#222222", linewidth=1.2, zorder=1)
    ax.plot(xs, np.minimum(bw * xs, peak1d), color="#222222", linewidth=0.9, linestyle=(0, (4, 2)), zorder=1)

    # Markers, one scatter per series.
    for i, s in enumerate(order):
        sel = np.array([v == s for v in series])
        ax.scatter(
            x[sel],
            y[sel],
            s=24,
            marker=SERIES_MARKERS[i % len(SERIES_MARKERS)],
            c=[kind_colour(k) for k, m in zip(kinds, sel) if m],
            edgecolors="#222222",
            linewidths=0.6,
            zorder=4,
        )

    # Arrows from the origin series to the others.
    where = {(n, s): (xv, yv) for n, s, xv, yv in zip(names, series, x, y)}
    arrows = []
    for n in dict.fromkeys(names):
        if (n, origin) not in where:
            continue
        a = where[(n, origin)]
        for s in order[1:]:
            b = where.get((n, s))
            if b is None or (math.isclose(a[0], b[0], rel_tol=1e-9) and math.isclose(a[1], b[1], rel_tol=1e-9)):
                continue
            arrows.append((a, b))
            ax.add_patch(
                FancyArrowPatch(
                    a,
                    b,
                    arrowstyle="-|>,head_length=0.3,head_width=0.15",
                    mutation_scale=8,
                    color="#666666",
                    linewidth=0.6,
                    shrinkA=3.5,
                    shrinkB=3.5,
                    zorder=3,
                )
            )

    handles: list = [
        Line2D(
            [], [], linestyle="none", marker=SERIES_MARKERS[i % len(SERIES_MARKERS)], markersize=4.5,
            markerfacecolor="white", markeredgecolor="#222222", markeredgewidth=0.6, label=s,
        )
        for i, s in enumerate(order)
    ]  # fmt: skip
    if len(order) > 1:
        handles.append(
            Line2D([], [], color="#666666", linewidth=0.6, marker=">", markersize=3, label=f"{origin} → fused")
        )
    handles += _kind_handles(kinds)
    _title(fig, title)
    _legend_below(fig, handles)

    # Now that the layout is fixed, place the roof labels, then the Einsum labels.
    fig.draw_without_rendering()
    placer = _Placer(ax)
    placer.add_markers(x, y, radius_pt=3.6)
    for peak in (peak2d, peak1d):
        placer.add_line(xs, np.minimum(bw * xs, peak))
    for a, b in arrows:
        placer.add_line(np.array([a[0], b[0]]), np.array([a[1], b[1]]), weight=0.5)
    _roof_labels(ax, placer, bw, peak2d, peak1d)
    first: dict[str, int] = {}
    for s in order:
        for i, (n, si) in enumerate(zip(names, series)):
            if si == s and n not in first:
                first[n] = i
    for n, i in sorted(first.items(), key=lambda item: (x[item[1]], y[item[1]])):
        placer.label_point(n, (x[i], y[i]))
    return fig


def _overlap(rect: Sequence[float], boxes: np.ndarray) -> float:
    """Total area of ``rect`` (x0, y0, x1, y1) overlapping each of ``boxes`` (an (n, 4) array)."""
    if len(boxes) == 0:
        return 0.0
    w = np.minimum(rect[2], boxes[:, 2]) - np.maximum(rect[0], boxes[:, 0])
    h = np.minimum(rect[3], boxes[:, 3]) - np.maximum(rect[1], boxes[:, 1])
    return float(np.sum(np.clip(w, 0, None) * np.clip(h, 0, None)))


def _sides(n: int) -> list[tuple[float, float, str, str]]:
    """(unit x, unit y, ha, va) of ``n`` directions around a point, east first, anticlockwise;
    the alignment puts the label on the far side of the direction."""
    out = []
    for k in range(n):
        t = 2 * math.pi * k / n
        ux, uy = math.cos(t), math.sin(t)
        ha = "left" if ux > 0.35 else "right" if ux < -0.35 else "center"
        va = "bottom" if uy > 0.35 else "top" if uy < -0.35 else "center"
        out.append((ux, uy, ha, va))
    return out


class _Placer:
    """Greedy label placement in display pixels.

    Each label takes the cheapest of its candidate boxes, where a box costs its overlap with
    labels already placed (heavily), with markers, with sampled lines (lightly) and with the
    outside of the axes (heavily), plus its distance from its point.
    """

    LABELS, MARKERS, LINES, OUTSIDE, DISTANCE = 8.0, 1.5, 0.3, 6.0, 1.2

    def __init__(self, ax) -> None:
        self.ax = ax
        self.fig = ax.figure
        self.px = self.fig.dpi / 72
        b = ax.get_window_extent()
        self.frame = (b.x0, b.y0, b.x1, b.y1)
        self.labels = np.zeros((0, 4))
        self.markers = np.zeros((0, 4))
        self.lines = np.zeros((0, 4))

    def add_markers(self, x: np.ndarray, y: np.ndarray, radius_pt: float) -> None:
        r = radius_pt * self.px
        p = self.ax.transData.transform(np.column_stack([x, y]))
        self.markers = np.vstack([self.markers, np.column_stack([p[:, 0] - r, p[:, 1] - r, p[:, 0] + r, p[:, 1] + r])])

    def add_line(
        self, x: np.ndarray, y: np.ndarray, step_px: float = 3.0, weight: float = 1.0, transform=None
    ) -> None:
        p = (transform or self.ax.transData).transform(np.column_stack([x, y]))
        samples = [p[:1]]
        for a, b in zip(p[:-1], p[1:]):
            n = max(1, int(np.hypot(*(b - a)) // step_px))
            samples.append(a + (b - a) * (np.arange(1, n + 1)[:, None] / n))
        q = np.vstack(samples)
        h = step_px / 2 * math.sqrt(weight)
        self.lines = np.vstack([self.lines, np.column_stack([q[:, 0] - h, q[:, 1] - h, q[:, 0] + h, q[:, 1] + h])])

    def cost(self, rect: Sequence[float]) -> float:
        area = (rect[2] - rect[0]) * (rect[3] - rect[1])
        inside = _overlap(rect, np.array([self.frame]))
        return (
            self.LABELS * _overlap(rect, self.labels)
            + self.MARKERS * _overlap(rect, self.markers)
            + self.LINES * _overlap(rect, self.lines)
            + self.OUTSIDE * (area - inside)
        )

    def take(self, rect: Sequence[float]) -> None:
        self.labels = np.vstack([self.labels, np.asarray(rect, dtype=float)[None, :]])

    def best_artist(self, make, candidates: Iterable) -> None:
        """Create ``make(candidate)`` for each candidate; keep the cheapest (its box is taken)."""
        renderer = self.fig.canvas.get_renderer()
        best = None
        for c in candidates:
            artist = make(c)
            b = artist.get_window_extent(renderer)
            rect = (b.x0, b.y0, b.x1, b.y1)
            cost = self.cost(rect)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, artist, rect)
            else:
                artist.remove()
            if cost == 0:
                break
        if best is not None:
            self.take(best[2])

    def label_point(self, text: str, point: tuple[float, float]) -> None:
        """Name ``point``: close to it where there is room, else further away with a leader line."""
        w = _text_width(text, NAME_PT) * self.fig.dpi
        h = NAME_PT * 1.2 * self.px
        cx, cy = self.ax.transData.transform(point)
        best = None
        for radius in (3.5, 6.0, 9.5, 14.0, 20.0, 27.0, 35.0):
            for ux, uy, ha, va in _sides(8 if radius < 9 else 16):
                ox, oy = cx + ux * radius * self.px, cy + uy * radius * self.px
                x0 = ox if ha == "left" else ox - w if ha == "right" else ox - w / 2
                y0 = oy if va == "bottom" else oy - h if va == "top" else oy - h / 2
                rect = (x0 - 1, y0 - 1, x0 + w + 1, y0 + h + 1)  # a pixel of room around the text
                cost = self.cost(rect) + self.DISTANCE * radius**1.5
                if best is None or cost < best[0]:
                    best = (cost, ux * radius, uy * radius, ha, va, rect, radius)
        assert best is not None
        _, dx, dy, ha, va, rect, radius = best
        self.take(rect)
        leader = (
            {"arrowstyle": "-", "color": "#666666", "linewidth": 0.4, "shrinkA": 0.5, "shrinkB": 3.0}
            if radius > 7
            else None
        )
        self.ax.annotate(
            text, point, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=NAME_PT,
            color="#111111", zorder=5, annotation_clip=False, arrowprops=leader,
        )  # fmt: skip


def _roof_labels(ax, placer: _Placer, bw: float, peak2d: float, peak1d: float) -> None:
    """Name the ceilings at the left, on faint extensions of their lines across the region no
    Einsum can reach, and the memory roof along its slope, where it hides the fewest markers."""
    xlo, xhi = ax.get_xlim()
    text = {"fontsize": NOTE_PT, "color": "#222222", "zorder": 2, "textcoords": "offset points"}
    same = math.isclose(peak1d, peak2d, rel_tol=1e-3)
    ceilings = [(max(peak2d, peak1d), 1.2, "bottom"), (min(peak2d, peak1d), -1.2, "top")][: 1 if same else 2]
    for value, dy, va in ceilings:
        name = "2D / 1D array peak" if same else ("2D array peak" if value == peak2d else "1D array peak")
        ax.plot([xlo, value / bw], [value, value], color="#bbbbbb", linewidth=0.6, linestyle=(0, (1, 1.5)), zorder=1)
        t = ax.annotate(f"{name} {_fmt_rate(value, 'ops/s')}", (xlo, value), xytext=(2, dy), ha="left", va=va, **text)
        b = t.get_window_extent(placer.fig.canvas.get_renderer())
        placer.take((b.x0, b.y0, b.x1, b.y1))
    # The memory roof, rotated along its slope and just above it, below both ceilings.
    ylo = ax.get_ylim()[0]
    start = max(xlo, ylo / bw) * 1.2
    stop = min(peak2d, peak1d) / bw / 4
    if stop <= start:
        return
    label = f"memory {_fmt_rate(bw, 'B/s')}"
    p0 = ax.transData.transform((start, bw * start))
    p1 = ax.transData.transform((start * 10, bw * start * 10))
    angle = math.atan2(p1[1] - p0[1], p1[0] - p0[0])
    lift = 4.0  # points off the line, clear of markers on it
    length = _text_width(label, NOTE_PT) * placer.fig.dpi
    height = NOTE_PT * placer.px
    pad = 8 * placer.px
    crowd = placer.markers + np.array([-pad, -pad, pad, pad])
    best = None
    for side, va in ((1, "bottom"), (-1, "top")):  # above the line, then below it
        off = (-side * lift * math.sin(angle), side * lift * math.cos(angle))
        for x0 in np.geomspace(start, stop, 16):
            # The rotated text as squares along its centre line.
            bx, by = ax.transData.transform((x0, bw * x0)) + np.array(off) * placer.px
            squares = []
            for f in np.linspace(0, 1, max(2, int(length // height) + 1)):
                cx = bx + math.cos(angle) * f * length - side * math.sin(angle) * height / 2
                cy = by + math.sin(angle) * f * length + side * math.cos(angle) * height / 2
                squares.append((cx - height / 2, cy - height / 2, cx + height / 2, cy + height / 2))
            # Keep well clear of markers: their labels need the room around them.
            cost = sum(placer.cost(q) + placer.MARKERS * _overlap(q, crowd) for q in squares)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, float(x0), squares, off, va)
    assert best is not None
    _, x0, squares, off, va = best
    for q in squares:
        placer.take(q)
    ax.annotate(
        label, (x0, bw * x0), xytext=off, ha="left", va=va, rotation=math.degrees(angle),
        rotation_mode="anchor", **text,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# 2. utilisation over time (Figure 2b/2c)
# ----------------------------------------------------------------------------------------------


def utilisation_timeline_figure(rows: pd.DataFrame, *, title: str) -> Figure:
    """Compute and memory-bandwidth utilisation over one layer's execution (Figure 2b/2c).

    ``rows`` has one row per Einsum with columns ``einsum``, ``kind``, ``group``, ``start_s``,
    ``end_s`` (seconds), ``compute_util`` and ``mem_util`` (fractions in [0, 1]). Einsums of
    one fusion ``group`` run together: they must share start and end, and their utilisations
    are stacked, so each row gives that Einsum's share of the unit's utilisation over the
    interval (the shares of a group add up to at most 1). A missing ``group`` (NaN/None) means
    the Einsum runs alone. Groups of several Einsums are outlined. An optional column
    ``spatial_util`` (the group's compute-weighted spatial utilisation of its PEs, the same for
    every Einsum of a group) adds a third panel: how much of the array its spatial mappings fill.
    """
    what = "utilisation timeline figure"
    cols = ("einsum", "kind", "group", "start_s", "end_s", "compute_util", "mem_util")
    df = _table(rows, cols, what)
    keys = ("einsum", "group")
    start = _numbers(df, "start_s", what, keys, nonnegative=True)
    end = _numbers(df, "end_s", what, keys)
    short = ~(end > start)
    if short.any():
        raise MambalayaError(
            f"{what}: every Einsum needs end_s > start_s; not so in {_rows_text(df, short, keys, 'end_s')}"
        )
    hint = " between 0 and 1 (fractions, not percentages)"
    util = {}
    for col in ("compute_util", "mem_util"):
        u = _numbers(df, col, what, keys, nonnegative=True, hint=hint)
        over = u > 1 + 1e-6
        if over.any():
            raise MambalayaError(f"{what}: column {col!r} must hold fractions{hint}; {_rows_text(df, over, keys, col)}")
        util[col] = u
    names, kinds = _labels(df, "einsum", what), _labels(df, "kind", what)
    group_ids = [f"\0{n}\0{i}" if pd.isna(g) else str(g) for i, (n, g) in enumerate(zip(names, df["group"]))]

    span = float(end.max() - start.min())
    unit, scale = _time_unit(span)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    tol = 1e-9 * max(span, 1e-300)
    for g, members in groups.items():
        s0, e0 = start[members[0]], end[members[0]]
        if any(abs(start[i] - s0) > tol or abs(end[i] - e0) > tol for i in members):
            shown = ", ".join(f"{names[i]} [{start[i]:.6g}, {end[i]:.6g}] s" for i in members[:4])
            raise MambalayaError(f"{what}: the Einsums of group {g!r} must share start_s and end_s; they have {shown}")
        for col, label in (("compute_util", "compute"), ("mem_util", "memory")):
            total = util[col][members].sum()
            if total > 1 + 1e-6:
                raise MambalayaError(
                    f"{what}: the {label} utilisations of group {g!r} ({', '.join(names[i] for i in members)}) add up "
                    f"to {total:.3g} > 1; give each Einsum its share of the group's utilisation"
                )

    spatial = "spatial_util" in rows.columns
    if spatial:
        su = _numbers(df.assign(spatial_util=rows["spatial_util"].to_numpy()), "spatial_util", what, keys,
                      nonnegative=True, hint=hint)
        if (su > 1 + 1e-6).any():
            raise MambalayaError(f"{what}: column 'spatial_util' must hold fractions{hint}")
        for g, members in groups.items():
            if np.ptp(su[members]) > 1e-9:
                raise MambalayaError(f"{what}: the Einsums of group {g!r} must share spatial_util (the group's value)")
        util["spatial_util"] = su
    fig = _new_figure(COLUMN_IN, 3.9 if spatial else 2.9)
    axes = fig.subplots(3 if spatial else 2, 1, sharex=True)
    panels = (("compute_util", "compute\nutilisation (%)"), ("mem_util", "memory BW\nutilisation (%)"))
    if spatial:
        panels += (("spatial_util", "PEs filled by\nspatial map (%)"),)
    tops: dict[str, dict[str, float]] = {}
    for ax, (col, ylabel) in zip(axes, panels):
        _style_axes(ax)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 122)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.axhline(100, color="#999999", linewidth=0.5, linestyle=":", zorder=1)
        tops[col] = {}
        for g, members in groups.items():
            x0, width = start[members[0]] / scale, (end[members[0]] - start[members[0]]) / scale
            bottom = 0.0
            for i in (members[:1] if col == "spatial_util" else members):
                height = 100 * util[col][i]
                ax.add_patch(
                    Rectangle(
                        (x0, bottom), width, height,
                        facecolor="#9e9e9e" if col == "spatial_util" else kind_colour(kinds[i]),
                        edgecolor=EDGE_COLOUR, linewidth=0.4, zorder=2,
                    )
                )  # fmt: skip
                bottom += height
            tops[col][g] = bottom
            if len(members) > 1:
                ax.add_patch(
                    Rectangle(
                        (x0, 0), width, max(bottom, 1.5), facecolor="none", edgecolor="#111111",
                        linewidth=1.2, zorder=3, joinstyle="miter",
                    )
                )  # fmt: skip
    lo, hi = start.min() / scale, end.max() / scale
    axes[0].set_xlim(lo, hi + (hi - lo) * 0.005)
    axes[-1].set_xlabel(f"time ({unit})")
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    fig.align_ylabels(axes)

    handles = _kind_handles(kinds)
    if any(len(m) > 1 for m in groups.values()):
        handles.append(Patch(facecolor="white", edgecolor="#111111", linewidth=1.2, label="fused group"))
    _title(fig, title)
    _legend_below(fig, handles)

    # Names above the bars of the compute panel, where they fit.
    fig.draw_without_rendering()
    ax = axes[0]
    pos = ax.get_position()
    ax_w_in = pos.width * fig.get_figwidth()
    ax_h_in = pos.height * fig.get_figheight()
    xlo, xhi = ax.get_xlim()
    per_in = (xhi - xlo) / ax_w_in
    pct_per_in = 122 / ax_h_in
    text_h_in = NAME_PT / 72 * 1.15
    for g, members in groups.items():
        x0, x1 = start[members[0]] / scale, end[members[0]] / scale
        width_in = (x1 - x0) / per_in
        label = _group_label([names[i] for i in members], width_in)
        top = tops["compute_util"][g]
        if label is not None:
            ax.text((x0 + x1) / 2, top + 2, label, ha="center", va="bottom", fontsize=NAME_PT, zorder=5)
            continue
        # Too narrow for a horizontal name: try it rotated, above the bar or inside it.
        first, last = names[members[0]], names[members[-1]]
        label = "+".join(names[i] for i in members) if len(members) <= 2 else f"{first}…{last}"
        if width_in < text_h_in * 0.9:
            continue
        length = (_text_width(label, NAME_PT) + 0.03) * pct_per_in
        if top + 2 + length <= 122:
            ax.text((x0 + x1) / 2, top + 2, label, ha="center", va="bottom", rotation=90, fontsize=NAME_PT, zorder=5)
        elif top - 2 - length >= 0:
            ax.text((x0 + x1) / 2, top - 2, label, ha="center", va="top", rotation=90, fontsize=NAME_PT, zorder=5)
    return fig


def _group_label(members: list[str], width_in: float) -> str | None:
    """The longest of 'A+B+C', 'A…C' that fits ``width_in`` inches, or None."""
    candidates = ["+".join(members)]
    if len(members) > 2:
        candidates.append(f"{members[0]}…{members[-1]}")
    for c in candidates:
        if _text_width(c, NAME_PT) + 0.02 <= width_in:
            return c
    return None


# ----------------------------------------------------------------------------------------------
# 3. speedup vs sequence length
# ----------------------------------------------------------------------------------------------


def speedup_figure(df: pd.DataFrame, *, title: str, published: Mapping[str, float] | None = None) -> Figure:
    """Speedup of mambalaya over each baseline against sequence length, one panel per phase.

    ``df`` has columns ``seq_len`` (tokens, positive), ``baseline`` (e.g. "marca-ideal"),
    ``phase`` ("prefill", "generation", ...) and ``speedup`` (baseline latency / mambalaya
    latency, positive). ``published`` maps keys ``"<phase> vs <baseline>"`` (e.g.
    ``"prefill vs marca-ideal"``) to the paper's ratio, drawn as a dashed line labelled
    "published 4.9×" in that phase's panel; every phase named must be in ``df``.
    """
    what = "speedup figure"
    data = _table(df, ("seq_len", "baseline", "phase", "speedup"), what)
    keys = ("baseline", "phase")
    seq = _numbers(data, "seq_len", what, keys, positive=True)
    speed = _numbers(data, "speedup", what, keys, positive=True)
    baselines = _ordered(_labels(data, "baseline", what))
    phase_col = _labels(data, "phase", what)
    phases = _ordered(phase_col, PHASE_ORDER)
    base_col = [str(b) for b in data["baseline"]]
    marks = []
    for left, right, value, key in _published_items(published, what):
        marks.append((_match(left, phases, key, what, "phase"), right, value))
    colours = baseline_colours(baselines + [r for _, r, _ in marks if r not in baselines])

    every = np.concatenate([speed, [m[2] for m in marks], [1.0]])
    log_y = every.max() / every.min() > 30

    fig = _new_figure(COLUMN_IN, 0.95 + 1.3 * len(phases))
    axes = np.atleast_1d(fig.subplots(len(phases), 1, sharex=True, squeeze=False)[:, 0])
    for k, (ax, phase) in enumerate(zip(axes, phases)):
        _style_axes(ax)
        ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
        _pow2_axis(ax, seq)
        ax.axhline(1.0, color="#555555", linewidth=0.7, zorder=1)
        for j, b in enumerate(baselines):
            sel = np.array([p == phase and bb == b for p, bb in zip(phase_col, base_col)])
            if not sel.any():
                continue
            o = np.argsort(seq[sel])
            ax.plot(
                seq[sel][o], speed[sel][o], color=colours[b], marker=BASELINE_MARKERS[j % len(BASELINE_MARKERS)],
                markersize=3.2, linewidth=1.1, zorder=3,
            )  # fmt: skip
        here = sorted((v, b) for p, b, v in marks if p == phase)
        sel_phase = np.array([p == phase for p in phase_col])
        values = np.concatenate([speed[sel_phase], [v for v, _ in here], [1.0]])
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(values.min() / 1.6, values.max() * 1.8)
        else:
            ax.set_ylim(0, values.max() * 1.18)
        ax.set_ylabel("speedup (×)")
        ax.set_title(phase, fontsize=AXIS_PT, loc="left", pad=2)
        if k < len(axes) - 1:
            ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel("sequence length L (tokens)")

    handles: list = [
        Line2D([], [], color=colours[b], marker=BASELINE_MARKERS[j % len(BASELINE_MARKERS)], markersize=3.2,
               linewidth=1.1, label=f"vs {b}")
        for j, b in enumerate(baselines)
    ]  # fmt: skip
    if marks:
        handles.append(Line2D([], [], color="#555555", linewidth=0.9, linestyle=(0, (4, 2)), label="published"))
    _title(fig, title)
    _legend_below(fig, handles)
    fig.draw_without_rendering()
    for ax, phase in zip(axes, phases):
        _published_lines(ax, sorted((v, b) for p, b, v in marks if p == phase), colours)
    return fig


def _published_lines(ax, marks: list[tuple[float, str]], colours: Mapping[str, str]) -> None:
    """Dashed lines at each published value, each labelled "published 4.9×" at whichever end,
    above or below, hides the least of the data and of the other labels."""
    for value, baseline in marks:
        ax.axhline(value, color=colours[baseline], linewidth=0.9, linestyle=(0, (4, 2)), zorder=2)
    if not marks:
        return
    placer = _Placer(ax)
    for line in ax.lines:
        x, y = (np.asarray(v, dtype=float) for v in line.get_data())
        if line.get_marker() not in (None, "None", "none", ""):
            placer.add_markers(x, y, radius_pt=2.5)
        if line.get_linestyle() != "None" and len(x) > 1:
            placer.add_line(x, y, transform=line.get_transform())
    for value, baseline in marks:
        spots = [(1.0, "right", 1.5, "bottom"), (0.0, "left", 1.5, "bottom"), (1.0, "right", -1.5, "top"),
                 (0.0, "left", -1.5, "top")]  # fmt: skip
        placer.best_artist(
            lambda spot: ax.annotate(
                f"published {_fmt_ratio(value)}", (spot[0], value), xycoords=("axes fraction", "data"),
                xytext=(-2 if spot[1] == "right" else 2, spot[2]), textcoords="offset points", ha=spot[1],
                va=spot[3], fontsize=NOTE_PT, color=colours[baseline], zorder=5,
            ),
            spots,
        )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# 4. end-to-end speedup
# ----------------------------------------------------------------------------------------------


def end_to_end_figure(df: pd.DataFrame, *, published: Mapping[str, float] | None, title: str) -> Figure:
    """Grouped bars of end-to-end speedup of mambalaya per model and baseline.

    ``df`` has columns ``model`` (e.g. "Mamba-1"), ``baseline`` and ``speedup`` (positive; one
    row per pair). ``published`` maps ``"<model> vs <baseline>"`` to the paper's ratio, drawn
    as a diamond beside that bar; every model named must be in ``df``.
    """
    what = "end-to-end figure"
    data = _table(df, ("model", "baseline", "speedup"), what)
    speed = _numbers(data, "speedup", what, ("model", "baseline"), positive=True)
    model_col, base_col = _labels(data, "model", what), _labels(data, "baseline", what)
    models, baselines = _ordered(model_col), _ordered(base_col)
    seen: set[tuple[str, str]] = set()
    for m, b in zip(model_col, base_col):
        if (m, b) in seen:
            raise MambalayaError(f"{what}: more than one row for model {m!r} and baseline {b!r}")
        seen.add((m, b))
    marks: dict[tuple[str, str], float] = {}
    for left, right, value, key in _published_items(published, what):
        m = _match(left, models, key, what, "model")
        b = _match(right, baselines, key, what, "baseline")
        marks[(m, b)] = value
    colours = baseline_colours(baselines)

    fig = _new_figure(COLUMN_IN, 2.5)
    ax = fig.add_subplot()
    _style_axes(ax)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
    slot = 0.8 / len(baselines)
    bar_w = slot * (0.62 if marks else 0.85)
    value = {(m, b): s for m, b, s in zip(model_col, base_col, speed)}
    top = max(list(speed) + list(marks.values()) + [1.0])
    for j, b in enumerate(baselines):
        for i, m in enumerate(models):
            if (m, b) not in value:
                continue
            x = i - 0.4 + slot * (j + 0.5) - (slot - bar_w) / 2 * (1 if marks else 0)
            v = value[(m, b)]
            ax.bar(x, v, width=bar_w, color=colours[b], edgecolor="#222222", linewidth=0.5, zorder=2)
            ax.text(x, v + top * 0.015, _fmt_ratio(v), ha="center", va="bottom", fontsize=NOTE_PT, zorder=4)
            if (m, b) in marks:
                px, pv = x + bar_w / 2 + (slot - bar_w) / 2, marks[(m, b)]
                ax.plot(
                    px, pv, linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                    markeredgecolor="#111111", markeredgewidth=0.8, zorder=4,
                )  # fmt: skip
                ax.annotate(
                    _fmt_ratio(pv), (px, pv), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=NAME_PT, color="#333333", style="italic", zorder=4,
                )  # fmt: skip
    ax.axhline(1.0, color="#555555", linewidth=0.7, zorder=1)
    ax.set_xticks(range(len(models)), models)
    ax.set_xlim(-0.55, len(models) - 0.45)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("end-to-end speedup (×)")
    handles: list = [
        Patch(facecolor=colours[b], edgecolor="#222222", linewidth=0.5, label=f"vs {b}") for b in baselines
    ]
    if marks:
        handles.append(
            Line2D([], [], linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                   markeredgecolor="#111111", markeredgewidth=0.8, label="published")
        )  # fmt: skip
    _title(fig, title)
    _legend_below(fig, handles)
    return fig


# ----------------------------------------------------------------------------------------------
# 5. off-chip traffic by tensor
# ----------------------------------------------------------------------------------------------


def traffic_by_tensor_figure(df: pd.DataFrame, *, title: str, top: int = 12) -> Figure:
    """Stacked bars of off-chip traffic (GB = 10⁹ bytes) per mapping, split by tensor.

    ``df`` has columns ``mapping``, ``tensor``, ``role`` (e.g. "input", "weight",
    "intermediate"), ``read_bytes`` and ``write_bytes`` (non-negative); rows repeating a
    (mapping, tensor) pair are added. Mappings are ordered unfused, ssm-ri, stitched, optimal,
    ideal (others after, as they come). The ``top`` tensors with the most traffic over all
    mappings get their own colour; the rest are summed as "other".
    """
    what = "traffic figure"
    data = _table(df, ("mapping", "tensor", "role", "read_bytes", "write_bytes"), what)
    if not isinstance(top, (int, np.integer)) or top < 1:
        raise MambalayaError(f"{what}: top must be a positive integer, got {top!r}")
    keys = ("mapping", "tensor")
    total = _numbers(data, "read_bytes", what, keys, nonnegative=True) + _numbers(
        data, "write_bytes", what, keys, nonnegative=True
    )
    mapping_col, tensor_col = _labels(data, "mapping", what), _labels(data, "tensor", what)
    role_col = ["" if pd.isna(r) else str(r) for r in data["role"]]
    mappings = _ordered(mapping_col, MAPPING_ORDER)

    table = pd.DataFrame({"mapping": mapping_col, "tensor": tensor_col, "bytes": total})
    per = table.groupby(["mapping", "tensor"], sort=False)["bytes"].sum()
    overall = table.groupby("tensor", sort=False)["bytes"].sum().sort_values(ascending=False, kind="stable")
    chosen = [t for t in overall.index[:top] if overall[t] > 0] or list(overall.index[:1])
    rest = [t for t in overall.index if t not in chosen]
    roles: dict[str, str] = {}
    for t, r in zip(tensor_col, role_col):
        roles.setdefault(t, r)
    stacks = chosen + (["other"] if rest and overall[rest].sum() > 0 else [])
    shown_roles = [roles[t] for t in chosen if roles[t]]
    common = max(sorted(set(shown_roles)), key=shown_roles.count) if shown_roles else ""  # not noted

    gb = 1e9
    heights = np.zeros((len(stacks), len(mappings)))
    for j, m in enumerate(mappings):
        for i, t in enumerate(chosen):
            heights[i, j] = per.get((m, t), 0.0) / gb
        if len(stacks) > len(chosen):
            heights[-1, j] = sum(per.get((m, t), 0.0) for t in rest) / gb

    fig = _new_figure(COLUMN_IN, 2.6)
    ax = fig.add_subplot()
    _style_axes(ax)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
    xs = np.arange(len(mappings))
    bottom = np.zeros(len(mappings))
    handles = []
    for i, t in enumerate(stacks):
        colour = OTHER_COLOUR if t == "other" else TENSOR_COLOURS[i % len(TENSOR_COLOURS)]
        ax.bar(xs, heights[i], 0.62, bottom=bottom, color=colour, edgecolor="white", linewidth=0.4, zorder=2)
        bottom += heights[i]
        if t == "other":
            label = f"other ({len(rest)} tensors)"
        else:
            label = t if roles[t] in ("", common) else f"{t} ({roles[t]})"
        handles.append(Patch(facecolor=colour, edgecolor="white", linewidth=0.4, label=label))
    peak = bottom.max() if bottom.max() > 0 else 1.0
    for x, h in zip(xs, bottom):
        ax.text(x, h + peak * 0.015, f"{h:.3g}", ha="center", va="bottom", fontsize=NOTE_PT, zorder=4)
    ax.set_xticks(xs, mappings)
    ax.set_xlim(-0.6, len(mappings) - 0.4)
    ax.set_ylim(0, peak * 1.12)
    ax.set_ylabel("off-chip traffic (GB)")
    ax.set_xlabel("mapping")
    _title(fig, title)
    ax.legend(
        handles=handles[::-1],  # top of the stack first
        title="tensor",
        title_fontsize=LEGEND_PT - 0.5,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=LEGEND_PT - 0.5,
        frameon=False,
        handlelength=1.0,
        handletextpad=0.4,
        labelspacing=0.3,
        alignment="left",
    )
    _fit_xticklabels(fig, ax)
    return fig


# ----------------------------------------------------------------------------------------------
# 6. latency breakdown
# ----------------------------------------------------------------------------------------------


def latency_breakdown_figure(df: pd.DataFrame, *, title: str) -> Figure:
    """Horizontal stacked bars of each design's latency split by Einsum, coloured by kind.

    ``df`` has columns ``design``, ``einsum``, ``kind`` and ``final_latency_s`` (seconds,
    non-negative; an Einsum fused into another may have 0). Designs are drawn top to bottom
    in order of appearance, Einsums left to right in order of appearance; a segment is named
    when the name fits.
    """
    what = "latency breakdown figure"
    data = _table(df, ("design", "einsum", "kind", "final_latency_s"), what)
    lat = _numbers(data, "final_latency_s", what, ("design", "einsum"), nonnegative=True)
    design_col, names, kinds = (_labels(data, c, what) for c in ("design", "einsum", "kind"))
    designs = _ordered(design_col)
    totals = {d: sum(v for dd, v in zip(design_col, lat) if dd == d) for d in designs}
    longest = max(totals.values())
    if longest <= 0:
        raise MambalayaError(f"{what}: every latency is zero; there is nothing to plot")
    unit, scale = _time_unit(longest)

    fig = _new_figure(COLUMN_IN, 1.15 + 0.36 * len(designs))
    ax = fig.add_subplot()
    _style_axes(ax)
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
        ax.text(left + longest / scale * 0.01, row, _fmt_time(totals[d], unit, scale), ha="left", va="center",
                fontsize=NOTE_PT, zorder=4)  # fmt: skip
    ax.set_yticks(range(len(designs)), designs)
    ax.set_ylim(len(designs) - 0.4, -0.6)
    ax.set_xlim(0, longest / scale * 1.16)
    ax.set_xlabel(f"latency ({unit})")
    _title(fig, title)
    _legend_below(fig, _kind_handles(kinds))

    fig.draw_without_rendering()
    pos = ax.get_position()
    per_in = (ax.get_xlim()[1] - ax.get_xlim()[0]) / (pos.width * fig.get_figwidth())
    for row, left, width, n in segments:
        if _text_width(n, NAME_PT) + 0.03 <= width / per_in:
            ax.text(left + width / 2, row, n, ha="center", va="center", fontsize=NAME_PT, zorder=4)
    return fig


# ----------------------------------------------------------------------------------------------
# saving
# ----------------------------------------------------------------------------------------------


def save_figure(fig: Figure, base_path: str | os.PathLike[str]) -> list[Path]:
    """Write ``fig`` to ``<base_path>.png`` (150 dpi) and ``<base_path>.svg`` (text kept as
    text), creating parent directories; return both paths. A ``.png``/``.svg``/``.pdf`` suffix
    on ``base_path`` is dropped; any other dot stays part of the name."""
    if not isinstance(fig, Figure):
        raise MambalayaError(f"save_figure: expected a matplotlib Figure, got {type(fig).__name__}")
    base = Path(base_path)
    if base.suffix.lower() in IMAGE_SUFFIXES:
        base = base.with_suffix("")
    if not base.name:
        raise MambalayaError(f"save_figure: {os.fspath(base_path)!r} has no file name")
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MambalayaError(f"save_figure: cannot create directory {str(base.parent)!r}: {err}") from err
    png = base.with_name(base.name + ".png")
    svg = base.with_name(base.name + ".svg")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mambalaya"}):
        fig.savefig(png, format="png", dpi=PNG_DPI)
        fig.savefig(svg, format="svg", metadata={"Date": None})
    return [png, svg]
