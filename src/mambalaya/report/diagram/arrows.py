"""How each read is drawn in the cascade diagram: its arrow's path from port to port through the
layers it crosses, and its label, placed where it overlaps no other label."""

from __future__ import annotations

from typing import Mapping

from matplotlib.patches import FancyArrowPatch
from matplotlib.path import Path as MplPath

from mambalaya.einsum.cascade import Cascade
from mambalaya.report.diagram.graph import graph_edges
from mambalaya.report.diagram.layout import LABEL_PT, Layout, position_at
from mambalaya.report.style import text_width_in


def edge_points(layout: Layout, origin) -> dict[tuple[str, str], list[tuple[float, float]]]:
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
        out[key] = [position_at(origin, p) for p in pts]
    return out


def _port(centre: tuple[float, float], i: int, n: int, width: float, dy: float) -> tuple[float, float]:
    span = min(width * 0.7, (n - 1) * 0.2)
    x = centre[0] - span / 2 + (span * i / (n - 1) if n > 1 else 0.0)
    return x, centre[1] + dy


def edge_path(points: list[tuple[float, float]]) -> MplPath:
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


def draw_edges(ax, cascade: Cascade, layout: Layout, origin, labels: Mapping[tuple[str, str], str]):
    """Draw the edges; return (x, y, text) of each edge label, placed so labels do not overlap."""
    initial = {(e.tensor, e.consumer) for e in graph_edges(cascade) if e.initial}
    spots: list[tuple[float, float, str]] = []
    taken: list[tuple[float, float, float, float]] = []
    for key, pts in edge_points(layout, origin).items():
        dashed = key in initial
        ax.add_patch(
            FancyArrowPatch(
                path=edge_path(pts),
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
    w = text_width_in(text, LABEL_PT) + 0.1
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


def draw_labels(ax, spots: list[tuple[float, float, str]]) -> None:
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
