"""What a candidate group's closed forms are made of that depends only on its Einsums and the
ranks it tiles, not on any rank size: which tiled ranks each tensor's reads mention, whether
its reads are aligned, which tensors may stay resident and what holding them costs
(:mod:`mambalaya.search.candidates` builds its tables from these)."""

from __future__ import annotations

import functools
import itertools
from typing import Any, NamedTuple

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import rank_of_variable, rank_variable
from mambalaya.fusion.mapping import FusionGroup, intermediates, register_resident, tensors_read, tensors_written
from mambalaya.cost.traffic import may_reach_initial, read_steps
from mambalaya.fusion.group_analysis import analyse


class _GroupShape(NamedTuple):
    """What a candidate group's closed forms are made of that depends on its Einsums and tiled
    ranks alone, not on any rank size (:func:`shape_of_group`)."""

    unmentioned: dict[str, list[int]]  # per tensor it may read: the tiled ranks its reads do not mention
    mentioned: dict[str, frozenset[int]]  # ... and those they do
    aligned: dict[str, bool]  # ... whether its reads are aligned (:func:`_reads_aligned`)
    readable: frozenset[str]  # the tensors it reads off-chip (residency candidates)
    unwritten: dict[str, list[int]]  # per tensor it writes: the tiled ranks its output does not index and its producer does not select
    orders: list[tuple[int, ...]]  # loop orders (rank indices, outermost first), the fixed one first
    held: list[tuple[float, tuple[str, ...], tuple[int, ...]]]  # footprint parts: :func:`held_layout`
    keep_under: dict[tuple[int, ...], frozenset[str]]  # per loop order, the tensors residency may keep (filled on use)


def shape_of_group(cascade: Cascade, einsums: tuple[str, ...], ranks: tuple[str, ...]) -> _GroupShape:
    """The :class:`_GroupShape` of a group of ``einsums`` tiling ``ranks``, memoised per cascade
    structure (:attr:`~mambalaya.einsum.cascade.Cascade.structure_memo`): a sweep's layers at
    other lengths, batches or widths share it."""
    memo = cascade.structure_memo.setdefault("group_shape", {})
    key = (einsums, ranks)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _make_group_shape(cascade, einsums, ranks)
    return hit


def _make_group_shape(cascade: Cascade, einsums: tuple[str, ...], ranks: tuple[str, ...]) -> _GroupShape:
    probe = FusionGroup("probe", einsums, ())
    accesses, where = _read_accesses(cascade, einsums)
    targets = [t for step in read_steps(cascade, probe) for t in (step[4], step[5]) if t is not None]
    mentioned = {t: frozenset(i for i, r in enumerate(ranks) if r in _mentioned_ranks(cascade, t, where.get(t, ()),
                                                                                       accesses.get(t, ())))
                 for t in targets}
    unwritten = {}
    selects = analyse(cascade, einsums).selects  # a select-runner writes once along the ranks it selects
    for t in tensors_written(cascade, probe):
        outs = {rank_of_variable(v) for v in cascade.einsum(t).output_variables} | set(selects.get(t, ()))
        unwritten[t] = [i for i, r in enumerate(ranks) if r not in outs]
    gen = set(cascade.generational_ranks)
    free = [i for i, r in enumerate(ranks) if r not in gen]
    tail = [i for i, r in enumerate(ranks) if r in gen]
    orders = [tuple(p) + tuple(tail) for p in itertools.permutations(free)] if len(free) <= 3 else [tuple(range(len(ranks)))]
    held = held_layouts(cascade, einsums, ranks)
    return _GroupShape(
        unmentioned={t: [i for i in range(len(ranks)) if i not in m] for t, m in mentioned.items()},
        mentioned=mentioned,
        aligned={t: _aligned_reads(cascade, t, where.get(t, ()), accesses.get(t, []), ranks) for t in targets},
        readable=frozenset(tensors_read(cascade, probe)),
        unwritten=unwritten,
        orders=orders,
        held=held,
        keep_under={},
    )


def held_layouts(cascade: Cascade, einsums: tuple[str, ...], ranks: tuple[str, ...]
                 ) -> list[tuple[float, tuple[str, ...], tuple[int, ...]]]:
    """The footprint parts of a group of ``einsums`` tiling ``ranks`` (:func:`held_layout` each):
    every intermediate the buffer holds (not one the lanes carry, which takes no buffer space,
    :func:`~mambalaya.fusion.mapping.register_resident`) and every recurrence's carried rows (a
    history recurrence's every earlier row: its rank whole). What the least footprint needs
    alone (:func:`~mambalaya.search.candidates.least_footprint_bound`)."""
    probe = FusionGroup("probe", einsums, ())
    lanes = register_resident(cascade, probe)  # no buffer space (fusion.mapping.footprint_bytes)
    held = [held_layout(cascade, t, None, 1, ranks) for t in intermediates(cascade, probe) if t not in lanes]
    for name in einsums:
        e = cascade.einsum(name)
        rec = cascade.recurrence(e)
        if rec and cascade.is_history_recurrence(e):  # every earlier row: its rank whole, by size at use
            base, whole, tiled = held_layout(cascade, name, rec[0], 1, ranks)
            held.append((base, (rec[0], *whole), tiled))
        elif rec:
            held.append(held_layout(cascade, name, rec[0], rec[1], ranks))
    return held


def held_layout(cascade: Cascade, tensor: str, skip_rank: str | None, rows: int, ranks: tuple[str, ...]
                 ) -> tuple[float, tuple[str, ...], tuple[int, ...]]:
    """How a group tiling ``ranks`` holds ``rows`` of ``tensor`` (all but its rank
    ``skip_rank``): (bytes per element times ``rows``, the ranks it holds whole, the indices
    of the tiled ones). :func:`held_bytes` makes the footprint term's fixed bytes. Memoised on
    the cascade (a search asks it for every intermediate of every group it meets)."""
    memo = cascade.__dict__.setdefault("_held_layout_memo", {})
    key = (tensor, skip_rank, rows, ranks)
    hit = memo.get(key)
    if hit is None:
        spec = cascade.tensors[tensor]
        whole = tuple(r for r in spec.ranks if r != skip_rank and r not in ranks)
        tiled = tuple(ranks.index(r) for r in spec.ranks if r != skip_rank and r in ranks)
        hit = memo[key] = (rows * spec.stored_bytes_per_element, whole, tiled)
    return hit


def held_bytes(cascade: Cascade, base: float, whole: tuple[str, ...]) -> float:
    """``base`` times the size of each rank of ``whole`` in turn."""
    for r in whole:
        base *= cascade.size(r)
    return base


@functools.lru_cache(maxsize=1 << 16)
def keepable_under(order: tuple[int, ...], seen: frozenset[int]) -> bool:
    """Whether a tensor indexed by the ranks ``seen`` may stay resident under ``order`` (rank
    indices, outermost first): a loop that does not index it runs inside the outermost loop
    that does. Memoised (a search asks it per group shape, loop order and tensor: a few
    thousand distinct questions among some 10^5)."""
    pos = {i: n for n, i in enumerate(order)}
    first = min((pos[i] for i in seen), default=-1)
    return any(i not in seen and pos[i] > first for i in order)


def _read_accesses(cascade: Cascade, einsums: tuple[str, ...]
                   ) -> tuple[dict[str, list[Any]], dict[str, tuple[tuple[str, int], ...]]]:
    """Per tensor a group of ``einsums`` reads off-chip, the accesses that read it (an access
    to a recurrence's output also reads that output's initial value), and where each of those
    accesses is (its Einsum and its position among that Einsum's inputs: a key that
    determines them)."""
    spec = cascade.tensors
    inside = set(einsums)
    out: dict[str, list[Any]] = {}
    where: dict[str, tuple[tuple[str, int], ...]] = {}
    for name in einsums:
        for i, a in enumerate(cascade.einsum(name).inputs):
            if a.tensor not in inside:
                out.setdefault(a.tensor, []).append(a)
                where[a.tensor] = where.get(a.tensor, ()) + ((name, i),)
            initial = spec[a.tensor].initial
            if initial and (a.tensor not in inside or may_reach_initial(cascade, a)):  # as read_steps reads it
                out.setdefault(initial, []).append(a)
                where[initial] = where.get(initial, ()) + ((name, i),)
    return out, where


def _mentioned_ranks(cascade: Cascade, tensor: str, where: tuple[tuple[str, int], ...], accesses: list[Any]
                     ) -> frozenset[str]:
    """The ranks of every variable in ``accesses`` (of ``tensor``, at ``where``:
    :func:`_read_accesses`), memoised per cascade structure, tensor and accesses."""
    memo = cascade.structure_memo.setdefault("mentioned_ranks", {})
    key = (tensor, where)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = frozenset(rank_of_variable(v) for a in accesses for idx in a.indices for v in idx.variables)
    return hit


def _aligned_reads(cascade: Cascade, tensor: str, where: tuple[tuple[str, int], ...], accesses: list[Any],
                   ranks: tuple[str, ...]) -> bool:
    """:func:`_reads_aligned`, memoised per cascade structure, tensor, accesses (``where``:
    :func:`_read_accesses`) and tileable ranks."""
    memo = cascade.structure_memo.setdefault("aligned_reads", {})
    key = (tensor, where, ranks)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _reads_aligned(cascade, accesses, ranks)
    return hit


def _reads_aligned(cascade: Cascade, accesses: list[Any], ranks: tuple[str, ...]) -> bool:
    """Whether every tile reads its own slice of a tensor read through ``accesses``: on each
    dimension, the index of every access moves with at most one tileable rank (of ``ranks``),
    that of the dimension, with coefficient 1 (plus offsets and ranks the group does not tile,
    as a window's). Then the tensor's reads are its untiled bytes times the trips of the ranks
    it does not mention, the closed form, for every tiling. A dimension indexed through
    another rank (``ACS[s]`` on Q), a mirrored index (rotary ``1-u``) or a product of ranks
    (``Q*c+q``) reads overlapping boxes, which only the general model counts; so do accesses
    that differ in which dimensions move (``ACS[255]`` beside ``ACS[q]``: the fixed slice is
    read again in every tile)."""
    tileable = set(ranks)
    signatures = set()
    for a in accesses:
        signature = []
        for idx, rank in zip(a.indices, cascade.tensors[a.tensor].ranks):
            moving = [(v, c) for v, c in idx.terms if rank_of_variable(v) in tileable]
            if moving and moving != [(rank_variable(rank), 1)]:
                return False
            signature.append(bool(moving))
        signatures.add(tuple(signature))
    return len(signatures) <= 1
