"""One analysis of a group: what a set of Einsums is when it runs as one loop nest, whatever its
tiles, loop order or residency.

:func:`analyse` answers it once per group shape (the group's Einsums) and cascade structure, and
everything that asks about a group asks it: the legality rules and the footprint
(:mod:`mambalaya.fusion.mapping`), the traffic and buffer models (:mod:`mambalaya.cost.traffic`,
:mod:`mambalaya.cost.buffer`), the search's candidate tables (:mod:`mambalaya.search.candidates`)
and the tiled executor (:mod:`mambalaya.execute.tiled`). What depends on the tiles (the tile
boxes, the footprint, the traffic of a tiling) is computed from it by those modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Einsum, rank_of_variable
from mambalaya.fusion.edges import reduce_then_reuse


@dataclass(frozen=True)
class GroupAnalysis:
    """The facts of one group shape (see the module doc)."""

    einsums: tuple[str, ...]
    #: tensors the group reads from off chip, in first-use order (initial values included)
    reads: tuple[str, ...]
    #: tensors the group produces that leave the chip: read by another group, or handed back
    writes: tuple[str, ...]
    #: tensors produced in the group and read by another Einsum of the group
    intermediates: tuple[str, ...]
    #: intermediates the lanes carry in registers from maker to readers, never in the buffer
    in_registers: frozenset[str]
    #: ranks every Einsum writes or runs once along (:attr:`selects`) and none reduces (a
    #: recurrence's contracted state ranks count as reduced), generational ones last: what the
    #: group tiles (those of more than one element)
    tileable: tuple[str, ...]
    #: ranks some Einsum writes and none reduces, generational ones last: what a fixed grouping
    #: may tile when a member lacks a rank (it then re-runs per tile)
    widened: tuple[str, ...]
    #: per member that would run once along a rank the group tiles (a *select-runner*,
    #: :func:`_select_candidates`), those ranks and where it reads the one position along each (an
    #: input access and a dimension of it: the position is the cascade's own,
    #: :meth:`select_positions_at`, so layers at other lengths share the analysis); members that
    #: would not are absent (read-only)
    selects: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    #: per recurrence member that stays on chip and that the group's other members read only at
    #: constant positions of its recurrence rank (the online softmax's running output ``OR``,
    #: read at the last key by ``AO``): that rank and where those reads are (reader, input
    #: access, dimension: the positions are the cascade's own, :meth:`kept_at`). Its carried
    #: value lives in the lanes that run the recurrence; the buffer receives those positions
    #: only (:func:`_kept`)
    kept: dict[str, tuple[str, frozenset[tuple[str, int, int]]]] = field(default_factory=dict)

    def select_positions_at(self, cascade: Cascade, name: str) -> dict[str, int]:
        """Per select rank of member ``name`` (:attr:`selects`), the one position of
        ``cascade`` it reads along it."""
        inputs = cascade.einsum(name).inputs
        return {r: inputs[i].indices[d].const for r, (i, d) in self.selects.get(name, {}).items()}

    def kept_at(self, cascade: Cascade, name: str) -> tuple[str, frozenset[int]] | None:
        """:attr:`kept` of member ``name`` on ``cascade``: its rank and the positions inside
        that rank its readers read (none, if they read only its initial value), or None if they
        are all of its positions (then the buffer receives the whole output, as for any member). The analysis itself
        holds no position and no size (it is shared by a layer's other lengths and batches)."""
        found = self.kept.get(name)
        if found is None:
            return None
        rank, where = found
        size = cascade.size(rank)
        inside = frozenset(p for n, i, d in where if (p := cascade.einsum(n).inputs[i].indices[d].const) < size)
        return (rank, inside) if len(inside) < size else None


def analyse(cascade: Cascade, einsums: tuple[str, ...]) -> GroupAnalysis:
    """The group of ``einsums`` analysed, memoised per cascade structure (sizes do not change it)."""
    memo = cascade.structure_memo.setdefault("group_analysis", {})
    hit = memo.get(einsums)
    if hit is None:
        hit = memo[einsums] = _analyse(cascade, einsums)
    return hit


@dataclass(frozen=True)
class _MemberFacts:
    """What :func:`_analyse` asks of one Einsum that does not depend on the group around it
    (memoised per cascade, :func:`_member_facts`): a group's analysis is then set operations on
    these and on the per-pair facts of :func:`_pair_facts`."""

    inputs: tuple[str, ...]  # the tensors it reads, in access order
    consumers: frozenset[str]  # the Einsums that read its tensor, itself left out
    handed_back: bool  # its tensor is one the cascade hands back
    outs: frozenset[str]  # the ranks it writes
    reduced: frozenset[str]  # the ranks it reduces (a recurrence's contracted state ranks too)
    one_lane: bool  # each element made by one lane: it reduces nothing and contracts no state
    #: where a select-runner of it reads its one position along each rank it could run once
    #: along (:func:`_select_candidates`, where :func:`_is_runner` holds), by rank
    select_where: dict[str, tuple[int, int]]
    recurrence_rank: str | None


@dataclass(frozen=True)
class _PairFacts:
    """What :func:`_analyse` asks of a producer ``e`` and one reader ``c`` of its tensor that
    does not depend on the group (memoised per cascade)."""

    in_place: bool  # c reads e's tensor in place (:func:`_reads_in_place`)
    one_step: bool  # c's reads of e, a recurrence, are one step of it (:func:`_reads_one_step`)
    reducers: frozenset[str]  # the other readers of e that reduce a rank before c reads it (reduce-then-reuse)
    #: where c reads e at constant positions of e's recurrence rank (reader, access, dimension;
    #: at or above 0), or None if one of c's reads indexes that rank with a variable
    kept_where: frozenset[tuple[str, int, int]] | None


def _member_facts(cascade: Cascade) -> dict[str, _MemberFacts]:
    memo = cascade.__dict__.get("_group_member_facts")
    if memo is None:
        handed_back = set(cascade.output_tensors())
        memo = cascade.__dict__["_group_member_facts"] = {}
        for e in cascade.einsums:
            along = cascade.recurrence(e)
            contracted = cascade.contracted_state_ranks(e)
            ranks = tuple(_select_candidates(cascade, e))
            memo[e.name] = _MemberFacts(
                tuple(e.input_tensors), frozenset(c.name for c in cascade.consumers(e.name) if c.name != e.name),
                e.name in handed_back, frozenset(rank_of_variable(v) for v in e.output_variables),
                frozenset(rank_of_variable(v) for v in e.reduced_variables) | frozenset(contracted),
                not e.reduced_variables and not contracted, {r: _where_read(cascade, e, r) for r in ranks},
                None if along is None else along[0])
    return memo


def _pair_facts(cascade: Cascade, producer: str, reader: str) -> _PairFacts:
    memo = cascade.__dict__.setdefault("_group_pair_facts", {})
    hit = memo.get((producer, reader))
    if hit is None:
        e, c = cascade.einsum(producer), cascade.einsum(reader)
        hit = memo[(producer, reader)] = _PairFacts(
            _reads_in_place(c, producer), _reads_one_step(cascade, c, producer),
            frozenset(who for _, who in reduce_then_reuse(cascade, producer, c)), _kept_reads(cascade, e, c))
    return hit


def _analyse(cascade: Cascade, einsums: tuple[str, ...]) -> GroupAnalysis:
    """The analysis of the group of ``einsums`` from the per-Einsum and per-pair facts (each
    field as its docstring in :class:`GroupAnalysis` defines it)."""
    inside = frozenset(einsums)
    facts = _member_facts(cascade)
    members = [facts[n] for n in einsums]
    reads: dict[str, None] = {}
    for f in members:
        for t in f.inputs:
            if t not in inside:
                reads.setdefault(t)
    writes = tuple(n for n, f in zip(einsums, members) if f.handed_back or not f.consumers <= inside)
    inter = tuple(n for n, f in zip(einsums, members) if not f.consumers.isdisjoint(inside))
    runners = {n for n, f in zip(einsums, members) if _is_runner(f, inside)}
    leaving = set(writes)
    lanes = frozenset(n for n, f in zip(einsums, members) if _in_lanes(cascade, n, f, inside, leaving, runners))
    selects = {n: dict(facts[n].select_where) for n in einsums if n in runners}
    common: set[str] | None = None
    written: set[str] = set()
    reduced: set[str] = set()
    for n, f in zip(einsums, members):
        runs_on = f.outs | set(selects.get(n, ()))
        common = set(runs_on) if common is None else common & runs_on
        written |= f.outs
        reduced |= f.reduced
    kept = {n: found for n, f in zip(einsums, members)
            if n not in lanes and n not in leaving and (found := _kept(cascade, n, f, inside)) is not None}
    return GroupAnalysis(einsums, tuple(reads), writes, inter, lanes,
                         _generational_last(cascade, (common or set()) - reduced),
                         _generational_last(cascade, written - reduced), selects, kept)


def _is_runner(f: _MemberFacts, inside: frozenset[str]) -> bool:
    """Whether a member of the group ``inside`` is a select-runner: it has select ranks
    (:func:`_select_candidates`), every tensor it reads is made in the group (it reads nothing
    off chip) and no other member reads its output (it leaves the group, written once along them)."""
    return bool(f.select_where) and inside.issuperset(f.inputs) and f.consumers.isdisjoint(inside)


def _in_lanes(cascade: Cascade, name: str, f: _MemberFacts, inside: frozenset[str], leaving: set[str],
              runners: set[str]) -> bool:
    """Whether the lanes carry member ``name``'s result from where it is made to where it is
    read, one word per lane, so it never reaches the buffer: it leaves neither the group nor the
    chip; each element is made by one lane (it reduces nothing and contracts no state: a pointwise
    Einsum or an elementwise recurrence such as the selective scan's ``H``); every reader in the
    group reads it in place (:func:`_reads_in_place`) or, of a recurrence, is a select-runner of
    the group (``runners``) taking one step of it from the lane that makes it
    (:func:`_reads_one_step`: the final state); and no reader's edge from it is a
    reduce-then-reuse with the reducer in the group (:func:`~mambalaya.fusion.edges.reduce_then_reuse`:
    the softmax's scores read by the row max and then by the exponential must be held for the
    whole row, which one word per lane does not do)."""
    if name in leaving or not f.one_lane:
        return False
    readers = [c for c in f.consumers if c in inside]
    if not readers:
        return False
    pairs = [_pair_facts(cascade, name, c) for c in readers]
    if not all(p.in_place or (c in runners and p.one_step) for c, p in zip(readers, pairs)):
        return False
    return all(p.reducers.isdisjoint(inside) for p in pairs)


def _kept(cascade: Cascade, name: str, f: _MemberFacts, inside: frozenset[str]):
    """For member ``name``, a recurrence, in the group of ``inside``: its recurrence rank and the
    positions along it that the group's other members read, if every one of their reads indexes
    that rank with a constant (none reads a position per step); None otherwise, or if no other
    member reads it. ``AO[b,i,g,r,e] = OR[b,i,TB-1,g,r,e] / LR[b,i,TB-1,g,r]`` reads the running
    output and sum at the last key block only. Where those reads are is returned (reader, input
    access, dimension), of the positions at or above 0: :meth:`GroupAnalysis.kept_at` reads the
    positions and applies the rank's size."""
    if f.recurrence_rank is None:
        return None
    readers = [c for c in f.consumers if c in inside]
    if not readers:
        return None
    where: set[tuple[str, int, int]] = set()
    for c in readers:
        found = _pair_facts(cascade, name, c).kept_where
        if found is None:
            return None
        where |= found
    return f.recurrence_rank, frozenset(where)


def _where_read(cascade: Cascade, e: Einsum, rank: str) -> tuple[int, int]:
    """The first input access of ``e`` and dimension of it that index ``rank`` with a constant
    alone (a select-runner reads its one position along a select rank there, and at every
    other such place alike)."""
    for i, a in enumerate(e.inputs):
        for d, (idx, r) in enumerate(zip(a.indices, cascade.tensors[a.tensor].ranks)):
            if r == rank and not idx.terms:
                return i, d
    raise AssertionError(f"{e.name} reads no constant position of {rank}")  # pragma: no cover


def _kept_reads(cascade: Cascade, e: Einsum, c: Einsum) -> frozenset[tuple[str, int, int]] | None:
    """Where ``c`` reads ``e``, a recurrence, at constant positions (at or above 0) of its
    recurrence rank (reader, input access, dimension), or None if one of its reads indexes that
    rank with a variable (empty for an Einsum that is no recurrence)."""
    along = cascade.recurrence(e)
    if along is None:
        return frozenset()
    dims = [d for d, rank in enumerate(cascade.tensors[e.name].ranks) if rank == along[0]]
    where: set[tuple[str, int, int]] = set()
    for i, a in enumerate(c.inputs):
        if a.tensor != e.name:
            continue
        if any(a.indices[d].terms for d in dims):
            return None
        where.update((c.name, i, d) for d in dims if a.indices[d].const >= 0)
    return frozenset(where)


def _select_candidates(cascade: Cascade, e: Einsum) -> dict[str, int]:
    """The ranks along which ``e`` runs once if a group tiles them, each with the one position it
    reads along it (the *select ranks* of :mod:`mambalaya.fusion.mapping`, before they are
    narrowed to the ranks the group tiles), where the group makes ``e`` a select-runner
    (:func:`_is_runner`).

    A rank ``R`` qualifies when ``e`` is no recurrence, its output lacks ``R`` and it does not
    reduce ``R``, and every one of its reads indexes each dimension of rank ``R`` of that tensor
    with one constant position, at or above 0, the same in all of them (at least one read).
    ``HN[b,e,n] = H[b,1023,e,n]`` beside the scan ``H`` runs once along ``I``, in the tile
    holding position 1023. None for a recurrence, an Einsum without inputs or one reading itself."""
    if cascade.recurrence(e) is not None or not e.inputs or any(a.tensor == e.name for a in e.inputs):
        return {}
    excluded = {rank_of_variable(v) for v in (*e.output_variables, *e.reduced_variables)}
    found: dict[str, int] | None = None
    for a in e.inputs:
        positions: dict[str, int | None] = {}
        for idx, rank in zip(a.indices, cascade.tensors[a.tensor].ranks):
            one = idx.const if not idx.terms and idx.const >= 0 else None
            positions[rank] = one if positions.get(rank, one) == one else None
        here = {r: p for r, p in positions.items() if p is not None and r not in excluded}
        found = here if found is None else {r: p for r, p in found.items() if here.get(r) == p}
    return found or {}


def _generational_last(cascade: Cascade, ranks: set[str]) -> tuple[str, ...]:
    gen = set(cascade.generational_ranks)
    ordered = [r for r in cascade.ranks if r in ranks]
    return tuple([r for r in ordered if r not in gen] + [r for r in ordered if r in gen])


def _plain_names(indices) -> list[str] | None:
    """The variables of ``indices`` if each is one plain variable (no offset, constant or
    stride, :attr:`~mambalaya.einsum.ir.AffineIndex.plain_variable`) and all are distinct."""
    names = [idx.plain_variable for idx in indices]
    return names if None not in names and len(set(names)) == len(names) else None  # type: ignore[return-value]


def _reads_in_place(reader: Einsum, tensor: str) -> bool:
    """Whether ``reader`` reads each element of ``tensor`` once, at the element its own
    iteration is at: every access a plain variable per dimension, all distinct, and together
    exactly the reader's iteration variables (so it runs over no rank the tensor lacks, which
    would reuse an element across it). A pointwise reader at its own output element, a
    reduction over the tensor's ranks (``YS[b,i,e] = H[b,i,e,n] * C[b,i,n]``) and a recurrence
    reading its step's input (``H = AD * H[i-1] + BX``) do."""
    wanted = set(reader.iteration_variables)
    for a in reader.inputs:
        if a.tensor == tensor and ((names := _plain_names(a.indices)) is None or set(names) != wanted):
            return False
    return True


def _reads_one_step(cascade: Cascade, reader: Einsum, tensor: str) -> bool:
    """Whether ``reader`` reads one position of ``tensor``, a recurrence: every dimension of the
    recurrence's rank at a constant and each other dimension with a plain variable, together its
    iteration variables (the final state ``HN[b,e,n] = H[b,L-1,e,n]``; not the attention output
    ``AO[b,i,g,r,e] = OR[..] / LR[b,i,TB-1,g,r]``, which reuses ``LR`` across ``e``). A
    select-runner of the group that reads so takes that step from the lane that holds it when it
    is made (it runs once, in the step that makes that position)."""
    along = cascade.recurrence(cascade.einsum(tensor))
    if along is None:
        return False
    wanted = set(reader.iteration_variables)
    ranks = cascade.tensors[tensor].ranks
    for a in reader.inputs:
        if a.tensor != tensor:
            continue
        if any(idx.terms for idx, rank in zip(a.indices, ranks) if rank == along[0]):
            return False
        names = _plain_names([idx for idx, rank in zip(a.indices, ranks) if rank != along[0]])
        if names is None or set(names) != wanted:
            return False
    return True
