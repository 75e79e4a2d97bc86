"""The segments an optimal search visits, and the dynamic programmes that choose a grouping
over them: least latency then least traffic within the tie tolerance (:func:`_least_traffic_within`)
and least energy-delay product (:func:`_least_edp`). :mod:`mambalaya.model.search` runs them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.model.candidates import GroupCostModel, build_candidates, cost_model, least_footprints, tileable_ranks

if TYPE_CHECKING:
    from mambalaya.model.search import GroupChoice


def _visited_segments(cascade: Cascade, names: list[str], buffer_bytes: int | None
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


def _candidate_count(cascade: Cascade, einsums: list[str]) -> int:
    """Candidates of a segment (for :class:`SearchStats`), memoised on the cascade."""
    memo = cascade.__dict__.setdefault("_candidate_count_memo", {})
    key = tuple(einsums)
    if key not in memo:
        memo[key] = cost_model(cascade, einsums, tileable_ranks(cascade, einsums)).size
    return memo[key]


def _least_edp(segments: dict[tuple[int, int], GroupChoice], n: int) -> list[GroupChoice]:
    """The grouping of least (sum of latencies) x (sum of energies) over the segments (their
    choices, in order): a Pareto dynamic programme over (latency, energy), exact since the
    product grows with both."""
    front: list[list[tuple[float, float, tuple[GroupChoice, ...]]]] = [[] for _ in range(n + 1)]
    front[0] = [(0.0, 0.0, ())]
    ends: dict[int, list[tuple[int, GroupChoice]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in range(1, n + 1):
        points = [(lat + c.latency_s, en + c.energy_pj, chosen + (c,))  # type: ignore[operator]
                  for a, c in ends.get(b, []) for lat, en, chosen in front[a]]
        points.sort(key=lambda p: (p[0], p[1]))
        kept: list[tuple[float, float, tuple[GroupChoice, ...]]] = []
        for p in points:
            if not kept or p[1] < kept[-1][1]:
                kept.append(p)
        front[b] = kept
    return list(min(front[n], key=lambda p: p[0] * p[1])[2])


def _least_traffic_within(segments: dict[tuple[int, int], Any], n: int, latency_bound: float) -> list[Any]:
    """The grouping of least off-chip traffic among those whose latency is at most
    ``latency_bound`` (the best latency plus the tie tolerance), over the same segments (their
    choices, :class:`GroupChoice` or :class:`_Pick`, in order).

    A Pareto dynamic programme: for each prefix it keeps the (latency, traffic) points no other
    partial grouping beats in both, dropping any that cannot finish within the bound (their
    latency plus the least latency of the remaining suffix exceeds it). Returned in order."""
    starts: dict[int, list[tuple[int, Any]]] = {}
    for (a, b), c in segments.items():
        starts.setdefault(a, []).append((b, c))
    suffix = [math.inf] * (n + 1)  # least latency of Einsums b..n
    suffix[n] = 0.0
    for a in range(n - 1, -1, -1):
        suffix[a] = min((c.cost() + suffix[b] for b, c in starts.get(a, ())), default=math.inf)
    # front[b]: list of (latency, traffic, choices) non-dominated partial groupings of 0..b
    front: list[list[tuple[float, float, tuple[Any, ...]]]] = [[] for _ in range(n + 1)]
    front[0] = [(0.0, 0.0, ())]
    ends: dict[int, list[tuple[int, Any]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in range(1, n + 1):
        points = []
        for a, c in ends.get(b, []):
            for lat, traffic, chosen in front[a]:
                total = lat + c.cost()
                if total + suffix[b] <= latency_bound:
                    points.append((total, traffic + c.traffic_bytes, chosen + (c,)))
        points.sort(key=lambda p: (p[0], p[1]))
        kept: list[tuple[float, float, tuple[Any, ...]]] = []
        for p in points:
            if not kept or p[1] < kept[-1][1]:
                kept.append(p)
        front[b] = kept
    if not front[n]:  # pragma: no cover - the latency-optimal grouping always qualifies
        raise SpecError("internal error: no grouping within the latency bound")
    return list(min(front[n], key=lambda p: (p[1], p[0]))[2])
