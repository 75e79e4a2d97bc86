"""One group's choice: the best tiling, loop order and residency of a group of Einsums that fits
the buffer (:func:`best_group`), and many groups' choices picked together from their closed
forms (:func:`picked_together`).

The switches here (:data:`CLOSED_FORM_COSTS`, :data:`PRUNE_DOMINATED`, :data:`MEMOISE_GROUPS`,
:data:`BATCH_PICKS`) each turn one shortcut off; the tests compare the mappings with each one
off against those with it on. :mod:`mambalaya.search.mappings` builds the named mappings from
these choices, and :mod:`mambalaya.search.convex_search` costs its convex groups with them.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mambalaya.arch.keys import latency_key, spec_key
from mambalaya.cost.area import leakage_w
from mambalaya.cost.energy import einsum_energy
from mambalaya.cost.latency import group_latency, group_seconds
from mambalaya.cost.traffic import group_traffic
from mambalaya.einsum.cascade import Cascade
from mambalaya.search.candidates import GroupCostModel, cost_model, prepare_full_tables, tileable_ranks
from mambalaya.search.picking import FELL_THROUGH, LATENCY_TIE_TOLERANCE, GroupChoice, Pick, legal_pick, pick_least
from mambalaya.search.picks import MAX_BATCH_CANDIDATES, batch_size, segment_picks


@dataclass
class SearchStats:
    evaluations: int = 0  # (group, tile combination) pairs costed
    groups_costed: int = 0
    seconds: float = 0.0

    @property
    def evaluations_per_s(self) -> float:
        return self.evaluations / self.seconds if self.seconds else float("inf")


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

    When None, ``why`` receives ``"buffer"`` if no tiling fits or ``"illegal"`` if the best
    tiling breaks a rule. A group holding this one may still fit: adding an Einsum mostly adds
    intermediates and state and removes tileable ranks, but adding the producer of a tensor a
    member reads at one position (``HN = H[b,L-1]``) turns a whole slice read from off chip into
    the tile holding that position (zamba2-2.7b's chunked Mamba layer: ``HN .. O`` needs 63 MB,
    ``XDT .. XO`` 28 MB; every group holding the first was once left out).

    Memoised on the cascade per (group, buffer, architecture value, objective); the candidate
    table (:meth:`GroupCostModel.candidates`) and the compute cycles behind it are shared by
    every architecture, so a sweep point that changes only the bandwidth, buffer or clock pays
    only for the final choice."""
    ranks = tileable_ranks(cascade, einsums) if ranks is None else ranks
    memo = cascade.__dict__.setdefault("_best_group_memo", {})
    model = cost_model(cascade, einsums, ranks)
    closed = model.exact_traffic and closed_form_costs(arch, objective)
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
    if PRUNE_DOMINATED:  # of the kept candidates only the first matters; for latency or traffic, its contenders
        flat, traffic, fp, tiling = (model.contenders(buffer_bytes) if arch is None or objective == "latency"
                                     else (cand.kept, cand.kept_traffic, cand.kept_fp, cand.kept_tiling))
        found = pick_least(cascade, model, cand, flat, traffic, fp, einsums, ranks, buffer_bytes, arch, objective,
                      subset=True, closed=closed, tiling=tiling)
        if found is not FELL_THROUGH:  # else the best kept candidate broke a rule: search them all
            return _choice(cascade, found, why, arch, objective)
    *_, traffic, fp = model.full_table()
    found = pick_least(cascade, model, cand, np.arange(cand.size), traffic.ravel(), fp.ravel(), einsums, ranks, buffer_bytes,
                  arch, objective, subset=False, closed=closed)
    return _choice(cascade, found, why, arch, objective)




#: Take a picked group's traffic and latency from the closed forms (verified on the groups of
#: the finished mapping, see :func:`_verify_closed_forms`) rather than re-costing every pick with the
#: general model; the tests compare against False.
CLOSED_FORM_COSTS = True

#: Set while a mapping is rebuilt with every pick re-costed, after the closed forms disagreed
#: with the general model on one of its groups (:func:`_recost_on_mismatch`).
RECOST_EVERY_PICK: contextvars.ContextVar[bool] = contextvars.ContextVar("recost_every_pick", default=False)


def closed_form_costs(arch: Any, objective: str) -> bool:
    """Whether a pick's costs may come from the closed forms (for a group whose traffic closed
    form is exact, :attr:`GroupCostModel.exact_traffic`). They equal the general model's where
    the latency depends only on the off-chip traffic, the compute cycles, the on-chip bytes and
    the steps (``tests/test_closed_forms.py`` checks candidates of every layer kind); the
    on-chip closed form leaves window halos out, so a group bound by the buffer with a halo
    disagrees and the search re-costs every pick (:func:`_recost_on_mismatch`). The energy
    closed form is a ranking, so an energy or EDP objective re-costs each pick."""
    if not CLOSED_FORM_COSTS or RECOST_EVERY_PICK.get():
        return False
    return arch is None or objective == "latency"


def _choice(cascade: Cascade, found: Any, why: list[str], arch: Any, objective: str) -> GroupChoice | None:
    """The exact costs of the picked group (or None, with the reason in ``why``)."""
    if isinstance(found, str):
        why.append(found)
        return None
    if isinstance(found, GroupChoice):  # costed by the closed forms already
        return found
    group = found
    exact = group_traffic(cascade, group, named=False)
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



#: Pick the segments of an optimal search together (:mod:`mambalaya.search.picks`) where the
#: closed forms cost the picks; the tests compare against False (one search per segment).
BATCH_PICKS = True


def picked_together(cascade: Cascade, keys: list[Any], models: list[GroupCostModel], buffer_bytes: int | None,
                     arch: Any) -> dict[Any, Pick | str]:
    """Each model's pick (by its key), picked together
    (:func:`~mambalaya.search.picks.segment_picks`), or ``"buffer"`` if none of its candidates
    fits. Left out, for :func:`best_group` to search alone: a model whose first pick breaks a
    rule (:func:`best_group` then searches its whole table, made here for all of them together,
    :func:`~mambalaya.search.candidates.prepare_full_tables`), and every model when they hold
    too many candidates."""
    out: dict[Any, Pick | str] = {}
    if not models or batch_size(models) > MAX_BATCH_CANDIDATES:
        return out
    broke: list[GroupCostModel] = []
    for key, model, pick in zip(keys, models, segment_picks(models, buffer_bytes, arch, LATENCY_TIE_TOLERANCE)):
        if pick is None:
            out[key] = "buffer"
        elif legal_pick(cascade, model, pick.flat):
            out[key] = Pick(model, pick.flat, pick.traffic_bytes, pick.footprint_bound_bytes, pick.latency_s)
        else:
            broke.append(model)
    prepare_full_tables(broke)
    return out




def batch_picks(arch: Any, objective: str) -> bool:
    """Whether the groups of a search are picked together (:func:`picked_together`): with
    :data:`BATCH_PICKS` on and the closed forms costing the picks (:func:`closed_form_costs`)."""
    return BATCH_PICKS and closed_form_costs(arch, objective)


__all__ = ["BATCH_PICKS", "CLOSED_FORM_COSTS", "MEMOISE_GROUPS", "PRUNE_DOMINATED", "RECOST_EVERY_PICK", "SearchStats",
           "batch_picks", "best_group", "closed_form_costs", "picked_together"]
