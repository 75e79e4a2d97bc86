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
The chosen group is re-checked by :func:`~mambalaya.fusion.mapping.check_group` and its
traffic recomputed by the general model, so a bug in the closed forms cannot produce an
illegal or mis-costed mapping.

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

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import rank_of_variable
from mambalaya.einsum.stats import einsum_ops
from mambalaya.fusion.mapping import (
    FusionGroup,
    Loop,
    Mapping,
    MappingError,
    check_group,
    check_mapping,
    intermediates,
    produced_in,
    tensors_read,
    unfused_mapping,
    window_halos,
)
from mambalaya.model.energy import compute_energy_pj, einsum_energy, movement_pj_per_byte, require_energy
from mambalaya.arch.spec import spec_key
from mambalaya.model.latency import combine, group_latency, group_seconds, onchip_seconds
from mambalaya.model.spatial import einsum_unit_cycles, step_shapes
from mambalaya.model.traffic import buffer_read_elements, group_traffic

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


def tileable_ranks(cascade: Cascade, einsums: list[str]) -> list[str]:
    """Ranks every Einsum of the group writes and none reduces, in loop order. Memoised on the
    (immutable) cascade: a search asks for every candidate group's on every point."""
    memo = cascade.__dict__.setdefault("_tileable_ranks_memo", {})
    key = tuple(einsums)
    if key not in memo:
        memo[key] = tuple(_tileable_ranks(cascade, einsums))
    return list(memo[key])


def _tileable_ranks(cascade: Cascade, einsums: list[str]) -> list[str]:
    common: set[str] | None = None
    reduced: set[str] = set()
    for name in einsums:
        e = cascade.einsum(name)
        outs = {rank_of_variable(v) for v in e.output_variables}
        common = outs if common is None else common & outs
        reduced |= {rank_of_variable(v) for v in e.reduced_variables}
    ranks = [r for r in cascade.ranks if r in (common or set()) - reduced and cascade.size(r) > 1]
    gen = set(cascade.generational_ranks)
    return [r for r in ranks if r not in gen] + [r for r in ranks if r in gen]


def _tile_options(size: int) -> list[int]:
    opts = [1 << k for k in range(size.bit_length()) if (1 << k) < size]
    return opts + [size]


@dataclass(frozen=True)
class _Candidates:
    """The candidate table of one group (see :meth:`_GroupCostModel.candidates`), as kept for
    the search: per tiling its tiles, trips and steps, and the candidates no other of the same
    tiling dominates (:func:`_kept`) with their traffic and footprint. The full table is rebuilt
    on the rare call that needs it (:meth:`_GroupCostModel.full_table`), so memory holds only
    the kept part."""

    tiles: list[np.ndarray]  # per tileable rank, its tile in each tiling
    trips: list[np.ndarray]
    options: list[tuple[tuple[int, ...], int]]  # (loop order, residency prefix) of each block of tilings
    n_tilings: int
    steps: np.ndarray  # per tiling (every option of a tiling runs the same steps)
    size: int  # candidates in the full table (options x tilings)
    kept: np.ndarray  # flat indices (option-major, ascending) of the kept candidates
    kept_traffic: np.ndarray  # off-chip bytes of each kept candidate
    kept_fp: np.ndarray  # footprint bound (bytes)
    kept_tiling: np.ndarray  # the tiling of each kept candidate (int32: memory holds millions of them)


def _kept(traffic: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Flat indices (ascending) of the candidates (arrays of shape (options, tilings)) no option
    of the same tiling beats or equals in traffic and footprint, an equal one of lower index
    excepted. Within a tiling the steps and compute cycles are the same and the on-chip bytes,
    energy and latency grow with the traffic, so a dropped candidate never comes first in
    :func:`_pick`'s order, for any buffer, bandwidth or objective."""
    order = np.lexsort((fp, traffic), axis=0)  # per tiling: by traffic, then footprint
    fp_sorted = np.take_along_axis(fp, order, axis=0)
    before = np.vstack([np.full((1, fp.shape[1]), np.inf), np.minimum.accumulate(fp_sorted, axis=0)[:-1]])
    rows, cols = np.nonzero(fp_sorted < before)
    kept = np.sort(order[rows, cols] * traffic.shape[1] + cols)
    return kept.astype(np.int32) if traffic.size < 2**31 else kept  # memory holds millions of them


class _GroupCostModel:
    """Closed forms of one group's traffic and footprint as functions of its tile sizes."""

    def __init__(self, cascade: Cascade, einsums: list[str], ranks: list[str]):
        self.cascade = cascade
        self.ranks = ranks
        full = FusionGroup("probe", tuple(einsums), tuple(Loop(r, cascade.size(r)) for r in ranks))
        self.probe = full
        # traffic: each read/written tensor costs its untiled bytes times the trips of the
        # fused ranks its accesses do not mention (see model/traffic.py)
        base = group_traffic(cascade, full)
        self.terms: list[tuple[float, list[int]]] = []
        inside = produced_in(full)
        einsum_objs = [cascade.einsum(n) for n in einsums]
        for t, b in base.read_bytes.items():
            mentioned = self._mentioned_for_read(t, einsum_objs, inside)
            self.terms.append((b, [i for i, r in enumerate(ranks) if r not in mentioned]))
        for t, b in base.write_bytes.items():
            outs = {rank_of_variable(v) for v in cascade.einsum(t).output_variables}
            self.terms.append((b, [i for i, r in enumerate(ranks) if r not in outs]))
        self._buffer_terms: list[tuple[float, list[int]]] | None = None
        self._candidates: _Candidates | None = None
        self._onchip: np.ndarray | None = None
        self._cycles: dict[str, np.ndarray] = {}
        # residency candidates: tensors read off-chip that some loop of the fixed order does
        # not index and that runs inside every loop that does (weights, per-channel parameters
        # under an outer channel loop); largest first
        readable = set(tensors_read(cascade, full))
        self._reads = [(t, b, {i for i, r in enumerate(ranks) if r in self._mentioned_for_read(t, einsum_objs, inside)})
                       for t, b in sorted(base.read_bytes.items(), key=lambda tb: (-tb[1], tb[0])) if t in readable]
        # loop orders: the fixed one first, then every other order of the ranks that are not
        # generational, the generational ones still innermost (so footprints do not change)
        gen = set(cascade.generational_ranks)
        free = [i for i, r in enumerate(ranks) if r not in gen]
        tail = [i for i, r in enumerate(ranks) if r in gen]
        self.orders = [tuple(p) + tuple(tail) for p in itertools.permutations(free)] if len(free) <= 3 else [tuple(range(len(ranks)))]
        self._keepable: dict[tuple[int, ...], list[tuple[str, float, set[int]]]] = {}
        self.keepable = self.keepable_for(self.orders[0])
        # footprint: sum of products of extents
        # (bytes per element x fixed extents, tiled rank indices, rank whose tiling creates the term)
        self.fp_terms: list[tuple[float, list[int], int | None]] = []
        for t in intermediates(cascade, full):
            self._add_fp(t, None, 1)
        for name in einsums:
            rec = cascade.recurrence(cascade.einsum(name))
            if rec:
                self._add_fp(name, rec[0], rec[1])
        if full.halo == "retain":  # a halo is kept only while its rank is actually tiled
            for (t, rank), rows in window_halos(cascade, full).items():
                self._add_fp(t, rank, rows, only_if_tiled=rank)

    def _mentioned_for_read(self, tensor, einsum_objs, inside) -> set[str]:
        mentioned: set[str] = set()
        spec = self.cascade.tensors
        for e in einsum_objs:
            for a in e.inputs:
                src = a.tensor
                hits = src == tensor and src not in inside
                hits = hits or (spec[src].initial == tensor)
                if hits:
                    mentioned |= {rank_of_variable(v) for idx in a.indices for v in idx.variables}
        return mentioned

    def _add_fp(self, tensor: str, skip_rank: str | None, rows: int, only_if_tiled: str | None = None) -> None:
        spec = self.cascade.tensors[tensor]
        fixed = rows * spec.bits / 8
        tiled = []
        for r in spec.ranks:
            if r == skip_rank:
                continue
            if r in self.ranks:
                tiled.append(self.ranks.index(r))
            else:
                fixed *= self.cascade.size(r)
        self.fp_terms.append((fixed, tiled, self.ranks.index(only_if_tiled) if only_if_tiled else None))

    def grid(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        opts = [np.array(_tile_options(self.cascade.size(r)), dtype=np.int64) for r in self.ranks]
        mesh = np.meshgrid(*opts, indexing="ij") if opts else []
        tiles = [m.ravel() for m in mesh]
        trips = [np.ceil(self.cascade.size(r) / t).astype(np.float64) for r, t in zip(self.ranks, tiles)]
        return tiles, trips

    def full_table(self) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[tuple[int, ...], int]], np.ndarray, np.ndarray]:
        """Every (loop order, residency prefix, tiling) of the group with its closed-form
        traffic and footprint, arrays of shape (options, tilings). Option ``(o, j)`` runs loop
        order ``o`` and keeps the ``j`` largest of its residency candidates on chip (``j = 0``,
        everything streamed, is the same for every order). Returned with the grid's tiles and
        trips."""
        tiles, trips = self.grid()
        traffic, fp = self.evaluate(tiles, trips)
        options: list[tuple[tuple[int, ...], int]] = [(self.orders[0], 0)]
        blocks_t, blocks_f = [traffic], [fp]
        for o in self.orders if self.ranks else []:
            if not self.keepable_for(o):
                continue
            saved, held = self.residency(tiles, trips, o)
            saved, held = np.cumsum(saved, axis=0), np.cumsum(held, axis=0)
            for j in range(len(saved)):
                options.append((o, j + 1))
                blocks_t.append(traffic - saved[j])
                blocks_f.append(fp + held[j])
        return tiles, trips, options, np.stack(blocks_t), np.stack(blocks_f)

    def candidates(self) -> "_Candidates":
        """The candidate table as the search keeps it (see :class:`_Candidates`). Independent
        of the architecture: built once."""
        if self._candidates is None:
            tiles, trips, options, traffic, fp = self.full_table()
            kept = _kept(traffic, fp)
            steps = np.prod(np.stack(trips), axis=0) if trips else np.ones(1)
            tiling = (kept % traffic.shape[1]).astype(np.int32)
            self._candidates = _Candidates(tiles, trips, options, traffic.shape[1], steps, traffic.size, kept,
                                           traffic.ravel()[kept], fp.ravel()[kept], tiling)
        return self._candidates

    def onchip_bytes(self, flat: np.ndarray, traffic: np.ndarray) -> np.ndarray:
        """On-chip buffer bytes of the candidates at ``flat`` (with off-chip ``traffic``): their
        off-chip bytes (fills and drains) plus each tiling's Einsum reads and writes."""
        if self._onchip is None:
            self._onchip = self.einsum_buffer_bytes(self.candidates().trips)
        return traffic + self._onchip[flat % len(self._onchip)]

    def cycles(self, compute: Any) -> np.ndarray:
        """Compute cycles of every candidate on ``compute``: each Einsum's cycles under its best
        spatial mapping summed over the tiling's step shapes
        (:func:`~mambalaya.model.spatial.step_shapes`), the units combined as the latency model
        does. Memoised per compute section (by value)."""
        key = spec_key(compute)
        if key not in self._cycles:
            cand = self.candidates()
            total = {"array_2d": 0.0, "array_1d": 0.0, "vector": 0.0, "mfu": 0.0}
            for name in self.probe.einsums:
                cyc = _einsum_grid_cycles(compute, self.cascade, name, self.ranks, cand.tiles)
                total = {k: total[k] + cyc[k] for k in total}
            array = total["array_2d"] + total["array_1d"]
            if compute.overlap_compute_units:
                cycles = np.maximum(np.maximum(array, total["vector"]), total["mfu"])
            else:
                cycles = array + total["vector"] + total["mfu"]
            self._cycles[key] = np.broadcast_to(np.asarray(cycles, dtype=float), (cand.n_tilings,))
        return self._cycles[key]

    def _buffer_closed_form(self) -> list[tuple[float, list[int]]]:
        """On-chip buffer terms: each Einsum reads its operands' boxes and writes its output in
        every step (model/traffic.py:group_buffer_accesses), so the same kind of closed form as
        the traffic; window halos re-read per tile are left out here (exact once a tiling is
        chosen). Built on first use: only architectures with an on-chip bandwidth need it."""
        if self._buffer_terms is None:
            cascade, ranks = self.cascade, self.ranks
            terms = []
            for e in (cascade.einsum(n) for n in self.probe.einsums):
                for t in dict.fromkeys(a.tensor for a in e.inputs if a.tensor != e.name):
                    accs = [a for a in e.inputs if a.tensor == t]
                    b = buffer_read_elements(cascade, self.probe, t, accs)
                    seen = {rank_of_variable(v) for a in accs for idx in a.indices for v in idx.variables}
                    terms.append((b, [i for i, r in enumerate(ranks) if r not in seen]))
                outs = {rank_of_variable(v) for v in e.output_variables}
                b = cascade.elements(e.name) * cascade.tensors[e.name].bits / 8
                terms.append((b, [i for i, r in enumerate(ranks) if r not in outs]))
            self._buffer_terms = terms
        return self._buffer_terms

    def keepable_for(self, order: tuple[int, ...]) -> list[tuple[str, float, set[int]]]:
        """Residency candidates under a loop order (rank indices, outermost first): tensors
        with a loop that does not index them inside the outermost loop that does."""
        if order not in self._keepable:
            pos = {i: n for n, i in enumerate(order)}
            kept = []
            for t, b, seen in self._reads:
                first = min((pos[i] for i in seen), default=-1)
                if any(i not in seen and pos[i] > first for i in order):
                    kept.append((t, b, seen))
            self._keepable[order] = kept
        return self._keepable[order]

    def residency(self, tiles: list[np.ndarray], trips: list[np.ndarray],
                  order: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per residency candidate and tiling: (bytes saved, bytes held). Streamed, a tensor is
        read once per trip of every loop that does not index it; resident, only per trip of
        those outside the innermost loop (of more than one trip) that does index it
        (model/traffic.py). It holds its largest one-step box (fusion/mapping.py:resident_bytes),
        here bounded from above: a dimension indexed by several tiled ranks counts in full."""
        n = len(tiles[0])
        order = self.orders[0] if order is None else order
        pos = {i: k for k, i in enumerate(order)}
        saved, held = [], []
        for t, b, seen in self.keepable_for(order):
            streamed = np.ones(n)
            for i in range(len(self.ranks)):
                if i not in seen:
                    streamed = streamed * trips[i]
            inner = np.full(n, -1)  # position of the innermost loop indexing it that moves
            for i in sorted(seen, key=pos.get):
                inner = np.where(trips[i] > 1, pos[i], inner)
            resident = np.ones(n)
            for i in range(len(self.ranks)):
                if i not in seen:
                    resident = resident * np.where(pos[i] < inner, trips[i], 1.0)
            saved.append(b * (streamed - resident))
            held.append(self._held_box(t, tiles))
        return np.array(saved), np.array(held)

    def _held_box(self, tensor: str, tiles: list[np.ndarray]) -> np.ndarray:
        cascade = self.cascade
        accs = [a for e in (cascade.einsum(x) for x in self.probe.einsums) for a in e.inputs
                if a.tensor == tensor and a.tensor != e.name]
        sizes = cascade.variable_sizes
        init = cascade.initial_axis(tensor)
        total = np.full(len(tiles[0]), cascade.tensors[tensor].bits / 8)
        for p, size in enumerate(cascade.shape(tensor)):
            valid = size + (init[1] if init is not None and init[0] == p else 0)
            dim_ranks = {rank_of_variable(v) for a in accs for v in a.indices[p].variables} & set(self.ranks)
            if len(dim_ranks) > 1:
                total = total * valid
                continue
            (r,) = dim_ranks or (None,)
            tile = tiles[self.ranks.index(r)] if r is not None else None
            lo = hi = None
            for a in accs:
                idx = a.indices[p]
                a_lo = a_hi = idx.const
                for v, c in idx.terms:
                    if rank_of_variable(v) == r:
                        span = c * (tile - 1)
                    else:
                        span = c * (sizes[v] - 1)
                    a_lo = a_lo + np.minimum(span, 0)
                    a_hi = a_hi + np.maximum(span, 0)
                lo = a_lo if lo is None else np.minimum(lo, a_lo)
                hi = a_hi if hi is None else np.maximum(hi, a_hi)
            total = total * np.minimum(valid, hi - lo + 1)
        return total

    def einsum_buffer_bytes(self, trips: list[np.ndarray]) -> np.ndarray:
        """On-chip buffer bytes the Einsums read and write, for every tiling (the fills and
        drains, the off-chip bytes, come on top)."""
        n = len(trips[0]) if trips else 1
        own = np.zeros(n)
        for b, idxs in self._buffer_closed_form():
            f = np.full(n, b)
            for i in idxs:
                f = f * trips[i]
            own += f
        return own

    def evaluate(self, tiles: list[np.ndarray], trips: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        n = len(tiles[0]) if tiles else 1
        traffic = np.zeros(n)
        for b, idxs in self.terms:
            f = np.full(n, b)
            for i in idxs:
                f = f * trips[i]
            traffic += f
        fp = np.zeros(n)
        for fixed, idxs, when in self.fp_terms:
            f = np.full(n, fixed)
            for i in idxs:
                f = f * np.minimum(tiles[i], self.cascade.size(self.ranks[i]))
            if when is not None:
                f = f * (tiles[when] < self.cascade.size(self.ranks[when]))
            fp += f
        return traffic, fp


def _cost_model(cascade: Cascade, einsums: list[str], ranks: list[str]) -> "_GroupCostModel":
    """The closed forms of a candidate group, memoised on the (immutable) cascade: they do not
    depend on the buffer or the architecture, so repeated searches (sweeps) reuse them."""
    memo = cascade.__dict__.setdefault("_group_cost_model_memo", {})
    key = (tuple(einsums), tuple(ranks))
    if key not in memo:
        memo[key] = _GroupCostModel(cascade, einsums, ranks)
    return memo[key]


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
    table (:meth:`_GroupCostModel.candidates`) and the compute cycles behind it are shared by
    every architecture, so a sweep point that changes only the bandwidth, buffer or clock pays
    only for the final choice."""
    ranks = tileable_ranks(cascade, einsums) if ranks is None else ranks
    memo = cascade.__dict__.setdefault("_best_group_memo", {})
    key = (tuple(einsums), tuple(ranks), buffer_bytes, None if arch is None else spec_key(arch), objective)
    model = _cost_model(cascade, einsums, ranks)
    if stats is not None:
        stats.evaluations += model.candidates().size
        stats.groups_costed += 1
    if key not in memo or not MEMOISE_GROUPS:
        reason: list[str] = []
        memo[key] = (_best_group(cascade, model, einsums, ranks, buffer_bytes, reason, arch, objective), reason)
    choice, reason = memo[key]
    if why is not None:
        why.extend(reason)
    return choice if choice is None or choice.group.name == name else replace(choice, group=replace(choice.group, name=name))


def _best_group(cascade: Cascade, model: "_GroupCostModel", einsums: list[str], ranks: list[str], buffer_bytes: int | None,
                why: list[str], arch: Any, objective: str) -> GroupChoice | None:
    cand = model.candidates()
    if PRUNE_DOMINATED:
        found = _pick(cascade, model, cand, cand.kept, cand.kept_traffic, cand.kept_fp, einsums, ranks, buffer_bytes,
                      arch, objective, subset=True)
        if found is not _FELL_THROUGH:  # else the best kept candidate broke a rule: search them all
            return _choice(cascade, found, why, arch, objective)
    *_, traffic, fp = model.full_table()
    found = _pick(cascade, model, cand, np.arange(cand.size), traffic.ravel(), fp.ravel(), einsums, ranks, buffer_bytes,
                  arch, objective, subset=False)
    return _choice(cascade, found, why, arch, objective)


_FELL_THROUGH = "fell through"


def _pick(cascade: Cascade, model: "_GroupCostModel", cand: "_Candidates", flat: np.ndarray, traffic: np.ndarray,
          fp: np.ndarray, einsums: list[str], ranks: list[str], buffer_bytes: int | None, arch: Any, objective: str,
          subset: bool) -> Any:
    """The first legal candidate in the objective's order (a group), ``"buffer"`` if none fits,
    ``"illegal"`` if none of the best few is legal. Over the candidates at ``flat`` (ascending
    flat indices, with their ``traffic`` and ``fp``); when they are a ``subset`` (the kept
    ones), :data:`_FELL_THROUGH` if its first fitting candidate is not legal.

    Order: the objective (latency within the tie tolerance, energy, EDP, or traffic without
    an architecture), then traffic, steps, latency, and the footprint last, so a candidate
    that another beats or equals in traffic and footprint with the same tiling never comes
    first: :meth:`_Candidates.kept` drops those."""
    n_tilings = cand.n_tilings
    tiling = cand.kept_tiling if subset else flat % n_tilings
    steps = cand.steps[tiling]
    ok = np.ones(len(traffic), dtype=bool) if buffer_bytes is None else fp <= buffer_bytes
    if not ok.any():
        return "buffer"
    if arch is None:
        order = np.lexsort((fp, steps, np.where(ok, traffic, np.inf)))
    else:
        onchip_bw = arch.memory.onchip_bandwidth_bytes_per_cycle
        need_buffer = objective != "latency" or onchip_bw is not None
        onchip = model.onchip_bytes(flat, traffic) if need_buffer else None
        comp = model.cycles(arch.compute)[tiling] / arch.clock_hz
        mem = traffic / arch.memory.offchip_bandwidth_bytes_per_s
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
        option, k = divmod(int(flat[pick]), n_tilings)
        loop_order, j = cand.options[option]
        loops = tuple(Loop(ranks[i], int(cand.tiles[i][k])) for i in loop_order if int(cand.tiles[i][k]) < cascade.size(ranks[i]))
        resident = tuple(t for t, _, _ in model.keepable_for(loop_order)[:j]) if loops else ()
        candidate = FusionGroup("G", tuple(einsums), loops, resident=resident)
        try:
            check_group(cascade, candidate, buffer_bytes)
        except MappingError:
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
    group = found
    exact = group_traffic(cascade, group)
    if arch is None:
        return GroupChoice(group, exact.total_bytes, exact.footprint_bytes)
    if objective == "latency":
        return GroupChoice(group, exact.total_bytes, exact.footprint_bytes, group_seconds(arch, cascade, group, exact))
    gl, rows = group_latency(arch, cascade, group, exact)
    energy = sum(einsum_energy(arch, cascade, r).total_pj for r in rows)
    return GroupChoice(group, exact.total_bytes, exact.footprint_bytes, gl.latency, energy, objective)


#: Search only the candidates no other of the same tiling beats or equals in both traffic and
#: footprint (:meth:`_Candidates.kept`); the tests compare against False (every candidate).
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


def _einsum_grid_cycles(compute: Any, cascade: Cascade, name: str, ranks: list[str], tiles: list[np.ndarray]) -> dict[str, Any]:
    """One Einsum's unit cycles for every tiling of ``ranks`` (the grid of
    :meth:`_GroupCostModel.grid`), memoised on the cascade: the grid depends only on the ranks,
    so every candidate group of a search that tiles the same ranks shares it."""
    memo = cascade.__dict__.setdefault("_grid_cycles_memo", {})
    key = (spec_key(compute), name, tuple(ranks))
    hit = memo.get(key)
    if hit is None:
        sizes = {r: cascade.size(r) for r in cascade.ranks}
        e = cascade.einsum(name)
        hit, _ = einsum_unit_cycles(compute, cascade, e, einsum_ops(cascade, e), step_shapes(sizes, list(zip(ranks, tiles))))
        memo[key] = hit
    return hit


def _finish(cascade: Cascade, name: str, groups: list[FusionGroup], buffer_bytes: int | None, description: str) -> Mapping:
    named = [FusionGroup(f"G{n + 1}", g.einsums, g.loops, g.halo, g.resident) for n, g in enumerate(groups)]
    return check_mapping(cascade, Mapping(name, tuple(named), buffer_bytes, description))


def _need(choice: GroupChoice | None, einsums: list[str], buffer_bytes: int | None) -> GroupChoice:
    if choice is None:
        raise SpecError(
            f"Einsums {', '.join(einsums)} do not fit a buffer of {buffer_bytes:,} bytes even alone "
            "(a recurrence's carried state must stay on chip); use a larger --buffer"
        )
    return choice


def unfused(cascade: Cascade, buffer_bytes: int | None = None, *, arch: Any = None, objective: str = "latency") -> Mapping:
    """Every Einsum alone. Tiling a lone Einsum never changes its traffic (its operands are
    partitioned, not re-read), but a recurrence's carried state must fit the buffer: a lone
    scan is tiled over its independent ranks when its whole state does not fit."""
    if buffer_bytes is None:
        m = unfused_mapping(cascade)
        return check_mapping(cascade, Mapping("unfused", m.groups, None, "every Einsum alone (MARCA, ideal)"))
    groups = [
        _need(best_group(cascade, [e.name], buffer_bytes, arch=arch, objective=objective), [e.name], buffer_bytes).group
        for e in cascade.einsums
    ]
    return _finish(cascade, "unfused", groups, buffer_bytes, "every Einsum alone (MARCA, ideal)")


def ideal(cascade: Cascade, buffer_bytes: int | None = None) -> Mapping:
    """Speed of light: one group, nothing but layer inputs, weights, outputs and state off chip."""
    g = FusionGroup("G1", tuple(e.name for e in cascade.einsums))
    return check_mapping(cascade, Mapping("ideal", (g,), None, "one group, buffer unbounded (a lower bound)"), ignore_buffer=True)


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
    groups: list[FusionGroup] = []
    placed = False
    for e in cascade.einsums:
        if e.name in members:
            if not placed:
                groups.append(_need(best_group(cascade, region, buffer_bytes, arch=arch, objective=objective), region, buffer_bytes).group)
                placed = True
            continue
        groups.append(_need(best_group(cascade, [e.name], buffer_bytes, arch=arch, objective=objective), [e.name], buffer_bytes).group)
    return _finish(cascade, "ssm-ri", groups, buffer_bytes, "RI fusion of AD, BX, H, YS (Geens et al.); rest unfused")


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
    groups: list[FusionGroup] = []
    current: list[str] = []
    current_choice: GroupChoice | None = None
    for e in cascade.einsums:
        alone = _need(best_group(cascade, [e.name], buffer_bytes, stats=stats, arch=arch, objective=objective), [e.name], buffer_bytes)
        if current_choice is not None:
            grown = best_group(cascade, current + [e.name], buffer_bytes, stats=stats, arch=arch, objective=objective)
            if grown is not None and _worth_growing(grown, current_choice, alone):
                current, current_choice = current + [e.name], grown
                continue
            groups.append(current_choice.group)
        current, current_choice = [e.name], alone
    if current_choice is not None:
        groups.append(current_choice.group)
    return _finish(cascade, "stitched", groups, buffer_bytes, "greedy stitching in topological order")


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
    segments: dict[tuple[int, int], GroupChoice] = {}
    best = [math.inf] * (n + 1)
    back: list[tuple[int, GroupChoice] | None] = [None] * (n + 1)
    best[0] = 0.0
    for b in range(1, n + 1):
        for a in range(b - 1, -1, -1):
            if best[a] == math.inf:
                continue
            why: list[str] = []
            choice = best_group(cascade, names[a:b], buffer_bytes, stats=stats, why=why, arch=arch, objective=objective)
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
    groups: list[FusionGroup] = []
    if arch is not None and objective == "edp":
        groups = _least_edp(segments, n)
    elif arch is not None and objective == "latency":
        groups = _least_traffic_within(segments, n, best[n] * (1 + LATENCY_TIE_TOLERANCE))
    else:
        b = n
        while b > 0:
            a, choice = back[b]  # type: ignore[misc]
            groups.append(choice.group)
            b = a
    stats.seconds += time.perf_counter() - t0
    what = "off-chip traffic" if arch is None else f"{_OBJECTIVE_WORDS[objective]} on {arch.name}"
    return _finish(cascade, "optimal", groups[::-1], buffer_bytes, f"least {what} over contiguous groups and tiles")


_OBJECTIVE_WORDS = {"latency": "latency", "energy": "energy", "edp": "energy-delay product"}


def _least_edp(segments: dict[tuple[int, int], GroupChoice], n: int) -> list[FusionGroup]:
    """The grouping of least (sum of latencies) x (sum of energies) over the segments: a
    Pareto dynamic programme over (latency, energy), exact since the product grows with both."""
    front: list[list[tuple[float, float, tuple[FusionGroup, ...]]]] = [[] for _ in range(n + 1)]
    front[0] = [(0.0, 0.0, ())]
    ends: dict[int, list[tuple[int, GroupChoice]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in range(1, n + 1):
        points = [(lat + c.latency_s, en + c.energy_pj, groups + (c.group,))  # type: ignore[operator]
                  for a, c in ends.get(b, []) for lat, en, groups in front[a]]
        points.sort(key=lambda p: (p[0], p[1]))
        kept: list[tuple[float, float, tuple[FusionGroup, ...]]] = []
        for p in points:
            if not kept or p[1] < kept[-1][1]:
                kept.append(p)
        front[b] = kept
    return list(min(front[n], key=lambda p: p[0] * p[1])[2])


def _least_traffic_within(segments: dict[tuple[int, int], GroupChoice], n: int, latency_bound: float) -> list[FusionGroup]:
    """The grouping of least off-chip traffic among those whose latency is at most
    ``latency_bound`` (the best latency plus the tie tolerance), over the same segments.

    A Pareto dynamic programme: for each prefix it keeps the (latency, traffic) points no other
    partial grouping beats in both, dropping any that cannot finish within the bound (their
    latency plus the least latency of the remaining suffix exceeds it). Returned in order."""
    suffix = [math.inf] * (n + 1)  # least latency of Einsums b..n
    suffix[n] = 0.0
    for a in range(n - 1, -1, -1):
        suffix[a] = min((c.cost() + suffix[b] for (x, b), c in segments.items() if x == a), default=math.inf)
    # front[b]: list of (latency, traffic, groups) non-dominated partial groupings of 0..b
    front: list[list[tuple[float, float, tuple[FusionGroup, ...]]]] = [[] for _ in range(n + 1)]
    front[0] = [(0.0, 0.0, ())]
    ends: dict[int, list[tuple[int, GroupChoice]]] = {}
    for (a, b), c in segments.items():
        ends.setdefault(b, []).append((a, c))
    for b in range(1, n + 1):
        points = []
        for a, c in ends.get(b, []):
            for lat, traffic, groups in front[a]:
                total = lat + c.cost()
                if total + suffix[b] <= latency_bound:
                    points.append((total, traffic + c.traffic_bytes, groups + (c.group,)))
        points.sort(key=lambda p: (p[0], p[1]))
        kept: list[tuple[float, float, tuple[FusionGroup, ...]]] = []
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
