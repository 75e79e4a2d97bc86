"""The optimal search over connected convex groups (:mod:`mambalaya.search.convex`), exact
without costing every group.

A grouping is a path over the cascade's downsets, each step a group, and its cost the sum of
its groups' costs (latency on an architecture, off-chip bytes without one). Every group has a
lower bound that needs no candidate table (:mod:`mambalaya.search.convex_bounds`). The search
costs groups lazily, as a shortest-path search with lower bounds does. Each group is valued at
its cost if costed, else at its bound; in each round, every uncosted group is costed whose best
path (the shortest prefix to it, it, the shortest suffix after it) is within the tie rule's
bound of the current shortest path (the tie tolerance with an architecture,
:func:`~mambalaya.search.segments.least_traffic_within`; equality without). When no uncosted
group is left within it:

* the shortest path holds costed groups only (its own groups are within the bound), so its cost
  is the optimum: every other path costs at least its valued sum;
* every grouping the tie rule may still choose holds costed groups only: an uncosted group in
  it would have a best path no longer than that grouping, within the bound.

The dynamic programmes of the exhaustive search then run over the costed groups, in the same
order, and so choose what they would choose over every group.

The contiguous search (:func:`mambalaya.search.mappings.optimal` beyond the convex limits) runs the
same lazy costing over :func:`~mambalaya.search.convex.contiguous_space`, the prefixes of the
cascade's order as downsets and its segments as groups (:func:`segment_choices`), and then its
own dynamic programmes over the costed segments.

Costing a group is :func:`~mambalaya.search.mappings.best_group`'s tile search, the groups of a
round picked together where their closed forms are exact (:mod:`mambalaya.search.picks`). A
group whose least footprint exceeds the buffer costs infinity (a group holding it may not: an
Einsum that reads one position of a tensor, the final state ``HN = H[b,L-1]``, holds that slice
whole when the tensor comes from off chip, and only the tile holding the position when it is
made in the group, so adding its producer can shrink the footprint). The energy objective runs
the same lazy search on energy's bounds
(:func:`~mambalaya.search.convex_bounds.energy_lower_bounds`; no tie rule: the least energy, as
without an architecture the least traffic). The energy-delay product, the
product of two sums, has no bound per group: it costs every group, up to
:data:`EXHAUSTIVE_GROUP_LIMIT` groups.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.search.candidates import build_candidates, cost_model, cycles_together, least_footprint_bound, tileable_ranks
from mambalaya.errors import SpecError
from mambalaya.search.convex import ConvexSpace, contiguous_space
from mambalaya.search.convex_bounds import (cycles_lower_bounds, energy_lower_bounds, latency_lower_bounds,
                                            traffic_lower_bounds)
from mambalaya.search.group_choice import batch_picks, best_group, picked_together
from mambalaya.search.picking import LATENCY_TIE_TOLERANCE, GroupChoice, Pick
from mambalaya.search.segments import least_edp, least_traffic_within

#: Most groups the EDP objective costs (every one; the Mamba-1 layer has 855 in prefill, 1,272 in
#: decode). Beyond it it searches contiguous groups.
EXHAUSTIVE_GROUP_LIMIT = 1500

#: Relative slack on the bound of step 2, so that a group is never left out by a rounding
#: difference between two sums of the same costs (costing one more group is always safe).
_BOUND_SLACK = 1e-9


class _Costed:
    """The groups of a space costed so far: ``cost`` per group (NaN where not yet, infinity
    where no tiling fits or the best breaks a rule) and the choice of each finite one."""

    def __init__(self, cascade: Cascade, space: ConvexSpace, buffer_bytes: int | None, stats: Any, arch: Any,
                 objective: str) -> None:
        self.cascade, self.space, self.buffer_bytes = cascade, space, buffer_bytes
        self.stats, self.arch, self.objective = stats, arch, objective
        self.cost = np.full(space.masks.size, np.nan)
        self.choices: dict[int, GroupChoice | Pick] = {}

    def add(self, wanted: np.ndarray) -> None:
        """Cost the groups ``wanted`` (indices) not costed yet, smallest first."""
        masks = self.space.masks
        models = _space_models(self.cascade, self.space)
        fitting: list[tuple[int, Any]] = []
        for i in np.sort(wanted).tolist():  # groups are in order of size
            if not np.isnan(self.cost[i]):
                continue
            m = int(masks[i])
            model = models[i]
            if model is None:
                einsums = self.space.einsums(m)
                ranks = tileable_ranks(self.cascade, einsums)
                if self.buffer_bytes is not None and least_footprint_bound(self.cascade, einsums, ranks) > self.buffer_bytes:
                    self.cost[i] = math.inf  # (its model's least footprint, to the bit, without building the model:
                    continue                 # most groups a search meets hold more than the buffer)
                model = models[i] = cost_model(self.cascade, einsums, ranks)
            if self.buffer_bytes is not None and model.least_footprint() > self.buffer_bytes:
                # (only it: a group holding it may need less, its reads of a position of a tensor now
                # made inside it, as HN of H; every such group was once left out with it)
                self.cost[i] = math.inf
                continue
            fitting.append((i, model))
        if not fitting:
            return
        build_candidates([model for _, model in fitting])
        together: dict[Any, Any] = {}
        if batch_picks(self.arch, self.objective):
            if self.arch is not None:
                cycles_together([model for _, model in fitting], self.arch.compute)
            exact = [(i, model) for i, model in fitting if model.exact_traffic]
            together = picked_together(self.cascade, [i for i, _ in exact], [model for _, model in exact],
                                       self.buffer_bytes, self.arch)
        for i, model in fitting:
            hit = together.get(i)
            if self.stats is not None:
                self.stats.evaluations += model.size
                self.stats.groups_costed += 1
            if hit is None:
                hit = best_group(self.cascade, self.space.einsums(int(masks[i])), self.buffer_bytes,
                                 arch=self.arch, objective=self.objective)
            if hit is None or isinstance(hit, str):
                self.cost[i] = math.inf
            else:
                self.cost[i] = hit.cost()
                self.choices[i] = hit


def _space_models(cascade: Cascade, space: ConvexSpace) -> list[Any]:
    """The cost model of each group of ``space`` met so far on ``cascade`` (None for the
    others), by group index: the searches of a sweep's points on one layer look them up without
    rebuilding each group's Einsums and ranks. Kept on the cascade with the space (whose id the
    key holds, so it is never reused while the entry lives)."""
    memo = cascade.__dict__.setdefault("_space_models_memo", {})
    hit = memo.get(id(space))
    if hit is None:
        hit = memo[id(space)] = (space, [None] * space.masks.size)
    return hit[1]


def convex_optimal(cascade: Cascade, space: ConvexSpace, buffer_bytes: int | None, stats: Any, arch: Any,
                   objective: str) -> list[GroupChoice | Pick] | None | str:
    """The best grouping over the space's groups (see the module doc), in the order
    :func:`convex_grouping` hands it on; None if no grouping fits the buffer; ``"limits"`` for
    the EDP objective on a space of more than :data:`EXHAUSTIVE_GROUP_LIMIT` groups."""
    if arch is not None and objective == "edp":
        if space.masks.size > EXHAUSTIVE_GROUP_LIMIT:
            return "limits"
        costed = _Costed(cascade, space, buffer_bytes, stats, arch, objective)
        costed.add(np.arange(space.masks.size))
        return convex_grouping(space, costed, arch, objective)
    lazy = lazily_costed(cascade, space, buffer_bytes, stats, arch, objective)
    return None if lazy is None else convex_grouping(space, lazy, arch, objective)


def lazily_costed(cascade: Cascade, space: ConvexSpace, buffer_bytes: int | None, stats: Any,
                  arch: Any, objective: str = "latency") -> _Costed | None:
    """The space's groups costed as the module doc says, for the least latency on ``arch`` (the
    least off-chip traffic without one, or the least energy with ``objective="energy"``): every
    group that could be in a grouping the tie rule may choose is costed, the others are left
    uncosted (NaN). None if no grouping fits the buffer. ``objective`` is the latency or the
    energy: the EDP has no bound."""
    costed = _Costed(cascade, space, buffer_bytes, stats, arch, objective)
    tied = arch is not None and objective == "latency"
    if arch is not None and objective == "energy":
        bound = energy_lower_bounds(arch, cascade, space)
    else:
        bound = traffic_lower_bounds(cascade, space)
        if arch is not None:
            bound = latency_lower_bounds(arch, bound, cycles_lower_bounds(cascade, space, arch.compute))
    tolerance = (1 + (LATENCY_TIE_TOLERANCE if tied else 0.0)) * (1 + _BOUND_SLACK)
    while True:
        mixed = np.where(np.isnan(costed.cost), bound, costed.cost)
        prefix = _prefix(space, mixed)
        if prefix[-1] == math.inf:
            return None
        suffix = _suffix(space, mixed)
        through = prefix[space.src] + mixed[space.group] + suffix[space.dst]
        least = np.full(space.masks.size, math.inf)
        np.minimum.at(least, space.group, through)
        wanted = np.isnan(costed.cost) & (least <= prefix[-1] * tolerance)
        if not wanted.any():
            return costed
        costed.add(np.flatnonzero(wanted))


def segment_choices(cascade: Cascade, buffer_bytes: int | None, stats: Any, arch: Any,
                    objective: str) -> dict[tuple[int, int], GroupChoice | Pick] | None:
    """For the contiguous search (:func:`mambalaya.search.mappings.optimal`): the choice of every
    segment ``names[a:b]`` of the cascade's order, keyed ``(a, b)``, that the lazy search over
    :func:`~mambalaya.search.convex.contiguous_space` costed and that maps. The others are in no
    grouping the search's dynamic programmes could choose (the module doc's argument, the
    segments being the groups and the prefixes the downsets). None where it does not apply
    (the EDP has no bound); no grouping fitting the buffer is the usual
    error."""
    space = contiguous_space(cascade) if arch is None or objective != "edp" else None
    if space is None:
        return None
    costed = lazily_costed(cascade, space, buffer_bytes, stats, arch, objective)
    if costed is None:
        raise SpecError(f"no mapping of cascade {cascade.name!r} fits a buffer of {buffer_bytes:,} bytes")
    return {(a, b): costed.choices[g] for a, b, g in zip(space.src.tolist(), space.dst.tolist(), space.group.tolist())
            if g in costed.choices}


def _prefix(space: ConvexSpace, cost: np.ndarray) -> np.ndarray:
    """The least cost from the empty downset to each downset, level by level of the downsets'
    sizes (a pair joins a smaller downset to a larger one; pairs are in order of ``dst``)."""
    best = np.full(space.downsets.size, math.inf)
    best[0] = 0.0
    for src, group, starts, dst in space.upward_levels:
        best[dst] = np.minimum.reduceat(best[src] + cost[group], starts)
    return best


def _suffix(space: ConvexSpace, cost: np.ndarray) -> np.ndarray:
    """The least cost from each downset to the whole cascade, level by level downwards."""
    best = np.full(space.downsets.size, math.inf)
    best[-1] = 0.0
    for dst, group, starts, src in space.downward_levels:
        best[src] = np.minimum.reduceat(cost[group] + best[dst], starts)
    return best


def _within_tie(space: ConvexSpace, cost: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Which of the pairs at ``rows`` (of costed groups) lie on some path no longer than the
    shortest times the tie tolerance: the only pairs the least-traffic-within-the-tie programme
    (:func:`~mambalaya.search.segments.least_traffic_within`) can use. Its partial paths to a
    pair's start are no shorter than the shortest prefix, summed in the same order (float sums
    grow with their terms), and its suffix bound is this suffix, so a pair left out here fails
    its own test (with :data:`_BOUND_SLACK` for sums of the same costs in another order: a pair
    kept beyond it is only tested again); the pairs kept keep their order."""
    costs = np.where(np.isnan(cost), np.inf, cost)
    prefix, suffix = _prefix(space, costs), _suffix(space, costs)
    through = prefix[space.src[rows]] + costs[space.group[rows]] + suffix[space.dst[rows]]
    return through <= prefix[-1] * (1 + LATENCY_TIE_TOLERANCE) * (1 + _BOUND_SLACK)


def convex_grouping(space: ConvexSpace, costed: _Costed, arch: Any,
                    objective: str) -> list[GroupChoice | Pick] | None:
    """The best grouping over the costed groups (None if none covers the cascade), in the
    order the contiguous search hands its groups on (last group first for an architecture's
    latency or EDP, first group first for traffic or energy). Segments are offered to the
    dynamic programmes group by group in the space's order, each group's pairs by ``dst`` then
    ``src``, whichever groups were costed."""
    rows = np.flatnonzero(np.isfinite(costed.cost[space.group]))
    if arch is not None and objective == "latency":
        rows = rows[_within_tie(space, costed.cost, rows)]
    rows = rows[np.lexsort((space.src[rows], space.dst[rows], space.group[rows]))]
    d = space.downsets.tolist()
    segments = {(d[a], d[b]): costed.choices[g]
                for a, b, g in zip(space.src[rows].tolist(), space.dst[rows].tolist(), space.group[rows].tolist())}
    states = d
    best = {s: math.inf for s in states}
    back: dict[int, tuple[int, Any]] = {}
    best[0] = 0.0
    ends: dict[int, list[tuple[int, Any]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in states[1:]:
        for a, c in ends.get(b, ()):
            total = best[a] + c.cost()
            if total < best[b]:
                best[b], back[b] = total, (a, c)
    whole = states[-1]
    if best[whole] == math.inf:
        return None
    if arch is not None and objective == "edp":
        return least_edp(segments, states)[::-1]
    if arch is not None and objective == "latency":
        return least_traffic_within(segments, states, best[whole] * (1 + LATENCY_TIE_TOLERANCE))[::-1]
    chosen = []
    b = whole
    while b:
        a, c = back[b]
        chosen.append(c)
        b = a
    return chosen[::-1]
