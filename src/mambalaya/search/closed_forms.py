"""The closed forms a candidate table is summed from: products of per-tiling factors
(:func:`_sum_of_products`), the weight bytes residency saves (:func:`_add_residency`), and the
compute cycles of every tiling on a compute section (:func:`cycles_together`,
:func:`einsum_grid_cycles`); :mod:`mambalaya.search.candidates` assembles them per group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mambalaya.arch.keys import spec_key
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import einsum_ops
from mambalaya.cost.spatial import einsum_unit_cycles, step_shapes

if TYPE_CHECKING:
    from mambalaya.search.candidates import GroupCostModel


def _sum_of_products(terms: list[list[tuple[float, list[int]]]], factors: list[np.ndarray]) -> np.ndarray:
    """Per model (rows), the sum over its terms ``(coefficient, factor indices)`` of the
    coefficient times those per-tiling factors: each product taken in the order of its
    indices, a factor the term does not use multiplying by one, the terms summed in the
    model's order, a missing term adding zero. So a model's values are the same floats
    whichever models share the pass (``tests/test_candidates.py``)."""
    n = len(factors[0]) if factors else 1
    width = max((len(ts) for ts in terms), default=0)
    coef = np.zeros((len(terms), width))
    uses = np.zeros((len(terms), width, len(factors)), dtype=bool)
    for k, ts in enumerate(terms):
        for t, (c, idxs) in enumerate(ts):
            coef[k, t] = c
            uses[k, t, idxs] = True
    some, every = uses.any(axis=0).tolist(), uses.all(axis=0).tolist()
    total = np.zeros((len(terms), n))
    f = np.empty((len(terms), n))
    for t in range(width):
        f[:] = coef[:, t:t + 1]
        for i, factor in enumerate(factors):  # in place; where a row does not use it, as if times one
            if every[t][i]:
                np.multiply(f, factor, out=f)
            elif some[t][i]:
                np.multiply(f, factor, out=f, where=uses[:, t, i:i + 1])
        total += f
    return total


def _add_residency(models: list[GroupCostModel], tiles: list[np.ndarray], trips: list[np.ndarray], n: int,
                   traffic0: np.ndarray, fp0: np.ndarray, traffic: np.ndarray, fp: np.ndarray) -> None:
    """Fill the residency options (rows 1.. of each model, :meth:`GroupCostModel.options`'s
    order) of ``traffic`` and ``fp``. Streamed, a tensor is read once per trip of every loop
    that does not index it; resident, only per trip of those outside the innermost loop (of
    more than one trip) that does index it (cost/traffic.py). It holds its largest one-step
    box (fusion/mapping.py:resident_bytes), here bounded from above: a dimension indexed by
    several tiled ranks counts in full (:meth:`GroupCostModel._held_box`). Option ``(o, j)``
    saves and holds the running sums over order ``o``'s first ``j`` residency candidates; the
    per-tiling factors are shared by every model that needs them."""
    chains = []  # (model row, first option row, [(bytes, saved-factor row, held row)])
    factors: dict[tuple, int] = {}
    factor_rows: list[np.ndarray] = []
    held: dict[tuple, int] = {}
    held_rows: list[np.ndarray] = []
    for k, m in enumerate(models):
        row = 1
        readers_of: dict[str, tuple[str, ...]] = {}  # a held box depends on the Einsums reading it
        for e in m.probe.einsums:
            for t in dict.fromkeys(a.tensor for a in m.cascade.einsum(e).inputs if a.tensor != e):
                readers_of[t] = readers_of.get(t, ()) + (e,)
        for o in m.orders if m.ranks else []:
            keep = m.keepable_for(o)
            if not keep:
                continue
            links = []
            irregular = m._irregular_factors() if m.exact_traffic and m.irregular else {}
            for t, b, seen in keep:
                key = (o, frozenset(seen))
                if key not in factors:
                    factors[key] = len(factor_rows)
                    factor_rows.append(_kept_row(m, ("saved", o, frozenset(seen)),
                                                 lambda: _saved_factor(trips, o, seen, len(m.ranks), n)))
                if t in irregular:  # its bytes per pass differ by tiling: a row of its own, times one
                    b, key = 1.0, (o, frozenset(seen), id(m), t)
                    factors[key] = len(factor_rows)
                    factor_rows.append(factor_rows[factors[(o, frozenset(seen))]] * irregular[t])
                readers = (t, readers_of.get(t, ()))
                if readers not in held:
                    held[readers] = len(held_rows)
                    held_rows.append(_kept_row(m, ("held", *readers), lambda: m._held_box(t, tiles)))
                links.append((b, factors[key], held[readers]))
            chains.append((k, row, links))
            row += len(links)
    if not chains:
        return
    chains.sort(key=lambda c: -len(c[2]))  # longest first (stable): the chains still adding are a prefix
    longest = len(chains[0][2])
    coef = np.zeros((len(chains), longest))
    saved_at = np.full((len(chains), longest), len(factor_rows))  # the last row: zeros
    held_at = np.full((len(chains), longest), len(held_rows))
    for c, (_, _, links) in enumerate(chains):
        for j, (b, f, h) in enumerate(links):
            coef[c, j], saved_at[c, j], held_at[c, j] = b, f, h
    saved_rows = np.vstack(factor_rows + [np.zeros(n)])
    held_all = np.vstack(held_rows + [np.zeros(n)])
    model_of = np.array([c[0] for c in chains])
    start = np.array([c[1] for c in chains])
    live = [sum(1 for c in chains if len(c[2]) > j) for j in range(longest)]  # chains with a j-th link
    saved_sum, held_sum = np.zeros((len(chains), n)), np.zeros((len(chains), n))
    link = np.empty((len(chains), n))  # scratch (in place: no temporaries)
    for j, k in enumerate(live):  # each chain's running sums, the same additions in the same order
        np.take(saved_rows, saved_at[:k, j], axis=0, out=link[:k], mode="clip")  # (in range: unbuffered)
        np.multiply(coef[:k, j:j + 1], link[:k], out=link[:k])
        saved_sum[:k] += link[:k]
        np.take(held_all, held_at[:k, j], axis=0, out=link[:k], mode="clip")
        held_sum[:k] += link[:k]
        rows, cols = model_of[:k], start[:k] + j
        np.take(traffic0, rows, axis=0, out=link[:k], mode="clip")  # the chain's model's, streamed
        traffic[rows, cols] = np.subtract(link[:k], saved_sum[:k], out=link[:k])
        np.take(fp0, rows, axis=0, out=link[:k], mode="clip")
        fp[rows, cols] = np.add(link[:k], held_sum[:k], out=link[:k])


def _kept_row(m: GroupCostModel, key: tuple, make: Any) -> np.ndarray:
    """A per-tiling row of :func:`_add_residency` (a saved factor or a held box), memoised on
    the cascade per ranks and ``key``: the groups tiling the same ranks share it across build
    passes (read-only)."""
    memo = m.cascade.__dict__.setdefault("_residency_rows_memo", {})
    full = (tuple(m.ranks), *key)
    hit = memo.get(full)
    if hit is None:
        hit = memo[full] = make()
        hit.flags.writeable = False
    return hit


def _saved_factor(trips: list[np.ndarray], order: tuple[int, ...], seen: frozenset[int], ranks: int, n: int) -> np.ndarray:
    """Per tiling, a resident tensor's reads saved per byte (streamed minus resident trips,
    :func:`_add_residency`), for a tensor indexed by the ranks ``seen`` under ``order``."""
    pos = {i: k for k, i in enumerate(order)}
    streamed = np.ones(n)
    for i in range(ranks):
        if i not in seen:
            streamed = streamed * trips[i]
    inner = np.full(n, -1)
    for i in sorted(seen, key=pos.get):
        inner = np.where(trips[i] > 1, pos[i], inner)
    resident = np.ones(n)
    for i in range(ranks):
        if i not in seen:
            resident = resident * np.where(pos[i] < inner, trips[i], 1.0)
    return streamed - resident


def cycles_together(models: list[GroupCostModel], compute: Any) -> list[np.ndarray]:
    """:meth:`GroupCostModel.cycles` of each model, made for those without them. A group's
    per-unit sums add its Einsums' cycles in order, so a group one Einsum longer than another
    of the list (met before it, tiling the same ranks) starts from that one's sums: the same
    additions in the same order, so the same floats."""
    key = spec_key(compute)
    # per Einsums, (ranks, sums) of this call's groups not yet grown by one Einsum (memory: a
    # group's sums are dropped once the next group has looked for them, whatever its ranks)
    sums: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, Any]]] = {}
    for m in models:
        if key in m._cycles:
            continue
        einsums, ranks = m.probe.einsums, tuple(m.ranks)
        shorter_ranks, total = sums.pop(einsums[:-1], (None, None))
        if shorter_ranks != ranks:
            total = None
        start = len(einsums) - 1 if total is not None else 0
        if total is None:
            total = {"array_2d": 0.0, "array_1d": 0.0, "vector": 0.0, "mfu": 0.0}
        tiles = m.grid()[0]
        for name in einsums[start:]:
            cyc = einsum_grid_cycles(compute, m.cascade, name, m.ranks, tiles)
            total = {k: total[k] + cyc[k] for k in total}
        sums[einsums] = (ranks, total)
        array = total["array_2d"] + total["array_1d"]
        if compute.overlap_compute_units:
            cycles = np.maximum(np.maximum(array, total["vector"]), total["mfu"])
        else:
            cycles = array + total["vector"] + total["mfu"]
        m._cycles[key] = np.broadcast_to(np.asarray(cycles, dtype=float), (m.n_tilings,))
    return [m._cycles[key] for m in models]


def einsum_grid_cycles(compute: Any, cascade: Cascade, name: str, ranks: list[str], tiles: list[np.ndarray]) -> dict[str, Any]:
    """One Einsum's unit cycles for every tiling of ``ranks`` (the grid of
    :meth:`GroupCostModel.grid`), memoised on the cascade: the grid depends only on the ranks,
    so every candidate group of a search that tiles the same ranks shares it."""
    memo = cascade.__dict__.setdefault("_grid_cycles_memo", {})
    key = (spec_key(compute), name, tuple(ranks))
    hit = memo.get(key)
    if hit is None:
        e = cascade.einsum(name)
        hit, _ = einsum_unit_cycles(compute, cascade, e, einsum_ops(cascade, e), _grid_step_shapes(cascade, ranks, tiles),
                                    shapes_key=("grid", tuple(ranks)))
        memo[key] = hit
    return hit


def _grid_step_shapes(cascade: Cascade, ranks: list[str], tiles: list[np.ndarray]) -> list[Any]:
    """:func:`~mambalaya.cost.spatial.step_shapes` of every tiling of ``ranks`` (the grid's
    ``tiles``), memoised on the cascade per ranks: they depend on the sizes alone, and every
    Einsum and compute section costed over that grid reads them (read-only)."""
    memo = cascade.__dict__.setdefault("_grid_step_shapes_memo", {})
    key = tuple(ranks)
    hit = memo.get(key)
    if hit is None:
        hit = step_shapes({r: cascade.size(r) for r in cascade.ranks}, list(zip(ranks, tiles)))
        if not tiles or len(tiles[0]) <= KEPT_SHAPES_TILINGS:
            memo[key] = hit
    return hit


#: Step shapes of grids of at most this many tilings are kept per cascade (memory, as
#: :data:`mambalaya.search.candidates.KEPT_GRID_TILINGS` keeps the grids themselves).
KEPT_SHAPES_TILINGS = 1 << 16
