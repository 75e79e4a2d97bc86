"""Fusion mappings: a partition of a cascade into groups, each with fused loops.

Semantics (the traffic model and the tiled executor both implement exactly this):

* A **group** runs its fused loops ``loops = ((rank, tile), ...)``, outermost first. Loop
  ``(R, t)`` visits the tiles ``[a, min(a+t, |R|))`` for ``a = 0, t, 2t, ...``; its trip count is
  ``ceil(|R|/t)``. Each visit of the innermost loop body is a **step**.
* In every step, every Einsum of the group runs once, in cascade order, over its iteration
  space restricted to the step's tile of each fused rank (other ranks in full). An Einsum that
  does not iterate a fused rank ``R`` runs in every step all the same: it is *recomputed* once
  per tile of ``R`` (how an RSp producer serves a consumer whose extra rank is fused).
* Tensors produced and consumed inside a group (its **intermediates**) never leave the chip.
  A tensor produced in a group and needed elsewhere (by another group, or because it is a
  cascade output or outgoing state) is written off-chip in every step that computes it.
  A tensor a group reads but does not produce is read off-chip in every step: the bounding box
  of the group's accesses to it over the step's ranges, clipped to the tensor (plus the
  incoming-state rows an access reaches below 0). Along a window rank with ``halo: retain``
  (the default) rows already read in the previous tile of that rank stay on chip and are not
  read again; with ``halo: recompute`` they are read (or recomputed) again.
* An Einsum that reads a fused rank ``R`` at **one position** runs once along ``R``: its
  ``R`` is a *select rank* (:func:`select_ranks`) when its output lacks ``R``, it does not
  reduce ``R``, it reads only tensors made in the group, each of its reads indexes every
  dimension of rank ``R`` with the same constant position ``p >= 0``, and no other Einsum of
  the group reads its output. Such a *select-runner* (``HN[b,e,n] = H[b,1023,e,n]``, the
  final state handed to decode, beside the scan ``H``) runs only in the steps whose tile of
  each of its select ranks holds its position, after the producer of what it reads (cascade
  order, same step), over the step's tiles of its other fused ranks; its output is written
  then, so once along its select ranks. Its step shapes, runs, buffer accesses and writes all
  leave out the loops of its select ranks (:func:`einsum_loops`).
* A recurrence's carried state (``H[b,i-1,e,n]``) and a retained window halo stay on chip
  between tiles of the ordered rank.
* A tensor the group reads off-chip and lists in ``resident`` stays on chip from one step to
  the next while its box does not change: it is read again only when a loop whose rank it is
  indexed by moves to another tile. Loops over ranks it is not indexed by that run inside the
  innermost loop it is indexed by (of more than one trip) so re-read nothing; a tensor indexed
  by no fused rank (a weight) is read once. Loop order therefore matters for residency.

Legality (checked by :func:`check_mapping`, each rule named in the error):

``cover``            every Einsum in exactly one group
``order``            the groups can run one after another (no cycle between groups)
``loops``            loop ranks exist, are not repeated, tiles are in ``1..|R|``
``reduction``        no Einsum of a group reduces a fused rank: an RSb/RD reduction completes
                     inside a tile (else the consumer would see partial sums)
``alignment``        inside a group, a consumer indexes a fused-rank dimension of an
                     intermediate by that rank's variable (plus window offsets), never by
                     another rank, and by a constant only along its select ranks (it runs
                     once along them, in the tile holding that position): otherwise it can
                     only see the current tile
``future``           inside a group, no consumer reads ahead (``i+1``) along a fused rank
``halo``             inside a group, a window over a fused rank needs ``halo: retain``
                     (recomputing a halo inside a group is not supported)
``resident``         a resident tensor is one the group reads off-chip, listed once
``buffer``           the group's on-chip footprint fits the buffer

The **footprint** of a group is what must stay on chip at once: the tile of every intermediate
(extent = tile for a fused rank, full size otherwise), the carried state of each recurrence
(``distance`` positions of its output, over the tile extents of the other ranks, full extent
for ranks whose loop is inside the recurrence's loop, and one copy per tile of a loop inside
it over a rank the recurrence lacks, since each recomputation carries its own chain), and each
retained halo (``halo`` rows of the windowed tensor, extents and copies likewise), and each
resident tensor's largest one-step box (:func:`resident_bytes`). Tensors streaming in from or
out to DRAM are not counted, nor an intermediate the lanes carry in registers from where it is
made to where it is read (:func:`register_resident`): it is one word per lane, in the PE-local level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Literal


from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade, stable_topological_order
from mambalaya.einsum.ir import Access, Einsum, rank_of_variable
from mambalaya.fusion.group_analysis import analyse

HaloPolicy = Literal["retain", "recompute"]


class MappingError(SpecError):
    """A mapping breaks a legality rule; ``rule``, ``group`` and ``edge`` say which and where."""

    def __init__(self, message: str, *, rule: str, group: str | None = None, edge: str | None = None, source: str | None = None):
        self.rule = rule
        self.group = group
        self.edge = edge
        where = " ".join(p for p in (f"group {group}" if group else "", f"edge {edge}" if edge else "") if p)
        super().__init__(f"{where + ': ' if where else ''}{message} [rule: {rule}]", source=source)


@dataclass(frozen=True)
class Loop:
    rank: str
    tile: int

    def trips(self, size: int) -> int:
        return math.ceil(size / self.tile)


@dataclass(frozen=True)
class FusionGroup:
    name: str
    einsums: tuple[str, ...]
    loops: tuple[Loop, ...] = ()
    halo: HaloPolicy = "retain"
    resident: tuple[str, ...] = ()  # off-chip tensors kept on chip across loops that do not index them

    def loop(self, rank: str) -> Loop | None:
        for lp in self.loops:
            if lp.rank == rank:
                return lp
        return None

    @cached_property
    def fused_ranks(self) -> tuple[str, ...]:
        return tuple(lp.rank for lp in self.loops)


@dataclass(frozen=True)
class Mapping:
    name: str
    groups: tuple[FusionGroup, ...]
    buffer_bytes: int | None = None
    description: str = field(default="", compare=False)

    def group_of(self, einsum: str) -> FusionGroup:
        for g in self.groups:
            if einsum in g.einsums:
                return g
        raise KeyError(einsum)


# ------------------------------------------------------------------------------------------
# facts about a group inside a cascade
# ------------------------------------------------------------------------------------------


def group_einsums(cascade: Cascade, group: FusionGroup) -> list[Einsum]:
    return [cascade.einsum(n) for n in group.einsums]


def produced_in(group: FusionGroup) -> set[str]:
    return set(group.einsums)


def tensors_read(cascade: Cascade, group: FusionGroup) -> list[str]:
    """Tensors the group reads from off-chip, in first-use order (initial values included)."""
    return list(analyse(cascade, group.einsums).reads)


def tensors_written(cascade: Cascade, group: FusionGroup) -> list[str]:
    """Tensors the group produces that leave the chip: read by another group, or handed back."""
    return list(analyse(cascade, group.einsums).writes)


def intermediates(cascade: Cascade, group: FusionGroup) -> list[str]:
    """Tensors produced in the group and read by another Einsum of the group."""
    return list(analyse(cascade, group.einsums).intermediates)


def register_resident(cascade: Cascade, group: FusionGroup) -> frozenset[str]:
    """Intermediates of the group that never reach its buffer: kept in the registers of the lane
    that computes them (:attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.in_registers`). A
    tensor qualifies when it leaves neither the group nor the chip, one lane makes each element
    (a pointwise Einsum or an elementwise recurrence), every reader in the group reads it in
    place (or, of a recurrence, takes one step of it as a select-runner) and none waits on
    another reader's reduction of it: the lane then carries each element from producer to
    readers, holding one word per such tensor, whatever the tile."""
    return analyse(cascade, group.einsums).in_registers


def select_ranks(cascade: Cascade, group: FusionGroup, einsum: str) -> frozenset[str]:
    """The fused ranks Einsum ``einsum`` of the group runs once along (its *select ranks*, see
    the module doc): the ranks the group tiles of
    :attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.selects`. Empty for every Einsum
    that runs in every step."""
    return group_select_ranks(cascade, group).get(einsum, frozenset())


def group_select_ranks(cascade: Cascade, group: FusionGroup) -> dict[str, frozenset[str]]:
    """Per select-runner of the group (a member with select ranks, :func:`select_ranks`), its
    select ranks; the group's other members are absent. Depends on the group's Einsums and
    fused ranks alone, so memoised on the (immutable) cascade like the other rule helpers
    (read-only)."""
    memo = cascade.__dict__.setdefault("_group_select_ranks_memo", {})
    key = (group.einsums, frozenset(group.fused_ranks))
    hit = memo.get(key)
    if hit is None:
        fused = key[1]
        found = {}
        facts = analyse(cascade, group.einsums)
        for name in facts.selects:
            positions = facts.select_positions_at(cascade, name)
            ranks = {r for r in fused.intersection(positions) if positions[r] < cascade.size(r)}  # a position it holds
            if ranks:
                found[name] = frozenset(ranks)
        hit = memo[key] = found
    return hit


def select_positions(cascade: Cascade, group: FusionGroup, einsum: str) -> dict[str, int]:
    """Per select rank of ``einsum`` in the group, the one position it reads along it: it runs
    in the tile of that rank holding the position."""
    positions = analyse(cascade, group.einsums).select_positions_at(cascade, einsum)
    return {r: positions[r] for r in select_ranks(cascade, group, einsum)}


def einsum_loops(cascade: Cascade, group: FusionGroup, einsum: str) -> tuple[Loop, ...]:
    """The group's loops that Einsum ``einsum`` runs over: all of them, but its select ranks'
    (:func:`select_ranks`), along which it runs once. Its step shapes, runs, on-chip accesses
    and off-chip writes are counted over these loops."""
    select = select_ranks(cascade, group, einsum)
    return tuple(lp for lp in group.loops if lp.rank not in select) if select else group.loops


def _extent(cascade: Cascade, group: FusionGroup, rank: str, *, full_inside_of: str | None = None) -> int:
    """On-chip extent of ``rank``: its tile if fused, else full. With ``full_inside_of=R``,
    ranks whose loop is inside ``R``'s loop count in full (their every tile needs its copy)."""
    lp = group.loop(rank)
    if lp is None:
        return cascade.size(rank)
    if full_inside_of is not None and full_inside_of in group.fused_ranks:
        ranks = group.fused_ranks
        if ranks.index(rank) > ranks.index(full_inside_of):
            return cascade.size(rank)
    return min(lp.tile, cascade.size(rank))


def window_halos(cascade: Cascade, group: FusionGroup) -> dict[tuple[str, str], int]:
    """``(tensor, rank) -> halo rows`` for windows (negative reach) over fused ranks of tensors
    the group reads, whether produced inside or read from off-chip. Depends only on the group's
    Einsums and fused ranks (not on tile sizes), so it is memoised on the immutable cascade."""
    memo = cascade.__dict__.setdefault("_window_halos_memo", {})
    key = (group.einsums, frozenset(group.fused_ranks))
    if key not in memo:
        memo[key] = _window_halos(cascade, group)
    return dict(memo[key])


def _window_halos(cascade: Cascade, group: FusionGroup) -> dict[tuple[str, str], int]:
    halos: dict[tuple[str, str], int] = {}
    fused = frozenset(group.fused_ranks)
    for name in group.einsums:
        for key, rows in _einsum_window_halos(cascade, name, fused).items():
            halos[key] = max(halos.get(key, 0), rows)
    return halos


def _einsum_window_halos(cascade: Cascade, name: str, fused: frozenset[str]) -> dict[tuple[str, str], int]:
    """One Einsum's part of :func:`window_halos`, memoised per fused ranks: the groups of a
    search share their Einsums."""
    memo = cascade.__dict__.setdefault("_einsum_window_halos_memo", {})
    key = (name, fused)
    if key not in memo:
        memo[key] = _einsum_halos(cascade, cascade.einsum(name), fused)
    return memo[key]


def _einsum_halos(cascade: Cascade, e: Einsum, fused: frozenset[str]) -> dict[tuple[str, str], int]:
    halos: dict[tuple[str, str], int] = {}
    sizes = cascade.variable_sizes
    for acc in e.inputs:
        if acc.tensor == e.name:
            continue
        ranks = cascade.tensors[acc.tensor].ranks
        for idx, rank in zip(acc.indices, ranks):
            if rank not in fused:
                continue
            own = rank.lower()
            coeff = dict(idx.terms).get(own)
            if coeff != 1:
                continue
            rest_lo, _ = idx.bounds({v: (sizes[v] if v != own else 1) for v in idx.variables})
            if rest_lo < 0:
                key = (acc.tensor, rank)
                halos[key] = max(halos.get(key, 0), -rest_lo)
    return halos


def footprint_bytes(cascade: Cascade, group: FusionGroup) -> float:
    """On-chip bytes the group keeps at once (see the module doc). Memoised on the (immutable)
    cascade: the traffic model and the legality check both ask for every group a search picks."""
    memo = cascade.__dict__.setdefault("_footprint_memo", {})
    key = (group.einsums, group.loops, group.halo, group.resident)
    if key not in memo:
        memo[key] = _footprint_bytes(cascade, group)
    return memo[key]


def _footprint_bytes(cascade: Cascade, group: FusionGroup) -> float:
    total = 0.0
    lanes = register_resident(cascade, group)  # carried in the lanes' registers: no buffer space
    for t in intermediates(cascade, group):
        if t in lanes:
            continue
        spec = cascade.tensors[t]
        n = 1
        for r in spec.ranks:
            n *= _extent(cascade, group, r)
        total += n * spec.stored_bytes_per_element
    for e in group_einsums(cascade, group):
        rec = cascade.recurrence(e)
        if rec is None:
            continue
        rank, distance = rec
        total += _held_bytes(cascade, group, e.name, rank, distance)
    if group.halo == "retain":
        for (t, rank), rows in window_halos(cascade, group).items():
            total += _held_bytes(cascade, group, t, rank, rows)
    for t in group.resident:
        total += resident_bytes(cascade, group, t)
    return total


def resident_bytes(cascade: Cascade, group: FusionGroup, tensor: str) -> float:
    """On-chip bytes of a resident tensor: the largest box one step reads of it. Per
    dimension, the box length of a full tile of the fused rank its index moves with (the
    index's spread over the tile plus the spread between the accesses' offsets), the whole
    dimension for an index moving with no fused rank or with several; clipped to the
    dimension and its incoming-state rows."""
    accs = [a for e in group_einsums(cascade, group) for a in e.inputs if a.tensor == tensor and a.tensor != e.name]
    fused = {lp.rank: lp for lp in group.loops}
    sizes = cascade.variable_sizes
    init = cascade.initial_axis(tensor)
    n = 1
    for p, size in enumerate(cascade.shape(tensor)):
        valid = size + (init[1] if init is not None and init[0] == p else 0)
        ranks = {rank_of_variable(v) for a in accs for v in a.indices[p].variables} & set(fused)
        if len(ranks) != 1:
            n *= valid if ranks or not accs else min(valid, _fixed_length(accs, p, sizes))
            continue
        (r,) = ranks
        tile = min(fused[r].tile, cascade.size(r))
        lo = hi = None
        for a in accs:
            idx = a.indices[p]
            ranges = {v: ((0, tile) if rank_of_variable(v) == r else (0, sizes[v])) for v in idx.variables}
            a_lo, a_hi = index_span(idx, ranges)
            lo = a_lo if lo is None else min(lo, a_lo)
            hi = a_hi if hi is None else max(hi, a_hi)
        n *= min(valid, hi - lo + 1)  # type: ignore[operator]
    return n * cascade.tensors[tensor].stored_bytes_per_element


def index_span(idx, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Smallest and largest value of ``idx`` with each variable in ``[start, stop)``."""
    lo = hi = idx.const
    for v, c in idx.terms:
        a, b = ranges[v]
        lo += min(c * a, c * (b - 1))
        hi += max(c * a, c * (b - 1))
    return lo, hi


def _fixed_length(accs, p: int, sizes: dict[str, int]) -> int:
    lo = hi = None
    for a in accs:
        idx = a.indices[p]
        a_lo, a_hi = index_span(idx, {v: (0, sizes[v]) for v in idx.variables})
        lo = a_lo if lo is None else min(lo, a_lo)
        hi = a_hi if hi is None else max(hi, a_hi)
    return hi - lo + 1  # type: ignore[operator]


def _held_bytes(cascade: Cascade, group: FusionGroup, tensor: str, rank: str, rows: int) -> float:
    """Bytes of ``rows`` positions of ``tensor`` kept on chip across tiles of ``rank``.

    One copy is kept per tile of every loop inside ``rank``'s loop: a rank of the tensor then
    counts in full, and a loop over a rank the tensor lacks (its producer is recomputed per
    tile) multiplies the copies by its trips, since each recomputation continues its own chain.
    """
    spec = cascade.tensors[tensor]
    n = rows
    for r in spec.ranks:
        if r != rank:
            n *= _extent(cascade, group, r, full_inside_of=rank)
    fused = group.fused_ranks
    if rank in fused:
        for lp in group.loops[fused.index(rank) + 1 :]:
            if lp.rank not in spec.ranks:
                n *= lp.trips(cascade.size(lp.rank))
    return n * spec.stored_bytes_per_element


# ------------------------------------------------------------------------------------------
# legality
# ------------------------------------------------------------------------------------------


def group_order(cascade: Cascade, groups: Iterable[FusionGroup]) -> list[FusionGroup]:
    """The groups in an order that respects every dependency, or a MappingError (rule order)."""
    groups = list(groups)
    owner = {e: g.name for g in groups for e in g.einsums}
    deps: dict[str, set[str]] = {g.name: set() for g in groups}
    for g in groups:
        for e in g.einsums:
            for t in cascade.einsum(e).input_tensors:
                if t in owner and owner[t] != g.name:
                    deps[g.name].add(owner[t])
    order, stuck = stable_topological_order([g.name for g in groups], deps)
    if stuck:
        raise MappingError(f"groups {', '.join(stuck)} depend on each other in a cycle; no order can run them",
                           rule="order", group=stuck[0])
    by_name = {g.name: g for g in groups}
    return [by_name[n] for n in order]


def _check_loops(cascade: Cascade, g: FusionGroup) -> None:
    seen = set()
    for lp in g.loops:
        if lp.rank not in cascade.ranks:
            raise MappingError(f"loop over unknown rank {lp.rank!r} (ranks: {', '.join(cascade.ranks)})", rule="loops", group=g.name)
        if lp.rank in seen:
            raise MappingError(f"rank {lp.rank} is looped over twice", rule="loops", group=g.name)
        seen.add(lp.rank)
        if isinstance(lp.tile, bool) or not isinstance(lp.tile, int) or not 1 <= lp.tile <= cascade.size(lp.rank):
            raise MappingError(f"tile {lp.tile!r} of rank {lp.rank} must be an integer in 1..{cascade.size(lp.rank)}", rule="loops", group=g.name)
    iterated = {r for e in g.einsums for r in cascade.iteration_ranks(cascade.einsum(e))}
    idle = [lp.rank for lp in g.loops if lp.rank not in iterated]
    if idle:  # every member would run once per tile of a rank it does not have: work and bytes for nothing
        raise MappingError(f"loop over rank {idle[0]}, which none of the group's Einsums ({', '.join(g.einsums)}) "
                           f"iterates (theirs: {', '.join(sorted(iterated))}): each would run again per tile of it",
                           rule="loops", group=g.name)


def check_group(cascade: Cascade, g: FusionGroup, buffer_bytes: int | None = None) -> None:
    """Raise MappingError if the group breaks a rule (other than cover/order).

    A group found legal is remembered on the (immutable) cascade, with the buffer it fitted."""
    memo = cascade.__dict__.setdefault("_legal_group_memo", set())
    key = (g.name, g.einsums, g.loops, g.halo, g.resident, buffer_bytes)
    if key in memo:
        return
    _check_group(cascade, g, buffer_bytes)
    memo.add(key)


def _check_group(cascade: Cascade, g: FusionGroup, buffer_bytes: int | None = None) -> None:
    _check_loops(cascade, g)
    check_group_rules(cascade, g)
    if buffer_bytes is not None:
        need = footprint_bytes(cascade, g)
        if need > buffer_bytes:
            raise MappingError(
                f"on-chip footprint {need:,.0f} bytes exceeds the buffer of {buffer_bytes:,} bytes", rule="buffer", group=g.name
            )


def check_group_rules(cascade: Cascade, g: FusionGroup) -> None:
    """The rules of :func:`check_group` that depend only on the group's Einsums, the set of
    ranks it tiles, its halo policy and its resident tensors: not on tile sizes, loop order or
    the buffer (halo, resident, reduction, alignment, future). A search that builds its
    candidates' tiles in range and bounds their footprint checks only these per candidate."""
    if g.halo not in ("retain", "recompute"):
        raise MappingError(f"halo must be 'retain' or 'recompute', not {g.halo!r}", rule="halo", group=g.name)
    inside = produced_in(g)
    fused = set(g.fused_ranks)
    if g.resident:
        readable = set(tensors_read(cascade, g))
        for t in g.resident:
            if t not in readable:
                raise MappingError(
                    f"resident tensor {t!r} is not a tensor the group reads off-chip "
                    f"(it reads: {', '.join(sorted(readable)) or 'none'})", rule="resident", group=g.name,
                )
        if len(set(g.resident)) != len(g.resident):
            raise MappingError("a resident tensor is listed twice", rule="resident", group=g.name)
    fused_key = frozenset(fused)
    for e in group_einsums(cascade, g):
        problem = _einsum_rule_problem(cascade, e, tuple(t for t in e.input_tensors if t in inside), fused_key, g.halo,
                                       select_ranks(cascade, g, e.name))
        if problem is not None:
            message, rule, edge = problem
            raise MappingError(message, rule=rule, group=g.name, edge=edge)
    if g.halo == "retain":
        _check_retained_windows(cascade, g)


def _check_retained_windows(cascade: Cascade, g: FusionGroup) -> None:
    """A tensor the group reads through a window along a rank it tiles, with ``halo: retain``,
    may not also be read along that rank at positions that do not move with it (by a member
    that runs in every step): the traffic counts each row once, as if the box between the
    window and those positions stayed on chip, while the footprint holds the window's rows
    alone (Mamba-2's conv CC beside its conv-state output CSCN reading CI's last rows: a
    footprint of 768 B for an on-chip peak of 115 KB). Memoised like :func:`window_halos`."""
    memo = cascade.__dict__.setdefault("_retained_windows_memo", {})
    key = (g.einsums, frozenset(g.fused_ranks))
    if key not in memo:
        memo[key] = _retained_window_problem(cascade, g)
    if memo[key] is not None:
        raise MappingError(memo[key], rule="halo", group=g.name)


def _retained_window_problem(cascade: Cascade, g: FusionGroup) -> str | None:
    for (tensor, rank), _rows in window_halos(cascade, g).items():
        dims = [d for d, r in enumerate(cascade.tensors[tensor].ranks) if r == rank]
        for e in group_einsums(cascade, g):
            if e.name == tensor or rank in select_ranks(cascade, g, e.name):
                continue
            for acc in e.inputs:
                if acc.tensor != tensor:
                    continue
                fixed = [d for d in dims if all(rank_of_variable(v) != rank for v in acc.indices[d].variables)]
                if fixed:
                    return (f"{e.name} reads {tensor} along {rank} at positions that do not move with the group's "
                            f"{rank} tiles ({acc.indices[fixed[0]]}), while the group reads {tensor} through a window "
                            f"along {rank} with halo: retain: the box between them would stay on chip, which the "
                            f"footprint does not hold; use halo: recompute, or put {e.name} in a group of its own")
    return None


def _einsum_rule_problem(cascade: Cascade, e: Einsum, inside: tuple[str, ...], fused: frozenset[str],
                         halo: str, select: frozenset[str] = frozenset()) -> tuple[str, str, str] | None:
    """The first rule of :func:`check_group_rules` that Einsum ``e`` breaks in a group that
    tiles ``fused`` and produces the tensors ``inside`` among ``e``'s inputs, where ``e`` runs
    once along ``select`` (:func:`select_ranks`), as (message, rule, edge); None if it keeps
    them all. Memoised on the (immutable) cascade: the groups of a search share their Einsums."""
    memo = cascade.__dict__.setdefault("_einsum_rule_memo", {})
    key = (e.name, inside, fused, halo, select)
    if key in memo:
        return memo[key]
    problem = None
    reduced = {rank_of_variable(v) for v in e.reduced_variables} & fused
    if reduced:
        r = min(reduced)
        problem = (f"Einsum {e.name} reduces rank {r}, which the group tiles: the reduction would not complete inside a tile",
                   "reduction", e.name)
    for acc in e.inputs if problem is None else ():
        if acc.tensor == e.name:
            problem = _self_read_problem(cascade, e, acc, fused - select)
        elif acc.tensor in inside:
            problem = _access_rule_problem(cascade, e, acc, fused - select, halo)
        if problem is not None:
            break
    memo[key] = problem
    return problem


def _self_read_problem(cascade: Cascade, e: Einsum, acc: Access, fused: frozenset[str]) -> tuple[str, str, str] | None:
    """The alignment rule a recurrence's read of its own earlier value breaks, or None: along its
    recurrence rank it reads an earlier step (carried between tiles), but along any other rank the
    group tiles it must read the current tile's position. The delta rule's state update reads its
    previous state across all of N (``H[b,i-1,g,r,p,m]`` for ``H[b,i,g,r,p,n]``): a tile of N
    needs the whole previous state (accepted once, the footprint costed at one tile's, and the
    tiled executor gave wrong outputs or a numpy shape error)."""
    rec = cascade.recurrence(e)
    for idx, rank in zip(acc.indices, cascade.tensors[e.name].ranks):
        if rank not in fused or (rec is not None and rank == rec[0]):
            continue
        if dict(idx.terms).get(rank.lower()) != 1:
            message = (f"{e.name} reads its earlier value {acc} with index {idx} on rank {rank}, which the group tiles: "
                       f"a tile of {rank} would need every position of the earlier step")
            return message, "alignment", f"{e.name}->{e.name}"
    return None


def _access_rule_problem(cascade: Cascade, e: Einsum, acc: Access, fused: frozenset[str],
                         halo: str) -> tuple[str, str, str] | None:
    """The alignment, future or halo rule that ``e``'s read ``acc`` of a tensor made in its
    group breaks, as (message, rule, edge), or None. ``fused`` leaves out ``e``'s select ranks:
    its constant index on them reads the one position of the tile it runs in."""
    edge = f"{acc.tensor}->{e.name}"
    for idx, rank in zip(acc.indices, cascade.tensors[acc.tensor].ranks):
        if rank not in fused:
            continue
        own = rank.lower()
        if dict(idx.terms).get(own) != 1:
            message = (f"{e.name} reads {acc} with index {idx} on rank {rank}, which the group tiles: "
                       f"it must index it with {own} (plus window offsets) to read the current tile")
            return message, "alignment", edge
        sizes = {v: (cascade.variable_sizes[v] if v != own else 1) for v in idx.variables}
        lo, hi = idx.bounds(sizes)
        if hi > 0:
            return f"{e.name} reads {acc}, ahead of the current tile of {rank}", "future", edge
        if lo < 0 and halo != "retain":
            message = (f"{e.name} reads {acc}, a window over tiled rank {rank}; inside a group its halo must be "
                       "retained (halo: retain)")
            return message, "halo", edge
    return None


def check_mapping(cascade: Cascade, mapping: Mapping, *, ignore_buffer: bool = False) -> Mapping:
    """Check every rule; return the mapping with its groups in an executable order. A mapping
    found legal is remembered on the (immutable) cascade, with its ordered form: a sweep's
    points finish the same mappings again and again."""
    key = (mapping, mapping.description, ignore_buffer)  # equal mappings may differ in description
    try:
        hash(key)
    except TypeError:  # groups built as a list, not a tuple
        return _check_mapping(cascade, mapping, ignore_buffer)
    memo = cascade.__dict__.setdefault("_checked_mapping_memo", {})
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _check_mapping(cascade, mapping, ignore_buffer)
    return hit


def _check_mapping(cascade: Cascade, mapping: Mapping, ignore_buffer: bool) -> Mapping:
    names = [g.name for g in mapping.groups]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise MappingError(f"two groups are named {dup!r}", rule="cover", group=dup)
    where: dict[str, str] = {}
    for g in mapping.groups:
        if not g.einsums:
            raise MappingError("a group needs at least one Einsum", rule="cover", group=g.name)
        for e in g.einsums:
            if cascade.producer(e) is None:
                raise MappingError(f"{e!r} is not an Einsum of cascade {cascade.name!r}", rule="cover", group=g.name)
            if e in where:
                raise MappingError(f"Einsum {e} is in groups {where[e]} and {g.name}", rule="cover", group=g.name)
            where[e] = g.name
    missing = [e.name for e in cascade.einsums if e.name not in where]
    if missing:
        raise MappingError(f"Einsums {', '.join(missing)} are in no group", rule="cover")
    ordered = group_order(cascade, mapping.groups)
    buffer = None if ignore_buffer else mapping.buffer_bytes
    for g in ordered:
        check_group(cascade, g, buffer)
    canonical = tuple(
        FusionGroup(g.name, tuple(e.name for e in cascade.einsums if e.name in set(g.einsums)), g.loops, g.halo, g.resident)
        for g in ordered
    )
    return Mapping(mapping.name, canonical, mapping.buffer_bytes, mapping.description)


# ------------------------------------------------------------------------------------------
# YAML
# ------------------------------------------------------------------------------------------

def unfused_mapping(cascade: Cascade) -> Mapping:
    """Every Einsum alone: the algorithmic minimum of traffic (MARCA made ideal)."""
    return Mapping("unfused", tuple(FusionGroup(e.name, (e.name,)) for e in cascade.einsums))

