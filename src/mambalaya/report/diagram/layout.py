"""Where each box of the cascade diagram goes, in inches, without graphviz: tensors are layered by
the longest path from the inputs, long edges get a virtual node in every layer they cross,
barycentre sweeps order each layer, and x positions are pulled towards their neighbours while
keeping each layer's order and spacing (an isotonic regression per layer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from mambalaya.einsum.cascade import Cascade
from mambalaya.report.diagram.graph import Edge, box_lines, weight_lines, graph_edges, graph_nodes, weight_reads
from mambalaya.report.style import text_width_in


# Geometry, in inches.
BOX_H = 0.74  # tensor box height
LAYER_GAP = 0.62  # vertical gap between layers (edges and their labels live here)
BOX_GAP = 0.32  # horizontal gap between boxes of a layer
DUMMY_W = 0.10  # slot of a long edge crossing a layer
WEIGHT_GAP = 0.06  # between stacked weights
WEIGHT_ARROW = 0.16  # between a box and its weights (room for the arrow)
LOOP_W = 0.55  # room left of a recurrent box for its loop
MARGIN = 0.3

# Font sizes, in points.
HEADER_PT, NAME_PT, DETAIL_PT = 6.5, 10.0, 7.5
WEIGHT_NAME_PT, WEIGHT_DETAIL_PT = 6.5, 6.0
LABEL_PT, LEGEND_PT, TITLE_PT = 7.0, 8.0, 11.0


def _box_size(cascade: Cascade, nodes: tuple[str, ...]) -> tuple[float, float]:
    widest = 0.0
    for n in nodes:
        header, name, ranks, shape = box_lines(cascade, n)
        widest = max(
            widest,
            text_width_in(header, HEADER_PT, style="italic"),
            text_width_in(name, NAME_PT, weight="bold"),
            text_width_in(ranks, DETAIL_PT),
            text_width_in(shape, DETAIL_PT),
        )
    return max(0.9, widest + 0.2), BOX_H


def _weight_box_size(cascade: Cascade, weights: set[str]) -> tuple[float, float]:
    widest = 0.0
    for w in weights:
        top, bottom = weight_lines(cascade, w)
        widest = max(
            widest, text_width_in(top, WEIGHT_NAME_PT, weight="bold"), text_width_in(bottom, WEIGHT_DETAIL_PT)
        )
    return widest + 0.12, 0.30


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


def position_at(origin: tuple[float, float], point: tuple[float, float]) -> tuple[float, float]:
    return origin[0] + point[0], origin[1] + point[1]
