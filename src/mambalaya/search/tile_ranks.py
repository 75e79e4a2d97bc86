"""Which ranks a fusion group may tile and the tile sizes each may take: the sizes decide only
which ranks are tileable, the group's structure which ranks every member writes and none
reduces (:mod:`mambalaya.fusion.group_analysis`). Memoised on the (immutable) cascade."""

from __future__ import annotations

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.group_analysis import analyse


def tileable_ranks(cascade: Cascade, einsums: list[str]) -> list[str]:
    """Ranks of more than one element that every Einsum of the group writes and none reduces,
    in loop order. Memoised on the (immutable) cascade: a search asks for every candidate
    group's on every point."""
    memo = cascade.__dict__.setdefault("_tileable_ranks_memo", {})
    key = tuple(einsums)
    if key not in memo:
        memo[key] = tuple(_tileable_ranks(cascade, einsums))
    return list(memo[key])


def _tileable_ranks(cascade: Cascade, einsums: list[str]) -> list[str]:
    return [r for r in _written_unreduced_ranks(cascade, tuple(einsums)) if cascade.size(r) > 1]


def _written_unreduced_ranks(cascade: Cascade, einsums: tuple[str, ...]) -> tuple[str, ...]:
    """Ranks every Einsum of ``einsums`` writes and none reduces, generational ones last
    (:attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.tileable`; the sizes decide only
    which of them are tileable)."""
    return analyse(cascade, einsums).tileable


def widened_ranks(cascade: Cascade, einsums: list[str]) -> list[str]:
    """Ranks of more than one element that some Einsum of the group writes and none reduces,
    generational ones last: what a group may tile when a member lacks a rank (that member then
    runs again in every tile of it, and its reads are re-read: the traffic and cycle models
    count both, and the tiled executor agrees byte for byte). A fixed grouping that fits no
    buffer over :func:`tileable_ranks` tries these (the search keeps to the narrower set: it
    costs every contiguous segment)."""
    return [r for r in analyse(cascade, tuple(einsums)).widened if cascade.size(r) > 1]


def tile_options(size: int) -> list[int]:
    opts = [1 << k for k in range(size.bit_length()) if (1 << k) < size]
    return opts + [size]


def rank_tile_options(cascade: Cascade, rank: str) -> np.ndarray:
    """:func:`tile_options` of a rank of the cascade, as a read-only array shared by every
    group that tiles it (memoised on the cascade)."""
    memo = cascade.__dict__.setdefault("_rank_tile_options_memo", {})
    hit = memo.get(rank)
    if hit is None:
        hit = memo[rank] = np.array(tile_options(cascade.size(rank)), dtype=np.int64)
        hit.flags.writeable = False
    return hit


__all__ = ["rank_tile_options", "tile_options", "tileable_ranks", "widened_ranks"]
