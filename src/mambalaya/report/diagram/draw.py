"""The cascade diagram drawn and saved: boxes, weights, recurrences, fusion groups, legend and
title on a figure sized from the layout (Agg canvas; nothing here touches pyplot)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Hashable, Mapping

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, PathPatch

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import MambalayaError
from mambalaya.report.diagram.arrows import draw_edges, draw_labels, edge_path, edge_points
from mambalaya.report.diagram.graph import (
    EdgeKey,
    box_lines,
    is_output,
    weight_lines,
    graph_edges,
    tensor_category,
    weight_reads,
)
from mambalaya.report.diagram.layout import (
    DETAIL_PT,
    HEADER_PT,
    LABEL_PT,
    LEGEND_PT,
    MARGIN,
    NAME_PT,
    TITLE_PT,
    WEIGHT_ARROW,
    WEIGHT_DETAIL_PT,
    WEIGHT_NAME_PT,
    Layout,
    position_at,
    compute_layout,
)
from mambalaya.report.style import CATEGORY_STYLE, PNG_DPI, text_width_in


#: Outline colours of fusion groups (cycled).
GROUP_COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
SAVE_FORMATS: tuple[str, ...] = ("svg", "png", "pdf")


def draw_cascade(
    cascade: Cascade,
    path: str | os.PathLike[str] | None = None,
    *,
    edge_labels: Mapping[EdgeKey, str] | None = None,
    groups: Mapping[str, Hashable] | None = None,
    title: str | None = None,
    show_weights: bool = True,
) -> Figure:
    """Draw ``cascade`` as a dataflow graph; save it to ``path`` (.svg, .png or .pdf) if given.

    ``edge_labels`` maps (producer Einsum, consumer Einsum, tensor) to a text drawn on that
    edge; the producer of a tensor no Einsum writes is ``None`` (its own name is accepted too).
    ``groups`` maps Einsum names to a group id: each group's boxes get a coloured halo and the
    edges inside a group a coloured band. ``title`` defaults to the cascade's description;
    pass ``""`` for none.
    """
    fmt = _save_format(path) if path is not None else None
    labels = _check_edge_labels(cascade, edge_labels or {}, show_weights)
    group_of = _check_groups(cascade, groups or {})
    layout = compute_layout(cascade, show_weights=show_weights)
    heading = (cascade.description or cascade.name) if title is None else title
    handles = _legend_handles(cascade, layout, group_of)
    fig, ax, origin = _blank_figure(layout, heading, handles)
    _draw_groups(ax, cascade, layout, origin, group_of)
    label_spots = draw_edges(ax, cascade, layout, origin, labels)
    _draw_boxes(ax, cascade, layout, origin)
    _draw_weights(ax, cascade, layout, origin, labels)
    _draw_recurrences(ax, cascade, layout, origin)
    draw_labels(ax, label_spots)
    if path is not None:
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # keep text as text in SVG
            fig.savefig(path, format=fmt, dpi=PNG_DPI if fmt == "png" else "figure")
    return fig


def _save_format(path: str | os.PathLike[str]) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in SAVE_FORMATS:
        shown = f"'.{suffix}'" if suffix else "no extension"
        raise MambalayaError(
            f"cannot save the cascade diagram to {os.fspath(path)!r}: {shown} is not a supported format; "
            f"use one of {', '.join('.' + f for f in SAVE_FORMATS)}"
        )
    return suffix


def _check_edge_labels(
    cascade: Cascade, labels: Mapping[EdgeKey, str], show_weights: bool
) -> dict[tuple[str, str], str]:
    """(tensor, consumer) -> label, after checking each key names an edge of the cascade."""
    reads = {(edge.tensor, edge.consumer) for edge in graph_edges(cascade)}
    weight_edges = {(w, c) for c, ws in weight_reads(cascade).items() for w in ws}
    out: dict[tuple[str, str], str] = {}
    for key, text in labels.items():
        producer, consumer, tensor = key
        made_by = cascade.producer(tensor) if tensor in cascade.tensors else None
        expected = (made_by.name,) if made_by is not None else (None, "", tensor)
        if (tensor, consumer) not in reads | weight_edges or producer not in expected:
            raise MambalayaError(
                f"edge label {key!r}: cascade {cascade.name!r} has no edge where Einsum {consumer!r} reads "
                f"tensor {tensor!r} produced by {producer!r}; keys are (producer Einsum, consumer Einsum, "
                "tensor), with producer None for a tensor no Einsum writes"
            )
        if (tensor, consumer) in weight_edges and not show_weights:
            continue
        out[(tensor, consumer)] = str(text)
    return out


def _check_groups(cascade: Cascade, groups: Mapping[str, Hashable]) -> dict[str, Hashable]:
    names = {e.name for e in cascade.einsums}
    unknown = [g for g in groups if g not in names]
    if unknown:
        raise MambalayaError(
            f"groups name {', '.join(map(repr, unknown))}, which {'is' if len(unknown) == 1 else 'are'} not "
            f"an Einsum of cascade {cascade.name!r}"
        )
    return dict(groups)


def _group_colours(group_of: Mapping[str, Hashable]) -> dict[Hashable, str]:
    ids = list(dict.fromkeys(group_of.values()))
    try:
        ids = sorted(ids)  # type: ignore[type-var]
    except TypeError:
        pass
    return {g: GROUP_COLORS[i % len(GROUP_COLORS)] for i, g in enumerate(ids)}


def _legend_handles(cascade: Cascade, layout: Layout, group_of: Mapping[str, Hashable]) -> list:
    present = {tensor_category(cascade, n) for n in layout.centres}
    if layout.weights:
        present.add("weight")
    handles: list = [
        Patch(facecolor=colour, edgecolor="#444444", label=text)
        for cat, (colour, text) in CATEGORY_STYLE.items()
        if cat in present
    ]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2.2, label="cascade output"))
    handles.append(Line2D([], [], color="#333333", linewidth=1.1, label="reads"))
    if any(edge.initial for edge in graph_edges(cascade)):
        handles.append(Line2D([], [], color="#1f4e99", linewidth=1.1, linestyle="--", label="reads initial value"))
    if cascade.generational_ranks:
        handles.append(
            Line2D(
                [],
                [],
                color="#a61c00",
                linestyle="none",
                marker=r"$\circlearrowleft$",
                markersize=11,
                label="recurrence over a rank",
            )
        )
    for g, colour in _group_colours(group_of).items():
        handles.append(Patch(facecolor=colour, alpha=0.3, edgecolor=colour, label=f"fusion group {g}"))  # (its name)
    return handles


def _blank_figure(layout: Layout, heading: str, handles: list):
    """A figure whose data units are inches; returns it, its axes and the graph's origin."""
    gw, gh = layout.size
    entry_w = max(text_width_in(h.get_label(), LEGEND_PT) for h in handles) + 0.75
    title_w = text_width_in(heading, TITLE_PT, weight="bold") + 2 * MARGIN if heading else 0.0
    width = max(gw + 2 * MARGIN, title_w, min(len(handles), 4) * entry_w + 2 * MARGIN)
    ncol = max(1, min(len(handles), int((width - 2 * MARGIN) // entry_w)))
    rows = math.ceil(len(handles) / ncol)
    legend_h = rows * 0.22 + 0.2
    title_h = 0.45 if heading else 0.0
    height = gh + 2 * MARGIN + legend_h + title_h
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    top = height - MARGIN / 2
    if heading:
        ax.text(width / 2, top, heading, ha="center", va="top", fontsize=TITLE_PT, fontweight="bold")
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(width / 2, top - title_h),
        bbox_transform=ax.transData,
        ncol=ncol,
        fontsize=LEGEND_PT,
        frameon=True,
        framealpha=1.0,
        edgecolor="#bbbbbb",
        handlelength=2.0,
        columnspacing=1.2,
    )
    return fig, ax, ((width - gw) / 2, MARGIN)


def _draw_boxes(ax, cascade: Cascade, layout: Layout, origin) -> None:
    w, h = layout.box
    for n, centre in layout.centres.items():
        x, y = position_at(origin, centre)
        colour = CATEGORY_STYLE[tensor_category(cascade, n)][0]
        output = is_output(cascade, n)
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2, y - h / 2),
                w,
                h,
                boxstyle="round,pad=0,rounding_size=0.07",
                facecolor=colour,
                edgecolor="black" if output else "#444444",
                linewidth=2.2 if output else 0.9,
                zorder=3,
            )
        )
        header, name, ranks, shape = box_lines(cascade, n)
        text = {"ha": "center", "va": "center", "zorder": 4}
        ax.text(x, y + h / 2 - 0.1, header, fontsize=HEADER_PT, style="italic", color="#333333", **text)
        ax.text(x, y + 0.05, name, fontsize=NAME_PT, fontweight="bold", **text)
        ax.text(x, y - 0.14, ranks, fontsize=DETAIL_PT, **text)
        ax.text(x, y - 0.27, shape, fontsize=DETAIL_PT, color="#222222", **text)


def _draw_weights(ax, cascade: Cascade, layout: Layout, origin, labels: Mapping[tuple[str, str], str]) -> None:
    ww, wh = layout.weight_box
    bw = layout.box[0]
    for (weight, consumer), centre in layout.weights.items():
        x, y = position_at(origin, centre)
        ax.add_patch(
            FancyBboxPatch(
                (x - ww / 2, y - wh / 2),
                ww,
                wh,
                boxstyle="round,pad=0,rounding_size=0.04",
                facecolor=CATEGORY_STYLE["weight"][0],
                edgecolor="#999999",
                linewidth=0.6,
                zorder=3,
            )
        )
        top, bottom = weight_lines(cascade, weight)
        text = {"ha": "center", "va": "center", "zorder": 4}
        ax.text(x, y + 0.06, top, fontsize=WEIGHT_NAME_PT, fontweight="bold", color="#555555", **text)
        ax.text(x, y - 0.07, bottom, fontsize=WEIGHT_DETAIL_PT, color="#666666", **text)
        cx, cy = position_at(origin, layout.centres[consumer])
        if x - ww / 2 - (cx + bw / 2) > WEIGHT_ARROW + 1e-6:
            continue  # a weight in a second column: the first column is in the way of an arrow
        end_y = min(max(y, cy - layout.box[1] / 2 + 0.05), cy + layout.box[1] / 2 - 0.05)
        ax.add_patch(
            FancyArrowPatch(
                (x - ww / 2, y),
                (cx + bw / 2, end_y),
                arrowstyle="-|>,head_length=0.25,head_width=0.12",
                mutation_scale=10,
                color="#999999",
                linewidth=0.7,
                shrinkA=0,
                shrinkB=0,
                zorder=2,
            )
        )
        if (weight, consumer) in labels:
            label = labels[(weight, consumer)]
            ax.text(x, y + wh / 2 + 0.02, label, ha="center", va="bottom", fontsize=LABEL_PT - 1, zorder=6)


def _draw_recurrences(ax, cascade: Cascade, layout: Layout, origin) -> None:
    w, h = layout.box
    for e in cascade.einsums:
        rec = cascade.recurrence(e)
        if rec is None:
            continue
        rank, distance = rec
        x, y = position_at(origin, layout.centres[e.name])
        left = x - w / 2
        ax.add_patch(
            FancyArrowPatch(
                (left, y + h * 0.22),
                (left, y - h * 0.22),
                connectionstyle="arc3,rad=1.6",
                arrowstyle="-|>,head_length=0.35,head_width=0.18",
                mutation_scale=10,
                color="#a61c00",
                linewidth=1.3,
                shrinkA=0,
                shrinkB=0,
                zorder=5,
            )
        )
        ax.text(
            left - 0.3,
            y,
            f"{rank}−{distance}",
            ha="right",
            va="center",
            fontsize=LABEL_PT,
            fontweight="bold",
            color="#a61c00",
            zorder=5,
        )


def _draw_groups(ax, cascade: Cascade, layout: Layout, origin, group_of: Mapping[str, Hashable]) -> None:
    if not group_of:
        return
    colours = _group_colours(group_of)
    w, h = layout.box
    pad = 0.08
    for (t, c), pts in edge_points(layout, origin).items():
        if t in group_of and group_of.get(c) == group_of[t]:
            band = PathPatch(edge_path(pts), facecolor="none", edgecolor=colours[group_of[c]], linewidth=9)
            band.set(alpha=0.25, capstyle="round", zorder=1)
            ax.add_patch(band)
    for name, g in group_of.items():
        x, y = position_at(origin, layout.centres[name])
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2 - pad, y - h / 2 - pad),
                w + 2 * pad,
                h + 2 * pad,
                boxstyle="round,pad=0,rounding_size=0.12",
                facecolor=colours[g],
                edgecolor=colours[g],
                alpha=0.3,
                linewidth=1.5,
                zorder=1,
            )
        )
