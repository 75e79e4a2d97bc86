"""Exact closed forms for the reads that tile boxes overlap, so that the groups making them are
picked in the batched pass like every other.

A tensor's reads are *aligned* (:func:`~mambalaya.search.group_shape._reads_aligned`) when each
dimension moves with its own rank at step one: every tile reads its own slice, and the tensor
costs its untiled bytes times the trips of the loops its accesses do not mention. The others
(the chunked scan's position-view tensors read in the chunk view, ``U[Q*c+q]``; a fixed slice
beside a moving one, ``ACS[255]`` beside ``ACS[q]``; a mirrored index) read boxes that overlap
from tile to tile. Their bytes still factor: the dimensions whose boxes overlap depend on a few
tiled ranks (the *irregular ranks*: those of the irregular dimensions, and of any dimension
sharing a rank with them), and each other dimension reads its full extent over its tiles, as
untiled. So a tiling's reads are the bytes a group tiling only the irregular ranks, at that
tiling's tiles of them, reads in one pass (the general model's count,
:func:`~mambalaya.cost.traffic.read_elements`), times the trips of the loops the accesses do
not mention. The bytes are counted once per combination of the irregular ranks' tile options (a
few dozen) and spread over the grid of tilings. ``tests/test_closed_forms.py`` checks the
result against the general model on sampled candidates of every layer kind.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import rank_of_variable, rank_variable
from mambalaya.fusion.mapping import FusionGroup, Loop
from mambalaya.cost.traffic import TrafficSizeError, apply_read_steps, read_elements, read_steps

#: Most combinations of the irregular ranks' tile options counted for one tensor; beyond it the
#: tensor's reads stay with the general model (its group is searched alone).
MAX_COMBINATIONS = 512


def irregular_ranks(cascade: Cascade, accesses: list[Any], tensor: str, ranks: tuple[str, ...]) -> tuple[str, ...]:
    """The tiled ranks (of ``ranks``) the overlapping boxes of ``tensor``'s reads depend on:
    those of each dimension that is not aligned (an index moving with another rank, at another
    step or with several ranks; or accesses that disagree on whether it moves), closed over the
    dimensions that share a rank with them. In ``ranks``' order."""
    tileable = set(ranks)
    dims = range(len(cascade.tensors[tensor].ranks))
    depends = [{rank_of_variable(v) for a in accesses for v, _ in a.indices[p].terms} & tileable for p in dims]
    found: set[str] = set()
    for p, rank in zip(dims, cascade.tensors[tensor].ranks):
        moving = [[(v, c) for v, c in a.indices[p].terms if rank_of_variable(v) in tileable] for a in accesses]
        if any(m and m != [(rank_variable(rank), 1)] for m in moving) or len({bool(m) for m in moving}) > 1:
            found |= depends[p]
    grown = True
    while grown:
        grown = False
        for dep in depends:
            if dep & found and not dep <= found:
                found |= dep
                grown = True
    return tuple(r for r in ranks if r in found)


def irregular_read_bytes(cascade: Cascade, einsums: tuple[str, ...], ranks: tuple[str, ...], key: str,
                         tiles: list[np.ndarray]) -> np.ndarray | None:
    """Per tiling of the grid (``tiles``: each rank's tile in every tiling), the bytes counted to
    ``key`` (a tensor or an initial value) that a group of ``einsums`` reads in one pass over
    the irregular ranks of its reads; None where the combinations are too many or the general
    model cannot count one. Memoised on the cascade per key, reading accesses and irregular ranks."""
    memo = cascade.__dict__.setdefault("_irregular_read_memo", {})
    steps = _steps_to(cascade, einsums, key)
    chosen = _chosen_ranks(cascade, steps, ranks)
    memo_key = (key, tuple(s[3] for s in steps), chosen)  # the reads depend on the accesses, not the other members
    if memo_key not in memo:
        memo[memo_key] = _per_combination(cascade, einsums, chosen, key, steps)
    found = memo[memo_key]
    if found is None:
        return None
    chosen, options, per_combo = found
    if not chosen:
        return np.full(len(tiles[0]) if tiles else 1, per_combo[0])
    positions = [np.searchsorted(options[k], tiles[ranks.index(r)]) for k, r in enumerate(chosen)]
    return per_combo[np.ravel_multi_index(positions, [len(o) for o in options])]


def _steps_to(cascade: Cascade, einsums: tuple[str, ...], key: str) -> list[Any]:
    """The read steps of a group of ``einsums`` that count to ``key``, memoised per cascade
    structure."""
    memo = cascade.structure_memo.setdefault("irregular_steps", {})
    full = (einsums, key, cascade.index_constants_of(einsums))  # the accesses, exactly
    if full not in memo:
        memo[full] = [s for s in read_steps(cascade, FusionGroup("probe", einsums, ())) if key in (s[4], s[5])]
    return memo[full]


def _chosen_ranks(cascade: Cascade, steps: list[Any], ranks: tuple[str, ...]) -> tuple[str, ...]:
    """The irregular ranks (of ``ranks``, in their order) of the reads of ``steps``."""
    found: set[str] = set()
    for tensor, accesses, *_ in steps:
        found |= set(irregular_ranks(cascade, accesses, tensor, ranks))
    return tuple(r for r in ranks if r in found)


def _per_combination(cascade: Cascade, einsums: tuple[str, ...], chosen: tuple[str, ...], key: str,
                     steps: list[Any]) -> tuple[tuple[str, ...], list[np.ndarray], np.ndarray] | None:
    from mambalaya.search.tile_ranks import rank_tile_options

    options = [np.asarray(rank_tile_options(cascade, r)) for r in chosen]
    if math.prod(len(o) for o in options) > MAX_COMBINATIONS:
        return None
    per_combo = []
    for combo in itertools.product(*options):
        loops = tuple(Loop(r, int(t)) for r, t in zip(chosen, combo) if t < cascade.size(r))
        group = FusionGroup("probe", einsums, loops)

        def read(t: str, accs: list[Any], self_only: bool, step_key: Any, group: FusionGroup = group) -> tuple[int, int]:
            return read_elements(cascade, group, t, accs, self_only=self_only, access_key=step_key)

        try:
            per_combo.append(apply_read_steps(cascade, steps, read).get(key, 0.0))
        except TrafficSizeError:
            return None
    return chosen, options, np.array(per_combo, dtype=float)


def times_trips(per_tiling: np.ndarray, trips: list[np.ndarray], idxs: list[int]) -> np.ndarray:
    """``per_tiling`` times the trips of the ranks at ``idxs``, in their order."""
    out = per_tiling
    for i in idxs:
        out = out * trips[i]
    return out


__all__ = ["MAX_COMBINATIONS", "irregular_ranks", "irregular_read_bytes", "times_trips"]
