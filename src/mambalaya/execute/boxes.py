"""Boxes of tensor indices, ``(start, stop)`` per dimension (half open), and what the tiled
executor does with them: volumes, intersections, differences, slices and copies, the range an
affine index spans, and the tiles of a rank (:mod:`mambalaya.execute.tiled`)."""

from __future__ import annotations

from typing import Mapping as TMapping

import numpy as np

from mambalaya.einsum.ir import AffineIndex


#: A box of tensor indices: ``(start, stop)`` per dimension, half open.
Box = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------------------------
# boxes
# ----------------------------------------------------------------------------------------------


def volume(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def box_empty(box: Box) -> bool:
    return any(b <= a for a, b in box)


def intersect(x: Box, y: Box) -> Box:
    return tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(x, y))


def _subtract(x: Box, y: Box) -> list[Box]:
    """``x`` minus ``y`` as disjoint boxes."""
    if box_empty(x):
        return []
    inter = intersect(x, y)
    if box_empty(inter):
        return [x]
    pieces: list[Box] = []
    rest = list(x)
    for d, ((lo, hi), (ilo, ihi)) in enumerate(zip(x, inter)):
        if lo < ilo:
            pieces.append(tuple(rest[:d]) + ((lo, ilo),) + tuple(rest[d + 1 :]))
        if ihi < hi:
            pieces.append(tuple(rest[:d]) + ((ihi, hi),) + tuple(rest[d + 1 :]))
        rest[d] = (ilo, ihi)
    return pieces


def subtract_all(x: Box, subs: list[Box]) -> list[Box]:
    pieces = [] if box_empty(x) else [x]
    for s in subs:
        pieces = [p for q in pieces for p in _subtract(q, s)]
    return pieces


def slices(region: Box, origin: Box) -> tuple[slice, ...]:
    """Slices of an array covering ``origin`` that select ``region``."""
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(region, origin))


def put_box(dst: np.ndarray, dst_box: Box, src: np.ndarray, src_box: Box, region: Box) -> None:
    if not box_empty(region):
        dst[slices(region, dst_box)] = src[slices(region, src_box)]


def index_range(idx: AffineIndex, ranges: TMapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Half-open range of values of ``idx`` with each variable in its ``[start, stop)``."""
    lo = hi = idx.const
    for v, c in idx.terms:
        a, b = ranges[v]
        lo += min(c * a, c * (b - 1))
        hi += max(c * a, c * (b - 1))
    return lo, hi + 1


def tile_bounds(size: int, tile: int) -> list[tuple[int, int]]:
    return [(a, min(a + tile, size)) for a in range(0, size, tile)]
