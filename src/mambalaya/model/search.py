"""Building mappings: tile choice, the named mappings, greedy stitching and the optimal search.

**Tile choice for one group.** The fused ranks a group may tile are the ranks every one of its
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
The candidate tables live in :mod:`mambalaya.model.candidates`.

**Closed-form costs, verified.** Where a group's traffic closed form is exact for every tiling
(:attr:`~mambalaya.model.candidates.GroupCostModel.exact_traffic`: every tile reads its own
slice of each tensor) and the objective is latency without an on-chip bandwidth (or traffic),
a pick's traffic and latency are the closed forms' and its legality is checked by the rules
that do not depend on tile sizes (its tiles are in range by construction and its footprint
bound fits). Otherwise every pick is re-checked by :func:`~mambalaya.fusion.mapping.check_group`
and re-costed by the general model. Either way the finished mapping is checked by every rule,
and the groups it chose are costed again by the general model: should that disagree with a
closed form, the search runs again re-costing every pick. A bug in the closed forms therefore
cannot produce an illegal or mis-costed mapping.

**Picked together.** The optimal search, ``unfused`` and ``ssm-ri`` pick the groups they need
in one pass over their concatenated candidate tables (:mod:`mambalaya.model.picks`), in the
same order as one search per group (``tests/test_closed_forms.py`` compares the mappings).

**The optimal search** is dynamic programming over the cascade's topological order: a
mapping is a sequence of *contiguous* segments, and a segment's cost (its reads from DRAM plus
its writes of tensors needed outside) depends on the segment alone, so
``best[b] = min_a best[a] + cost(a, b)`` is exact over that space. Groups that are not
contiguous in the topological order are not considered; the space includes every mapping the
greedy stitching, ``ssm-ri`` and ``unfused`` produce, so the optimum is never worse than they
are. ``tests/test_search.py`` checks it against exhaustive enumeration of the same space
(every tiling, loop order and residency prefix, costed by the general model).
"""

from __future__ import annotations

import contextvars
import functools
import math
import time
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import einsum_ops
from mambalaya.fusion.mapping import (
    FusionGroup,
    Mapping,
    MappingError,
    check_group,
    check_group_rules,
    check_mapping,
    unfused_mapping,
)
from mambalaya.model.area import leakage_w
from mambalaya.model.energy import compute_energy_pj, einsum_energy, movement_pj_per_byte, require_energy
from mambalaya.arch.kernels import compute_hz, offchip_bytes_per_s
from mambalaya.arch.spec import latency_key, spec_key
from mambalaya.model.latency import combine, group_latency, group_seconds, onchip_seconds
from mambalaya.model.candidates import (Candidates, GroupCostModel, build_candidates, cost_model, cycles_together,
                                        least_footprints, tileable_ranks, widened_ranks)
from mambalaya.model.picks import MAX_BATCH_CANDIDATES, batch_size, segment_picks
from mambalaya.model.traffic import TrafficSizeError, group_traffic

NAMED_MAPPINGS = ("unfused", "ssm-ri", "stitched", "optimal", "ideal")

#: What a search on an architecture minimises (``--objective``).
OBJECTIVES = ("latency", "energy", "edp")

#: When the search minimises latency, candidates (tilings of a group, or whole mappings) whose
#: latency is within this fraction of the best are taken as tied, and the one moving the least
#: off-chip traffic wins. A modelling rule, not a measured value: latency differences of this
#: size are below what the model resolves (its wind-up and fill terms are estimates), while
#: traffic differences among tied candidates are often several-fold (a compute-bound prefill
#: layer at L = 65536 ties within 0.5% between mappings moving 0.43 TB and 1.56 TB).
LATENCY_TIE_TOLERANCE = 0.005

#: The cascade region (``Cascade.regions``) the fine-grained-fusion baseline fuses: Geens et
#: al.'s "Fuse-All" group (discretisation, scan, readout) in the Mamba builders.
SSM_REGION_NAME = "ssm"


@dataclass
class SearchStats:
    evaluations: int = 0  # (group, tile combination) pairs costed
    groups_costed: int = 0
    seconds: float = 0.0

    @property
    def evaluations_per_s(self) -> float:
        return self.evaluations / self.seconds if self.seconds else float("inf")


@dataclass(frozen=True)
class GroupChoice:
    group: FusionGroup
    traffic_bytes: float
    footprint_bytes: float
    latency_s: float | None = None  # when chosen for an architecture
    energy_pj: float | None = None  # when chosen for energy or EDP
    objective: str = "latency"
    #: costs from the closed forms (footprint_bytes is then their upper bound), verified
    #: against the general model once the group is chosen (:func:`_verify_closed_forms`)
    closed_form: bool = False

    def cost(self) -> float:
        """What the search minimises: traffic without an architecture; with one, the
        objective's latency, energy or (for one group) energy x latency."""
        if self.latency_s is None:
            return self.traffic_bytes
        if self.objective == "energy":
            return self.energy_pj  # type: ignore[return-value]
        if self.objective == "edp":
            return self.latency_s * self.energy_pj  # type: ignore[operator]
        return self.latency_s

    def choice(self) -> GroupChoice:
        return self


class _Pick(NamedTuple):
    """A segment's candidate picked from the pick table (:func:`_picked_together`), costed by
    the closed forms: what a search needs of a :class:`GroupChoice` (:meth:`cost` and the
    costs), whose group (:meth:`choice`) is made only for the segments the search keeps. A
    search picks every segment at every point and keeps a few."""

    model: GroupCostModel
    flat: int
    traffic_bytes: float
    footprint_bytes: float
    latency_s: float | None

    def cost(self) -> float:
        return self.traffic_bytes if self.latency_s is None else self.latency_s

    def choice(self) -> GroupChoice:
        return GroupChoice(self.model.group_at(self.flat), self.traffic_bytes, self.footprint_bytes, self.latency_s,
                           closed_form=True)


def best_group(
    cascade: Cascade,
    einsums: list[str],
    buffer_bytes: int | None,
    *,
    name: str = "G",
    stats: SearchStats | None = None,
    ranks: list[str] | None = None,
    why: list[str] | None = None,
    arch: Any = None,
    objective: str = "latency",
) -> GroupChoice | None:
    """The least-traffic tiling of ``einsums`` as one group that fits the buffer, or None.

    When None, ``why`` receives ``"buffer"`` if no tiling fits (then no superset of the group
    fits either: adding an Einsum adds intermediates and state and removes tileable ranks, so
    the smallest footprint only grows) or ``"illegal"`` if the best tiling breaks a rule.

    Memoised on the cascade per (group, buffer, architecture value, objective); the candidate
    table (:meth:`GroupCostModel.candidates`) and the compute cycles behind it are shared by
    every architecture, so a sweep point that changes only the bandwidth, buffer or clock pays
    only for the final choice."""
    ranks = tileable_ranks(cascade, einsums) if ranks is None else ranks
    memo = cascade.__dict__.setdefault("_best_group_memo", {})
    model = cost_model(cascade, einsums, ranks)
    closed = model.exact_traffic and _closed_form_costs(arch, objective)
    arch_key = None if arch is None else latency_key(arch) if objective == "latency" else spec_key(arch)
    key = (tuple(einsums), tuple(ranks), buffer_bytes, arch_key, objective, closed)
    if stats is not None:
        stats.evaluations += model.size
        stats.groups_costed += 1
    if key not in memo or not MEMOISE_GROUPS:
        reason: list[str] = []
        memo[key] = (_best_group(cascade, model, einsums, ranks, buffer_bytes, reason, arch, objective, closed), reason)
    choice, reason = memo[key]
    if why is not None:
        why.extend(reason)
    return choice if choice is None or choice.group.name == name else replace(choice, group=replace(choice.group, name=name))


def _best_group(cascade: Cascade, model: "GroupCostModel", einsums: list[str], ranks: list[str], buffer_bytes: int | None,
                why: list[str], arch: Any, objective: str, closed: bool) -> GroupChoice | None:
    cand = model.candidates()
    if PRUNE_DOMINATED:
        found = _pick(cascade, model, cand, cand.kept, cand.kept_traffic, cand.kept_fp, einsums, ranks, buffer_bytes,
                      arch, objective, subset=True, closed=closed)
        if found is not _FELL_THROUGH:  # else the best kept candidate broke a rule: search them all
            return _choice(cascade, found, why, arch, objective)
    *_, traffic, fp = model.full_table()
    found = _pick(cascade, model, cand, np.arange(cand.size), traffic.ravel(), fp.ravel(), einsums, ranks, buffer_bytes,
                  arch, objective, subset=False, closed=closed)
    return _choice(cascade, found, why, arch, objective)


_FELL_THROUGH = "fell through"


#: Take a picked group's traffic and latency from the closed forms (verified on the groups of
#: the finished mapping, see :func:`_verify_closed_forms`) rather than re-costing every pick with the
#: general model; the tests compare against False.
CLOSED_FORM_COSTS = True

#: Set while a mapping is rebuilt with every pick re-costed, after the closed forms disagreed
#: with the general model on one of its groups (:func:`_recost_on_mismatch`).
_RECOST_EVERY_PICK: contextvars.ContextVar[bool] = contextvars.ContextVar("recost_every_pick", default=False)


def _closed_form_costs(arch: Any, objective: str) -> bool:
    """Whether a pick's costs may come from the closed forms (for a group whose traffic closed
    form is exact, :attr:`GroupCostModel.exact_traffic`). They equal the general model's where
    the latency depends only on the off-chip traffic, the compute cycles, the on-chip bytes and
    the steps (``tests/test_closed_forms.py`` checks candidates of every layer kind); the
    on-chip closed form leaves window halos out, so a group bound by the buffer with a halo
    disagrees and the search re-costs every pick (:func:`_recost_on_mismatch`). The energy
    closed form is a ranking, so an energy or EDP objective re-costs each pick."""
    if not CLOSED_FORM_COSTS or _RECOST_EVERY_PICK.get():
        return False
    return arch is None or objective == "latency"


def _legal_rules(cascade: Cascade, group: FusionGroup) -> bool:
    """Whether ``group`` keeps the rules that do not depend on its tile sizes
    (:func:`~mambalaya.fusion.mapping.check_group_rules`), memoised per Einsums, tiled ranks,
    halo and resident tensors."""
    memo = cascade.__dict__.setdefault("_legal_rules_memo", {})
    key = (group.einsums, frozenset(group.fused_ranks), group.halo, group.resident)
    if key not in memo:
        try:
            check_group_rules(cascade, group)
            memo[key] = True
        except MappingError:
            memo[key] = False
    return memo[key]


def _legal_pick(cascade: Cascade, model: GroupCostModel, flat: int) -> bool:
    """Whether ``model``'s candidate ``flat`` keeps the rules that do not depend on its tile
    sizes (:func:`_legal_rules`); memoised per segment (on its cost model, one per Einsums
    and tiled ranks of the cascade) and candidate, as a segment picks the same candidate at
    many points of a sweep, and the verdict per
    :meth:`~mambalaya.model.candidates.GroupCostModel.rule_key` (the candidates of one option
    that tile the same ranks share it)."""
    memo = model.__dict__.setdefault("_legal_picks_memo", {})
    hit = memo.get(flat)
    if hit is None:
        verdicts = model.__dict__.setdefault("_rule_verdicts_memo", {})  # per GroupCostModel.rule_key
        key = model.rule_key(flat)
        hit = verdicts.get(key)
        if hit is None:
            hit = verdicts[key] = _legal_rules(cascade, model.group_at(flat))
        memo[flat] = hit
    return hit


def _pick(cascade: Cascade, model: "GroupCostModel", cand: "Candidates", flat: np.ndarray, traffic: np.ndarray,
          fp: np.ndarray, einsums: list[str], ranks: list[str], buffer_bytes: int | None, arch: Any, objective: str,
          subset: bool, closed: bool = False) -> Any:
    """The first legal candidate in the objective's order (a group), ``"buffer"`` if none fits,
    ``"illegal"`` if none of the best few is legal. Over the candidates at ``flat`` (ascending
    flat indices, with their ``traffic`` and ``fp``); when they are a ``subset`` (the kept
    ones), :data:`_FELL_THROUGH` if its first fitting candidate is not legal.

    With ``closed`` (:func:`_closed_form_costs`) the group comes back as a
    :class:`GroupChoice` with its closed-form costs, and its legality is checked by the rules that do not depend on
    tile sizes: its tiles are in range by construction, and its footprint bound fits.

    Order: the objective (latency within the tie tolerance, energy, EDP, or traffic without
    an architecture), then traffic, steps, latency, and the footprint last, so a candidate
    that another beats or equals in traffic and footprint with the same tiling never comes
    first: :meth:`Candidates.kept` drops those."""
    n_tilings = cand.n_tilings
    tiling = cand.kept_tiling if subset else flat % n_tilings
    steps = cand.steps[tiling]
    ok = np.ones(len(traffic), dtype=bool) if buffer_bytes is None else fp <= buffer_bytes
    if not ok.any():
        return "buffer"
    latency = None
    if arch is None:
        order = np.lexsort((fp, steps, np.where(ok, traffic, np.inf)))
    else:
        onchip_bw = arch.memory.buffer_bandwidth_bytes_per_cycle
        need_buffer = objective != "latency" or onchip_bw is not None
        onchip = model.onchip_bytes(flat, traffic) if need_buffer else None
        comp = model.cycles(arch.compute)[tiling] / compute_hz(arch)
        mem = traffic / offchip_bytes_per_s(arch)
        latency, _ = combine(arch, comp, mem, onchip_seconds(arch, onchip) if onchip_bw else 0.0 * traffic,
                             steps, len(einsums))
        if objective == "latency":  # latencies within LATENCY_TIE_TOLERANCE of the best tie; then the least traffic wins
            best = np.min(np.where(ok, latency, np.inf))
            tied = ok & (latency <= best * (1 + LATENCY_TIE_TOLERANCE))
            order = _tied_first(tied, traffic, steps, latency, fp)
        else:
            energy = _energy_of(arch, cascade, einsums, traffic, onchip)
            value = energy if objective == "energy" else energy * latency
            order = np.lexsort((fp, steps, traffic, np.where(ok, value, np.inf)))
    for n, pick in enumerate(order[:_RECHECKS]):  # the closed forms bound the footprint from above: the first legal pick
        if not ok[pick]:
            break
        candidate = model.group_at(int(flat[pick]))
        if closed:
            if _legal_rules(cascade, candidate):
                return GroupChoice(candidate, float(traffic[pick]), float(fp[pick]),
                                   None if latency is None else float(latency[pick]), closed_form=True)
            if subset:
                return _FELL_THROUGH
            continue
        try:
            check_group(cascade, candidate, buffer_bytes)
            group_traffic(cascade, candidate)  # (memoised) the general model must be able to cost it
        except (MappingError, TrafficSizeError):
            if subset:
                return _FELL_THROUGH
            continue
        return candidate
    return "illegal"


def _tied_first(tied: np.ndarray, traffic: np.ndarray, steps: np.ndarray, latency: np.ndarray,
                fp: np.ndarray) -> np.ndarray:
    """The order ``np.lexsort((fp, latency, steps, np.where(tied, traffic, inf)))`` as far as
    :func:`_pick` reads it (the first :data:`_RECHECKS`): the tied candidates by traffic, steps,
    latency and footprint, then, only when fewer are tied, the others by steps, latency and
    footprint (ties by index, as the stable sort keeps them). Sorting the few tied candidates
    alone is what makes it cheap."""
    first = np.flatnonzero(tied)
    first = first[np.lexsort((fp[first], latency[first], steps[first], traffic[first]))]
    if len(first) >= _RECHECKS:
        return first
    rest = np.flatnonzero(~tied)
    return np.concatenate([first, rest[np.lexsort((fp[rest], latency[rest], steps[rest]))]])


def _choice(cascade: Cascade, found: Any, why: list[str], arch: Any, objective: str) -> GroupChoice | None:
    """The exact costs of the picked group (or None, with the reason in ``why``)."""
    if isinstance(found, str):
        why.append(found)
        return None
    if isinstance(found, GroupChoice):  # costed by the closed forms already
        return found
    group = found
    exact = group_traffic(cascade, group)
    if arch is None:
        return GroupChoice(group, exact.total_bytes, exact.footprint_bytes)
    if objective == "latency":
        return GroupChoice(group, exact.total_bytes, exact.footprint_bytes, group_seconds(arch, cascade, group))
    gl, rows = group_latency(arch, cascade, group, exact)
    static_w = leakage_w(arch)
    energy = sum(einsum_energy(arch, cascade, r, static_w).total_pj for r in rows)
    return GroupChoice(group, exact.total_bytes, exact.footprint_bytes, gl.latency, energy, objective)


#: Search only the candidates no other of the same tiling beats or equals in both traffic and
#: footprint (:meth:`Candidates.kept`); the tests compare against False (every candidate).
PRUNE_DOMINATED = True

#: Memoise :func:`best_group` per (group, buffer, architecture, objective); the tests compare
#: against False.
MEMOISE_GROUPS = True


#: How many of the best candidates of a group's search are re-checked before it gives up: the
#: first legal one is taken (a candidate fails only on a rule the closed forms do not see).
_RECHECKS = 8


def _energy_of(arch: Any, cascade: Cascade, einsums: list[str], traffic: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Group energy for every tiling: arithmetic (which the tiling does not change) plus DRAM
    and buffer bytes; the buffer's reads and writes at their mean energy (a ranking; the chosen
    tiling's energy is recomputed exactly)."""
    fixed = sum(compute_energy_pj(arch, cascade, n, einsum_ops(cascade, cascade.einsum(n))) for n in einsums)
    dram, buf_read, buf_write = movement_pj_per_byte(arch)
    return fixed + traffic * dram + buffer * (buf_read + buf_write) / 2


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
    little; a mismatch (never seen on the shipped cascades) makes the search run again with
    every pick re-costed (:func:`_recost_on_mismatch`)."""
    for c in choices:
        if not c.closed_form:
            continue
        exact = group_traffic(cascade, c.group)
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
            token = _RECOST_EVERY_PICK.set(True)
            try:
                return build(*args, **kwargs)
            finally:
                _RECOST_EVERY_PICK.reset(token)

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
    return _finish(cascade, "ssm-ri", choices, buffer_bytes, "RI fusion of AD, BX, H, YS (Geens et al.); rest unfused", arch)


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
) -> Mapping:
    """The least-traffic mapping over contiguous groupings and tile sizes (see the module doc);
    with ``arch``, the least-latency (or least-energy, or least energy-delay product) one on
    that architecture (tile sizes chosen by the same objective). Latency and energy add over
    groups, so the dynamic programme is exact for them; the EDP of a layer is the product of
    the sums, so for ``edp`` a Pareto pass keeps the (latency, energy) points no other
    partial grouping beats and takes the least product at the end."""
    stats = stats if stats is not None else SearchStats()
    t0 = time.perf_counter()
    names = [e.name for e in cascade.einsums]
    n = len(names)
    segments: dict[tuple[int, int], GroupChoice | _Pick] = {}
    best = [math.inf] * (n + 1)
    back: list[tuple[int, GroupChoice | _Pick] | None] = [None] * (n + 1)
    best[0] = 0.0
    batched = _batched_choices(cascade, names, buffer_bytes, arch, objective)
    for b in range(1, n + 1):
        for a in range(b - 1, -1, -1):
            if best[a] == math.inf:
                continue
            why: list[str] = []
            hit = batched.get((a, b))
            choice: GroupChoice | _Pick | None
            if hit is None:
                choice = best_group(cascade, names[a:b], buffer_bytes, stats=stats, why=why, arch=arch, objective=objective)
            else:
                choice, why = (None, [hit]) if isinstance(hit, str) else (hit, why)
                if stats is not None:
                    stats.evaluations += _candidate_count(cascade, names[a:b])
                    stats.groups_costed += 1
            if choice is None:
                if why == ["buffer"]:
                    break  # growing the segment upwards only adds on-chip data (see best_group)
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
    chosen: list[GroupChoice | _Pick] = []
    if arch is not None and objective == "edp":
        chosen = _least_edp(segments, n)[::-1]
    elif arch is not None and objective == "latency":
        chosen = _least_traffic_within(segments, n, best[n] * (1 + LATENCY_TIE_TOLERANCE))[::-1]
    else:
        b = n
        while b > 0:
            a, choice = back[b]  # type: ignore[misc]
            chosen.append(choice)
            b = a
        chosen.reverse()
    stats.seconds += time.perf_counter() - t0
    what = "off-chip traffic" if arch is None else f"{_OBJECTIVE_WORDS[objective]} on {arch.name}"
    return _finish(cascade, "optimal", [c.choice() for c in chosen], buffer_bytes,
                   f"least {what} over contiguous groups and tiles", arch)


_OBJECTIVE_WORDS = {"latency": "latency", "energy": "energy", "edp": "energy-delay product"}

#: Pick the segments of an optimal search together (:mod:`mambalaya.model.picks`) where the
#: closed forms cost the picks; the tests compare against False (one search per segment).
BATCH_PICKS = True


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


def _batched_choices(cascade: Cascade, names: list[str], buffer_bytes: int | None, arch: Any,
                     objective: str) -> dict[tuple[int, int], _Pick | str]:
    """The choices of the segments an optimal search visits (:func:`_visited_segments`), picked
    together (:func:`_picked_together`), or ``"buffer"`` for a segment none of whose candidates
    fits; segments left out are for :func:`best_group` to search alone (their compute cycles
    made together beforehand, :func:`~mambalaya.model.candidates.cycles_together`)."""
    if not BATCH_PICKS or not _closed_form_costs(arch, objective):
        return {}
    visited, models, too_large, fitting = _visited_segments(cascade, names, buffer_bytes)
    if arch is not None:
        cycles_together(fitting, arch.compute)
    out: dict[tuple[int, int], _Pick | str] = dict.fromkeys(too_large, "buffer")
    out.update(_picked_together(cascade, visited, models, buffer_bytes, arch))
    return out


def _picked_together(cascade: Cascade, keys: list[Any], models: list[GroupCostModel], buffer_bytes: int | None,
                     arch: Any) -> dict[Any, _Pick | str]:
    """Each model's pick (by its key), picked together
    (:func:`~mambalaya.model.picks.segment_picks`), or ``"buffer"`` if none of its candidates
    fits. Left out, for :func:`best_group` to search alone: a model whose first pick breaks a
    rule, and every model when they hold too many candidates."""
    out: dict[Any, _Pick | str] = {}
    if not models or batch_size(models) > MAX_BATCH_CANDIDATES:
        return out
    for key, model, pick in zip(keys, models, segment_picks(models, buffer_bytes, arch, LATENCY_TIE_TOLERANCE)):
        if pick is None:
            out[key] = "buffer"
        elif _legal_pick(cascade, model, pick.flat):
            out[key] = _Pick(model, pick.flat, pick.traffic_bytes, pick.footprint_bound_bytes, pick.latency_s)
    return out


def _best_groups(cascade: Cascade, segments: list[list[str]], buffer_bytes: int | None, arch: Any,
                 objective: str) -> list[GroupChoice]:
    """The chosen group of each segment (:func:`best_group`'s choice), those whose closed forms
    are exact picked together; a segment that fits no buffer is a clear error (:func:`_need`)."""
    together: dict[Any, _Pick | str] = {}
    if BATCH_PICKS and _closed_form_costs(arch, objective):
        keys, models = [], []
        for n, einsums in enumerate(segments):
            model = cost_model(cascade, einsums, tileable_ranks(cascade, einsums))
            if model.exact_traffic:
                keys.append(n)
                models.append(model)
        build_candidates(models)
        together = _picked_together(cascade, keys, models, buffer_bytes, arch)
    choices = []
    for n, einsums in enumerate(segments):
        hit: GroupChoice | _Pick | str | None = together.get(n)
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
    raise SpecError(f"unknown mapping {name!r}: use one of {', '.join(NAMED_MAPPINGS)} or a mapping YAML file")


@dataclass(frozen=True)
class ParetoPoint:
    buffer_bytes: int
    footprint_bytes: float
    traffic_bytes: float
    groups: int


def pareto_frontier(cascade: Cascade, buffers: list[int] | None = None) -> list[ParetoPoint]:
    """Optimal traffic at each buffer size (default 64 KiB .. 4 GiB in factors of 2), keeping
    the points no smaller buffer matches."""
    buffers = buffers or [1 << k for k in range(16, 33)]
    points: list[ParetoPoint] = []
    for cap in sorted(buffers):
        try:
            m = optimal(cascade, cap)
        except SpecError:
            continue
        groups = [group_traffic(cascade, g) for g in m.groups]
        traffic = sum(g.total_bytes for g in groups)
        fp = max(g.footprint_bytes for g in groups)
        if points and traffic >= points[-1].traffic_bytes:
            continue
        points.append(ParetoPoint(cap, fp, traffic, len(groups)))
    return points


__all__ = [
    "NAMED_MAPPINGS",
    "OBJECTIVES",
    "GroupChoice",
    "ParetoPoint",
    "SearchStats",
    "best_group",
    "ideal",
    "named_mapping",
    "optimal",
    "pareto_frontier",
    "ssm_ri",
    "stitched",
    "tileable_ranks",
    "unfused",
]
