"""A tiled executor: runs a cascade under a fusion mapping the way hardware would, counting bytes.

The mapping's meaning is the module doc of :mod:`mambalaya.fusion.mapping`; this module is an
independent, data-moving implementation of it (it never calls an analytic traffic formula), so
its byte counts are the ground truth the analytic model (:mod:`mambalaya.cost.traffic`) is
tested against.

* :class:`OffChipStore` is DRAM: the full arrays of the given inputs, weights and incoming
  state, and of every tensor a group writes off-chip. Every transfer goes through
  :meth:`OffChipStore.read` / :meth:`OffChipStore.write`, which count, per ``(group, tensor)``,
  the elements moved times the tensor's declared ``bits / 8`` (not numpy's itemsize; 0 for a
  declared mask, which kernels make from the indices: ``TensorSpec.stored_bytes_per_element``). Rows read
  below index 0 along the axis of a tensor's ``initial`` value are read from (and counted
  against) that state tensor. A store tensor is freed after the last group that reads it
  unless it is a cascade output.
* Groups run in mapping order (made executable by :func:`check_mapping`). A group iterates
  its fused loops outer to inner over tiles ``[a, min(a+t, |R|))``; each innermost visit is a
  step. In a step:

  1. every tensor the group reads off-chip is fetched: the bounding box of the group's
     accesses to it over the step's variable ranges (fused ranks: the tile; others: full),
     clipped to the tensor (rows below 0 along its ``initial`` axis, down to the history
     depth, come from the state tensor; anything else out of range reads zero). Along the
     window rank of a tensor (a fused rank it is read with a negative reach, see
     :func:`window_halos`), with ``halo: retain`` the rows the previous tile of that rank
     brought on chip and this tile needs again are taken from an on-chip halo buffer, not
     re-read;
  2. every Einsum of the group runs in cascade order over the step's ranges (an Einsum lacking
     a fused rank is so recomputed once per tile of it), but a select-runner
     (:func:`~mambalaya.fusion.mapping.select_ranks`: it reads one position along a fused
     rank) runs only in the steps whose tile of each of its select ranks holds its position,
     and only those steps count its accesses to the tensors it reads. Intermediates are read from on-chip
     tiles only: the producer's current tile, its retained halo rows from previous tiles of a
     window rank, and incoming-state rows (read off-chip) below 0; a recurrence runs position
     by position from its carried state (its last ``distance`` positions), kept on chip across
     the tiles of its generational rank, one state per tile of the other fused loops;
  3. every tensor of :func:`tensors_written` is written off-chip for the region the step
     computed (again in every step that recomputes it).

  Each Einsum's on-chip buffer accesses are counted as it runs: per input tensor, the
  bounding box of its accesses over the step (clipped to the tensor and its incoming-state
  rows), and its output tile (:attr:`TiledRun.buffer_read_bytes` / ``buffer_write_bytes``);
  with the fills (DRAM reads) and drains (DRAM writes), :meth:`TiledRun.group_buffer_bytes`
  is what :func:`mambalaya.cost.buffer.group_buffer_accesses` predicts.

  Masks (:mod:`mambalaya.einsum.dead_work`): every value is computed (the dead ones are the
  mask's constants), but only live cells move. A masked tensor's writes, and its reads where
  the group reads it at whole cells, count its live cells in the box; an Einsum with a frame
  reads, of an operand read at both frame variables, the live cells of its box. A recurrence
  the group's other members read at a few positions only
  (:attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.kept`) writes the buffer at those.

  Halo buffers and carried states are keyed by the tile indices of the other fused loops, so
  loops inside the window/generational rank's loop keep one per inner tile (the footprint's
  "full extent for ranks whose loop is inside").

**On-chip peak** (:attr:`TiledRun.onchip_peak_bytes`, declared bits): the largest, over the
moments "all Einsums of a step have run" and "the step's halos and states were updated", of

    intermediate tiles of the step (tensors of :func:`intermediates`, over the computed region)
  + carried recurrence states held (all keys; the incoming state a first tile starts from too)
  + retained halo rows held (all keys, only rows inside the tensor or its incoming state).

Tiles streamed from or to DRAM (off-chip input boxes, output tiles that only leave) are not
counted there, as in :func:`footprint_bytes`; their largest per-step sum (new elements read +
elements written of tensors that are not intermediates) is :attr:`TiledRun.streamed_peak_bytes`.

Python memory: a fused group never holds a full-size intermediate, only tiles (plus the
zero-padded copies its windows read); tensors leaving a group are full arrays in the store.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping as TMapping

import numpy as np

from mambalaya.errors import ExecutionError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.dead_work import frame_dims, frame_live_elements, live_elements, reads_aligned
from mambalaya.einsum.ir import Access, Einsum
from mambalaya.execute.numpy_exec import (
    Source,
    check_arrays,
    evaluate_einsum,
    resolve_dtype,
)
from mambalaya.execute.boxes import Box, volume, box_empty, intersect, subtract_all, slices, put_box, index_range, tile_bounds
from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import (
    FusionGroup,
    Mapping,
    check_mapping,
    group_einsums,
    intermediates,
    produced_in,
    register_resident,
    select_positions,
    tensors_written,
    window_halos,
)

__all__ = ["OffChipStore", "TiledRun", "run_tiled"]

# ----------------------------------------------------------------------------------------------
# DRAM
# ----------------------------------------------------------------------------------------------


class OffChipStore:
    """Off-chip memory: full arrays by tensor name, with per-``(group, tensor)`` byte counters."""

    def __init__(self, cascade: Cascade, arrays: TMapping[str, np.ndarray]):
        self.cascade = cascade
        self.arrays: dict[str, np.ndarray] = dict(arrays)
        self.read_bytes: dict[tuple[str, str], float] = {}
        self.write_bytes: dict[tuple[str, str], float] = {}

    def __contains__(self, tensor: str) -> bool:
        return tensor in self.arrays

    def _bytes(self, tensor: str, elements: int) -> float:
        return elements * self.cascade.tensors[tensor].stored_bytes_per_element

    def _check(self, tensor: str, box: Box) -> None:
        shape = self.cascade.shape(tensor)
        if len(box) != len(shape) or any(a < 0 or b > n or b < a for (a, b), n in zip(box, shape)):
            raise ExecutionError(f"off-chip access to {tensor}{list(box)} is outside its shape {shape}")

    def read(self, group: str, tensor: str, box: Box, *, live_only: bool = False) -> np.ndarray:
        """The elements of ``box`` (a view of DRAM: do not modify), counted as read by ``group``:
        every one, or with ``live_only`` (a masked tensor read at whole cells) those in live
        cells (:mod:`mambalaya.einsum.dead_work`)."""
        if tensor not in self.arrays:
            raise ExecutionError(f"group {group} reads {tensor}, which is not in off-chip memory")
        self._check(tensor, box)
        n = live_elements(self.cascade, tensor, box) if live_only else volume(box)
        if n:
            key = (group, tensor)
            self.read_bytes[key] = self.read_bytes.get(key, 0.0) + self._bytes(tensor, n)
        return self.arrays[tensor][tuple(slice(a, b) for a, b in box)]

    def write(self, group: str, tensor: str, box: Box, data: np.ndarray) -> None:
        """Store ``data`` at ``box`` of ``tensor`` (allocated on first write), counted as written:
        a masked tensor's live cells only (its dead ones hold what the mask makes them)."""
        self._check(tensor, box)
        if tensor not in self.arrays:
            self.arrays[tensor] = np.zeros(self.cascade.shape(tensor), data.dtype)
        self.arrays[tensor][tuple(slice(a, b) for a, b in box)] = data
        n = live_elements(self.cascade, tensor, box)
        if n:
            key = (group, tensor)
            self.write_bytes[key] = self.write_bytes.get(key, 0.0) + self._bytes(tensor, n)

    def free(self, tensor: str) -> None:
        self.arrays.pop(tensor, None)


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------


@dataclass
class TiledRun:
    """What a tiled run computed and moved. Byte keys are ``(group name, tensor name)``."""

    outputs: dict[str, np.ndarray]
    read_bytes: dict[tuple[str, str], float]
    write_bytes: dict[tuple[str, str], float]
    onchip_peak_bytes: dict[str, float]
    steps: dict[str, int]
    streamed_peak_bytes: dict[str, float] = field(default_factory=dict)
    #: on-chip buffer bytes per ``(group, einsum)``: operands read, results written
    buffer_read_bytes: dict[tuple[str, str], float] = field(default_factory=dict)
    buffer_write_bytes: dict[tuple[str, str], float] = field(default_factory=dict)

    def group_buffer_bytes(self, group: str) -> tuple[float, float]:
        """(reads, writes) of the group's buffer: its Einsums' accesses plus the drain of what
        it writes off-chip (a read) and the fill of what it reads (a write)."""
        reads = sum(b for (g, _), b in self.buffer_read_bytes.items() if g == group)
        writes = sum(b for (g, _), b in self.buffer_write_bytes.items() if g == group)
        return reads + sum(self.group_write_bytes(group).values()), writes + sum(self.group_read_bytes(group).values())

    @property
    def total_read_bytes(self) -> float:
        return float(sum(self.read_bytes.values()))

    @property
    def total_write_bytes(self) -> float:
        return float(sum(self.write_bytes.values()))

    @property
    def offchip_bytes(self) -> float:
        return self.total_read_bytes + self.total_write_bytes

    def group_read_bytes(self, group: str) -> dict[str, float]:
        return {t: b for (g, t), b in self.read_bytes.items() if g == group}

    def group_write_bytes(self, group: str) -> dict[str, float]:
        return {t: b for (g, t), b in self.write_bytes.items() if g == group}


# ----------------------------------------------------------------------------------------------
# one group
# ----------------------------------------------------------------------------------------------


class _GroupRun:
    def __init__(self, cascade: Cascade, group: FusionGroup, store: OffChipStore, dtype: np.dtype):
        self.c = cascade
        self.g = group
        self.store = store
        self.dtype = dtype
        self.einsums: list[Einsum] = group_einsums(cascade, group)
        self.inside = produced_in(group)
        self.inter = set(intermediates(cascade, group))
        self.written = set(tensors_written(cascade, group))
        self.loops = group.loops
        self.tiles = [tile_bounds(cascade.size(lp.rank), lp.tile) for lp in self.loops]
        self.trips = {lp.rank: len(t) for lp, t in zip(self.loops, self.tiles)}
        self.accs: dict[str, list[Access]] = {}
        #: per select-runner, the position of each of its select ranks it runs at
        self.runs_at = {e.name: pos for e in self.einsums if (pos := select_positions(cascade, group, e.name))}
        self.reader_accs: dict[str, list[tuple[str, Access]]] = {}  # per tensor, (reading Einsum, access)
        for e in self.einsums:
            for a in e.inputs:
                if a.tensor != e.name:
                    self.accs.setdefault(a.tensor, []).append(a)
                    self.reader_accs.setdefault(a.tensor, []).append((e.name, a))
        # the rank along which a tensor's halo is retained (innermost if several)
        order = {lp.rank: n for n, lp in enumerate(self.loops)}
        self.retain_rank: dict[str, str] = {}
        for t, r in window_halos(cascade, group):
            if t not in self.inside and group.halo != "retain":
                continue
            if t not in self.retain_rank or order[r] > order[self.retain_rank[t]]:
                self.retain_rank[t] = r
        self.halo: dict[tuple, tuple[Box, np.ndarray]] = {}
        self.resident: dict[str, tuple[Box, Source, int]] = {}  # tensor -> (box, data, elements held)
        self.carry: dict[tuple, np.ndarray] = {}
        self.peak = 0.0
        self.streamed_peak = 0.0
        self.buffer_reads: dict[str, float] = {}  # per Einsum: operand bytes read from the buffer
        self.buffer_writes: dict[str, float] = {}  # per Einsum: result bytes written to it
        self.in_registers = register_resident(cascade, group)  # carried by the lanes, never in the buffer
        self.facts = analyse(cascade, group.einsums)  # kept_at: recurrences the buffer receives a few positions of
        self.steps = 0

    # -- facts --------------------------------------------------------------------------
    def _bits(self, tensor: str) -> float:
        return self.c.tensors[tensor].stored_bytes_per_element

    def _valid(self, tensor: str) -> Box:
        """Indices holding data: the tensor, plus its incoming-state rows below 0."""
        init = self.c.initial_axis(tensor)
        return tuple(
            (-init[1] if init is not None and init[0] == p else 0, n) for p, n in enumerate(self.c.shape(tensor))
        )

    def _runs_in(self, einsum: str, ranges: TMapping[str, tuple[int, int]]) -> bool:
        """Whether ``einsum`` runs in the step over ``ranges``: always, but a select-runner only
        where the tile of each of its select ranks holds its position."""
        at = self.runs_at.get(einsum)
        return at is None or all(ranges[r.lower()][0] <= p < ranges[r.lower()][1] for r, p in at.items())

    def _need(self, tensor: str, ranges: TMapping[str, tuple[int, int]]) -> Box:
        """Bounding box (unclipped) of the accesses to ``tensor`` over ``ranges`` of the
        group's Einsums that run in that step (:meth:`_runs_in`)."""
        accs = [a for e, a in self.reader_accs[tensor] if self._runs_in(e, ranges)]
        box = []
        for p in range(len(self.c.shape(tensor))):
            spans = [index_range(a.indices[p], ranges) for a in accs]
            box.append((min(s[0] for s in spans), max(s[1] for s in spans)))
        return tuple(box)

    def _key(self, tensor: str, rank: str, tidx: dict[str, int]) -> tuple:
        return (tensor,) + tuple((r, k) for r, k in tidx.items() if r != rank)

    def _next_ranges(self, ranges: dict, rank: str, tidx: dict[str, int]) -> dict | None:
        k = tidx[rank] + 1
        if k >= self.trips[rank]:
            return None
        out = dict(ranges)
        out[rank.lower()] = self.tiles[[lp.rank for lp in self.loops].index(rank)][k]
        return out

    # -- off-chip reads -----------------------------------------------------------------
    def _written_elements(self, einsum: str, out_box: Box) -> int:
        """Elements of an output tile the buffer receives: its live ones (a mask's dead cells are
        known), or, of a recurrence the group's other members read at a few positions
        (:attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.kept`), those positions whole."""
        kept = self.facts.kept_at(self.c, einsum)
        if kept is None:
            return live_elements(self.c, einsum, out_box)
        rank, positions = kept
        dim = self.c.tensors[einsum].ranks.index(rank)
        lo, hi = out_box[dim]
        return sum(volume(out_box[:dim] + ((p, p + 1),) + out_box[dim + 1:]) for p in positions if lo <= p < hi)

    def _live_only(self, tensor: str) -> bool:
        """Whether the group's reads of ``tensor`` move only its live cells (a masked tensor
        read at whole cells: :func:`~mambalaya.einsum.dead_work.reads_aligned`)."""
        return reads_aligned(self.c, tensor, self.accs.get(tensor, ()))

    def _read_pieces(self, tensor: str, box: Box) -> list[tuple[Box, np.ndarray]]:
        """Read ``box`` (inside ``_valid``) from DRAM: rows >= 0 from the tensor, rows below 0
        along its initial axis from the state tensor. The same box read twice in one step (a
        recurrence's incoming state, also read below 0 by another Einsum) is read once."""
        key = (tensor, box)
        if key not in self._step_reads:
            self._step_reads[key] = self._read_pieces_from_dram(tensor, box)
        return self._step_reads[key]

    def _read_pieces_from_dram(self, tensor: str, box: Box) -> list[tuple[Box, np.ndarray]]:
        init = self.c.initial_axis(tensor)
        out = []
        live_only = self._live_only(tensor)
        if init is None or box[init[0]][0] >= 0:
            return [(box, self.store.read(self.g.name, tensor, box, live_only=live_only))]
        axis, depth = init
        lo, hi = box[axis]
        below = box[:axis] + ((lo, min(hi, 0)),) + box[axis + 1 :]
        state = self.c.tensors[tensor].initial
        assert state is not None
        if len(self.c.tensors[state].ranks) == len(box) - 1:  # depth 1: the axis is dropped
            data = self.store.read(self.g.name, state, box[:axis] + box[axis + 1 :])
            data = np.expand_dims(data, axis)
        else:  # history rank: position p is history row p + depth
            data = self.store.read(self.g.name, state, box[:axis] + ((lo + depth, min(hi, 0) + depth),) + box[axis + 1 :])
        out.append((below, data))
        if hi > 0:
            above = box[:axis] + ((0, hi),) + box[axis + 1 :]
            out.append((above, self.store.read(self.g.name, tensor, above, live_only=live_only)))
        return out

    def _fetch(self, tensor: str, ranges: dict, tidx: dict[str, int], pending: dict) -> tuple[Source, int]:
        """The on-chip box of an off-chip tensor for this step and the new elements read. A
        resident tensor whose box is the one it holds from the previous step is not read."""
        need = self._need(tensor, ranges)
        held = self.resident.get(tensor)
        if held is not None and held[0] == need:
            return held[1], 0
        source, fresh = self._fetch_box(tensor, need, ranges, tidx, pending)
        if tensor in self.g.resident:
            self.resident[tensor] = (need, source, volume(intersect(need, self._valid(tensor))))
        return source, fresh

    def _fetch_box(self, tensor: str, need: Box, ranges: dict, tidx: dict[str, int], pending: dict) -> tuple[Source, int]:
        valid = self._valid(tensor)
        fetch = intersect(need, valid)
        rank = self.retain_rank.get(tensor)
        retained = self.halo.get(self._key(tensor, rank, tidx)) if rank else None
        covered = [retained[0]] if retained else []
        pieces = subtract_all(fetch, covered)
        fresh = 0
        init = self.c.initial_axis(tensor)
        if not retained and need == fetch and (init is None or fetch[init[0]][0] >= 0):
            array = self.store.read(self.g.name, tensor, fetch, live_only=self._live_only(tensor))  # a view of DRAM
            fresh = volume(fetch)
        else:
            array = np.zeros([b - a for a, b in need], self.dtype)
            if retained:
                put_box(array, need, retained[1], retained[0], intersect(fetch, retained[0]))
            for piece in pieces:
                for box, data in self._read_pieces(tensor, piece):
                    put_box(array, need, data, box, box)
                    fresh += volume(box)
        if rank:
            nxt = self._next_ranges(ranges, rank, tidx)
            keep = intersect(fetch, intersect(self._need(tensor, nxt), valid)) if nxt else None
            pending[self._key(tensor, rank, tidx)] = (
                (keep, array[slices(keep, need)].copy()) if keep and not box_empty(keep) else None
            )
        return Source(array, tuple(-a for a, _ in need)), fresh

    # -- intermediates ------------------------------------------------------------------
    def _assemble(
        self, tensor: str, tile_box: Box, tile: np.ndarray, ranges: dict, tidx: dict[str, int], pending: dict
    ) -> tuple[Source, int]:
        """What the group's consumers read of an intermediate: the current tile, retained halo
        rows of earlier tiles and incoming-state rows below 0 (read off-chip); zero elsewhere."""
        need = self._need(tensor, ranges)
        valid = self._valid(tensor)
        rank = self.retain_rank.get(tensor)
        retained = self.halo.get(self._key(tensor, rank, tidx)) if rank else None
        if need == tile_box and not retained:
            array = tile
            fresh = 0
        else:
            array = np.zeros([b - a for a, b in need], self.dtype)
            put_box(array, need, tile, tile_box, intersect(need, tile_box))
            covered = [tile_box]
            if retained:
                put_box(array, need, retained[1], retained[0], intersect(need, retained[0]))
                covered.append(retained[0])
            fresh = 0
            init = self.c.initial_axis(tensor)
            for piece in subtract_all(intersect(need, valid), covered):
                if init is None or piece[init[0]][1] > 0:
                    raise ExecutionError(
                        f"group {self.g.name}: {tensor}{list(piece)} is needed but neither in the current tile "
                        "nor retained on chip (the mapping reads an intermediate outside its tile)"
                    )
                for box, data in self._read_pieces(tensor, piece):
                    put_box(array, need, data, box, box)
                    fresh += volume(box)
        if rank:
            # what the next tile of ``rank`` will read again: rows of what was read now (a
            # window's overlap) and rows of the tile just computed (a shifted read such as
            # HC[c-1], whose next need is this very tile)
            nxt = self._next_ranges(ranges, rank, tidx)
            keep = None
            if nxt:
                hull = tuple((min(a0, b0), max(a1, b1)) for (a0, a1), (b0, b1) in zip(need, tile_box))
                keep = intersect(intersect(hull, valid), self._need(tensor, nxt))
            if keep and not box_empty(keep):
                data = np.zeros([b - a for a, b in keep], self.dtype)
                put_box(data, keep, array, need, intersect(keep, need))
                put_box(data, keep, tile, tile_box, intersect(keep, tile_box))
                pending[self._key(tensor, rank, tidx)] = (keep, data)
            else:
                pending[self._key(tensor, rank, tidx)] = None
        return Source(array, tuple(-a for a, _ in need)), fresh

    # -- recurrences --------------------------------------------------------------------
    def _carried_in(self, e: Einsum, ranges: dict, tidx: dict[str, int]) -> tuple[np.ndarray, bool, int]:
        """The state a recurrence starts the step from; whether it is the stored one; elements read."""
        rank, distance = self.c.recurrence(e)  # type: ignore[misc]
        spec = self.c.tensors[e.name]
        axis = spec.ranks.index(rank)
        if rank in self.trips and tidx[rank] > 0:
            return self.carry[self._key(e.name, rank, tidx)], True, 0
        out_box = tuple(ranges[v] for v in e.output_variables)
        assert out_box[axis][0] == 0
        state_box = out_box[:axis] + ((-distance, 0),) + out_box[axis + 1 :]
        carried = np.zeros([b - a for a, b in state_box], self.dtype)
        fresh = 0
        init = self.c.initial_axis(e.name)
        if init is not None and init[0] == axis:
            box = intersect(state_box, self._valid(e.name))
            if not box_empty(box):
                for b, data in self._read_pieces(e.name, box):
                    put_box(carried, state_box, data, b, b)
                    fresh += volume(b)
        return carried, False, fresh

    # -- steps --------------------------------------------------------------------------
    def run(self) -> None:
        sizes = self.c.variable_sizes
        for combo in itertools.product(*(range(len(t)) for t in self.tiles)):
            ranges = {v: (0, s) for v, s in sizes.items()}
            tidx: dict[str, int] = {}
            for lp, k, tiles in zip(self.loops, combo, self.tiles):
                ranges[lp.rank.lower()] = tiles[k]
                tidx[lp.rank] = k
            self._step(ranges, tidx)
            self.steps += 1

    def _step(self, ranges: dict, tidx: dict[str, int]) -> None:
        self._step_reads: dict[tuple[str, Box], list[tuple[Box, np.ndarray]]] = {}
        pending_halo: dict[tuple, tuple[Box, np.ndarray] | None] = {}
        pending_carry: dict[tuple, np.ndarray | None] = {}
        onchip: dict[str, Source] = {}
        streamed = 0.0
        for t in self.accs:
            if t not in self.inside:
                onchip[t], fresh = self._fetch(t, ranges, tidx, pending_halo)
                streamed += fresh * self._bits(t)
        tiles: dict[str, tuple[Box, np.ndarray]] = {}
        transient_carry = 0.0
        for e in self.einsums:
            if not self._runs_in(e.name, ranges):
                continue  # a select-runner outside the tile holding its position
            for t in e.input_tensors:
                if t != e.name and t not in onchip:
                    box, tile = tiles[t]
                    onchip[t], fresh = self._assemble(t, box, tile, ranges, tidx, pending_halo)
                    streamed += fresh * self._bits(self.c.tensors[t].initial or t)
            sources = {t: onchip[t] for t in e.input_tensors if t != e.name}
            own = {v: ranges[v] for v in e.iteration_variables}
            out_box = tuple(ranges[v] for v in e.output_variables)
            rec = self.c.recurrence(e)
            if rec is None:
                out = evaluate_einsum(self.c, e, sources, own, self.dtype)
            else:
                rank, distance = rec
                carried, stored, fresh = self._carried_in(e, ranges, tidx)
                streamed += fresh * self._bits(self.c.tensors[e.name].initial or e.name)
                if not stored:
                    transient_carry += carried.size * self._bits(e.name)
                out = evaluate_einsum(self.c, e, sources, own, self.dtype, carried=carried)
                axis = self.c.tensors[e.name].ranks.index(rank)
                key = self._key(e.name, rank, tidx)
                if rank in self.trips and tidx[rank] + 1 < self.trips[rank]:
                    both = np.concatenate([carried, out], axis=axis)
                    take = [slice(None)] * both.ndim
                    take[axis] = slice(both.shape[axis] - distance, None)
                    pending_carry[key] = np.ascontiguousarray(both[tuple(take)])
                elif rank in self.trips:
                    pending_carry[key] = None
            tiles[e.name] = (out_box, out)
            self._count_buffer(e, ranges, self._written_elements(e.name, out_box))
            if e.name in self.written:
                self.store.write(self.g.name, e.name, out_box, out)
                if e.name not in self.inter:
                    streamed += out.size * self._bits(e.name)
        # on-chip bytes with every Einsum of the step done
        held_tiles = sum(tiles[t][1].size * self._bits(t) for t in self.inter if t not in self.in_registers)
        self.peak = max(self.peak, held_tiles + transient_carry + self._held())
        self.streamed_peak = max(self.streamed_peak, streamed)
        for k, v in pending_halo.items():
            if v is None:
                self.halo.pop(k, None)
            else:
                self.halo[k] = v
        for k, c in pending_carry.items():
            if c is None:
                self.carry.pop(k, None)
            else:
                self.carry[k] = c
        self.peak = max(self.peak, self._held())

    def _count_buffer(self, e: Einsum, ranges: dict, out_elements: int) -> None:
        """On-chip buffer accesses of one Einsum in one step: per input tensor (its own earlier
        positions and tensors the lanes carry in registers excepted) the bounding box of its
        accesses, clipped to the tensor and its incoming-state rows (those at the state's width);
        its output tile written once, unless the lanes carry it."""
        read = 0.0
        for t in dict.fromkeys(a.tensor for a in e.inputs if a.tensor != e.name and a.tensor not in self.in_registers):
            accs = [a for a in e.inputs if a.tensor == t]
            box = []
            for p in range(len(self.c.shape(t))):
                spans = [index_range(a.indices[p], ranges) for a in accs]
                box.append((min(sp[0] for sp in spans), max(sp[1] for sp in spans)))
            region = intersect(tuple(box), self._valid(t))
            if box_empty(region):
                continue
            init = self.c.initial_axis(t)
            below = 0
            if init is not None and region[init[0]][0] < 0:
                axis = init[0]
                below = volume(region[:axis] + ((region[axis][0], min(region[axis][1], 0)),) + region[axis + 1 :])
            dims = frame_dims(self.c, e.name, accs) if not below else None
            live = volume(region) if dims is None else frame_live_elements(self.c, e.name, dims, region)
            read += (live - below) * self._bits(t)
            if below:
                read += below * self._bits(self.c.tensors[t].initial)  # type: ignore[arg-type]
        self.buffer_reads[e.name] = self.buffer_reads.get(e.name, 0.0) + read
        written = 0 if e.name in self.in_registers else out_elements * self._bits(e.name)
        self.buffer_writes[e.name] = self.buffer_writes.get(e.name, 0.0) + written

    def _held(self) -> float:
        """Carried states, retained halos and resident tensors held between steps."""
        total = sum(n * self._bits(t) for t, (_, _, n) in self.resident.items())
        for key, c in self.carry.items():
            total += c.size * self._bits(key[0])
        for key, (box, _) in self.halo.items():
            total += volume(box) * self._bits(key[0])
        return total


# ----------------------------------------------------------------------------------------------
# the whole mapping
# ----------------------------------------------------------------------------------------------


def _group_reads(cascade: Cascade, group: FusionGroup) -> set[str]:
    """Tensors a group reads off-chip, incoming states included."""
    inside = produced_in(group)
    out: set[str] = set()
    for e in group_einsums(cascade, group):
        for t in e.input_tensors:
            if t not in inside:
                out.add(t)
            init = cascade.tensors[t].initial
            if init is not None:
                out.add(init)
    return out


def check_runnable(cascade: Cascade, group: FusionGroup) -> None:
    """An :class:`ExecutionError` for a group this executor does not run: a history recurrence
    (the delta rule's forward substitution ``TI``, which reads every earlier row of its rank
    through a variable of its own) tiled along that rank. The model costs such a group (every
    earlier row held on chip, as a blocked forward substitution holds them); this executor
    carries a fixed number of rows between tiles, so it cannot check those numbers (it failed
    with numpy's shape error)."""
    trips = {lp.rank: lp.trips(cascade.size(lp.rank)) for lp in group.loops}
    for name in group.einsums:
        e = cascade.einsum(name)
        rec = cascade.recurrence(e)
        if rec is not None and cascade.is_history_recurrence(e) and trips.get(rec[0], 1) > 1:
            raise ExecutionError(f"group {group.name}: Einsum {name} reads every earlier row of rank {rec[0]}, which "
                                 f"the group tiles ({trips[rec[0]]} tiles); the tiled executor runs such a recurrence "
                                 f"whole along {rec[0]} only (the model costs it: its numbers are not checked here)")


def check_counts_comparable(cascade: Cascade) -> None:
    """An :class:`ExecutionError` for a cascade whose bytes this executor would count otherwise
    than the model: a mixture-of-experts layer whose routing runs a share of its experts
    (:func:`~mambalaya.einsum.routing.routed_scale` below 1). The executor runs the dense form,
    every expert on every token (the routing weight zeroes the unpicked ones), so it moves every
    expert's weights and pairs, where the model counts the routed share (``top_k/n_experts`` of
    the pairs, the experts a pass reaches of the weights): its counts were the dense form's,
    beside the model's routed ones, without a word. With routing that runs every expert
    (``top_k = n_experts``) the two count the same bytes."""
    from mambalaya.einsum.routing import routed_einsums, routed_scale

    routed = sorted(n for n in routed_einsums(cascade) if routed_scale(cascade, n) != 1)
    if routed:
        raise ExecutionError(f"cascade {cascade.name}: Einsums {', '.join(routed[:4])}{' ...' if len(routed) > 4 else ''} "
                             "run a routed share of their experts (a mixture-of-experts layer); the tiled executor runs "
                             "every expert on every token and would count the dense form's bytes, not the routed ones the "
                             "model counts; run the layer with every expert routed (top_k = n_experts) to compare them, or "
                             "the untiled executor (mambalaya.execute.execute) for its values")


def run_tiled(
    cascade: Cascade,
    mapping: Mapping,
    arrays: TMapping[str, np.ndarray],
    *,
    dtype: str | np.dtype = "float64",
) -> TiledRun:
    """Execute ``cascade`` under ``mapping`` tile by tile, counting every off-chip transfer.

    ``arrays`` are the external tensors (inputs, weights, incoming state). The mapping is
    re-checked (buffer capacity ignored) to get an executable group order.
    """
    dt = resolve_dtype(dtype)
    check_counts_comparable(cascade)
    ordered = check_mapping(cascade, mapping, ignore_buffer=True)
    for g in ordered.groups:
        check_runnable(cascade, g)
    store = OffChipStore(cascade, check_arrays(cascade, arrays, dt))
    wanted = set(cascade.output_tensors())
    reads = [_group_reads(cascade, g) for g in ordered.groups]
    peaks: dict[str, float] = {}
    streamed: dict[str, float] = {}
    buffer_reads: dict[tuple[str, str], float] = {}
    buffer_writes: dict[tuple[str, str], float] = {}
    steps: dict[str, int] = {}
    with np.errstate(over="ignore", under="ignore"):
        for n, g in enumerate(ordered.groups):
            run = _GroupRun(cascade, g, store, dt)
            run.run()
            peaks[g.name] = run.peak
            streamed[g.name] = run.streamed_peak
            steps[g.name] = run.steps
            buffer_reads.update({(g.name, e): b for e, b in run.buffer_reads.items()})
            buffer_writes.update({(g.name, e): b for e, b in run.buffer_writes.items()})
            later = set().union(*reads[n + 1 :]) if n + 1 < len(reads) else set()
            for t in list(store.arrays):
                if t not in wanted and t not in later:
                    store.free(t)
    missing = [t for t in cascade.output_tensors() if t not in store]
    if missing:
        raise ExecutionError(f"no group wrote the outputs {', '.join(missing)}")  # pragma: no cover
    return TiledRun(
        outputs={t: store.arrays[t] for t in cascade.output_tensors()},
        read_bytes=dict(store.read_bytes),
        write_bytes=dict(store.write_bytes),
        onchip_peak_bytes=peaks,
        steps=steps,
        streamed_peak_bytes=streamed,
        buffer_read_bytes=buffer_reads,
        buffer_write_bytes=buffer_writes,
    )
