"""Is each Einsum bound by compute or by memory, unfused and fused? The roofline (Figure 2a)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch
from matplotlib.ticker import LogLocator

from mambalaya.report.figures.checks import labels, numbers, ordered, positive_scalar, checked_table
from mambalaya.report.figures.placement import overlap, Placer
from mambalaya.report.figures.style import (
    COLUMN_IN,
    NOTE_PT,
    kind_handles,
    legend_below,
    new_figure,
    style_axes,
    figure_title,
    kind_colour,
)
from mambalaya.report.style import text_width_in


#: Marker per roofline series, in order of appearance.
SERIES_MARKERS: tuple[str, ...] = ("o", "^", "s", "D", "v", "P", "X")


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
    df = checked_table(points, cols, what)
    peak2d = positive_scalar(peak_ops_per_s, "peak_ops_per_s", what)
    peak1d = positive_scalar(peak_elementwise_ops_per_s, "peak_elementwise_ops_per_s", what)
    bw = positive_scalar(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", what)
    keys = ("einsum", "series")
    log_hint = " (a log-log plot cannot show zero; leave such Einsums out)"
    x = numbers(df, "intensity_ops_per_byte", what, keys, positive=True, hint=log_hint)
    y = numbers(df, "performance_ops_per_s", what, keys, positive=True, hint=log_hint)
    names, kinds, series = (labels(df, c, what) for c in ("einsum", "kind", "series"))
    order = ordered(series)
    origin = next((s for s in order if s.casefold() == "unfused"), order[0])
    order = [origin] + [s for s in order if s != origin]

    fig = new_figure(COLUMN_IN, 3.45)
    ax = fig.add_subplot()
    style_axes(ax)
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
    handles += kind_handles(kinds)
    figure_title(fig, title)
    legend_below(fig, handles)

    # Now that the layout is fixed, place the roof labels, then the Einsum labels.
    fig.draw_without_rendering()
    placer = Placer(ax)
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


def _fmt_rate(value: float, unit: str) -> str:
    """``value`` with an SI prefix: 2.29e14 ops/s -> '229 Tops/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _roof_labels(ax, placer: Placer, bw: float, peak2d: float, peak1d: float) -> None:
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
    length = text_width_in(label, NOTE_PT) * placer.fig.dpi
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
            cost = sum(placer.cost(q) + placer.MARKERS * overlap(q, crowd) for q in squares)
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
