"""Candidate tables of one fusion group: the closed forms of its traffic, footprint and compute
cycles over every tiling, loop order and residency option (see :mod:`mambalaya.search.mappings` for
what is searched and why). Everything here is independent of the buffer and the bandwidth, and
memoised on the (immutable) cascade, so repeated searches of one layer (sweeps) build it once.

The closed forms a table is summed from are at the end of the module: products of per-tiling
factors (:func:`sum_of_products`), the weight bytes residency saves (:func:`add_residency`), and
the compute cycles of every tiling on a compute section (:func:`cycles_together`,
:func:`einsum_grid_cycles`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mambalaya.arch.keys import spec_key
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.routing import operand_scale
from mambalaya.einsum.stats import einsum_ops
from mambalaya.cost.spatial import einsum_unit_cycles, step_shapes
from mambalaya.einsum.ir import rank_of_variable
from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import (FusionGroup, Loop, window_halos)
from mambalaya.search.group_shape import shape_of_group, held_layout, held_layouts, held_bytes, keepable_under
from mambalaya.cost.buffer import buffer_read_bytes_over_tilings, buffer_written_bytes
from mambalaya.search.irregular_reads import irregular_read_bytes, times_trips
from mambalaya.cost.traffic import read_steps, untiled_traffic, written_bytes
from mambalaya.search.tile_ranks import rank_tile_options, tile_options, tileable_ranks, widened_ranks


@dataclass(frozen=True)
class Candidates:
    """The candidate table of one group (see :meth:`GroupCostModel.candidates`), as kept for
    the search: per tiling its steps, and the candidates no other of the same tiling dominates
    (:func:`kept_candidates`) with their traffic and footprint. The tiles and trips of the
    tilings (:meth:`GroupCostModel.grid`) and the full table
    (:meth:`GroupCostModel.full_table`) are rebuilt on the rare call that needs them, so memory
    holds only the kept part."""

    options: list[tuple[tuple[int, ...], int]]  # (loop order, residency prefix) of each block of tilings
    n_tilings: int
    steps: np.ndarray  # per tiling (every option of a tiling runs the same steps)
    size: int  # candidates in the full table (options x tilings)
    kept: np.ndarray  # flat indices (option-major, ascending) of the kept candidates
    kept_traffic: np.ndarray  # off-chip bytes of each kept candidate
    kept_fp: np.ndarray  # footprint bound (bytes)
    kept_tiling: np.ndarray  # the tiling of each kept candidate (int32: memory holds millions of them)
    least_fp: float  # the least footprint bound of any candidate (every tiling keeps its least)


def kept_candidates(traffic: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Flat indices (ascending) of the candidates (arrays of shape (options, tilings)) no option
    of the same tiling beats or equals in traffic and footprint, an equal one of lower index
    excepted. Within a tiling the steps and compute cycles are the same and the on-chip bytes,
    energy and latency grow with the traffic, so a dropped candidate never comes first in
    :func:`_pick`'s order, for any buffer, bandwidth or objective. (:func:`build_candidates`
    applies the same rule to many groups at once, :func:`_kept_mask`.)"""
    kept = np.flatnonzero(_kept_mask(traffic[None], fp[None])[0])
    return kept.astype(np.int32) if traffic.size < 2**31 else kept  # memory holds millions of them


def least_traffic_fitting(key: np.ndarray, n_keys: int, traffic: np.ndarray, fp: np.ndarray,
                          buffer_bytes: int | None) -> np.ndarray:
    """Positions (ascending) of the candidates whose footprint bound fits ``buffer_bytes`` (all
    with None) and whose traffic is the least of the fitting ones with the same ``key`` (a
    tiling, numbered below ``n_keys``). Of one tiling's kept candidates only that one can come
    first in the search's order, for any architecture and the latency or traffic objective:
    they share the steps, compute cycles and Einsums' on-chip bytes, so its latency is the least
    of them (every term grows with the traffic); where another is within the tie tolerance so
    is it, and it comes first in traffic (a tiling's kept candidates differ in traffic,
    :func:`kept_candidates`)."""
    fit = np.arange(len(fp)) if buffer_bytes is None else np.flatnonzero(fp <= buffer_bytes)
    least = np.full(n_keys, np.inf)
    np.minimum.at(least, key[fit], traffic[fit])
    return fit[traffic[fit] == least[key[fit]]]


class GroupCostModel:
    """Closed forms of one group's traffic and footprint as functions of its tile sizes."""

    def __init__(self, cascade: Cascade, einsums: list[str], ranks: list[str]):
        self.cascade = cascade
        self.ranks = ranks
        self._ranks_key = tuple(ranks)
        self._tile_options = [rank_tile_options(cascade, r) for r in ranks]
        full = FusionGroup("probe", tuple(einsums), tuple(Loop(r, cascade.size(r)) for r in ranks))
        self.probe = full
        self._shape = shape = shape_of_group(cascade, full.einsums, tuple(ranks))
        self._selects = analyse(cascade, full.einsums).selects  # the members that run once along a rank they read at one position
        # traffic: each read/written tensor costs its untiled bytes times the trips of the
        # fused ranks its accesses do not mention (see cost/traffic.py)
        read_bytes, write_bytes = untiled_traffic(cascade, full.einsums)
        self.terms: list[tuple[float, list[int]]] = [(b, shape.unmentioned[t]) for t, b in read_bytes.items()]
        self.terms += [(b, shape.unwritten[t]) for t, b in write_bytes.items()]
        self._candidates: Candidates | None = None
        self._least_fp: float | None = None
        self._size: int | None = None
        self._groups: dict[int, FusionGroup] = {}  # by flat index: the groups picked so far
        self._cycles: dict[str, np.ndarray] = {}
        self._tiling_buffer: np.ndarray | None = None  # tiling_buffer_bytes, made on first use
        self._options: list[tuple[tuple[int, ...], int]] | None = None
        self._tile_lists: list[list[int]] | None = None  # the tile options as Python ints (group_at)
        # residency candidates: tensors read off-chip that some loop of the fixed order does
        # not index and that runs inside every loop that does (weights, per-channel parameters
        # under an outer channel loop); largest first
        self._reads = [(t, b, shape.mentioned[t])
                       for t, b in sorted(read_bytes.items(), key=lambda tb: (-tb[1], tb[0])) if t in shape.readable]
        #: the reads whose tile boxes overlap (not aligned, :func:`_reads_aligned`): their bytes
        #: in one pass at every tiling (:mod:`mambalaya.search.irregular_reads`) times the trips
        #: of the loops they do not mention
        self.irregular = [t for t in read_bytes if not shape.aligned[t]]
        self._irregular_bytes: dict[str, np.ndarray | None] | None = None
        # bound on every term's bytes at any tiling: an overlapping read's, its untiled bytes
        # times every tiled rank's size (loose: a layer past it is searched one group at a time,
        # which for a few designs per layer is also the cheaper way)
        whole = math.prod(cascade.size(r) for r in ranks)
        most = sum(b * (whole if t in self.irregular else math.prod(cascade.size(ranks[i]) for i in shape.unmentioned[t]))
                   for t, b in read_bytes.items())
        most += sum(b * math.prod(cascade.size(ranks[i]) for i in shape.unwritten[t]) for t, b in write_bytes.items())
        #: whether the traffic closed form is exact for every tiling: every read aligned or
        #: counted per tile combination (:meth:`_irregular_factors`); a residency candidate's
        #: initial value read through its accesses alone (:func:`_saved_together`); and bytes
        #: below 2^53 (beyond, floats summed in another order than the general model's may differ)
        self._read_bytes = read_bytes
        #: per residency candidate with an initial value the group reads (a conv state before
        #: the first positions, a KV cache before its appended rows), that value: held on chip
        #: with it (:meth:`_held_box` counts its rows), so residency saves its bytes too
        #: (:func:`~mambalaya.cost.traffic.read_elements` gives both the same repeats)
        self._initial_of = {t: init for t, _, _ in self._reads
                            if (init := cascade.tensors[t].initial) and init in read_bytes}
        steps = read_steps(cascade, full) if self._initial_of else []
        self.exact_traffic = (all(_saved_together(shape, steps, t, init) for t, init in self._initial_of.items())
                              and most < 2**53 and (not self.irregular or self._irregular_factors() is not None))
        if self.exact_traffic and self.irregular:  # their terms come from the per-tiling bytes instead
            self.terms = [(b, shape.unmentioned[t]) for t, b in read_bytes.items() if t not in self.irregular]
            self.terms += [(b, shape.unwritten[t]) for t, b in write_bytes.items()]
        # loop orders: the fixed one first, then every other order of the ranks that are not
        # generational, the generational ones still innermost (so footprints do not change)
        self.orders = shape.orders
        self._keepable: dict[tuple[int, ...], list[tuple[str, float, frozenset[int]]]] = {}
        self.keepable = self.keepable_for(self.orders[0])
        # footprint: sum of products of extents
        # (bytes per element x fixed extents, tiled rank indices, rank whose tiling creates the term)
        self.fp_terms = footprint_terms(cascade, full, ranks, shape.held)

    def _irregular_factors(self) -> dict[str, np.ndarray] | None:
        """Per irregular read, its bytes in one pass at every tiling; None if one cannot be
        counted that way (then the traffic closed form is not exact)."""
        if self._irregular_bytes is None:
            tiles = self.grid()[0]
            self._irregular_bytes = {t: irregular_read_bytes(self.cascade, self.probe.einsums, tuple(self.ranks), t, tiles)
                                     for t in self.irregular}
        if any(v is None for v in self._irregular_bytes.values()):
            return None
        return self._irregular_bytes  # type: ignore[return-value]

    def grid(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per tileable rank, its tile and its trips in every tiling (the tilings in C order of
        the ranks' tile options). Kept per cascade and tuple of ranks, which every group
        tiling the same ranks shares (a few such tuples per layer), up to
        :data:`KEPT_GRID_TILINGS` tilings; a larger grid (at L = 2^40 an attention group has
        a few hundred thousand tilings) is rebuilt when needed. Read-only."""
        memo = self.cascade.__dict__.setdefault("_tiling_grid_memo", {})
        key = tuple(self.ranks)
        hit = memo.get(key)
        if hit is None:
            opts = self._tile_options
            mesh = np.meshgrid(*opts, indexing="ij") if opts else []
            tiles = [m.ravel() for m in mesh]
            trips = [np.ceil(self.cascade.size(r) / t).astype(np.float64) for r, t in zip(self.ranks, tiles)]
            for a in tiles + trips:
                a.flags.writeable = False
            hit = (tiles, trips)
            if self.n_tilings <= KEPT_GRID_TILINGS:
                memo[key] = hit
        return hit

    def full_table(self) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[tuple[int, ...], int]], np.ndarray, np.ndarray]:
        """Every (loop order, residency prefix, tiling) of the group with its closed-form
        traffic and footprint, arrays of shape (options, tilings). Option ``(o, j)`` runs loop
        order ``o`` and keeps the ``j`` largest of its residency candidates on chip (``j = 0``,
        everything streamed, is the same for every order). Returned with the grid's tiles and
        trips."""
        tiles, trips = self.grid()
        prepared = self.__dict__.pop("_prepared_full_table", None)  # (prepare_full_tables): used once
        if prepared is not None:
            return tiles, trips, self.options(), *prepared
        traffic, fp = _tables([self], tiles, trips)
        return tiles, trips, self.options(), traffic[0], fp[0]

    def candidates(self) -> "Candidates":
        """The candidate table as the search keeps it (see :class:`Candidates`). Independent
        of the architecture: built once, by :func:`build_candidates` (which builds many
        groups' tables together; :meth:`full_table` is its per-group reference)."""
        if self._candidates is None:
            build_candidates([self])
        return self._candidates  # type: ignore[return-value]

    @property
    def n_tilings(self) -> int:
        return math.prod(len(o) for o in self._tile_options)

    @property
    def size(self) -> int:
        """Candidates in the full table (:attr:`Candidates.size`), without building it."""
        if self._size is None:
            self._size = len(self.options()) * self.n_tilings
        return self._size

    def options(self) -> list[tuple[tuple[int, ...], int]]:
        """The (loop order, residency prefix) of each block of the full table, in its order
        (see :meth:`full_table`). Made once; read-only."""
        if self._options is None:
            options: list[tuple[tuple[int, ...], int]] = [(self.orders[0], 0)]
            for o in self.orders if self.ranks else []:
                options.extend((o, j + 1) for j in range(len(self.keepable_for(o))))
            self._options = options
        return self._options

    def contenders(self, buffer_bytes: int | None) -> tuple[np.ndarray, ...]:
        """The kept candidates that can come first at ``buffer_bytes`` for the latency or
        traffic objective (:func:`least_traffic_fitting`): their flat indices, traffic,
        footprint bounds and tilings. Kept for the :data:`CONTENDER_BUFFERS` buffers used last
        (a sweep's points at other bandwidths search the group again)."""
        memo: dict[int | None, tuple[np.ndarray, ...]] = self.__dict__.setdefault("_contenders_memo", {})
        hit = memo.pop(buffer_bytes, None)
        if hit is None:
            c = self.candidates()
            at = least_traffic_fitting(c.kept_tiling, c.n_tilings, c.kept_traffic, c.kept_fp, buffer_bytes)
            hit = (c.kept[at], c.kept_traffic[at], c.kept_fp[at], c.kept_tiling[at])
            while len(memo) >= CONTENDER_BUFFERS:
                del memo[next(iter(memo))]
        memo[buffer_bytes] = hit
        return hit

    def least_footprint(self) -> float:
        """The least footprint bound of any candidate (:attr:`Candidates.least_fp`), without
        building the table (:func:`least_footprints`). Memoised."""
        if self._least_fp is None:
            least_footprints([self])
        return self._least_fp  # type: ignore[return-value]

    def group_at(self, flat: int) -> FusionGroup:
        """The group of candidate ``flat`` (a flat index into the full table): its tiled ranks
        in the option's loop order and the option's resident tensors."""
        hit = self._groups.get(flat)
        if hit is not None:
            return hit
        option, k = divmod(flat, self.n_tilings)
        loop_order, j = self.options()[option]
        tiles = self._tiles_of(k)
        size = self.cascade.size
        loops = tuple(Loop(self.ranks[i], tiles[i]) for i in loop_order if tiles[i] < size(self.ranks[i]))
        resident = tuple(t for t, _, _ in self.keepable_for(loop_order)[:j]) if loops else ()
        self._groups[flat] = FusionGroup("G", self.probe.einsums, loops, resident=resident)
        return self._groups[flat]

    def rule_key(self, flat: int) -> int:
        """What decides whether candidate ``flat``'s group keeps the rules that do not depend
        on tile sizes (:func:`~mambalaya.fusion.mapping.check_group_rules`: its Einsums, the
        ranks it tiles, its halo policy and resident tensors): its option (loop order and
        residency prefix) and which ranks its tiling tiles (:meth:`group_at`), as one integer
        (:meth:`rule_keys`)."""
        return int(self.rule_keys(np.array([flat], dtype=np.int64))[0])

    def rule_keys(self, flat: np.ndarray) -> np.ndarray:
        """:meth:`rule_key` of every candidate at ``flat``: its option times 2^ranks plus a bit
        per rank its tiling tiles (a tile below the rank's size; the first rank the highest
        bit), the tiling's digits taken in the mixed radix of the ranks' tile options, as
        :meth:`_tiles_of` does."""
        option, k = np.divmod(np.asarray(flat, dtype=np.int64), self.n_tilings)
        tiled = np.zeros(len(k), dtype=np.int64)
        for bit, (opts, rank) in enumerate(zip(reversed(self._tile_options), reversed(self.ranks))):
            k, digit = np.divmod(k, len(opts))
            tiled |= (np.asarray(opts)[digit] < self.cascade.size(rank)).astype(np.int64) << bit
        return (option << len(self.ranks)) | tiled

    def _tiles_of(self, k: int) -> list[int]:
        """Tiling ``k``'s tile of each rank: its digits in the mixed radix of the options."""
        if self._tile_lists is None:
            self._tile_lists = [o.tolist() for o in self._tile_options]
        tiles = []
        for opts in reversed(self._tile_lists):
            k, digit = divmod(k, len(opts))
            tiles.append(opts[digit])
        tiles.reverse()
        return tiles

    def onchip_bytes(self, flat: np.ndarray, traffic: np.ndarray) -> np.ndarray:
        """On-chip buffer bytes of the candidates at ``flat`` (with off-chip ``traffic``): their
        off-chip bytes (fills and drains) plus each tiling's Einsum reads and writes."""
        return traffic + self.tiling_buffer_bytes(flat % self.n_tilings)

    def tiling_buffer_bytes(self, tilings: np.ndarray | None = None) -> np.ndarray:
        """Per tiling (all, or those at ``tilings``), the on-chip bytes its Einsums read and write, as
        :func:`~mambalaya.cost.buffer.group_buffer_accesses` counts them (window halos and
        rotated boxes read again per tile included, what the lanes carry in registers left out):
        the sum of the Einsums' memoised arrays, in the group's order (the same floats for any
        selection), kept per group (one float per tiling: every compute section's pick table
        reads it)."""
        if self._tiling_buffer is None:
            facts = analyse(self.cascade, self.probe.einsums)
            total = np.zeros(self.n_tilings)
            for name in self.probe.einsums:
                total += self._einsum_buffer_term(name, facts)
            total.flags.writeable = False
            self._tiling_buffer = total
        return self._tiling_buffer if tilings is None else self._tiling_buffer[tilings]

    def _einsum_buffer_term(self, name: str, facts: Any) -> np.ndarray:
        """One Einsum's term of :meth:`tiling_buffer_bytes` in a group of the analysis ``facts``:
        its reads of what the lanes do not carry, plus what it writes into the buffer
        (:func:`~mambalaya.cost.buffer.buffer_written_bytes`). Memoised on the cascade per Einsum,
        ranks, select ranks, the reads left out and how it writes: the groups of a search that
        tile the same ranks share it (the same operations in the same order, so the same floats
        in every group; read-only)."""
        select = self.select_ranks(name)
        lanes = facts.in_registers
        skipped = tuple(t for t in self.cascade.einsum(name).input_tensors if t in lanes) if lanes else ()
        writes = "registers" if name in lanes else facts.kept_at(self.cascade, name)
        memo = self.cascade.__dict__.setdefault("_einsum_buffer_term_memo", {})
        key = (name, self._ranks_key, select, skipped, writes)
        hit = memo.get(key)
        if hit is None:
            reads, repeat, written = self._einsum_buffer_bytes(name, select)
            part = sum((r for t, r in reads if t not in lanes), np.zeros(1))
            hit = part + buffer_written_bytes(self.cascade, self.probe.einsums, name, repeat, written)
            hit.flags.writeable = False
            memo[key] = hit
        return hit

    def select_ranks(self, name: str) -> tuple[str, ...]:
        """The ranks of this model that Einsum ``name`` runs once along when the group tiles
        them (:func:`~mambalaya.fusion.mapping.select_ranks`; a rank at its full size is one
        trip, so leaving it out or in changes nothing)."""
        positions = self._selects.get(name)
        return tuple(r for r in self.ranks if r in positions) if positions else ()

    def _einsum_buffer_bytes(self, name: str, select: tuple[str, ...] = ()
                             ) -> tuple[list[tuple[str, np.ndarray]], np.ndarray, np.ndarray]:
        """One Einsum's on-chip reads (per tensor), how many times it writes its output and the
        bytes of those writes (:func:`~mambalaya.cost.buffer.buffer_written_bytes` turns them
        into the group's) per tiling of this model's ranks, running once along ``select`` (its select ranks:
        their loops left out): memoised on
        the cascade per Einsum, ranks and select ranks, which every group holding it and
        tiling them shares."""
        cascade, ranks = self.cascade, self.ranks
        memo = cascade.__dict__.setdefault("_einsum_buffer_bytes_memo", {})
        key = (name, tuple(ranks), select)
        hit = memo.get(key)
        if hit is None:
            e = cascade.einsum(name)
            all_tiles, all_trips = self.grid()
            runs = [i for i, r in enumerate(ranks) if r not in select]
            own = [ranks[i] for i in runs]
            tiles, trips = [all_tiles[i] for i in runs], [all_trips[i] for i in runs]
            probe = FusionGroup("probe", (name,), tuple(Loop(r, cascade.size(r)) for r in own))
            reads = []
            for t in dict.fromkeys(a.tensor for a in e.inputs if a.tensor != e.name):
                accs = [a for a in e.inputs if a.tensor == t]
                read = buffer_read_bytes_over_tilings(cascade, probe, t, accs, own, tiles, trips, self.n_tilings)
                share = float(operand_scale(cascade, name, accs))  # a routed or masked Einsum's share (einsum.routing)
                reads.append((t, read * share if share != 1.0 else read))
            outs = {rank_of_variable(v) for v in e.output_variables}
            repeat = np.ones(self.n_tilings)
            for i, r in enumerate(own):
                if r not in outs:
                    repeat = repeat * trips[i]
            hit = memo[key] = (reads, repeat, written_bytes(cascade, name, repeat))
        return hit

    def forget_cycles(self) -> None:
        """Drop the cycles kept per compute section (:meth:`cycles`)."""
        self._cycles.clear()

    def cycles(self, compute: Any) -> np.ndarray:
        """Compute cycles of every candidate on ``compute``: each Einsum's cycles under its best
        spatial mapping summed over the tiling's step shapes
        (:func:`~mambalaya.cost.spatial.step_shapes`), the units combined as the latency model
        does. Memoised per compute section (by value); :func:`cycles_together` makes many."""
        return cycles_together([self], compute)[0]

    def keepable_for(self, order: tuple[int, ...]) -> list[tuple[str, float, frozenset[int]]]:
        """Residency candidates under a loop order (rank indices, outermost first): tensors
        with a loop that does not index them inside the outermost loop that does."""
        hit = self._keepable.get(order)
        if hit is None:
            shape = self._shape
            kept = shape.keep_under.get(order)  # which tensors: per group shape
            if kept is None:
                kept = shape.keep_under[order] = frozenset(
                    t for t, seen in shape.mentioned.items() if t in shape.readable and keepable_under(order, seen))
            hit = self._keepable[order] = [x for x in self._reads if x[0] in kept]
        return hit

    def _held_box(self, tensor: str, tiles: list[np.ndarray]) -> np.ndarray:
        cascade = self.cascade
        accs = [a for e in (cascade.einsum(x) for x in self.probe.einsums) for a in e.inputs
                if a.tensor == tensor and a.tensor != e.name]
        sizes = cascade.variable_sizes
        init = cascade.initial_axis(tensor)
        total = np.full(len(tiles[0]), cascade.tensors[tensor].stored_bytes_per_element)
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


#: Tiling grids of at most this many tilings are kept per cascade (:meth:`GroupCostModel.grid`):
#: memory, not a model constant.
KEPT_GRID_TILINGS = 1 << 16

#: At most this many cells (groups x options x tilings) in one pass of
#: :func:`build_candidates` (about 40 bytes of transient memory each); a larger group is built alone.
BUILD_BATCH_CELLS = 1 << 20


def build_candidates(models: list[GroupCostModel]) -> None:
    """Build the candidate tables (:meth:`GroupCostModel.candidates`) of ``models`` not built
    yet. The groups of one cascade that tile the same ranks share their tilings, so their
    tables are built together: every closed form evaluated, every residency option added and
    every dominated candidate dropped in a few numpy passes over arrays of shape (groups,
    options, tilings), instead of a few hundred short passes per group. A group's table is the
    same, to the bit, whichever groups share its pass: the same floating-point operations in
    the same order per candidate, padding only multiplying by one or adding zero
    (``tests/test_candidates.py`` compares every table with its group built alone and pruned by
    a plain sort)."""
    for same in _sharing_tilings(m for m in models if m._candidates is None):
        n = same[0].n_tilings
        part: list[GroupCostModel] = []
        widest = 0
        # widest first: a pass pads every group to the options of its widest, so a pass ends
        # before a group of less than half as many (or beyond BUILD_BATCH_CELLS cells): on the
        # Mamba layers padding was 44% of the cells, now about 23%, for twice as many passes
        for m in sorted(same, key=lambda m: -len(m.options())):
            width = len(m.options())
            if part and ((len(part) + 1) * widest * n > BUILD_BATCH_CELLS or 2 * width < widest):
                _build_together(part)
                part = []
            if not part:
                widest = width
            part.append(m)
        _build_together(part)


def prepare_full_tables(models: list[GroupCostModel]) -> None:
    """Make the full tables (:meth:`GroupCostModel.full_table`) of ``models`` together, each kept
    on its model for its next :meth:`~GroupCostModel.full_table` call only (memory: a full table
    is not kept): a search whose batch picks broke a rule for many groups searches each of them
    over its whole table next (:func:`~mambalaya.search.group_choice.best_group`). The groups
    tiling the same ranks share the passes of :func:`_tables`, as :func:`build_candidates`'
    do, so each table is the same, to the bit, as made alone."""
    for same in _sharing_tilings(m for m in models if "_prepared_full_table" not in m.__dict__):
        n, start = same[0].n_tilings, 0
        while start < len(same):  # passes of at most BUILD_BATCH_CELLS cells (one group at least)
            stop, widest = start + 1, len(same[start].options())
            while stop < len(same) and (stop - start + 1) * max(widest, len(same[stop].options())) * n <= BUILD_BATCH_CELLS:
                widest = max(widest, len(same[stop].options()))
                stop += 1
            part = same[start:stop]
            traffic, fp = _tables(part, *part[0].grid())
            for k, m in enumerate(part):
                width = len(m.options())
                m.__dict__["_prepared_full_table"] = (traffic[k, :width], fp[k, :width])
            start = stop


def _sharing_tilings(models: Iterable[GroupCostModel]) -> list[list[GroupCostModel]]:
    """``models`` (each once, in order) in classes of one cascade and tuple of tiled ranks,
    whose groups share their tilings."""
    classes: dict[tuple[int, tuple[str, ...]], list[GroupCostModel]] = {}
    for m in dict.fromkeys(models):
        classes.setdefault((id(m.cascade), tuple(m.ranks)), []).append(m)
    return list(classes.values())


def footprint_terms(cascade: Cascade, group: FusionGroup, ranks: list[str],
                    held: list[tuple[float, tuple[str, ...], tuple[int, ...]]]) -> list[tuple[float, tuple[int, ...], int | None]]:
    """The footprint's terms of ``group`` tiling ``ranks`` (its :func:`~mambalaya.search.group_shape.held_layouts`
    ``held``): (bytes per element x fixed extents, tiled rank indices, rank whose tiling creates the
    term: a retained halo's, kept only while its rank is tiled)."""
    terms: list[tuple[float, tuple[int, ...], int | None]] = [(held_bytes(cascade, base, whole), tiled, None)
                                                        for base, whole, tiled in held]
    if group.halo == "retain":
        for (t, rank), rows in window_halos(cascade, group).items():
            base, whole, tiled = held_layout(cascade, t, rank, rows, tuple(ranks))
            terms.append((held_bytes(cascade, base, whole), tiled, ranks.index(rank)))
    return terms


def least_footprint_bound(cascade: Cascade, einsums: list[str], ranks: list[str]) -> float:
    """:meth:`GroupCostModel.least_footprint` of the group of ``einsums`` tiling ``ranks``, to the
    bit, from its held layouts alone, without the model's traffic terms or group shape: most
    groups a search meets hold more than the buffer at every tiling, and were each built whole
    to learn it."""
    full = FusionGroup("probe", tuple(einsums), tuple(Loop(r, cascade.size(r)) for r in ranks))
    terms = footprint_terms(cascade, full, ranks, held_layouts(cascade, full.einsums, tuple(ranks)))
    return _least_of_terms(terms, [cascade.size(r) for r in ranks])


def _least_of_terms(fp_terms: list[tuple[float, tuple[int, ...], int | None]], sizes: list[int]) -> float:
    """The least of the footprint's corners (see :func:`least_footprints`)."""
    halo_ranks = sorted({when for _, _, when in fp_terms if when is not None})
    least = math.inf
    for corner in itertools.product((False, True), repeat=len(halo_ranks)):
        untiled = {i for i, whole in zip(halo_ranks, corner) if whole}
        least = min(least, _footprint_at(fp_terms, [sizes[i] if i in untiled else 1 for i in range(len(sizes))], sizes))
    return least


def least_footprints(models: list[GroupCostModel]) -> None:
    """Find the least footprint bound of every model not known yet
    (:meth:`GroupCostModel.least_footprint`).

    Every footprint term grows with each tile size, except a retained halo's, which vanishes
    once its rank is untiled, and residency only adds held boxes: so a group's least is at a
    tiling whose ranks are all 1 except its halo ranks, each 1 or untiled, with everything
    streamed. Those few corners are evaluated by :func:`_footprint_at`, the same floating-point
    operations in the same order as the table's (:func:`_footprint_together`), so the least is
    the table's, to the bit."""
    for m in models:
        if m._least_fp is None:
            m._least_fp = _least_of_terms(m.fp_terms, [m.cascade.size(r) for r in m.ranks])


def _footprint_at(fp_terms: list[tuple[float, tuple[int, ...], int | None]], tiles: list[int], sizes: list[int]) -> float:
    """The footprint bound of ``m`` with everything streamed at one tiling, in Python floats:
    :func:`_footprint_together`'s operations for that tiling (its factors, the tiled extents
    and then the "rank is tiled" flags, multiplied in their order; the terms summed in
    order), which IEEE doubles round the same way numpy's do."""
    ranks = len(sizes)
    factors = [min(t, size) for t, size in zip(tiles, sizes)] + [t < size for t, size in zip(tiles, sizes)]
    total = 0.0
    for fixed, idxs, when in fp_terms:
        f = fixed
        for i in sorted(set(idxs) | ({ranks + when} if when is not None else set())):
            f = f * factors[i]
        total += f
    return total


def _build_together(models: list[GroupCostModel]) -> None:
    """The candidate tables of ``models`` (one cascade, the same tileable ranks)."""
    tiles, trips = models[0].grid()
    n = len(trips[0]) if trips else 1
    traffic, fp = _tables(models, tiles, trips)
    options = [m.options() for m in models]
    at = np.flatnonzero(_kept_mask(traffic, fp))  # by group, then ascending flat index
    kept_traffic, kept_fp = traffic.ravel()[at], fp.ravel()[at]  # one gather for every group
    g, flat = np.divmod(at, traffic.shape[1] * n)
    cols = (flat % n).astype(np.int32)
    bounds = np.searchsorted(g, np.arange(len(models) + 1)).tolist()
    steps = np.prod(np.stack(trips), axis=0) if trips else np.ones(1)
    for k, m in enumerate(models):
        part = slice(bounds[k], bounds[k + 1])
        size = len(options[k]) * n
        kept = flat[part].astype(np.int32) if size < 2**31 else flat[part]
        m._candidates = Candidates(options[k], n, steps, size, kept, kept_traffic[part], kept_fp[part], cols[part],
                                   float(kept_fp[part].min()))


def _tables(models: list[GroupCostModel], tiles: list[np.ndarray], trips: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every candidate's closed-form traffic and footprint bound, arrays of shape (models,
    options, tilings); a model with fewer options than the widest is padded with infinite
    traffic and footprint. Option 0 streams everything; the others follow
    :meth:`GroupCostModel.options`."""
    n = len(trips[0]) if trips else 1
    traffic0, fp0 = _evaluate_together(models, tiles, trips)
    widest = max(len(m.options()) for m in models)
    traffic = np.full((len(models), widest, n), np.inf)
    fp = np.full((len(models), widest, n), np.inf)
    traffic[:, 0], fp[:, 0] = traffic0, fp0
    add_residency(models, tiles, trips, n, traffic0, fp0, traffic, fp)
    return traffic, fp


def _kept_mask(traffic: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """:func:`kept_candidates` of each group (arrays of shape (groups, options, tilings);
    padding rows have infinite traffic and footprint and are never kept), as a mask. Per
    tiling, the options in order of traffic (ties by option) are kept where their footprint
    is below every earlier one's; of a run of equal traffic, only the last so kept, the one of
    least footprint (first option among equals), stays. That is the order by traffic, then
    footprint, then option, that :func:`kept_candidates` sorts by, for one stable sort on one
    key instead of two. (Row ``r`` of the sorted arrays holds the ``r``-th least traffic of
    every group and tiling, contiguous for the passes over it.)"""
    groups, options, n = traffic.shape
    flat = np.argsort(traffic, axis=1, kind="stable")  # made the flat index in place (memory: one copy)
    flat *= n
    flat += np.arange(groups)[:, None, None] * (options * n) + np.arange(n)[None, None, :]
    flat = flat.transpose(1, 0, 2).reshape(options, groups * n)  # flat index of each group's r-th least
    t, f = traffic.ravel().take(flat), fp.ravel().take(flat)
    keep = np.empty(t.shape, dtype=bool)
    least = np.full(groups * n, np.inf)
    for r in range(options):
        np.less(f[r], least, out=keep[r])
        np.minimum(least, f[r], out=least)
    next_kept = np.full(least.shape, np.nan)  # traffic of the next kept row of the tiling
    for r in range(options - 1, -1, -1):
        superseded = keep[r] & (t[r] == next_kept)
        next_kept = np.where(keep[r], t[r], next_kept)
        keep[r] &= ~superseded
    mask = np.empty(traffic.size, dtype=bool)
    mask[flat.ravel()] = keep.ravel()
    return mask.reshape(traffic.shape)


def _evaluate_together(models: list[GroupCostModel], tiles: list[np.ndarray],
                       trips: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The closed forms' traffic and footprint bound with everything streamed, for every model
    (rows) at the tilings given by each rank's ``tiles`` and ``trips``."""
    return _traffic_together(models, trips), _footprint_together(models, tiles)


def _traffic_together(models: list[GroupCostModel], trips: list[np.ndarray]) -> np.ndarray:
    """Each term's untiled bytes times the trips of the ranks it does not mention, summed; and
    each exact model's irregular reads, their per-tiling bytes times those trips (integers below
    2^53 in floats: exact in any order)."""
    total = sum_of_products([m.terms for m in models], trips)
    for k, m in enumerate(models):
        if m.exact_traffic and m.irregular:
            for t, per_tiling in m._irregular_factors().items():  # type: ignore[union-attr]
                total[k] += times_trips(per_tiling, trips, m._shape.unmentioned[t])
    return total


def _footprint_together(models: list[GroupCostModel], tiles: list[np.ndarray]) -> np.ndarray:
    """Each term's fixed bytes times the tiled extents of its ranks (a retained halo's only
    while its rank is tiled), summed."""
    sizes = [models[0].cascade.size(r) for r in models[0].ranks]
    extents = [np.minimum(t, size) for t, size in zip(tiles, sizes)]
    tiled = [t < size for t, size in zip(tiles, sizes)]
    ranks = len(sizes)
    terms = [[(fixed, list(idxs) + ([ranks + when] if when is not None else [])) for fixed, idxs, when in m.fp_terms]
             for m in models]
    return sum_of_products(terms, extents + tiled)


#: Buffers whose contenders a group's cost model keeps (:meth:`GroupCostModel.contenders`), the
#: most recently used (speed and memory only).
CONTENDER_BUFFERS = 4


def cost_model(cascade: Cascade, einsums: list[str], ranks: list[str]) -> "GroupCostModel":
    """The closed forms of a candidate group, memoised on the (immutable) cascade: they do not
    depend on the buffer or the architecture, so repeated searches (sweeps) reuse them."""
    memo = cascade.__dict__.setdefault("_group_cost_model_memo", {})
    key = (tuple(einsums), tuple(ranks))
    if key not in memo:
        memo[key] = GroupCostModel(cascade, einsums, ranks)
    return memo[key]



# ---------------------------------------------------------------------------------------------
# The closed forms a candidate table is summed from


def sum_of_products(terms: list[list[tuple[float, list[int]]]], factors: list[np.ndarray]) -> np.ndarray:
    """Per model (rows), the sum over its terms ``(coefficient, factor indices)`` of the
    coefficient times those per-tiling factors: each product taken in the order of its
    indices, a factor the term does not use multiplying by one, the terms summed in the
    model's order, a missing term adding zero. So a model's values are the same floats
    whichever models share the pass (``tests/test_candidates.py``). The products of a block of
    terms are taken together, one pass per factor (at most :data:`PRODUCT_BLOCK_CELLS` cells at
    once), then added term by term."""
    n = len(factors[0]) if factors else 1
    width = max((len(ts) for ts in terms), default=0)
    coef = np.zeros((len(terms), width))
    uses = np.zeros((len(terms), width, len(factors)), dtype=bool)
    for k, ts in enumerate(terms):
        for t, (c, idxs) in enumerate(ts):
            coef[k, t] = c
            uses[k, t, idxs] = True
    total = np.zeros((len(terms), n))
    block = max(1, PRODUCT_BLOCK_CELLS // max(1, len(terms) * n))
    for start in range(0, width, block):
        stop = min(width, start + block)
        products = np.empty((len(terms), stop - start, n))
        products[:] = coef[:, start:stop, None]
        for i, factor in enumerate(factors):  # in place; where a term does not use it, as if times one
            used = uses[:, start:stop, i]
            if used.all():
                np.multiply(products, factor, out=products)
            elif used.any():
                np.multiply(products, factor, out=products, where=used[:, :, None])
        for t in range(stop - start):
            total += products[:, t]
    return total


#: The most cells (models x terms x tilings) :func:`sum_of_products` multiplies in one pass
#: (memory: 8 bytes each).
PRODUCT_BLOCK_CELLS = 1 << 21


def add_residency(models: list[GroupCostModel], tiles: list[np.ndarray], trips: list[np.ndarray], n: int,
                   traffic0: np.ndarray, fp0: np.ndarray, traffic: np.ndarray, fp: np.ndarray) -> None:
    """Fill the residency options (rows 1.. of each model, :meth:`GroupCostModel.options`'s
    order) of ``traffic`` and ``fp``. Streamed, a tensor is read once per trip of every loop
    that does not index it; resident, only per trip of those outside the innermost loop (of
    more than one trip) that does index it (cost/traffic.py). It holds its largest one-step
    box (fusion/mapping.py:resident_bytes), here bounded from above: a dimension indexed by
    several tiled ranks counts in full (:meth:`GroupCostModel._held_box`). Option ``(o, j)``
    saves and holds the running sums over order ``o``'s first ``j`` residency candidates; the
    per-tiling factors are shared by every model that needs them."""
    chains = []  # (model row, first option row, [(bytes, saved-factor row, held row)])
    factors: dict[tuple, int] = {}
    factor_rows: list[np.ndarray] = []
    held: dict[tuple, int] = {}
    held_rows: list[np.ndarray] = []
    for k, m in enumerate(models):
        row = 1
        readers_of: dict[str, tuple[str, ...]] = {}  # a held box depends on the Einsums reading it
        for e in m.probe.einsums:
            for t in dict.fromkeys(a.tensor for a in m.cascade.einsum(e).inputs if a.tensor != e):
                readers_of[t] = readers_of.get(t, ()) + (e,)
        for o in m.orders if m.ranks else []:
            keep = m.keepable_for(o)
            if not keep:
                continue
            links = []
            irregular = m._irregular_factors() if m.exact_traffic and m.irregular else {}
            for t, b, seen in keep:
                key = (o, frozenset(seen))
                if key not in factors:
                    factors[key] = len(factor_rows)
                    factor_rows.append(_kept_row(m, ("saved", o, frozenset(seen)),
                                                 lambda: _saved_factor(trips, o, seen, len(m.ranks), n)))
                saved = [t] + ([m._initial_of[t]] if t in m._initial_of else [])  # its initial value's bytes too
                if any(x in irregular for x in saved):  # bytes per pass differ by tiling: a row of its own, times one
                    per_pass = sum(irregular[x] if x in irregular else m._read_bytes[x] for x in saved)
                    b, key = 1.0, (o, frozenset(seen), id(m), t)
                    factors[key] = len(factor_rows)
                    factor_rows.append(factor_rows[factors[(o, frozenset(seen))]] * per_pass)
                else:
                    b = sum(m._read_bytes[x] for x in saved)
                readers = (t, readers_of.get(t, ()))
                if readers not in held:
                    held[readers] = len(held_rows)
                    held_rows.append(_kept_row(m, ("held", *readers), lambda: m._held_box(t, tiles)))
                links.append((b, factors[key], held[readers]))
            chains.append((k, row, links))
            row += len(links)
    if not chains:
        return
    chains.sort(key=lambda c: -len(c[2]))  # longest first (stable): the chains still adding are a prefix
    longest = len(chains[0][2])
    coef = np.zeros((len(chains), longest))
    saved_at = np.full((len(chains), longest), len(factor_rows))  # the last row: zeros
    held_at = np.full((len(chains), longest), len(held_rows))
    for c, (_, _, links) in enumerate(chains):
        for j, (b, f, h) in enumerate(links):
            coef[c, j], saved_at[c, j], held_at[c, j] = b, f, h
    saved_rows = np.vstack(factor_rows + [np.zeros(n)])
    held_all = np.vstack(held_rows + [np.zeros(n)])
    model_of = np.array([c[0] for c in chains])
    start = np.array([c[1] for c in chains])
    live = [sum(1 for c in chains if len(c[2]) > j) for j in range(longest)]  # chains with a j-th link
    saved_sum, held_sum = np.zeros((len(chains), n)), np.zeros((len(chains), n))
    link = np.empty((len(chains), n))  # scratch (in place: no temporaries)
    for j, k in enumerate(live):  # each chain's running sums, the same additions in the same order
        np.take(saved_rows, saved_at[:k, j], axis=0, out=link[:k], mode="clip")  # (in range: unbuffered)
        np.multiply(coef[:k, j:j + 1], link[:k], out=link[:k])
        saved_sum[:k] += link[:k]
        np.take(held_all, held_at[:k, j], axis=0, out=link[:k], mode="clip")
        held_sum[:k] += link[:k]
        rows, cols = model_of[:k], start[:k] + j
        np.take(traffic0, rows, axis=0, out=link[:k], mode="clip")  # the chain's model's, streamed
        traffic[rows, cols] = np.subtract(link[:k], saved_sum[:k], out=link[:k])
        np.take(fp0, rows, axis=0, out=link[:k], mode="clip")
        fp[rows, cols] = np.add(link[:k], held_sum[:k], out=link[:k])


def _saved_together(shape: Any, steps: list[Any], tensor: str, initial: str) -> bool:
    """Whether the residency closed form saves ``initial``'s bytes exactly with ``tensor``'s: the
    general model reads both in one step (:func:`~mambalaya.cost.traffic.read_steps`) with one
    repeat count, so they do when ``initial`` is read in that step alone and through the same
    accesses (the ranks they mention are the same)."""
    return (sum(1 for step in steps if step[5] == initial) == 1
            and any(step[0] == tensor and step[5] == initial for step in steps)
            and shape.mentioned[tensor] == shape.mentioned[initial])


def _kept_row(m: GroupCostModel, key: tuple, make: Any) -> np.ndarray:
    """A per-tiling row of :func:`add_residency` (a saved factor or a held box), memoised on
    the cascade per ranks and ``key``: the groups tiling the same ranks share it across build
    passes (read-only)."""
    memo = m.cascade.__dict__.setdefault("_residency_rows_memo", {})
    full = (tuple(m.ranks), *key)
    hit = memo.get(full)
    if hit is None:
        hit = memo[full] = make()
        hit.flags.writeable = False
    return hit


def _saved_factor(trips: list[np.ndarray], order: tuple[int, ...], seen: frozenset[int], ranks: int, n: int) -> np.ndarray:
    """Per tiling, a resident tensor's reads saved per byte (streamed minus resident trips,
    :func:`add_residency`), for a tensor indexed by the ranks ``seen`` under ``order``."""
    pos = {i: k for k, i in enumerate(order)}
    streamed = np.ones(n)
    for i in range(ranks):
        if i not in seen:
            streamed = streamed * trips[i]
    inner = np.full(n, -1)
    for i in sorted(seen, key=pos.get):
        inner = np.where(trips[i] > 1, pos[i], inner)
    resident = np.ones(n)
    for i in range(ranks):
        if i not in seen:
            resident = resident * np.where(pos[i] < inner, trips[i], 1.0)
    return streamed - resident


def cycles_together(models: list[GroupCostModel], compute: Any) -> list[np.ndarray]:
    """:meth:`GroupCostModel.cycles` of each model, made for those without them. A group's
    per-unit sums add its Einsums' cycles in order, so a group one Einsum longer than another
    of the list (met before it, tiling the same ranks) starts from that one's sums: the same
    additions in the same order, so the same floats."""
    key = spec_key(compute)
    # per Einsums, (ranks, sums) of this call's groups not yet grown by one Einsum (memory: a
    # group's sums are dropped once the next group has looked for them, whatever its ranks)
    sums: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, Any]]] = {}
    for m in models:
        if key in m._cycles:
            continue
        einsums = m.probe.einsums
        ranks = (tuple(m.ranks), tuple(m.select_ranks(name) for name in einsums))  # a select-runner's cycles differ
        shorter_ranks, total = sums.pop(einsums[:-1], (None, None))
        if shorter_ranks is None or shorter_ranks != (ranks[0], ranks[1][:-1]):
            total = None
        start = len(einsums) - 1 if total is not None else 0
        if total is None:
            total = {"array_2d": 0.0, "array_1d": 0.0, "vector": 0.0, "mfu": 0.0}
        tiles = m.grid()[0]
        for name in einsums[start:]:
            cyc = einsum_grid_cycles(compute, m.cascade, name, m.ranks, tiles, m.select_ranks(name))
            total = {k: total[k] + cyc[k] for k in total}
        sums[einsums] = (ranks, total)
        array = total["array_2d"] + total["array_1d"]
        if compute.overlap_compute_units:
            cycles = np.maximum(np.maximum(array, total["vector"]), total["mfu"])
        else:
            cycles = array + total["vector"] + total["mfu"]
        m._cycles[key] = np.broadcast_to(np.asarray(cycles, dtype=float), (m.n_tilings,))
    return [m._cycles[key] for m in models]


def einsum_grid_cycles(compute: Any, cascade: Cascade, name: str, ranks: list[str], tiles: list[np.ndarray],
                       select: tuple[str, ...] = ()) -> dict[str, Any]:
    """One Einsum's unit cycles for every tiling of ``ranks`` (the grid of
    :meth:`GroupCostModel.grid`), running once along ``select`` (its select ranks in the group,
    :func:`~mambalaya.fusion.mapping.select_ranks`: their loops left out of its step shapes),
    memoised on the cascade: the grid depends only on the ranks, so every candidate group of a
    search that tiles the same ranks shares it."""
    memo = cascade.__dict__.setdefault("_grid_cycles_memo", {})
    key = (spec_key(compute), name, tuple(ranks), select)
    hit = memo.get(key)
    if hit is None:
        e = cascade.einsum(name)
        hit, _ = einsum_unit_cycles(compute, cascade, e, einsum_ops(cascade, e),
                                    _grid_step_shapes(cascade, ranks, tiles, select),
                                    shapes_key=("grid", tuple(ranks)) + (("select", select) if select else ()))
        if select:  # a select-runner's shapes over no other rank are scalars: the same cycles in every tiling
            n = len(tiles[0]) if tiles else 1
            hit = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)) if np.ndim(v) == 0 else v for k, v in hit.items()}
        memo[key] = hit
    return hit


def _grid_step_shapes(cascade: Cascade, ranks: list[str], tiles: list[np.ndarray], select: tuple[str, ...] = ()) -> list[Any]:
    """:func:`~mambalaya.cost.spatial.step_shapes` of every tiling of ``ranks`` (the grid's
    ``tiles``) but the loops of ``select``, memoised on the cascade per ranks and select ranks:
    they depend on the sizes alone, and every Einsum and compute section costed over that grid
    reads them (read-only)."""
    memo = cascade.__dict__.setdefault("_grid_step_shapes_memo", {})
    key = (tuple(ranks), select)
    hit = memo.get(key)
    if hit is None:
        hit = step_shapes({r: cascade.size(r) for r in cascade.ranks}, [(r, t) for r, t in zip(ranks, tiles) if r not in select])
        if not tiles or len(tiles[0]) <= KEPT_SHAPES_TILINGS:
            memo[key] = hit
    return hit


#: Step shapes of grids of at most this many tilings are kept per cascade (memory, as
#: :data:`mambalaya.search.candidates.KEPT_GRID_TILINGS` keeps the grids themselves).
KEPT_SHAPES_TILINGS = 1 << 16


__all__ = ["add_residency", "sum_of_products", "Candidates", "GroupCostModel", "build_candidates", "cost_model", "cycles_together", "einsum_grid_cycles", "kept_candidates", "least_footprint_bound", "least_footprints", "least_traffic_fitting", "prepare_full_tables",
           "tile_options", "tileable_ranks", "widened_ranks"]
