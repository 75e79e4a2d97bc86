"""The optimal search over connected convex groups (:mod:`mambalaya.model.convex`): every such
group costed by the tile search of :func:`mambalaya.model.search.best_group` (the groups whose
closed forms are exact picked together, :mod:`mambalaya.model.picks`), then a dynamic programme
over the cascade's downsets with the same objective, tie rule and EDP pass as the contiguous
search."""

from __future__ import annotations

import math
from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.model.candidates import build_candidates, cost_model, cycles_together, tileable_ranks
from mambalaya.model.convex import ConvexSpace
from mambalaya.model.picking import LATENCY_TIE_TOLERANCE, GroupChoice, _Pick
from mambalaya.model.segments import _least_edp, _least_traffic_within


def convex_choices(cascade: Cascade, space: ConvexSpace, buffer_bytes: int | None, stats: Any, arch: Any,
                   objective: str) -> dict[int, GroupChoice | _Pick]:
    """The chosen tiling of every connected convex group that fits the buffer, by group mask.
    A group whose least footprint exceeds the buffer, and every group holding it, is left out
    (adding an Einsum only adds on-chip data, see :func:`~mambalaya.model.search.best_group`)."""
    from mambalaya.model import search

    masks = sorted(space.groups, key=lambda m: (bin(m).count("1"), m))
    too_large: list[int] = []
    fitting: list[tuple[int, Any]] = []
    for m in masks:
        if any(t & m == t for t in too_large):
            continue
        einsums = space.einsums(m)
        model = cost_model(cascade, einsums, tileable_ranks(cascade, einsums))
        if buffer_bytes is not None and model.least_footprint() > buffer_bytes:
            too_large.append(m)
            continue
        fitting.append((m, model))
    build_candidates([model for _, model in fitting])
    together: dict[Any, Any] = {}
    if search.BATCH_PICKS and search._closed_form_costs(arch, objective):
        if arch is not None:
            cycles_together([model for _, model in fitting], arch.compute)
        exact = [(m, model) for m, model in fitting if model.exact_traffic]
        together = search._picked_together(cascade, [m for m, _ in exact], [model for _, model in exact],
                                           buffer_bytes, arch)
    found: dict[int, GroupChoice | _Pick] = {}
    for m, model in fitting:
        hit = together.get(m)
        if stats is not None:
            stats.evaluations += model.size
            stats.groups_costed += 1
        if hit is None:
            hit = search.best_group(cascade, space.einsums(m), buffer_bytes, arch=arch, objective=objective)
        if hit is not None and not isinstance(hit, str):
            found[m] = hit
    return found


def convex_grouping(space: ConvexSpace, choices: dict[int, GroupChoice | _Pick], arch: Any,
                    objective: str) -> list[GroupChoice | _Pick] | None:
    """The best grouping over the downsets (None if no grouping covers the cascade), in the
    order the contiguous search hands its groups on (last group first for an architecture's
    latency or EDP, first group first for traffic or energy)."""
    segments = {pair: c for m, c in choices.items() for pair in space.groups[m]}
    states = space.downsets
    best = {d: math.inf for d in states}
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
        return _least_edp(segments, states)[::-1]
    if arch is not None and objective == "latency":
        return _least_traffic_within(segments, states, best[whole] * (1 + LATENCY_TIE_TOLERANCE))[::-1]
    chosen = []
    b = whole
    while b:
        a, c = back[b]
        chosen.append(c)
        b = a
    return chosen[::-1]
