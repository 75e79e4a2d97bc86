"""The segments an optimal search visits, and the dynamic programmes that choose a grouping
over them: least latency then least traffic within the tie tolerance (:func:`least_traffic_within`)
and least energy-delay product (:func:`least_edp`). :mod:`mambalaya.search.mappings` runs them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.search.candidates import GroupCostModel, build_candidates, cost_model, least_footprints, tileable_ranks

if TYPE_CHECKING:
    from mambalaya.search.picking import GroupChoice


def visited_segments(cascade: Cascade, names: list[str], buffer_bytes: int | None
                      ) -> tuple[list[tuple[int, int]], list[GroupCostModel], list[tuple[int, int]], list[GroupCostModel]]:
    """The segments an optimal search visits whose closed forms are exact, with their cost
    models, the segments where it stops growing (none of their candidates fits), and the cost
    models of every segment visited that fits, in the order visited: for each end ``b``,
    growing downwards until a segment does not fit. Memoised per buffer."""
    memo = cascade.__dict__.setdefault("_visited_segments_memo", {})
    key = (tuple(names), buffer_bytes)
    if key not in memo:
        visited, models, too_large, fitting = [], [], [], []
        for b in range(1, len(names) + 1):
            for a, model in _segments_ending_at(cascade, names, b, buffer_bytes is not None):
                if buffer_bytes is not None and model.least_footprint() > buffer_bytes:
                    too_large.append((a, b))
                    break
                fitting.append(model)
                if model.exact_traffic:
                    visited.append((a, b))
                    models.append(model)
        build_candidates(fitting)  # the search needs every one's table: built together
        memo[key] = (visited, models, too_large, fitting)
    return memo[key]


def _segments_ending_at(cascade: Cascade, names: list[str], b: int, footprints: bool) -> Any:
    """``(a, cost model)`` of the segments ``names[a:b]``, growing downwards (a = b - 1, ...),
    made in runs of 2, 4, 8, ... segments; with ``footprints``, each run's least footprints
    are found in one pass (:func:`least_footprints`). A walk that stops early (a segment too
    large for the buffer) has made at most one run it did not need."""
    a, run = b - 1, 2
    while a >= 0:
        starts = range(a, max(a - run, -1), -1)
        made = [cost_model(cascade, names[x:b], tileable_ranks(cascade, names[x:b])) for x in starts]
        if footprints:
            least_footprints(made)
        yield from zip(starts, made)
        a, run = a - run, 2 * run


def candidate_count(cascade: Cascade, einsums: list[str]) -> int:
    """Candidates of a segment (for :class:`SearchStats`), memoised on the cascade."""
    memo = cascade.__dict__.setdefault("_candidate_count_memo", {})
    key = tuple(einsums)
    if key not in memo:
        memo[key] = cost_model(cascade, einsums, tileable_ranks(cascade, einsums)).size
    return memo[key]


def least_edp(segments: dict[tuple[Any, Any], GroupChoice], states: Sequence[Any]) -> list[GroupChoice]:
    """The grouping of least (sum of latencies) x (sum of energies) over the segments (their
    choices, keyed by the states they join: prefix ends ``(a, b)`` for contiguous groups,
    downsets for convex ones; ``states`` in an order where every segment goes forward, the
    empty state first and the whole cascade last): a Pareto dynamic programme over (latency,
    energy), exact since the product grows with both. Returned in order."""
    front: dict[Any, list[tuple[float, float, tuple[GroupChoice, ...]]]] = {s: [] for s in states}
    front[states[0]] = [(0.0, 0.0, ())]
    ends: dict[Any, list[tuple[Any, GroupChoice]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in states[1:]:
        points = [(lat + c.latency_s, en + c.energy_pj, chosen + (c,))  # type: ignore[operator]
                  for a, c in ends.get(b, []) for lat, en, chosen in front[a]]
        front[b] = _pareto(points)
    return list(min(front[states[-1]], key=lambda p: p[0] * p[1])[2])


def _pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points no other beats or equals in both coordinates (ties: the first in order)."""
    points.sort(key=lambda p: (p[0], p[1]))
    kept: list[tuple[float, float, Any]] = []
    for p in points:
        if not kept or p[1] < kept[-1][1]:
            kept.append(p)
    return kept


def least_traffic_within(segments: dict[tuple[Any, Any], Any], states: Sequence[Any], latency_bound: float) -> list[Any]:
    """The grouping of least off-chip traffic among those whose latency is at most
    ``latency_bound`` (the best latency plus the tie tolerance), over the same segments (their
    choices, :class:`GroupChoice` or :class:`_Pick`, keyed and ordered as for :func:`least_edp`).

    A Pareto dynamic programme: for each state it keeps the (latency, traffic) points no other
    partial grouping beats in both, dropping any that cannot finish within the bound (their
    latency plus the least latency of the remaining Einsums exceeds it). Returned in order."""
    starts: dict[Any, list[tuple[Any, Any]]] = {}
    ends: dict[Any, list[tuple[Any, Any]]] = {}
    for (a, b), c in segments.items():
        starts.setdefault(a, []).append((b, c))
        ends.setdefault(b, []).append((a, c))
    suffix = {s: math.inf for s in states}  # least latency from the state to the whole cascade
    suffix[states[-1]] = 0.0
    for a in reversed(states[:-1]):
        suffix[a] = min((c.cost() + suffix[b] for b, c in starts.get(a, ())), default=math.inf)
    # front[b]: (latency, traffic, choices) of the non-dominated partial groupings reaching b
    front: dict[Any, list[tuple[float, float, tuple[Any, ...]]]] = {s: [] for s in states}
    front[states[0]] = [(0.0, 0.0, ())]
    for b in states[1:]:
        points = []
        for a, c in ends.get(b, []):
            for lat, traffic, chosen in front[a]:
                total = lat + c.cost()
                if total + suffix[b] <= latency_bound:
                    points.append((total, traffic + c.traffic_bytes, chosen + (c,)))
        front[b] = _pareto(points)
    if not front[states[-1]]:  # pragma: no cover - the latency-optimal grouping always qualifies
        raise SpecError("internal error: no grouping within the latency bound")
    return list(min(front[states[-1]], key=lambda p: (p[1], p[0]))[2])
