"""The analytic traffic and buffer model of a mapping (semantics: :mod:`mambalaya.fusion.mapping`).

For a group with fused loops, a tensor ``T`` it reads from DRAM costs, summed over all steps,
the elements of the bounding box of the group's accesses to ``T`` in that step. The box of a
dimension depends only on the tiles of the fused ranks its index mentions, so the sum factors:

    reads(T) = prod(trips of fused ranks T's indices do not mention)
               x prod over independent dimension groups of sum over their tiles of box length

With ``halo: retain`` a window dimension reads each row once over the tiles of its rank (the
previous tile's rows are still on chip). Rows an access reaches below 0 along the axis of
``T``'s initial value are read from that state tensor. A tensor the group produces and that
leaves it is written once per step that computes it: its size times the trips of the fused
ranks it lacks (a recomputed RSp producer writes again), but for its producer's select ranks,
along which it runs, and so writes, once (:func:`~mambalaya.fusion.mapping.select_ranks`). A **resident** tensor is read again
only when a loop that indexes it (of more than one trip) moves: the trips of the loops it does
not mention count only when they run outside the innermost loop it does. Bytes are
elements x bits / 8, and none for a declared mask, which kernels make from the indices
(:attr:`~mambalaya.einsum.ir.TensorSpec.stored_bytes_per_element`).

The on-chip buffer's reads and writes (:func:`group_buffer_accesses`) use the same box sums
with every step reading its whole box: each Einsum reads its operands' boxes and writes its
output tile in every step, plus the fills and drains of the group's DRAM bytes.

This module never runs the cascade; :mod:`mambalaya.execute.tiled` moves real data and counts
it, and the tests require the two to agree to the byte.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import math
from dataclasses import dataclass, field

from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import MambalayaError
from mambalaya.einsum.ir import Access, Einsum, rank_of_variable
from mambalaya.einsum.dead_work import dead_work
from mambalaya.einsum.routing import read_scale, tensor_scale
from mambalaya.fusion.mapping import (
    FusionGroup,
    Mapping,
    einsum_loops,
    footprint_bytes,
    group_einsums,
    index_span,
    tensors_read,
    tensors_written,
    window_halos,
)


@dataclass(frozen=True)
class GroupTraffic:
    group: str
    einsums: tuple[str, ...]
    loops: tuple[tuple[str, int], ...]
    steps: int
    read_bytes: dict[str, float]
    write_bytes: dict[str, float]
    footprint_bytes: float

    @property
    def total_bytes(self) -> float:
        return sum(self.read_bytes.values()) + sum(self.write_bytes.values())


def shared_traffic(traffic: GroupTraffic, dram_share: dict[str, float]) -> GroupTraffic:
    """``traffic`` with each tensor's off-chip bytes times its ``dram_share`` (a tensor absent
    keeps all its bytes): on a multi-core chip, the share of a tensor's off-chip traffic one core
    carries (:mod:`mambalaya.cost.cores`)."""
    def scaled(table: dict[str, float]) -> dict[str, float]:
        return {t: b * dram_share.get(t, 1.0) for t, b in table.items()}
    return dataclasses.replace(traffic, read_bytes=scaled(traffic.read_bytes), write_bytes=scaled(traffic.write_bytes))


@dataclass(frozen=True)
class MappingTraffic:
    mapping: Mapping
    groups: tuple[GroupTraffic, ...]
    by_tensor: dict[str, tuple[float, float]] = field(default_factory=dict)  # tensor -> (read, write)

    @property
    def read_bytes(self) -> float:
        return sum(g.read_bytes[t] for g in self.groups for t in g.read_bytes)

    @property
    def write_bytes(self) -> float:
        return sum(g.write_bytes[t] for g in self.groups for t in g.write_bytes)

    @property
    def offchip_bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def peak_footprint_bytes(self) -> float:
        return max((g.footprint_bytes for g in self.groups), default=0.0)


def read_elements(
    cascade: Cascade, group: FusionGroup, tensor: str, accesses: list[Access], self_only: bool,
    resident: bool = False, access_key: Any = None,
) -> tuple[int, int]:
    """(elements of ``tensor``, elements of its initial value) the group reads over all steps.

    ``self_only``: the accesses are a recurrence reading its own output; only the part below 0
    (the incoming state) comes from DRAM. ``resident``: the tensor stays on chip while its box
    does not change, so loops it does not mention that run inside the innermost loop it does
    mention (counting only loops of more than one trip) cost no re-read. ``access_key``: a
    cheap hashable that identifies ``accesses`` (default: the accesses themselves); groups
    whose Einsums read ``tensor`` through the same accesses share it, and so share the memos.
    """
    fused = {lp.rank: lp for lp in group.loops}
    plan = read_plan(cascade, group, tensor, accesses, access_key)
    mentioned, comps = plan.mentioned, plan.comps
    repeat = 1
    if resident:
        moving = [lp.rank for lp in group.loops if lp.rank in mentioned and lp.trips(cascade.size(lp.rank)) > 1]
        outer = group.fused_ranks[: group.fused_ranks.index(moving[-1])] if moving else ()
        for r in outer:
            if r not in mentioned:
                repeat *= fused[r].trips(cascade.size(r))
    else:
        for r, lp in fused.items():
            if r not in mentioned:
                repeat *= lp.trips(cascade.size(r))
    retain = group.halo == "retain"
    halos = window_halos(cascade, group) if retain and any(len(c[1]) == 1 for c in comps) else {}
    prod_all, prod_own = 1, 1  # own elements = product of the components' own sums; all = of all sums
    for dims, ranks, bounds in comps:
        windowed = len(ranks) == 1 and (tensor, ranks[0]) in halos  # retained rows exist only along a window's rank
        s_own, s_init = component_sums(cascade, tensor, plan.access_key, accesses, dims,
                                        tuple((r, fused[r].tile) for r in ranks), bounds, retain and windowed)
        prod_all *= s_own + s_init
        prod_own *= s_own
    total_own = prod_own * repeat
    total_init = (prod_all - prod_own) * repeat
    if self_only:
        total_own = 0
    return total_own, total_init


@dataclass(frozen=True)
class _ReadPlan:
    """What a tensor's reads depend on, for one set of accesses and fused ranks."""

    access_key: Any
    mentioned: frozenset[str]  # fused ranks some access's index mentions
    # components: dimensions that share fused ranks, with those ranks and their bounds (below 0
    # only along the initial axis, by the history depth)
    comps: tuple[tuple[tuple[int, ...], tuple[str, ...], tuple[tuple[int, int], ...]], ...]


def read_plan(cascade: Cascade, group: FusionGroup, tensor: str, accesses: list[Access], access_key: Any) -> _ReadPlan:
    key = (tensor, tuple(accesses) if access_key is None else access_key, frozenset(group.fused_ranks))
    memo = cascade.__dict__.setdefault("_read_plan_memo", {})
    hit = memo.get(key)
    if hit is not None:
        return hit
    shape = cascade.shape(tensor)
    init = cascade.initial_axis(tensor)
    fused = set(group.fused_ranks)
    deps: list[set[str]] = []  # which fused ranks each dimension's box depends on
    for p in range(len(shape)):
        deps.append({r for acc in accesses for v in acc.indices[p].variables if (r := rank_of_variable(v)) in fused})
    bounds = []
    for p, n in enumerate(shape):
        depth = init[1] if init is not None and init[0] == p else 0
        bounds.append((-depth, n - 1))
    comps: list[tuple[list[int], list[str]]] = []
    for p in range(len(shape)):
        merged = [c for c in comps if set(c[1]) & deps[p]]
        dims = [p] + [d for c in merged for d in c[0]]
        ranks = sorted(deps[p].union(*[set(c[1]) for c in merged]))
        comps = [c for c in comps if c not in merged] + [(dims, ranks)]
    hit = _ReadPlan(
        key[1], frozenset().union(*deps) if deps else frozenset(),
        tuple((tuple(dims), tuple(ranks), tuple(bounds[p] for p in dims)) for dims, ranks in comps))
    memo[key] = hit
    return hit


#: Most tile combinations a component of a tensor may enumerate (after counting regular tiles
#: once): beyond it the traffic is refused with an error rather than computed in time that grows
#: with the rank sizes.
MAX_ENUMERATED_TILES = 1 << 20

#: Below this bound on a component's sums numpy's int64 is exact; above it Python integers are used.
_INT64_SAFE = 1 << 62
_INT64_MAX, _INT64_MIN = int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min)


class TrafficSizeError(MambalayaError):
    """A traffic count the closed forms cannot give without enumerating too many tiles."""


def component_sums(cascade: Cascade, tensor: str, access_key: Any, accesses: list[Access], dims: tuple[int, ...],
                    tiles: tuple[tuple[str, int], ...], bounds: tuple[tuple[int, int], ...],
                    retained: bool) -> tuple[int, int]:
    """(sum over the component's tiles of the product over ``dims`` of rows >= 0, the same for
    rows < 0): the box sums of one group of dimensions that share fused ranks. Memoised on the
    cascade: candidate groups of a search, and mappings of a sweep, share most of them."""
    memo = cascade.__dict__.setdefault("_component_sums_memo", {})
    key = (tensor, access_key, dims, tiles, retained, COMPRESS_REGULAR_TILES)
    hit = memo.get(key)
    if hit is None:
        all_bounds = dict(zip(dims, bounds))
        if not tiles:  # no fused rank: one box, every step
            hit = _untiled_sums(cascade, accesses, dims, all_bounds)
        elif len(tiles) == 1:
            (rank, tile), = tiles
            hit = _single_rank_sums(cascade, tensor, list(accesses), list(dims), rank, tile, all_bounds, retained)
        else:
            hit = _multi_rank_sums(cascade, tensor, tuple(accesses), dims, tiles, all_bounds)
        memo[key] = hit
    return hit


def _untiled_sums(cascade: Cascade, accesses: list[Access], dims: tuple[int, ...],
                  bounds: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Box sums of dimensions that depend on no fused rank (exact Python integers)."""
    sizes = cascade.variable_sizes
    n_own = n_all = 1
    for p in dims:
        spans = [index_span(acc.indices[p], {v: (0, sizes[v]) for v in acc.indices[p].variables}) for acc in accesses]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        lower, upper = bounds[p]
        lo, hi = max(lo, lower), min(hi, upper)
        own = neg = 0
        if hi >= lo:
            own, neg = max(0, hi - max(lo, 0) + 1), max(0, min(hi, -1) - lo + 1)
        n_own *= own
        n_all *= own + neg
    return n_own, n_all - n_own


def _exact_dtype(bound: int) -> Any:
    """int64 when every value and sum stays below :data:`_INT64_SAFE`, else Python integers."""
    return np.int64 if bound < _INT64_SAFE else object


def _rank_terms(idx: Any, rank: str) -> list[int]:
    """Coefficients of the variables of ``rank`` in one index."""
    return [c for v, c in idx.terms if rank_of_variable(v) == rank]


def _every_tile(tensor: str, rank: str, tile: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    if n > MAX_ENUMERATED_TILES:
        raise TrafficSizeError(
            f"the traffic of tensor {tensor!r} needs all {n:,} tiles of rank {rank} (tile {tile}): its accesses do "
            "not move by one common step from tile to tile, so regular tiles cannot be counted once; use a larger tile")
    return np.arange(n, dtype=np.int64), np.ones(n, dtype=np.int64)


def _representatives(cascade: Cascade, tensor: str, accesses: tuple[Access, ...], dims: tuple[int, ...], rank: str, tile: int,
                     bounds: dict[int, tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Tile indices of ``rank`` to enumerate and how many tiles each stands for. The tiles away
    from both ends (the *middle*: full tiles whose boxes, for any tile of the other ranks, lie
    inside the bounds and at or above 0) read the same rows, since every access moves its box by
    the same step from one tile to the next: one stands for all of them."""
    size = cascade.size(rank)
    n = -(-size // tile)
    edge = 8
    if not COMPRESS_REGULAR_TILES or n <= 2 * edge + 2:
        return _every_tile(tensor, rank, tile, n)
    first, last = (edge + 1) * tile, (n - edge - 1) * tile - 1  # rows of the middle tiles edge+1 .. n-edge-2
    for p in dims:
        coeffs = {tuple(_rank_terms(acc.indices[p], rank)) for acc in accesses}
        if coeffs == {()}:
            continue
        if len(coeffs) != 1 or len(next(iter(coeffs))) != 1:
            return _every_tile(tensor, rank, tile, n)  # accesses moving at different rates (or twice): no common step
        lo, hi = _boxes(cascade, accesses, p, {rank: (np.array([first]), np.array([last]))}, 1)
        lower, upper = bounds[p]
        if lo[0] < max(lower, 0) or hi[0] > upper:
            return _every_tile(tensor, rank, tile, n)
    middle = n - 2 * edge - 2
    reps = np.concatenate([np.arange(edge + 1), np.arange(n - edge - 1, n)]).astype(np.int64)
    weights = np.ones(len(reps), dtype=np.int64)
    reps = np.insert(reps, edge + 1, edge + 1)
    weights = np.insert(weights, edge + 1, middle)
    return reps, weights


def _mesh(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``np.meshgrid(*arrays, indexing="ij")``, each raveled (one array: itself)."""
    return [np.asarray(arrays[0]).ravel()] if len(arrays) == 1 else [m.ravel() for m in np.meshgrid(*arrays, indexing="ij")]


def _multi_rank_sums(cascade: Cascade, tensor: str, accesses: tuple[Access, ...], dims: tuple[int, ...],
                     tiles: tuple[tuple[str, int], ...], bounds: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Box sums of a component whose dimensions depend on several fused ranks (or none), over
    the product of their tiles: each rank's middle tiles counted once (:func:`_representatives`),
    so the work does not grow with the ranks' sizes."""
    reps = [_representatives(cascade, tensor, accesses, dims, r, t, bounds) for r, t in tiles]
    combos = math.prod(len(idx) for idx, _ in reps)
    if combos > MAX_ENUMERATED_TILES:
        raise TrafficSizeError(
            f"the traffic of tensor {tensor!r} needs {combos:,} tile combinations of ranks "
            f"{', '.join(r for r, _ in tiles)} (tiles {', '.join(f'{r}={t}' for r, t in tiles)}): its accesses do not "
            f"move by a common step from tile to tile, so regular tiles cannot be counted once; use larger tiles")
    mesh = _mesh([idx for idx, _ in reps])
    spans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for (r, tile), m in zip(tiles, mesh):
        spans.update(_tile_span(r, tile, cascade.size(r), m))
    weight = np.ones(combos, dtype=_exact_dtype(math.prod(-(-cascade.size(r) // t) for r, t in tiles)))
    for m in _mesh([w for _, w in reps]):
        weight = weight * m
    bound = math.prod(bounds[p][1] - bounds[p][0] + 1 for p in dims) * math.prod(
        -(-cascade.size(r) // t) for r, t in tiles)
    dtype = _exact_dtype(bound)
    n_own = np.ones(combos, dtype=dtype)
    n_all = np.ones(combos, dtype=dtype)
    for p in dims:
        lo, hi = _boxes(cascade, accesses, p, spans, combos)
        lower, upper = bounds[p]
        own, neg = _rows(np.maximum(lo, lower), np.minimum(hi, upper), dtype)
        n_own = n_own * own
        n_all = n_all * (own + neg)
    s_own = int((n_own * weight).sum())
    return s_own, int((n_all * weight).sum()) - s_own


#: Count regular tiles once (see :func:`_single_rank_sums`); the tests compare against False.
COMPRESS_REGULAR_TILES = True


def _single_rank_sums(cascade, tensor, accesses, dims, rank, tile, bounds, retained) -> tuple[int, int]:
    """Sum over the tiles of one fused rank of the product over ``dims`` of the rows read per
    tile, split into (rows >= 0 everywhere, the rest), evaluated for all tiles at once: each
    tile's box clipped to the bounds (``retained``: a window whose earlier rows stay on chip
    reads only the rows its predecessors did not bring), as :mod:`mambalaya.execute.tiled`
    reads them.

    When every access's index grows with the rank's variable at one common rate, a tile away
    from both ends (its box and its predecessor's inside the bounds, at or above 0) reads the
    same rows as every other such tile: those *regular* tiles are counted once and multiplied,
    so the cost does not grow with the number of tiles. Otherwise every tile is evaluated (at
    most :data:`MAX_ENUMERATED_TILES`)."""
    size = cascade.size(rank)
    n = -(-size // tile)
    edge = 8
    dtype = _exact_dtype(math.prod(bounds[p][1] - bounds[p][0] + 1 for p in dims) * n)
    args = (cascade, accesses, dims, rank, tile, size, bounds, retained, dtype)
    rates = {tuple(_rank_terms(acc.indices[p], rank)) for acc in accesses for p in dims}
    common = len(rates) == 1 and len(next(iter(rates))) == 1 and next(iter(rates))[0] > 0
    if COMPRESS_REGULAR_TILES and n > 2 * edge + 2 and common:
        probe = np.array([edge - 1, edge, n - edge - 1], dtype=np.int64)
        if _regular(*args, probe).all():
            head = np.arange(0, edge + 1, dtype=np.int64)
            tail = np.arange(n - edge, n, dtype=np.int64)
            own_h, all_h = _tile_rows(*args, head)
            own_t, all_t = _tile_rows(*args, tail)
            middle = n - edge - 1 - edge  # tiles edge+1 .. n-edge-1, each equal to tile `edge`
            s_own = int(own_h.sum()) + int(own_h[-1]) * middle + int(own_t.sum())
            s_all = int(all_h.sum()) + int(all_h[-1]) * middle + int(all_t.sum())
            return s_own, s_all - s_own
    _every_tile(tensor, rank, tile, n)  # refuses too many tiles
    own, every = _tile_rows(*args, np.arange(n, dtype=np.int64), sequential=True)
    s_own = int(own.sum())
    return s_own, int(every.sum()) - s_own


def _boxes(cascade: Cascade, accesses: Any, p: int, spans: dict[str, tuple[np.ndarray, np.ndarray]],
           n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unclipped (lo, hi) of dimension ``p``, the union of the accesses' index ranges, for ``n``
    steps: a variable of a rank in ``spans`` runs over that rank's (first, last) rows of each
    step; any other variable spans its whole range."""
    sizes = cascade.variable_sizes
    lo: Any = _INT64_MAX
    hi: Any = _INT64_MIN
    for acc in accesses:  # exact integers: Python ints where no rank of ``spans`` enters, int64 arrays where one does
        idx = acc.indices[p]
        acc_lo = acc_hi = idx.const
        for v, c in idx.terms:
            span = spans.get(rank_of_variable(v))
            if span is None:
                whole = c * (sizes[v] - 1)
                acc_lo, acc_hi = acc_lo + min(0, whole), acc_hi + max(0, whole)
            else:
                a, b = c * span[0], c * span[1]
                acc_lo, acc_hi = acc_lo + np.minimum(a, b), acc_hi + np.maximum(a, b)
        lo, hi = np.minimum(lo, acc_lo), np.maximum(hi, acc_hi)
    return _steps_long(lo, n), _steps_long(hi, n)


def _steps_long(bound: Any, n: int) -> np.ndarray:
    """``bound`` as an int64 array over ``n`` steps (itself if one: callers never write to it)."""
    if isinstance(bound, np.ndarray) and bound.shape == (n,) and bound.dtype == np.int64:
        return bound
    return np.broadcast_to(np.asarray(bound, dtype=np.int64), (n,))


def _tile_span(rank: str, tile: int, size: int, t: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The rows of tiles ``t`` of ``rank`` (the last tile may be short)."""
    first = t * tile
    return {rank: (first, np.minimum(first + tile, size) - 1)}


def _rows(start: np.ndarray, hi: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rows from ``start`` to ``hi`` (both clipped to the tensor's bounds), split into
    (rows >= 0, rows < 0: the incoming state's)."""
    empty = hi < start
    own = np.where(empty, 0, np.maximum(0, hi - np.maximum(start, 0) + 1)).astype(dtype)
    neg = np.where(empty, 0, np.maximum(0, np.minimum(hi, -1) - start + 1)).astype(dtype)
    return own, neg


def _regular(cascade, accesses, dims, rank, tile, size, bounds, retained, dtype, t) -> np.ndarray:
    """Tiles ``t`` whose box, and their predecessor's, lies within the bounds and at or above 0
    in every dimension (and is a full tile): they all read the same number of rows."""
    ok = (t >= 1) & ((t + 1) * tile <= size)
    for p in dims:
        lower, upper = bounds[p]
        for tt in (t, t - 1):
            lo, hi = _boxes(cascade, accesses, p, _tile_span(rank, tile, size, np.maximum(tt, 0)), len(t))
            ok &= (lo >= max(lower, 0)) & (hi <= upper)
    return ok


def _tile_rows(cascade, accesses, dims, rank, tile, size, bounds, retained, dtype, t,
               sequential: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per tile in ``t``: (product over dims of rows >= 0, product of all rows). A retained
    window reads only rows the previous tile did not bring: with ``sequential`` (``t`` is every
    tile in order) the running maximum of earlier tiles, else the predecessor's box, which is
    the same when indices grow with the tile (see :func:`_single_rank_sums`)."""
    n_own = np.ones(len(t), dtype=dtype)
    n_all = np.ones(len(t), dtype=dtype)
    floor = _INT64_MIN
    for p in dims:
        lower, upper = bounds[p]
        lo, hi = _boxes(cascade, accesses, p, _tile_span(rank, tile, size, t), len(t))
        lo, hi = np.maximum(lo, lower), np.minimum(hi, upper)
        start = lo
        if retained:
            if sequential:
                seen = np.where(hi >= lo, hi, floor)
                prev = np.concatenate(([floor], np.maximum.accumulate(seen)[:-1]))
            else:
                plo, phi = _boxes(cascade, accesses, p, _tile_span(rank, tile, size, np.maximum(t - 1, 0)), len(t))
                plo, phi = np.maximum(plo, lower), np.minimum(phi, upper)
                prev = np.where((t > 0) & (phi >= plo), phi, floor)
            start = np.where(prev > floor, np.maximum(lo, prev + 1), lo)
        own, neg = _rows(start, hi, dtype)
        n_own = n_own * own
        n_all = n_all * (own + neg)
    return n_own, n_all


def group_traffic(cascade: Cascade, group: FusionGroup, *, named: bool = True) -> GroupTraffic:
    """Predicted off-chip bytes read and written by one group, and its on-chip footprint.

    Memoised on the (immutable) cascade, keyed by the (immutable) group. With ``named=False``
    the result may carry the name of an equal group met first (for callers that read only its
    figures: renaming copies it)."""
    memo = cascade.__dict__.setdefault("_group_traffic_memo", {})
    key = (group.einsums, group.loops, group.halo, group.resident)
    if key not in memo:
        memo[key] = _group_traffic(cascade, group)
    found = memo[key]
    if named and found.group != group.name:
        from dataclasses import replace

        found = replace(found, group=group.name)
    return found


def _group_reads(cascade: Cascade, group: FusionGroup, read: Any = None) -> dict[str, float]:
    """Bytes the group reads, per tensor (initial values apart). ``read(tensor, accesses,
    self_only, key)`` returns (own, initial) elements; by default :func:`read_elements`."""
    if read is None:
        def read(t: str, accs: list[Access], self_only: bool, key: Any) -> tuple[int, int]:
            return read_elements(cascade, group, t, accs, self_only=self_only, resident=t in group.resident,
                                  access_key=key)

    return apply_read_steps(cascade, read_steps(cascade, group), read)


ReadStep = tuple[str, list[Access], bool, tuple, "str | None", "str | None"]


def read_steps(cascade: Cascade, group: FusionGroup) -> list[ReadStep]:
    """The reads the group makes, in order: ``(tensor, accesses, self_only, key, own_to,
    init_to)``, the elements read of ``tensor`` through ``accesses`` (identified by ``key``)
    counted to ``own_to`` (None: not counted, a recurrence's own earlier rows) and those of its
    initial value to ``init_to``. They depend on the group's Einsums alone, not on its loops
    or the rank sizes, so they are memoised per cascade structure
    (:attr:`~mambalaya.einsum.cascade.Cascade.structure_memo`: a search costs many tilings of
    one group, a sweep the same groups at other sizes); the list is shared, not to be changed."""
    memo = cascade.structure_memo.setdefault("read_steps", {})
    key = (group.einsums, cascade.index_constants_of(group.einsums))  # the accesses, exactly
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _read_steps(cascade, group)
    return hit


def _read_steps(cascade: Cascade, group: FusionGroup) -> list[ReadStep]:
    einsums_ = group_einsums(cascade, group)
    steps: list[ReadStep] = []
    readers_of: dict[str, list[Einsum]] = {}  # per tensor, the group's other Einsums reading it, in order
    for e in einsums_:
        for t in e.input_tensors:
            if t != e.name:
                readers_of.setdefault(t, []).append(e)
    for t in tensors_read(cascade, group):
        readers = readers_of.get(t, [])
        accs = [a for e in readers for a in e.inputs if a.tensor == t]
        steps.append((t, accs, False, ("reads", tuple(e.name for e in readers)), t, cascade.tensors[t].initial))
    for t in group.einsums:  # tensors made on chip whose incoming state is read below 0
        initial = cascade.tensors[t].initial
        if not initial:
            continue
        readers = [e for e in einsums_ if t in e.input_tensors]
        accs = [a for e in readers for a in e.inputs if a.tensor == t and may_reach_initial(cascade, a)]
        if accs:
            steps.append((t, accs, True, ("self", tuple(e.name for e in readers)), None, initial))
    return steps


def may_reach_initial(cascade: Cascade, access: Access) -> bool:
    """Whether ``access`` may read its tensor's incoming state: False when it indexes the
    initial value's axis with a constant at or above 0 (one position of the tensor itself, as
    a select-runner reads the scan's last position), which never reaches below 0."""
    axis = cascade.initial_axis(access.tensor)
    if axis is None:
        return False
    idx = access.indices[axis[0]]
    return bool(idx.terms) or idx.const < 0


def _scale(cascade: Cascade, tensor: str) -> float:
    """:func:`~mambalaya.einsum.routing.tensor_scale` as a float, memoised on the cascade."""
    memo = cascade.__dict__.setdefault("_tensor_scale_memo", {})
    hit = memo.get(tensor)
    if hit is None:
        hit = memo[tensor] = float(tensor_scale(cascade, tensor))
    return hit


def _read_scale(cascade: Cascade, tensor: str, accesses) -> float:
    """:func:`~mambalaya.einsum.routing.read_scale` as a float, memoised on the cascade; a tensor
    with no live share under a mask is read at its :func:`_scale`, whatever the accesses."""
    if tensor not in dead_work(cascade).tensor_shares:
        return _scale(cascade, tensor)
    memo = cascade.__dict__.setdefault("_read_scale_memo", {})
    key = (tensor, tuple(accesses))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = float(read_scale(cascade, tensor, accesses))
    return hit


def apply_read_steps(cascade: Cascade, steps: list[ReadStep], read: Any) -> dict[str, float]:
    """Bytes per tensor of :func:`read_steps`, each step's (own, initial) elements from
    ``read``; a tensor read no element of is left out."""
    reads: dict[str, float] = {}

    def add_read(t: str, elements: int, accs) -> None:
        if elements:  # a MoE block's expert weights and tensors, a masked tensor's live cells (einsum.routing)
            reads[t] = reads.get(t, 0.0) + elements * cascade.tensors[t].stored_bytes_per_element * _read_scale(cascade, t, accs)

    for t, accs, self_only, key, own_to, init_to in steps:
        own, init = read(t, accs, self_only, key)
        if own_to is not None:
            add_read(own_to, own, accs)
        if init:
            add_read(init_to, init, ())  # type: ignore[arg-type]
    return reads


def _group_writes(cascade: Cascade, group: FusionGroup) -> dict[str, float]:
    """Bytes the group writes, per tensor."""
    writes: dict[str, float] = {}
    for t in tensors_written(cascade, group):
        e = cascade.einsum(t)
        out_ranks = {rank_of_variable(v) for v in e.output_variables}
        repeat = 1
        for lp in einsum_loops(cascade, group, t):  # a select-runner writes once along its select ranks
            if lp.rank not in out_ranks:
                repeat *= lp.trips(cascade.size(lp.rank))
        writes[t] = written_bytes(cascade, t, repeat)
    return writes


def written_bytes(cascade: Cascade, tensor: str, repeat: int) -> float:
    """Bytes of ``tensor`` written ``repeat`` times over."""
    return cascade.elements(tensor) * repeat * cascade.tensors[tensor].stored_bytes_per_element * _scale(cascade, tensor)


def untiled_traffic(cascade: Cascade, einsums: tuple[str, ...]) -> tuple[dict[str, float], dict[str, float]]:
    """(read, write) bytes per tensor of ``einsums`` run as one group in a single step, as
    :func:`group_traffic` gives them for that group untiled. What the group reads and writes
    (:func:`read_steps`, :func:`~mambalaya.fusion.mapping.tensors_written`) is memoised per
    cascade structure (:attr:`~mambalaya.einsum.cascade.Cascade.structure_memo`: a sweep's
    layers at other sizes share it); with no loop, a tensor's reads depend only on the
    accesses that read it, so the elements are memoised on the cascade per tensor and reading
    Einsums: the candidate groups of a search share them."""
    plans = cascade.structure_memo.setdefault("untiled_traffic", {})
    plan_key = (einsums, cascade.index_constants_of(einsums))  # the accesses, exactly
    plan = plans.get(plan_key)
    if plan is None:
        probe = FusionGroup("untiled", einsums, ())
        plan = plans[plan_key] = (read_steps(cascade, probe), tuple(tensors_written(cascade, probe)))
    steps, written = plan
    memo = cascade.__dict__.setdefault("_untiled_reads_memo", {})

    def read(t: str, accs: list[Access], self_only: bool, key: Any) -> tuple[int, int]:
        hit = memo.get((t, key))
        if hit is None:
            group = FusionGroup("untiled", einsums, ())
            hit = memo[(t, key)] = read_elements(cascade, group, t, accs, self_only=self_only, access_key=key)
        return hit

    return apply_read_steps(cascade, steps, read), {t: written_bytes(cascade, t, 1) for t in written}


def _group_traffic(cascade: Cascade, group: FusionGroup) -> GroupTraffic:
    reads = _group_reads(cascade, group)
    writes = _group_writes(cascade, group)
    steps = math.prod(lp.trips(cascade.size(lp.rank)) for lp in group.loops)
    return GroupTraffic(
        group=group.name,
        einsums=group.einsums,
        loops=tuple((lp.rank, lp.tile) for lp in group.loops),
        steps=steps,
        read_bytes=reads,
        write_bytes=writes,
        footprint_bytes=footprint_bytes(cascade, group),
    )


def mapping_traffic(cascade: Cascade, mapping: Mapping) -> MappingTraffic:
    """Predicted traffic of every group of a (checked) mapping, and totals per tensor."""
    groups = tuple(group_traffic(cascade, g) for g in mapping.groups)
    by_tensor: dict[str, tuple[float, float]] = {}
    for g in groups:
        for t, b in g.read_bytes.items():
            r, w = by_tensor.get(t, (0.0, 0.0))
            by_tensor[t] = (r + b, w)
        for t, b in g.write_bytes.items():
            r, w = by_tensor.get(t, (0.0, 0.0))
            by_tensor[t] = (r, w + b)
    return MappingTraffic(mapping, groups, by_tensor)
