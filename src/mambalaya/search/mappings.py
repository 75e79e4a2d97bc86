"""Building mappings: the named mappings, greedy stitching and the optimal search, from the
choices of single groups (:mod:`mambalaya.search.group_choice`).

**Tile choice for one group** (:func:`~mambalaya.search.group_choice.best_group`). The fused ranks a group may tile are the ranks every one of its
Einsums writes and none reduces (tiling another rank breaks the ``reduction`` or
``alignment`` rule). Searched are the tile sizes (every power of two below each rank's size,
and the size itself, = untiled), the **loop order** and the **residency** of the tensors the
group reads. Generational ranks stay innermost (the smallest carried state and halo, so the
order changes no footprint); the other ranks take every order (up to three of them; beyond
that, batch-like ranks outermost in cascade order). With every tensor streamed, order changes
nothing; what it changes is which tensors residency can help: one that some loop does not
index, running inside the outermost loop that does (weights, per-channel parameters under an
outer channel loop). Streamed, such a tensor is read in every step; resident, once per tile of
the loops that index it (inside which the others run), and its box is held on chip. For each
order and tiling the options are to keep the ``j`` largest of them, ``j = 0..k`` (largest by
bytes: a heuristic order). The traffic and
footprint of all tile and residency combinations are evaluated at once with numpy from their
closed forms (a product of trip counts per tensor; a product of extents per on-chip term),
and the combination with the least traffic that fits the buffer wins (ties: fewest steps).
The candidate tables live in :mod:`mambalaya.search.candidates`.

**Closed-form costs, verified.** Where a group's traffic closed form is exact for every tiling
(:attr:`~mambalaya.search.candidates.GroupCostModel.exact_traffic`: every tile reads its own
slice of each tensor, or a tensor's overlapping reads are counted per tile combination,
:mod:`mambalaya.search.irregular_reads`) and the objective is latency without an on-chip bandwidth (or traffic),
a pick's traffic and latency are the closed forms' and its legality is checked by the rules
that do not depend on tile sizes (its tiles are in range by construction and its footprint
bound fits). Otherwise every pick is re-checked by :func:`~mambalaya.fusion.mapping.check_group`
and re-costed by the general model. Either way the finished mapping is checked by every rule,
and the groups it chose are costed again by the general model: should that disagree with a
closed form, the search runs again re-costing every pick. A bug in the closed forms therefore
cannot produce an illegal or mis-costed mapping.

**Picked together.** The optimal search, ``unfused`` and ``ssm-ri`` pick the groups they need
in one pass over their concatenated candidate tables (:mod:`mambalaya.search.picks`), in the
same order as one search per group (``tests/test_closed_forms.py`` compares the mappings).

**The optimal search** is dynamic programming over the cascade's topological order: a
mapping is a sequence of *contiguous* segments, and a segment's cost (its reads from DRAM plus
its writes of tensors needed outside) depends on the segment alone, so
``best[b] = min_a best[a] + cost(a, b)`` is exact over that space. Groups that are not
contiguous in the topological order are not considered; the space includes every mapping the
greedy stitching, ``ssm-ri`` and ``unfused`` produce, so the optimum is never worse than they
are. ``tests/test_search.py`` checks it against exhaustive enumeration of the same space
(every tiling, loop order and residency prefix, costed by the general model). For latency and
traffic it costs only the segments lower bounds cannot rule out (the lazy search of
:mod:`mambalaya.search.convex_search` over the prefixes as downsets), and chooses what costing
every segment chooses (``tests/test_convex.py``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import replace
from typing import Any


from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import (
    FusionGroup,
    Mapping,
    MappingError,
    check_mapping,
    group_order,
    unfused_mapping,
)
from mambalaya.cost.energy import require_energy
from mambalaya.cost.latency import group_seconds
from mambalaya.search import group_choice
from mambalaya.search.group_choice import SearchStats, best_group, picked_together
from mambalaya.search.picking import LATENCY_TIE_TOLERANCE, GroupChoice, Pick
from mambalaya.search import convex
from mambalaya.search.convex import convex_space, search_order
from mambalaya.search import convex_search
from mambalaya.search.convex_search import convex_optimal
from mambalaya.search.segments import visited_segments, candidate_count, least_edp, least_traffic_within
from mambalaya.search.candidates import (build_candidates, cost_model, cycles_together,
                                        tileable_ranks, widened_ranks)
from mambalaya.cost.traffic import group_traffic

NAMED_MAPPINGS = ("unfused", "ssm-ri", "stitched", "optimal", "optimal-convex", "ideal")

#: What a search on an architecture minimises (``--objective``).
OBJECTIVES = ("latency", "energy", "edp")


#: The cascade region (``Cascade.regions``) the fine-grained-fusion baseline fuses: Geens et
#: al.'s "Fuse-All" group (discretisation, scan, readout) in the Mamba builders.
SSM_REGION_NAME = "ssm"


def _finish(cascade: Cascade, name: str, choices: list[GroupChoice], buffer_bytes: int | None, description: str,
            arch: Any = None) -> Mapping:
    """The mapping of the chosen groups, checked by every rule, once the general model agrees
    with the closed-form costs of the groups chosen from them (:func:`_verify_closed_forms`)."""
    _verify_closed_forms(cascade, choices, arch)
    named = [FusionGroup(f"G{n + 1}", c.group.einsums, c.group.loops, c.group.halo, c.group.resident)
             for n, c in enumerate(choices)]
    return check_mapping(cascade, Mapping(name, tuple(named), buffer_bytes, description))


class _ClosedFormMismatch(Exception):
    """The closed forms and the general model disagree on a chosen group."""


def _verify_closed_forms(cascade: Cascade, choices: list[GroupChoice], arch: Any) -> None:
    """Raise :class:`_ClosedFormMismatch` unless every choice costed by the closed forms has
    the general model's traffic and latency (to 1e-12: the on-chip bytes are summed in another
    order), and a footprint within its bound. The finished
    mapping is costed again by the general model (the traffic is memoised), so this costs
    little; a mismatch makes the search run again with every pick re-costed
    (:func:`_recost_on_mismatch`). One case is known on the shipped cascades: a retained halo
    under an inner loop, which the general model holds once per inner tile and the closed form
    once (``docs/fusion.md``, Re-checking; a test pins it)."""
    for c in choices:
        if not c.closed_form:
            continue
        exact = group_traffic(cascade, c.group, named=False)
        latency_ok = c.latency_s is None or math.isclose(group_seconds(arch, cascade, c.group), c.latency_s, rel_tol=1e-12)
        if exact.total_bytes != c.traffic_bytes or exact.footprint_bytes > c.footprint_bytes or not latency_ok:
            raise _ClosedFormMismatch(c.group)


def _recost_on_mismatch(build: Any) -> Any:
    """Run a mapping builder; should the closed forms disagree with the general model on a
    group it chose, run it again with every pick re-costed by the general model."""

    @functools.wraps(build)
    def run(*args: Any, **kwargs: Any) -> Mapping:
        try:
            return build(*args, **kwargs)
        except _ClosedFormMismatch:
            token = group_choice.RECOST_EVERY_PICK.set(True)
            try:
                return build(*args, **kwargs)
            finally:
                group_choice.RECOST_EVERY_PICK.reset(token)

    return run


def _need(choice: GroupChoice | None, einsums: list[str], buffer_bytes: int | None,
          why: list[str] | None = None) -> GroupChoice:
    if choice is None and why and "illegal" in why:
        raise SpecError(
            f"no tiling of Einsums {', '.join(einsums)} that fits a buffer of {buffer_bytes:,} bytes is both legal and "
            "one whose traffic the model can count (among the best few: at this size, tiles whose reads do not "
            "move by a common step would need every tile enumerated); try a shorter sequence or a larger buffer "
            "(--buffer on the fusion commands, --set memory.onchip_buffer_bytes=... where a design is given)"
        )
    if choice is None:
        raise SpecError(
            f"Einsums {', '.join(einsums)} do not fit a buffer of {buffer_bytes:,} bytes even alone "
            "(a recurrence's carried state must stay on chip); use a larger buffer (--buffer on the fusion commands, "
            "--set memory.onchip_buffer_bytes=... where a design is given)"
        )
    return choice


@_recost_on_mismatch
def unfused(cascade: Cascade, buffer_bytes: int | None = None, *, arch: Any = None, objective: str = "latency") -> Mapping:
    """Every Einsum alone. Tiling a lone Einsum never changes its traffic (its operands are
    partitioned, not re-read), but a recurrence's carried state must fit the buffer: a lone
    scan is tiled over its independent ranks when its whole state does not fit."""
    if buffer_bytes is None:
        m = unfused_mapping(cascade)
        return check_mapping(cascade, Mapping("unfused", m.groups, None, "every Einsum alone (MARCA, ideal)"))
    choices = _best_groups(cascade, [[e.name] for e in cascade.einsums], buffer_bytes, arch, objective)
    return _finish(cascade, "unfused", choices, buffer_bytes, "every Einsum alone (MARCA, ideal)", arch)


def ideal(cascade: Cascade, buffer_bytes: int | None = None) -> Mapping:
    """Speed of light: one group, nothing but layer inputs, weights, outputs and state off chip."""
    g = FusionGroup("G1", tuple(e.name for e in cascade.einsums))
    return check_mapping(cascade, Mapping("ideal", (g,), None, "one group, buffer unbounded (a lower bound)"), ignore_buffer=True)


@_recost_on_mismatch
def ssm_ri(cascade: Cascade, buffer_bytes: int | None = None, *, arch: Any = None, objective: str = "latency") -> Mapping:
    """Geens et al.'s fine-grained fusion: the cascade's ``ssm`` region (discretisation, scan,
    readout) fused over its tileable ranks (RI across batch, channels, heads); the rest unfused."""
    members = set(cascade.regions.get(SSM_REGION_NAME, ()))
    region = [e.name for e in cascade.einsums if e.name in members]
    if not region:
        raise SpecError(
            f"cascade {cascade.name!r} declares no '{SSM_REGION_NAME}' region (regions: {', '.join(cascade.regions) or 'none'}); "
            "ssm-ri fuses that region: add `regions: {ssm: [...]}` to the cascade file"
        )
    segments: list[list[str]] = []
    for e in cascade.einsums:
        if e.name not in members:
            segments.append([e.name])
        elif region not in segments:  # the region runs where its first Einsum would
            segments.append(region)
    choices = _best_groups(cascade, segments, buffer_bytes, arch, objective)
    return _finish(cascade, "ssm-ri", choices, buffer_bytes,
                   f"RI fusion of {', '.join(region)} (the ssm region, as Geens et al. fuse it); rest unfused", arch)


@_recost_on_mismatch
def stitched(cascade: Cascade, buffer_bytes: int | None = None, stats: SearchStats | None = None, arch: Any = None,
             objective: str = "latency") -> Mapping:
    """The paper's greedy stitching: walk the Einsums in topological order and add each to the
    current group while the grown group has a legal loop order whose footprint fits the buffer
    and growing does not increase the cost (traffic, or latency on ``arch``: the grown group
    costs no more than the current group and the Einsum alone); otherwise close the group and
    start a new one.

    The last condition is ours: without it the greedy pass accepts any growth that fits, e.g.
    fusing the whole layer into one group with tiles so small that every weight is re-read per
    tile, which moves more bytes than running unfused.
    """
    chosen: list[GroupChoice] = []
    current: list[str] = []
    current_choice: GroupChoice | None = None
    for e in cascade.einsums:
        why: list[str] = []
        alone = _need(best_group(cascade, [e.name], buffer_bytes, stats=stats, why=why, arch=arch, objective=objective),
                      [e.name], buffer_bytes, why)
        if current_choice is not None:
            grown = best_group(cascade, current + [e.name], buffer_bytes, stats=stats, arch=arch, objective=objective)
            if grown is not None and _worth_growing(grown, current_choice, alone):
                current, current_choice = current + [e.name], grown
                continue
            chosen.append(current_choice)
        current, current_choice = [e.name], alone
    if current_choice is not None:
        chosen.append(current_choice)
    return _finish(cascade, "stitched", chosen, buffer_bytes, "greedy stitching in topological order", arch)


def _worth_growing(grown: GroupChoice, current: GroupChoice, alone: GroupChoice) -> bool:
    """Grow when the grown group costs less; on an architecture, latencies within
    :data:`LATENCY_TIE_TOLERANCE` count as equal and then the grown group must not move more bytes (a compute-bound group would
    otherwise absorb Einsums whose fusion only adds weight re-reads)."""
    apart = current.cost() + alone.cost()
    if grown.latency_s is None or grown.objective == "energy":
        return grown.cost() <= apart
    if grown.objective == "edp":  # the product of the summed latencies and energies
        return grown.cost() <= (current.latency_s + alone.latency_s) * (current.energy_pj + alone.energy_pj)  # type: ignore[operator]
    if grown.cost() < apart * (1 - LATENCY_TIE_TOLERANCE):
        return True
    return (grown.cost() <= apart * (1 + LATENCY_TIE_TOLERANCE)
            and grown.traffic_bytes <= current.traffic_bytes + alone.traffic_bytes)


@_recost_on_mismatch
def optimal(
    cascade: Cascade,
    buffer_bytes: int | None = None,
    stats: SearchStats | None = None,
    *,
    arch: Any = None,
    objective: str = "latency",
    groups: str = "auto",
) -> Mapping:
    """The least-traffic mapping over groupings and tile sizes (see the module doc). The groups
    are connected convex sets of Einsums (:mod:`mambalaya.search.convex`) where the cascade has
    few enough of them (``groups="auto"``) or always (``"convex"``, the ``optimal-convex``
    mapping), else contiguous segments of the cascade;
    with ``arch``, the least-latency (or least-energy, or least energy-delay product) one on
    that architecture (tile sizes chosen by the same objective). Latency and energy add over
    groups, so the dynamic programme is exact for them; the EDP of a layer is the product of
    the sums, so for ``edp`` a Pareto pass keeps the (latency, energy) points no other
    partial grouping beats and takes the least product at the end."""
    stats = stats if stats is not None else SearchStats()
    t0 = time.perf_counter()
    what = "off-chip traffic" if arch is None else f"{_OBJECTIVE_WORDS[objective]} on {arch.name}"
    widest = groups == "convex"
    space = convex_space(cascade, widest=widest) if CONVEX_GROUPS or widest else None
    if widest and space is None:
        raise SpecError(f"cascade {cascade.name!r} is too wide for optimal-convex (more than "
                        f"{convex.WIDEST_DOWNSETS:,} downsets, {convex.WIDEST_GROUPS:,} connected convex groups or "
                        f"{convex.MAX_EINSUMS} Einsums): use the optimal mapping, which searches contiguous groups")
    if space is not None:
        grouping = convex_optimal(cascade, space, buffer_bytes, stats, arch, objective)
        if grouping is None:
            raise SpecError(f"no mapping of cascade {cascade.name!r} fits a buffer of {buffer_bytes:,} bytes")
        if grouping == "limits" and widest:
            raise SpecError(f"optimal-convex minimises {_OBJECTIVE_WORDS[objective]} by costing every connected convex "
                            f"group, at most {convex_search.EXHAUSTIVE_GROUP_LIMIT:,}; cascade {cascade.name!r} has "
                            f"{space.masks.size:,}: use --objective latency, or the optimal mapping")
        if grouping != "limits":
            found = select_runner_moves(cascade, [c.choice() for c in grouping], buffer_bytes, stats, arch, objective)
            stats.seconds += time.perf_counter() - t0
            return _finish(cascade, "optimal-convex" if widest else "optimal", found,
                           buffer_bytes, f"least {what} over connected convex groups and tiles", arch)
    names = list(search_order(cascade))  # the cascade's order, each selecting sink next to its source
    n = len(names)
    segments: dict[tuple[int, int], GroupChoice | Pick] = {}
    best = [math.inf] * (n + 1)
    back: list[tuple[int, GroupChoice | Pick] | None] = [None] * (n + 1)
    best[0] = 0.0
    lazy = convex_search.segment_choices(cascade, buffer_bytes, stats, arch, objective) if LAZY_SEGMENTS else None
    batched = {} if lazy is not None else _batched_choices(cascade, names, buffer_bytes, arch, objective)
    for b in range(1, n + 1):
        for a in range(b - 1, -1, -1):
            if best[a] == math.inf:
                continue
            choice: GroupChoice | Pick | None
            if lazy is not None:  # a segment left uncosted is in no grouping the DP could choose
                choice = lazy.get((a, b))
                if choice is None:
                    continue
            elif (hit := batched.get((a, b))) is None:
                choice = best_group(cascade, names[a:b], buffer_bytes, stats=stats, arch=arch, objective=objective)
            else:
                choice = None if isinstance(hit, str) else hit
                if stats is not None:
                    stats.evaluations += candidate_count(cascade, names[a:b])
                    stats.groups_costed += 1
            if choice is None:  # (a longer segment may still fit: see best_group)
                continue
            segments[(a, b)] = choice
            total = best[a] + choice.cost()
            if total < best[b]:
                best[b], back[b] = total, (a, choice)
    if back[n] is None:
        raise SpecError(f"no mapping of cascade {cascade.name!r} fits a buffer of {buffer_bytes:,} bytes")
    # The latency and EDP groupings are handed to _finish last group first, which numbers their
    # groups from the last (G1 = the layer's last group): kept as it has always been, so every
    # mapping and report stays the same; the traffic grouping is handed on first group first.
    chosen: list[GroupChoice | Pick] = []
    if arch is not None and objective == "edp":
        chosen = least_edp(segments, range(n + 1))[::-1]
    elif arch is not None and objective == "latency":
        chosen = least_traffic_within(segments, range(n + 1), best[n] * (1 + LATENCY_TIE_TOLERANCE))[::-1]
    else:
        b = n
        while b > 0:
            a, choice = back[b]  # type: ignore[misc]
            chosen.append(choice)
            b = a
        chosen.reverse()
    found = select_runner_moves(cascade, [c.choice() for c in chosen], buffer_bytes, stats, arch, objective)
    stats.seconds += time.perf_counter() - t0
    return _finish(cascade, "optimal", found, buffer_bytes,
                   f"least {what} over contiguous groups and tiles (its connected convex groups exceed the "
                   "default search's limits: the optimal-convex mapping searches them)" if CONVEX_GROUPS
                   else f"least {what} over contiguous groups and tiles", arch)


_OBJECTIVE_WORDS = {"latency": "latency", "energy": "energy", "edp": "energy-delay product"}


def select_runner_moves(cascade: Cascade, choices: list[GroupChoice], buffer_bytes: int | None,
                        stats: SearchStats | None, arch: Any, objective: str) -> list[GroupChoice]:
    """The optimal search's last pass: each Einsum ``S`` (in cascade order) that reads only
    tensors one other group of ``choices`` makes, and that would run once along a rank in that
    group (a *select-runner*, :func:`~mambalaya.fusion.mapping.select_ranks`: it reads one
    position of what the group makes, as the final state ``HN`` reads the scan's last), is
    tried in that group: both groups are chosen again (:func:`best_group`, the producers' group
    with ``S``, the donor without it, if any Einsum is left), and the move is kept when the
    objective does not get worse (:func:`_move_not_worse`). The dynamic programmes cannot find
    such groupings where ``S`` comes late in the cascade's order (contiguous segments) or the
    limits leave them out; without the move the group ``S`` reads from writes the whole tensor
    off chip for one position of it. Returned in the order given (a donor left empty removed)."""
    choices = list(choices)
    for name in [e.name for e in cascade.einsums]:
        where = {x: k for k, c in enumerate(choices) for x in c.group.einsums}
        inputs = cascade.einsum(name).input_tensors
        if not inputs or any(cascade.producer(t) is None for t in inputs):
            continue
        targets = {where[t] for t in inputs}
        donor = where[name]
        if len(targets) != 1 or donor in targets:
            continue
        (target,) = targets
        members = set(choices[target].group.einsums) | {name}
        joined = tuple(e.name for e in cascade.einsums if e.name in members)
        if name not in analyse(cascade, joined).selects:
            continue
        rest = [x for x in choices[donor].group.einsums if x != name]
        grown = best_group(cascade, list(joined), buffer_bytes, stats=stats, arch=arch, objective=objective)
        shrunk = best_group(cascade, rest, buffer_bytes, stats=stats, arch=arch, objective=objective) if rest else None
        if grown is None or (rest and shrunk is None):
            continue
        trial = [grown if k == target else shrunk if k == donor else c for k, c in enumerate(choices)]
        trial = [c for c in trial if c is not None]
        try:
            group_order(cascade, [replace(c.group, name=f"G{k}") for k, c in enumerate(trial)])
        except MappingError:
            continue
        if _move_not_worse(choices, trial, [choices[target], choices[donor]], [grown, shrunk], arch, objective):
            choices = trial
    return choices


def _move_not_worse(before: list[GroupChoice], after: list[GroupChoice], old: list[GroupChoice],
                    new: list[GroupChoice | None], arch: Any, objective: str) -> bool:
    """Whether the mapping ``after`` (``old`` groups replaced by ``new``) is no worse than
    ``before``: without an architecture in traffic; for latency, by the tie rule on the whole
    mapping, as the search chose ``before``: faster beyond :data:`LATENCY_TIE_TOLERANCE`
    (``before`` no longer ties with it), or within it and moving no more traffic (the moved
    groups' own latency once judged it: a move 0.03% faster for the layer and 512 B heavier
    passed, where the tie rule keeps the lighter mapping); for energy, in energy; for EDP, the
    product of the mapping's summed latencies and energies."""
    moved = [c for c in new if c is not None]
    traffic_old, traffic_new = sum(c.traffic_bytes for c in old), sum(c.traffic_bytes for c in moved)
    if arch is None:
        return traffic_new <= traffic_old
    if objective == "energy":
        return sum(c.energy_pj for c in moved) <= sum(c.energy_pj for c in old)  # type: ignore[misc]
    if objective == "edp":
        return (sum(c.latency_s for c in after) * sum(c.energy_pj for c in after)  # type: ignore[misc]
                <= sum(c.latency_s for c in before) * sum(c.energy_pj for c in before))  # type: ignore[misc]
    latency_before = sum(c.latency_s for c in before)  # type: ignore[misc]
    latency_after = sum(c.latency_s for c in after)  # type: ignore[misc]
    if latency_before > latency_after * (1 + LATENCY_TIE_TOLERANCE):
        return True
    return latency_after <= latency_before * (1 + LATENCY_TIE_TOLERANCE) and traffic_new <= traffic_old

#: Search groupings over connected convex groups (:mod:`mambalaya.search.convex`) where the
#: cascade's are few enough; the tests compare against False (contiguous groups only).
CONVEX_GROUPS = True



#: Cost only the contiguous segments the lower bounds cannot rule out (the lazy search of
#: :mod:`mambalaya.search.convex_search` over :func:`~mambalaya.search.convex.contiguous_space`);
#: the tests compare against False (every segment the search visits costed).
LAZY_SEGMENTS = True


def _batched_choices(cascade: Cascade, names: list[str], buffer_bytes: int | None, arch: Any,
                     objective: str) -> dict[tuple[int, int], Pick | str]:
    """The choices of the segments an optimal search visits (:func:`_visited_segments`), picked
    together (:func:`picked_together`), or ``"buffer"`` for a segment none of whose candidates
    fits; segments left out are for :func:`best_group` to search alone (their compute cycles
    made together beforehand, :func:`~mambalaya.search.candidates.cycles_together`)."""
    if not group_choice.batch_picks(arch, objective):
        return {}
    visited, models, too_large, fitting = visited_segments(cascade, names, buffer_bytes)
    if arch is not None:
        cycles_together(fitting, arch.compute)
    out: dict[tuple[int, int], Pick | str] = dict.fromkeys(too_large, "buffer")
    out.update(picked_together(cascade, visited, models, buffer_bytes, arch))
    return out


def _best_groups(cascade: Cascade, segments: list[list[str]], buffer_bytes: int | None, arch: Any,
                 objective: str) -> list[GroupChoice]:
    """The chosen group of each segment (:func:`best_group`'s choice), those whose closed forms
    are exact picked together; a segment that fits no buffer is a clear error (:func:`_need`)."""
    together: dict[Any, Pick | str] = {}
    if group_choice.batch_picks(arch, objective):
        keys, models = [], []
        for n, einsums in enumerate(segments):
            model = cost_model(cascade, einsums, tileable_ranks(cascade, einsums))
            if model.exact_traffic:
                keys.append(n)
                models.append(model)
        build_candidates(models)
        together = picked_together(cascade, keys, models, buffer_bytes, arch)
    choices = []
    for n, einsums in enumerate(segments):
        hit: GroupChoice | Pick | str | None = together.get(n)
        why = [hit] if isinstance(hit, str) else []
        if hit is None:
            hit = best_group(cascade, einsums, buffer_bytes, why=why, arch=arch, objective=objective)
        if (hit is None or isinstance(hit, str)) and "buffer" in why:
            wider = widened_ranks(cascade, einsums)
            if wider != tileable_ranks(cascade, einsums):  # tile a rank some member lacks (it re-runs per tile)
                retry: list[str] = []
                hit = best_group(cascade, einsums, buffer_bytes, why=retry, arch=arch, objective=objective, ranks=wider)
                why = retry if hit is None else why
        choices.append(_need(None if hit is None or isinstance(hit, str) else hit.choice(), einsums, buffer_bytes, why))
    return choices


def named_mapping(
    name: str, cascade: Cascade, buffer_bytes: int | None, stats: SearchStats | None = None, arch: Any = None,
    objective: str = "latency",
) -> Mapping:
    """Build a named mapping; with ``arch``, tiles (and for stitched/optimal, groups) are chosen
    for ``objective`` (latency, energy or edp) on that architecture, else for traffic."""
    if objective not in OBJECTIVES:
        raise SpecError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if objective != "latency" and arch is not None:
        require_energy(arch)
    if name == "unfused":
        return unfused(cascade, buffer_bytes, arch=arch, objective=objective)
    if name == "ideal":
        return ideal(cascade, buffer_bytes)
    if name == "ssm-ri":
        return ssm_ri(cascade, buffer_bytes, arch=arch, objective=objective)
    if name == "stitched":
        return stitched(cascade, buffer_bytes, stats, arch=arch, objective=objective)
    if name == "optimal":
        return optimal(cascade, buffer_bytes, stats, arch=arch, objective=objective)
    if name == "optimal-convex":
        return optimal(cascade, buffer_bytes, stats, arch=arch, objective=objective, groups="convex")
    raise SpecError(f"unknown mapping {name!r}: use one of {', '.join(NAMED_MAPPINGS)} or a mapping YAML file")


def load_mapping_file(name: str) -> Mapping:
    """The mapping YAML file ``name`` (given where a named mapping could be); a name that is
    neither a named mapping nor an existing file is one error that lists the named mappings."""

    from mambalaya.fusion.mapping_file import load_mapping
    from mambalaya.specio import path_is

    if not path_is(name):
        raise SpecError(f"unknown mapping {name!r}: use one of {', '.join(NAMED_MAPPINGS)} or the path of a mapping "
                        "YAML file")
    written = load_mapping(name)  # named by its path: a file written as "optimal" at another point is not the search's
    return replace(written, name=str(name), description=f"a mapping file, its groups and tiles as written "
                                                         f"(written as {written.name!r}: {written.description})")


__all__ = [
    "NAMED_MAPPINGS",
    "load_mapping_file",
    "OBJECTIVES",
    "GroupChoice",
    "SearchStats",
    "ideal",
    "named_mapping",
    "optimal",
    "select_runner_moves",
    "ssm_ri",
    "stitched",
    "tileable_ranks",
    "unfused",
]
