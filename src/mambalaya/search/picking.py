"""Picking one candidate of a group's table: the choice itself (:class:`GroupChoice`), the
rules a candidate must keep whatever its tile sizes (:func:`legal_rules`), and the first legal
candidate in the objective's order (:func:`pick_least`). :mod:`mambalaya.search.mappings` runs it per
group and segment."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from mambalaya.arch.kernels import compute_hz, offchip_bytes_per_s
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import einsum_ops
from mambalaya.fusion.mapping import FusionGroup, MappingError, check_group, check_group_rules
from mambalaya.search.candidates import Candidates, GroupCostModel
from mambalaya.cost.energy import compute_energy_pj, movement_pj_per_byte, staging_pj_per_byte
from mambalaya.cost.latency import combine, onchip_seconds, scan_floor_s
from mambalaya.cost.traffic import TrafficSizeError, group_traffic

#: When the search minimises latency, candidates (tilings of a group, or whole mappings) whose
#: latency is within this fraction of the best are taken as tied, and the one moving the least
#: off-chip traffic wins. A modelling rule, not a measured value: latency differences of this
#: size are below what the model resolves (its wind-up and fill terms are estimates), while
#: traffic differences among tied candidates are often several-fold (a compute-bound prefill
#: layer at L = 65536 ties within 0.5% between mappings moving 0.43 TB and 1.56 TB).
LATENCY_TIE_TOLERANCE = 0.005


FELL_THROUGH = "fell through"


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


class Pick(NamedTuple):
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


def legal_rules(cascade: Cascade, group: FusionGroup) -> bool:
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


def legal_pick(cascade: Cascade, model: GroupCostModel, flat: int) -> bool:
    """Whether ``model``'s candidate ``flat`` keeps the rules that do not depend on its tile
    sizes (:func:`legal_rules`); memoised per segment (on its cost model, one per Einsums
    and tiled ranks of the cascade) and candidate, as a segment picks the same candidate at
    many points of a sweep, and the verdict per
    :meth:`~mambalaya.search.candidates.GroupCostModel.rule_key` (:func:`legal_picks`: the
    candidates of one option that tile the same ranks share it)."""
    memo = model.__dict__.setdefault("_legal_picks_memo", {})
    hit = memo.get(flat)
    if hit is None:
        hit = memo[flat] = bool(legal_picks(cascade, model, np.array([flat], dtype=np.int64))[0])
    return hit


def legal_picks(cascade: Cascade, model: GroupCostModel, flat: np.ndarray) -> np.ndarray:
    """:func:`legal_pick` of every candidate at ``flat``: one verdict per distinct
    :meth:`~mambalaya.search.candidates.GroupCostModel.rule_keys` among them (the same memo),
    spread back over the candidates."""
    verdicts = model.__dict__.setdefault("_rule_verdicts_memo", {})
    keys, first, inverse = np.unique(model.rule_keys(flat), return_index=True, return_inverse=True)
    judged = np.empty(len(keys), dtype=bool)
    for i, (key, at) in enumerate(zip(keys.tolist(), first.tolist())):
        hit = verdicts.get(key)
        if hit is None:
            hit = verdicts[key] = legal_rules(cascade, model.group_at(int(flat[at])))
        judged[i] = hit
    return judged[inverse.reshape(-1)]


def pick_least(cascade: Cascade, model: "GroupCostModel", cand: "Candidates", flat: np.ndarray, traffic: np.ndarray,
          fp: np.ndarray, einsums: list[str], ranks: list[str], buffer_bytes: int | None, arch: Any, objective: str,
          subset: bool, closed: bool = False, tiling: np.ndarray | None = None) -> Any:
    """The first legal candidate in the objective's order (a group), ``"buffer"`` if none fits,
    ``"illegal"`` if none of the best few is legal. Over the candidates at ``flat`` (ascending
    flat indices, with their ``traffic`` and ``fp``); when they are a ``subset`` (the kept
    ones, or fewer: only the first is checked), :data:`FELL_THROUGH` if its first fitting
    candidate is not legal. ``tiling``: each candidate's tiling (default: its flat index's).

    With ``closed`` (:func:`_closed_form_costs`) the group comes back as a
    :class:`GroupChoice` with its closed-form costs, and its legality is checked by the rules that do not depend on
    tile sizes: its tiles are in range by construction, and its footprint bound fits.

    Order: the objective (latency within the tie tolerance, energy, EDP, or traffic without
    an architecture), then traffic, steps, latency, and the footprint last, so a candidate
    that another beats or equals in traffic and footprint with the same tiling never comes
    first: :meth:`Candidates.kept` drops those."""
    n_tilings = cand.n_tilings
    tiling = flat % n_tilings if tiling is None else tiling
    steps = cand.steps[tiling]
    ok = np.ones(len(traffic), dtype=bool) if buffer_bytes is None else fp <= buffer_bytes
    if not ok.any():
        return "buffer"
    latency, order = _pick_order(cascade, model, flat, traffic, fp, steps, tiling, einsums, ok, arch, objective)
    found = _first_legal(cascade, model, flat, traffic, fp, latency, ok, itertools.islice(order, _RECHECKS),
                         buffer_bytes, subset, closed)
    if found != "illegal" or subset:
        return found
    # the best few break a rule that does not depend on tile sizes (a tiled rank some member reads
    # at other positions, whatever its tile): the search was exact only if the group was not
    # dropped, so every candidate is judged by those rules (memoised per option and tiled ranks)
    # and the objective's order taken again over the legal ones
    legal = ok.copy()
    legal[ok] = legal_picks(cascade, model, flat[ok])
    if not legal.any():
        return "illegal"
    latency, order = _pick_order(cascade, model, flat, traffic, fp, steps, tiling, einsums, legal, arch, objective)
    return _first_legal(cascade, model, flat, traffic, fp, latency, legal, order, buffer_bytes, subset, closed)


def _pick_order(cascade: Cascade, model: "GroupCostModel", flat: np.ndarray, traffic: np.ndarray, fp: np.ndarray,
                steps: np.ndarray, tiling: np.ndarray, einsums: list[str], ok: np.ndarray, arch: Any,
                objective: str) -> tuple[Any, Any]:
    """(each candidate's latency or None without an architecture, the candidates in the
    objective's order among those ``ok``: :func:`pick_least`'s order)."""
    if arch is None:
        return None, np.lexsort((fp, steps, np.where(ok, traffic, np.inf)))
    onchip_bw = arch.memory.buffer_bandwidth_bytes_per_cycle
    need_buffer = objective != "latency" or onchip_bw is not None
    onchip = model.onchip_bytes(flat, traffic) if need_buffer else None
    comp = np.maximum(model.cycles(arch.compute)[tiling] / compute_hz(arch),
                      scan_floor_s(arch, cascade, tuple(einsums)))
    mem = traffic / offchip_bytes_per_s(arch)
    latency, _ = combine(arch, comp, mem, onchip_seconds(arch, onchip if onchip_bw else 0.0 * traffic, traffic),
                         steps, len(einsums))
    if objective == "latency":  # latencies within LATENCY_TIE_TOLERANCE of the best tie; then the least traffic wins
        best = np.min(np.where(ok, latency, np.inf))
        tied = ok & (latency <= best * (1 + LATENCY_TIE_TOLERANCE))
        return latency, _tied_first(tied, traffic, steps, latency, fp)
    energy = _energy_of(arch, cascade, einsums, traffic, onchip)
    value = energy if objective == "energy" else energy * latency
    return latency, np.lexsort((fp, steps, traffic, np.where(ok, value, np.inf)))


def _first_legal(cascade: Cascade, model: "GroupCostModel", flat: np.ndarray, traffic: np.ndarray, fp: np.ndarray,
                 latency: Any, ok: np.ndarray, order: Any, buffer_bytes: int | None, subset: bool, closed: bool) -> Any:
    """The first candidate of ``order`` that keeps every rule (:func:`pick_least`), ``"illegal"``
    if none of them does (or :data:`FELL_THROUGH` for a ``subset`` whose first does not)."""
    for pick in order:  # the closed forms bound the footprint from above: the first legal pick
        if not ok[pick]:
            break
        candidate = model.group_at(int(flat[pick]))
        if closed:
            if legal_rules(cascade, candidate):
                return GroupChoice(candidate, float(traffic[pick]), float(fp[pick]),
                                   None if latency is None else float(latency[pick]), closed_form=True)
            if subset:
                return FELL_THROUGH
            continue
        try:
            check_group(cascade, candidate, buffer_bytes)
            group_traffic(cascade, candidate)  # (memoised) the general model must be able to cost it
        except (MappingError, TrafficSizeError):
            if subset:
                return FELL_THROUGH
            continue
        return candidate
    return "illegal"


def _tied_first(tied: np.ndarray, traffic: np.ndarray, steps: np.ndarray, latency: np.ndarray,
                fp: np.ndarray) -> Iterator[int]:
    """The order ``np.lexsort((fp, latency, steps, np.where(tied, traffic, inf)))`` as far as
    :func:`pick_least` reads it: the tied candidates by traffic, steps, latency and footprint, then,
    only when :func:`pick_least` reads past them (fewer than :data:`_RECHECKS` are tied and none of
    them was legal), the others by steps, latency and footprint (ties by index, as the stable
    sort keeps them). Sorting the few tied candidates alone, and the rest only when it is read,
    is what makes it cheap."""
    first = np.flatnonzero(tied)
    yield from first[np.lexsort((fp[first], latency[first], steps[first], traffic[first]))]
    if len(first) >= _RECHECKS:
        return
    rest = np.flatnonzero(~tied)
    yield from rest[np.lexsort((fp[rest], latency[rest], steps[rest]))]


#: How many of the best candidates of a group's search are re-checked before it gives up: the
#: first legal one is taken (a candidate fails only on a rule the closed forms do not see).
_RECHECKS = 8


def _energy_of(arch: Any, cascade: Cascade, einsums: list[str], traffic: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Group energy for every tiling: arithmetic (which the tiling does not change) plus DRAM
    and buffer bytes; the buffer's reads and writes at their mean energy (a ranking; the chosen
    tiling's energy is recomputed exactly)."""
    fixed = sum(compute_energy_pj(arch, cascade, n, einsum_ops(cascade, cascade.einsum(n))) for n in einsums)
    dram, buf_read, buf_write = movement_pj_per_byte(arch)
    return fixed + traffic * (dram + staging_pj_per_byte(arch)) + buffer * (buf_read + buf_write) / 2
