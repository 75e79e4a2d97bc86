"""A cascade drawn as a dataflow graph, in the style of Figure 1 of the Mambalaya paper.

Every tensor that is not a weight is a box showing its name, ranks and shape. The box of a
tensor an Einsum writes stands for that Einsum: it carries the Einsum's number
(:meth:`Cascade.position`) and kind. Data flows top to bottom: an edge runs from each tensor an
Einsum reads to the Einsum's box, dashed when the read is of an initial value (incoming state);
a recurrence is a loop on the left of its box, labelled with the generational rank. Weights
are drawn small and grey beside each Einsum that reads them.

The layout (:func:`layout_cascade`) is computed here, without graphviz: tensors are layered by
the longest path from the inputs (sources sit just above their first reader), long edges get a
virtual node in every layer they cross, a few barycentre sweeps order each layer to reduce
crossings, and x positions are pulled towards the mean of their neighbours while keeping the
order and spacing of each layer (an isotonic regression per layer). Lengths are in inches, so
the figure is sized from the layout and text sizes are real.

Figures are made with :class:`matplotlib.figure.Figure` and the Agg canvas; nothing here
touches pyplot or changes matplotlib's global backend.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Hashable, Mapping

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, PathPatch
from matplotlib.path import Path as MplPath

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import MambalayaError

EdgeKey = tuple[str, str, str]  # (producer Einsum, consumer Einsum, tensor)

#: Box categories in legend order: (face colour, legend text).
CATEGORY_STYLE: dict[str, tuple[str, str]] = {
    "input": ("#c9daf8", "input / incoming state"),
    "gemm": ("#f6b26b", "GEMM with a weight"),
    "recurrent": ("#e88080", "recurrent (scan)"),
    "window": ("#ffe599", "window (causal conv)"),
    "reduction": ("#9fd3cc", "reduction"),
    "elementwise": ("#b6d7a8", "elementwise / broadcast / copy"),
    "unary": ("#c5b6e3", "unary / nonlinear"),
    "weight": ("#eeeeee", "weight"),
}

_KIND_CATEGORY = {
    "recurrent": "recurrent",
    "window": "window",
    "gemm": "gemm",
    "reduction": "reduction",
    "unary": "unary",
    "broadcast": "elementwise",
    "elementwise": "elementwise",
    "copy": "elementwise",
}

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

# Geometry, in inches.
BOX_H = 0.74  # tensor box height
LAYER_GAP = 0.62  # vertical gap between layers (edges and their labels live here)
BOX_GAP = 0.32  # horizontal gap between boxes of a layer
DUMMY_W = 0.10  # slot of a long edge crossing a layer
WEIGHT_GAP = 0.06  # between stacked weights
WEIGHT_ARROW = 0.16  # between a box and its weights (room for the arrow)
LOOP_W = 0.55  # room left of a recurrent box for its loop
MARGIN = 0.3
PNG_DPI = 150

# Font sizes, in points.
HEADER_PT, NAME_PT, DETAIL_PT = 6.5, 10.0, 7.5
WEIGHT_NAME_PT, WEIGHT_DETAIL_PT = 6.5, 6.0
LABEL_PT, LEGEND_PT, TITLE_PT = 7.0, 8.0, 11.0


# ----------------------------------------------------------------------------------------------
# what is drawn
# ----------------------------------------------------------------------------------------------


def tensor_category(cascade: Cascade, tensor: str) -> str:
    """The colour category of a tensor's box (a key of :data:`CATEGORY_STYLE`).

    Weights are ``weight``; tensors no Einsum writes (inputs, incoming state) are ``input``;
    a tensor an Einsum writes takes the category of that Einsum's kind.
    """
    spec = cascade.tensors[tensor]
    if spec.role == Role.WEIGHT:
        return "weight"
    producer = cascade.producer(tensor)
    if producer is None:
        return "input"
    return _KIND_CATEGORY[cascade.kind(producer)]


@dataclass(frozen=True)
class Edge:
    """``consumer`` (an Einsum) reads ``tensor``; ``initial`` if it reads it as an initial value."""

    tensor: str
    consumer: str
    initial: bool = False


def _is_weight(cascade: Cascade, tensor: str) -> bool:
    return cascade.tensors[tensor].role == Role.WEIGHT


def graph_nodes(cascade: Cascade) -> tuple[str, ...]:
    """The boxes of the graph: tensors no Einsum writes first, then the Einsums in order."""
    externals = tuple(t for t in cascade.external_tensors() if not _is_weight(cascade, t))
    return externals + tuple(e.name for e in cascade.einsums)


def graph_edges(cascade: Cascade) -> tuple[Edge, ...]:
    """Reads of non-weight tensors, plain then initial-value, in Einsum order."""
    out: list[Edge] = []
    for e in cascade.einsums:
        plain = [t for t in e.input_tensors if t != e.name and not _is_weight(cascade, t)]
        out += [Edge(t, e.name) for t in plain]
        out += [
            Edge(t, e.name, initial=True)
            for t in cascade.initial_reads(e)
            if t not in plain and not _is_weight(cascade, t)
        ]
    return tuple(out)


def weight_reads(cascade: Cascade) -> dict[str, tuple[str, ...]]:
    """Einsum name -> the weights it reads, in the order they appear."""
    return {
        e.name: tuple(t for t in e.input_tensors if _is_weight(cascade, t))
        for e in cascade.einsums
        if any(_is_weight(cascade, t) for t in e.input_tensors)
    }


def _box_lines(cascade: Cascade, tensor: str) -> tuple[str, str, str, str]:
    """(header, name, ranks, shape) of a tensor's box."""
    spec = cascade.tensors[tensor]
    producer = cascade.producer(tensor)
    if producer is not None:
        header = f"{cascade.position(tensor)} · {cascade.kind(producer)}"
    else:
        header = "state in" if spec.role == Role.STATE else spec.role.value
    return header, tensor, _ranks_text(spec.ranks), _shape_text(cascade.shape(tensor))


def _ranks_text(ranks: tuple[str, ...]) -> str:
    return "[" + ",".join(ranks) + "]"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "×".join(str(s) for s in shape) if shape else "scalar"


def _is_output(cascade: Cascade, tensor: str) -> bool:
    return tensor in cascade.output_tensors()


@lru_cache(maxsize=4096)
def _text_width(text: str, size: float, weight: str = "normal", style: str = "normal") -> float:
    """Width of a one-line text in inches, measured with the Agg renderer."""
    renderer = RendererAgg(8, 8, 72)
    prop = FontProperties(size=size, weight=weight, style=style)
    width, _, _ = renderer.get_text_width_height_descent(text, prop, ismath=False)
    return float(width) / 72.0


def _box_size(cascade: Cascade, nodes: tuple[str, ...]) -> tuple[float, float]:
    widest = 0.0
    for n in nodes:
        header, name, ranks, shape = _box_lines(cascade, n)
        widest = max(
            widest,
            _text_width(header, HEADER_PT, style="italic"),
            _text_width(name, NAME_PT, weight="bold"),
            _text_width(ranks, DETAIL_PT),
            _text_width(shape, DETAIL_PT),
        )
    return max(0.9, widest + 0.2), BOX_H


def _weight_lines(cascade: Cascade, weight: str) -> tuple[str, str]:
    return f"{weight} {_ranks_text(cascade.tensors[weight].ranks)}", _shape_text(cascade.shape(weight))


def _weight_box_size(cascade: Cascade, weights: set[str]) -> tuple[float, float]:
    widest = 0.0
    for w in weights:
        top, bottom = _weight_lines(cascade, w)
        widest = max(
            widest, _text_width(top, WEIGHT_NAME_PT, weight="bold"), _text_width(bottom, WEIGHT_DETAIL_PT)
        )
    return widest + 0.12, 0.30


# ----------------------------------------------------------------------------------------------
# layout
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where everything goes, in inches, origin at the bottom left of the graph."""

    box: tuple[float, float]  # width, height of a tensor box
    weight_box: tuple[float, float]
    centres: dict[str, tuple[float, float]]  # box centres of the graph nodes
    routes: dict[tuple[str, str], tuple[tuple[float, float], ...]]  # (tensor, consumer) -> x, y of
    # each layer the edge crosses (the centre of its virtual node), empty for adjacent layers
    weights: dict[tuple[str, str], tuple[float, float]]  # (weight, consumer) -> centre
    size: tuple[float, float]


def assign_layers(nodes: tuple[str, ...], edges: tuple[Edge, ...]) -> dict[str, int]:
    """Longest path from the sources; a source then moves down to just above its first reader.

    ``nodes`` must be in topological order.
    """
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for edge in edges:
        preds[edge.consumer].append(edge.tensor)
        succs[edge.tensor].append(edge.consumer)
    layer: dict[str, int] = {}
    for n in nodes:
        layer[n] = 1 + max((layer[p] for p in preds[n]), default=-1)
    for n in nodes:
        if not preds[n] and succs[n]:
            layer[n] = min(layer[s] for s in succs[n]) - 1
    low = min(layer.values(), default=0)
    return {n: v - low for n, v in layer.items()}


def _dummy(edge: Edge, layer: int) -> str:
    return f"~{edge.tensor}>{edge.consumer}@{layer}"  # '~' is never in a tensor name


def _layered_graph(
    nodes: tuple[str, ...], edges: tuple[Edge, ...], layer: dict[str, int]
) -> tuple[list[list[str]], list[tuple[str, str]], dict[Edge, list[str]]]:
    """Layers (with a virtual node per crossed layer of each long edge), adjacent-layer links
    and each edge's chain of nodes."""
    depth = max(layer.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    for n in nodes:
        layers[layer[n]].append(n)
    links: list[tuple[str, str]] = []
    chains: dict[Edge, list[str]] = {}
    for edge in edges:
        top, bottom = layer[edge.tensor], layer[edge.consumer]
        chain = [edge.tensor] + [_dummy(edge, k) for k in range(top + 1, bottom)] + [edge.consumer]
        for k, d in enumerate(chain[1:-1], start=top + 1):
            layers[k].append(d)
        links += list(zip(chain, chain[1:]))
        chains[edge] = chain
    return layers, links, chains


def _crossings(layers: list[list[str]], links: list[tuple[str, str]]) -> int:
    pos = {n: i for layer in layers for i, n in enumerate(layer)}
    depth = {n: k for k, layer in enumerate(layers) for n in layer}
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for a, b in links:
        by_layer.setdefault(depth[a], []).append((pos[a], pos[b]))
    total = 0
    for pairs in by_layer.values():
        for i, (a1, b1) in enumerate(pairs):
            for a2, b2 in pairs[i + 1 :]:
                total += (a1 - a2) * (b1 - b2) < 0
    return total


def order_layers(layers: list[list[str]], links: list[tuple[str, str]], sweeps: int = 12) -> list[list[str]]:
    """Barycentre sweeps (down, then up, ...); the order with fewest crossings wins."""
    ups: dict[str, list[str]] = {}
    downs: dict[str, list[str]] = {}
    for a, b in links:
        downs.setdefault(a, []).append(b)
        ups.setdefault(b, []).append(a)
    current = [list(layer) for layer in layers]
    best, best_count = [list(layer) for layer in current], _crossings(current, links)
    for sweep in range(sweeps):
        downward = sweep % 2 == 0
        indices = range(1, len(current)) if downward else range(len(current) - 2, -1, -1)
        for k in indices:
            ref = current[k - 1] if downward else current[k + 1]
            nbrs = ups if downward else downs
            current[k] = _barycentre_order(current[k], ref, nbrs)
        count = _crossings(current, links)
        if count < best_count:
            best, best_count = [list(layer) for layer in current], count
    return best


def _barycentre_order(layer: list[str], ref: list[str], nbrs: dict[str, list[str]]) -> list[str]:
    where = {n: i for i, n in enumerate(ref)}

    def key(item: tuple[int, str]) -> tuple[float, int]:
        i, n = item
        near = [where[m] for m in nbrs.get(n, ()) if m in where]
        return (sum(near) / len(near) if near else float(i), i)

    return [n for _, n in sorted(enumerate(layer), key=key)]


def _isotonic(targets: list[float], weights: list[float]) -> list[float]:
    """Non-decreasing values closest (weighted least squares) to ``targets``: pool adjacent
    violators."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for t, w in zip(targets, weights):
        blocks.append([t * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, wt, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += c
    out: list[float] = []
    for s, wt, c in blocks:
        out += [s / wt] * int(c)
    return out


def _place_row(desired: list[float], separations: list[float], weights: list[float]) -> list[float]:
    """Positions closest to ``desired`` with consecutive ones at least ``separations`` apart."""
    offsets = [0.0]
    for s in separations:
        offsets.append(offsets[-1] + s)
    shifted = _isotonic([d - o for d, o in zip(desired, offsets)], weights)
    return [y + o for y, o in zip(shifted, offsets)]


def assign_x(
    layers: list[list[str]],
    links: list[tuple[str, str]],
    extent: Mapping[str, tuple[float, float]],
    rounds: int = 40,
) -> dict[str, float]:
    """x of each node: repeatedly pull nodes towards the mean x of their neighbours (down,
    up, then both), keeping each layer's order and spacing. ``extent`` is (left, right) of
    each node from its x."""
    ups: dict[str, list[tuple[str, float]]] = {}
    downs: dict[str, list[tuple[str, float]]] = {}
    for a, b in links:
        w = 1.0 + 3.0 * a.startswith("~") + 3.0 * b.startswith("~")  # keep long edges straight
        downs.setdefault(a, []).append((b, w))
        ups.setdefault(b, []).append((a, w))
    x: dict[str, float] = {}
    seps: list[list[float]] = []
    for layer in layers:
        gaps = [_separation(a, b, extent) for a, b in zip(layer, layer[1:])]
        seps.append(gaps)
        x.update(zip(layer, _place_row([0.0] * len(layer), gaps, [1.0] * len(layer))))
    for r in range(rounds):
        use = (ups,) if r % 3 == 0 else (downs,) if r % 3 == 1 else (ups, downs)
        order = range(len(layers)) if r % 3 != 1 else range(len(layers) - 1, -1, -1)
        for k in order:
            layer = layers[k]
            desired = [_pull(n, x, use) for n in layer]
            weights = [0.5 if n.startswith("~") else 1.0 for n in layer]
            x.update(zip(layer, _place_row(desired, seps[k], weights)))
    return x


def _separation(a: str, b: str, extent: Mapping[str, tuple[float, float]]) -> float:
    gap = BOX_GAP if not (a.startswith("~") and b.startswith("~")) else DUMMY_W
    return extent[a][1] + gap + extent[b][0]


def _pull(n: str, x: dict[str, float], tables: tuple[dict[str, list[tuple[str, float]]], ...]) -> float:
    near = [(x[m], w) for table in tables for m, w in table.get(n, ())]
    if not near:
        return x[n]
    return sum(v * w for v, w in near) / sum(w for _, w in near)


def _weight_columns(count: int, weight_box: tuple[float, float]) -> tuple[int, int]:
    """(columns, rows per column) of a stack of ``count`` weights beside a box."""
    per_column = max(1, int((BOX_H + WEIGHT_GAP) // (weight_box[1] + WEIGHT_GAP)))
    return math.ceil(count / per_column), per_column


def compute_layout(cascade: Cascade, *, show_weights: bool = True) -> Layout:
    """The full layout: boxes, long-edge waypoints and weight boxes."""
    nodes = graph_nodes(cascade)
    edges = graph_edges(cascade)
    box = _box_size(cascade, nodes)
    reads = weight_reads(cascade) if show_weights else {}
    weight_box = _weight_box_size(cascade, {w for ws in reads.values() for w in ws})
    layer = assign_layers(nodes, edges)
    layers, links, chains = _layered_graph(nodes, edges, layer)
    layers = order_layers(layers, links)

    extent = {n: _extent(cascade, n, box, reads, weight_box) for row in layers for n in row}
    x = assign_x(layers, links, extent)
    low = min(x[n] - extent[n][0] for n in x)
    high = max(x[n] + extent[n][1] for n in x)
    depth = len(layers)
    height = depth * BOX_H + max(depth - 1, 0) * LAYER_GAP

    def y_of(n: str) -> float:
        k = next(i for i, row in enumerate(layers) if n in row)
        return height - BOX_H / 2 - k * (BOX_H + LAYER_GAP)

    ys = {n: y_of(n) for n in x}
    centres = {n: (x[n] - low, ys[n]) for n in nodes}
    routes = {
        (edge.tensor, edge.consumer): tuple((x[d] - low, ys[d]) for d in chain[1:-1])
        for edge, chain in chains.items()
    }
    weights = _weight_centres(reads, centres, box, weight_box)
    return Layout(box, weight_box, centres, routes, weights, (high - low, height))


def _extent(
    cascade: Cascade,
    node: str,
    box: tuple[float, float],
    reads: Mapping[str, tuple[str, ...]],
    weight_box: tuple[float, float],
) -> tuple[float, float]:
    """How far a node reaches left and right of its x: a recurrent box has its loop on the
    left, an Einsum reading weights has them on the right."""
    if node.startswith("~"):
        return DUMMY_W / 2, DUMMY_W / 2
    producer = cascade.producer(node)
    left = box[0] / 2 + (LOOP_W if producer is not None and cascade.recurrence(producer) else 0.0)
    right = box[0] / 2
    if reads.get(node):
        columns = _weight_columns(len(reads[node]), weight_box)[0]
        right += WEIGHT_ARROW - WEIGHT_GAP + columns * (WEIGHT_GAP + weight_box[0])
    return left, right


def _weight_centres(
    reads: Mapping[str, tuple[str, ...]],
    centres: Mapping[str, tuple[float, float]],
    box: tuple[float, float],
    weight_box: tuple[float, float],
) -> dict[tuple[str, str], tuple[float, float]]:
    out: dict[tuple[str, str], tuple[float, float]] = {}
    ww, wh = weight_box
    for consumer, ws in reads.items():
        cx, cy = centres[consumer]
        _, per_column = _weight_columns(len(ws), weight_box)
        for i, w in enumerate(ws):
            col, row = divmod(i, per_column)
            in_column = min(per_column, len(ws) - col * per_column)
            top = cy + (in_column * wh + (in_column - 1) * WEIGHT_GAP) / 2
            x = cx + box[0] / 2 + WEIGHT_ARROW + ww / 2 + col * (ww + WEIGHT_GAP)
            out[(w, consumer)] = (x, top - wh / 2 - row * (wh + WEIGHT_GAP))
    return out


def layout_cascade(cascade: Cascade, *, show_weights: bool = True) -> dict[str, tuple[float, float]]:
    """Centre (x, y), in inches, of the box of every non-weight tensor.

    Data flows downwards: a tensor's box is strictly above the boxes of the Einsums reading it.
    """
    return dict(compute_layout(cascade, show_weights=show_weights).centres)


# ----------------------------------------------------------------------------------------------
# drawing
# ----------------------------------------------------------------------------------------------


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
    label_spots = _draw_edges(ax, cascade, layout, origin, labels)
    _draw_boxes(ax, cascade, layout, origin)
    _draw_weights(ax, cascade, layout, origin, labels)
    _draw_recurrences(ax, cascade, layout, origin)
    _draw_labels(ax, label_spots)
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
        handles.append(Patch(facecolor=colour, alpha=0.3, edgecolor=colour, label=f"fusion group {g}"))
    return handles


def _blank_figure(layout: Layout, heading: str, handles: list):
    """A figure whose data units are inches; returns it, its axes and the graph's origin."""
    gw, gh = layout.size
    entry_w = max(_text_width(h.get_label(), LEGEND_PT) for h in handles) + 0.75
    title_w = _text_width(heading, TITLE_PT, weight="bold") + 2 * MARGIN if heading else 0.0
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


def _at(origin: tuple[float, float], point: tuple[float, float]) -> tuple[float, float]:
    return origin[0] + point[0], origin[1] + point[1]


def _draw_boxes(ax, cascade: Cascade, layout: Layout, origin) -> None:
    w, h = layout.box
    for n, centre in layout.centres.items():
        x, y = _at(origin, centre)
        colour = CATEGORY_STYLE[tensor_category(cascade, n)][0]
        output = _is_output(cascade, n)
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
        header, name, ranks, shape = _box_lines(cascade, n)
        text = {"ha": "center", "va": "center", "zorder": 4}
        ax.text(x, y + h / 2 - 0.1, header, fontsize=HEADER_PT, style="italic", color="#333333", **text)
        ax.text(x, y + 0.05, name, fontsize=NAME_PT, fontweight="bold", **text)
        ax.text(x, y - 0.14, ranks, fontsize=DETAIL_PT, **text)
        ax.text(x, y - 0.27, shape, fontsize=DETAIL_PT, color="#222222", **text)


def _draw_weights(ax, cascade: Cascade, layout: Layout, origin, labels: Mapping[tuple[str, str], str]) -> None:
    ww, wh = layout.weight_box
    bw = layout.box[0]
    for (weight, consumer), centre in layout.weights.items():
        x, y = _at(origin, centre)
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
        top, bottom = _weight_lines(cascade, weight)
        text = {"ha": "center", "va": "center", "zorder": 4}
        ax.text(x, y + 0.06, top, fontsize=WEIGHT_NAME_PT, fontweight="bold", color="#555555", **text)
        ax.text(x, y - 0.07, bottom, fontsize=WEIGHT_DETAIL_PT, color="#666666", **text)
        cx, cy = _at(origin, layout.centres[consumer])
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
        x, y = _at(origin, layout.centres[e.name])
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


def _edge_points(layout: Layout, origin) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Each edge as points: the source port, top and bottom of each crossed layer, the target port."""
    w, h = layout.box
    outgoing: dict[str, list[tuple[float, tuple[str, str]]]] = {}
    incoming: dict[str, list[tuple[float, tuple[str, str]]]] = {}
    for (t, c), waypoints in layout.routes.items():
        first = waypoints[0][0] if waypoints else layout.centres[c][0]
        last = waypoints[-1][0] if waypoints else layout.centres[t][0]
        outgoing.setdefault(t, []).append((first, (t, c)))
        incoming.setdefault(c, []).append((last, (t, c)))
    start = {
        key: _port(layout.centres[key[0]], i, len(v), w, -h / 2)
        for v in outgoing.values()
        for i, (_, key) in enumerate(sorted(v))
    }
    end = {
        key: _port(layout.centres[key[1]], i, len(v), w, h / 2)
        for v in incoming.values()
        for i, (_, key) in enumerate(sorted(v))
    }
    out = {}
    for key, waypoints in layout.routes.items():
        pts = [start[key]]
        for x, y in waypoints:
            pts += [(x, y + h / 2), (x, y - h / 2)]
        pts.append(end[key])
        out[key] = [_at(origin, p) for p in pts]
    return out


def _port(centre: tuple[float, float], i: int, n: int, width: float, dy: float) -> tuple[float, float]:
    span = min(width * 0.7, (n - 1) * 0.2)
    x = centre[0] - span / 2 + (span * i / (n - 1) if n > 1 else 0.0)
    return x, centre[1] + dy


def _edge_path(points: list[tuple[float, float]]) -> MplPath:
    """Vertical-tangent curves across the gaps between layers, straight lines through layers."""
    verts = [points[0]]
    codes = [MplPath.MOVETO]
    for k, (a, b) in enumerate(zip(points, points[1:])):
        if k % 2 == 0:  # a gap between layers
            mid = (a[1] + b[1]) / 2
            verts += [(a[0], mid), (b[0], mid), b]
            codes += [MplPath.CURVE4] * 3
        else:  # through a layer, in a long edge's slot
            verts.append(b)
            codes.append(MplPath.LINETO)
    return MplPath(verts, codes)


def _bezier(a: tuple[float, float], b: tuple[float, float], t: float) -> tuple[float, float]:
    mid = (a[1] + b[1]) / 2
    ctrl = [a, (a[0], mid), (b[0], mid), b]
    coef = [(1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t**2, t**3]
    return sum(c * p[0] for c, p in zip(coef, ctrl)), sum(c * p[1] for c, p in zip(coef, ctrl))


def _draw_edges(ax, cascade: Cascade, layout: Layout, origin, labels: Mapping[tuple[str, str], str]):
    """Draw the edges; return (x, y, text) of each edge label, placed so labels do not overlap."""
    initial = {(e.tensor, e.consumer) for e in graph_edges(cascade) if e.initial}
    spots: list[tuple[float, float, str]] = []
    taken: list[tuple[float, float, float, float]] = []
    for key, pts in _edge_points(layout, origin).items():
        dashed = key in initial
        ax.add_patch(
            FancyArrowPatch(
                path=_edge_path(pts),
                arrowstyle="-|>,head_length=0.35,head_width=0.15",
                mutation_scale=10,
                color="#1f4e99" if dashed else "#333333",
                linewidth=1.1,
                linestyle=(0, (4, 2.5)) if dashed else "solid",
                zorder=2,
            )
        )
        if key in labels:
            spots.append(_label_spot(pts[-2], pts[-1], labels[key], taken))
    return spots


def _label_spot(a, b, text: str, taken: list[tuple[float, float, float, float]]) -> tuple[float, float, str]:
    w = _text_width(text, LABEL_PT) + 0.1
    h = LABEL_PT / 72 + 0.08
    for t in (0.65, 0.45, 0.28, 0.55, 0.36):  # near the arrow head first, where edges are apart
        x, y = _bezier(a, b, t)
        rect = (x - w / 2, y - h / 2, x + w / 2, y + h / 2)
        if not any(_overlap(rect, r) for r in taken):
            break
    taken.append(rect)
    return x, y, text


def _overlap(r1, r2) -> bool:
    return r1[0] < r2[2] and r2[0] < r1[2] and r1[1] < r2[3] and r2[1] < r1[3]


def _draw_labels(ax, spots: list[tuple[float, float, str]]) -> None:
    for x, y, text in spots:
        ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=LABEL_PT,
            fontweight="bold",
            color="#7a2e00",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "#c98a5c", "linewidth": 0.6},
            zorder=6,
        )


def _draw_groups(ax, cascade: Cascade, layout: Layout, origin, group_of: Mapping[str, Hashable]) -> None:
    if not group_of:
        return
    colours = _group_colours(group_of)
    w, h = layout.box
    pad = 0.08
    for (t, c), pts in _edge_points(layout, origin).items():
        if t in group_of and group_of.get(c) == group_of[t]:
            band = PathPatch(_edge_path(pts), facecolor="none", edgecolor=colours[group_of[c]], linewidth=9)
            band.set(alpha=0.25, capstyle="round", zorder=1)
            ax.add_patch(band)
    for name, g in group_of.items():
        x, y = _at(origin, layout.centres[name])
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
