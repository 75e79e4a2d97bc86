"""Where does a label go without hiding data? Greedy placement in display pixels, used for the
names of the roofline's points and the published-value labels of the speedup figure."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from mambalaya.report.figures.style import NAME_PT
from mambalaya.report.style import text_width_in


def overlap(rect: Sequence[float], boxes: np.ndarray) -> float:
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


class Placer:
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
        inside = overlap(rect, np.array([self.frame]))
        return (
            self.LABELS * overlap(rect, self.labels)
            + self.MARKERS * overlap(rect, self.markers)
            + self.LINES * overlap(rect, self.lines)
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
        w = text_width_in(text, NAME_PT) * self.fig.dpi
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
