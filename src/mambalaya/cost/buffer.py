"""The on-chip buffer's accesses of a group, at tile granularity (:func:`group_buffer_accesses`),
and the same count for every tiling of a candidate group at once
(:func:`buffer_read_bytes_over_tilings`, the closed form :mod:`mambalaya.search.candidates` uses);
:mod:`mambalaya.execute.tiled` counts the same bytes by moving data."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Access, rank_of_variable
from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import FusionGroup, einsum_loops, group_einsums, register_resident
from mambalaya.einsum.routing import operand_scale
from mambalaya.cost.traffic import (GroupTraffic, TrafficSizeError, component_sums, read_elements, read_plan,
                                     group_traffic, written_bytes)


@dataclass(frozen=True)
class BufferAccesses:
    """On-chip buffer bytes of one group (see :func:`group_buffer_accesses`)."""

    einsum_read_bytes: dict[str, float]  # operands each Einsum reads, over all steps
    einsum_write_bytes: dict[str, float]  # results each Einsum writes, over all steps
    fill_bytes: float  # written into the buffer from DRAM
    drain_bytes: float  # read from the buffer to DRAM

    @property
    def read_bytes(self) -> float:
        return sum(self.einsum_read_bytes.values()) + self.drain_bytes

    @property
    def write_bytes(self) -> float:
        return sum(self.einsum_write_bytes.values()) + self.fill_bytes

    @property
    def total_bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def buffer_written_bytes(cascade: Cascade, einsums: tuple[str, ...], name: str, repeat: Any,
                         written: Any = None) -> Any:
    """Bytes Einsum ``name``, in a group of ``einsums``, writes into the buffer over ``repeat``
    passes of its output: none for what the lanes carry in registers; of a recurrence the
    group's other members read at a few positions only, those positions, whole (its carried
    value lives in the lanes; a carried cell a mask left dead is written there too:
    :attr:`~mambalaya.fusion.group_analysis.GroupAnalysis.kept`); else its output as it
    exists (:func:`~mambalaya.cost.traffic.written_bytes`; ``written``, if given, is that)."""
    facts = analyse(cascade, einsums)
    if name in facts.in_registers:
        return 0.0 * repeat
    kept = facts.kept_at(cascade, name)
    if kept is not None:
        rank, positions = kept
        return cascade.elements(name) // cascade.size(rank) * len(positions) * repeat * cascade.tensors[name].stored_bytes_per_element
    return written if written is not None else written_bytes(cascade, name, repeat)


def buffer_read_elements(cascade: Cascade, group: FusionGroup, tensor: str, accesses: list[Access]) -> float:
    """Bytes one Einsum reads of ``tensor`` from the buffer over the group's steps: the box of
    its ``accesses`` in every step (retained halo rows read again), incoming-state rows at the
    state tensor's width."""
    rereading = FusionGroup(group.name, group.einsums, group.loops, "recompute")  # every step reads its whole box
    own, init = read_elements(cascade, rereading, tensor, accesses, self_only=False)
    total = own * cascade.tensors[tensor].stored_bytes_per_element
    if init:
        total += init * cascade.tensors[cascade.tensors[tensor].initial].stored_bytes_per_element  # type: ignore[index]
    return total


def buffer_read_bytes_over_tilings(cascade: Cascade, probe: FusionGroup, tensor: str, accesses: list[Access],
                                   ranks: list[str], tiles: list[np.ndarray], trips: list[np.ndarray],
                                   n_tilings: int | None = None) -> np.ndarray:
    """:func:`buffer_read_elements` in bytes for every tiling of ``ranks`` at once (``tiles`` and
    ``trips`` per rank and tiling; ``probe`` fuses every rank at its full size): the same box
    sums, window halos and rotated boxes read again per tile included. A component whose boxes
    tile its dimensions exactly (plain rank indices, no incoming state) sums to its untiled box
    at any tile; the others are summed per distinct tile. A tiling whose boxes cannot be counted
    without enumerating too many tiles (:class:`TrafficSizeError`) costs infinitely many bytes.
    ``n_tilings``: the tilings, where ``ranks`` may be none of a grid's (a select-runner's
    reads, with its select ranks left out)."""
    n = len(tiles[0]) if tiles else (n_tilings or 1)
    plan = read_plan(cascade, probe, tensor, accesses, None)
    own, every = np.ones(n), np.ones(n)
    for dims, comp_ranks, bounds in plan.comps:
        sums = _tiled_component_sums(cascade, tensor, plan.access_key, accesses, dims, comp_ranks, bounds,
                                     [tiles[ranks.index(r)] for r in comp_ranks], n)
        own *= sums[0]
        every *= sums[0] + sums[1]
    repeat = np.ones(n)
    for i, r in enumerate(ranks):
        if r not in plan.mentioned:
            repeat = repeat * trips[i]
    total = own * repeat * cascade.tensors[tensor].stored_bytes_per_element
    initial = cascade.tensors[tensor].initial
    if initial is not None:  # an uncountable tiling (own infinite) stays infinite, never inf - inf = NaN
        uncounted = np.isinf(own)
        incoming = np.where(uncounted, 0.0, every - np.where(uncounted, 0.0, own))
        total = total + incoming * repeat * cascade.tensors[initial].stored_bytes_per_element
    return total


def _tiled_component_sums(cascade: Cascade, tensor: str, access_key: Any, accesses: list[Access], dims: tuple[int, ...],
                          comp_ranks: tuple[str, ...], bounds: tuple[tuple[int, int], ...], tiles: list[np.ndarray],
                          n: int) -> tuple[Any, Any]:
    """(own, incoming-state) box sums of one component for every tiling (scalars when the same for all)."""
    def at(row: tuple[int, ...]) -> tuple[float, float]:
        try:
            own, init = component_sums(cascade, tensor, access_key, accesses, dims,
                                        tuple((r, int(t)) for r, t in zip(comp_ranks, row)), bounds, False)
            return float(own), float(init)
        except TrafficSizeError:
            return math.inf, 0.0

    full = tuple(cascade.size(r) for r in comp_ranks)
    if not comp_ranks or _exact_tiling(accesses, dims, bounds):
        return at(full)
    unique, where = distinct_rows(tiles)
    sums = np.array([at(row) for row in unique]).reshape(-1, 2)
    return sums[where, 0], sums[where, 1]


def distinct_rows(columns: list[np.ndarray]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct rows of integer ``columns`` (equal lengths), in lexicographic order, and each
    row's index among them: ``np.unique(np.stack(columns, 1), axis=0, return_inverse=True)``
    through one integer code per row (the columns' value indices in mixed radix), far cheaper
    than sorting rows."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    values = []
    for col in columns:
        vals, index = np.unique(col, return_inverse=True)
        code = code * len(vals) + index.reshape(-1)
        values.append(vals)
    codes, where = np.unique(code, return_inverse=True)
    digits = []
    for vals in reversed(values):
        codes, digit = np.divmod(codes, len(vals))
        digits.append(vals[digit].tolist())
    return list(zip(*reversed(digits))), where.reshape(-1)


def _exact_tiling(accesses: list[Access], dims: tuple[int, ...], bounds: tuple[tuple[int, int], ...]) -> bool:
    """Whether every access indexes each of ``dims`` by one rank variable alone (coefficient 1,
    no offset) and none has rows below 0: then the boxes of any tiling sum to the untiled box."""
    if any(lo < 0 for lo, _ in bounds):
        return False
    return all(a.indices[p].plain_variable is not None for a in accesses for p in dims)


def group_buffer_accesses(cascade: Cascade, group: FusionGroup, traffic: GroupTraffic | None = None) -> BufferAccesses:
    """Bytes the group moves through its on-chip buffer, at tile granularity.

    In every step each Einsum reads, per input tensor, the bounding box of its accesses over
    the step's ranges (clipped to the tensor and its incoming-state rows: an operand element
    is read once per step and Einsum, its reuse inside the tile happening in the PEs) and
    writes its output tile; every byte read from DRAM is written into the buffer (fill) and
    every byte written to DRAM is read from it (drain). A recurrence's reads of its own
    earlier positions are not counted: its carried state lives in the lanes computing it. Nor
    are the writes and reads of an intermediate the lanes carry in their
    registers (:func:`~mambalaya.fusion.mapping.register_resident`). A select-runner reads and
    writes only in the steps it runs in: its select ranks' loops are left out
    (:func:`~mambalaya.fusion.mapping.einsum_loops`). An Einsum that runs a share of its dense
    work (a MoE block's routed pairs: every operand; a mask's live cells: the operands that
    read both of its frame's variables, :func:`~mambalaya.einsum.routing.operand_scale`) reads
    that share of them, and writes the share of its output that exists, as the off-chip
    traffic counts them.
    :mod:`mambalaya.execute.tiled` counts the same accesses by moving data.
    """
    traffic = traffic or group_traffic(cascade, group)
    reads, writes = _einsum_buffer_bytes(cascade, group)
    # the fill and drain are the traffic given (a multi-core chip's core: its share of each tensor,
    # where a memo of the whole tensors' once answered for it)
    return BufferAccesses(reads, writes, sum(traffic.read_bytes.values()), sum(traffic.write_bytes.values()))


def _einsum_buffer_bytes(cascade: Cascade, group: FusionGroup) -> tuple[dict[str, float], dict[str, float]]:
    """Each member's buffer reads and writes (:func:`group_buffer_accesses`), which depend on the
    group alone: memoised on the cascade."""
    memo = cascade.__dict__.setdefault("_group_buffer_memo", {})
    key = (group.einsums, group.loops, group.halo, group.resident)
    if key in memo:
        return memo[key]
    lanes = register_resident(cascade, group)
    reads: dict[str, float] = {}
    writes: dict[str, float] = {}
    for e in group_einsums(cascade, group):
        loops = einsum_loops(cascade, group, e.name)  # a select-runner's steps: its select ranks' loops left out
        runs = group if loops == group.loops else FusionGroup(group.name, group.einsums, loops, group.halo)
        reads[e.name] = 0.0
        for t in dict.fromkeys(a.tensor for a in e.inputs if a.tensor != e.name and a.tensor not in lanes):
            accs = [a for a in e.inputs if a.tensor == t]
            reads[e.name] += buffer_read_elements(cascade, runs, t, accs) * float(operand_scale(cascade, e.name, accs))
        out_ranks = {rank_of_variable(v) for v in e.output_variables}
        repeat = math.prod(lp.trips(cascade.size(lp.rank)) for lp in loops if lp.rank not in out_ranks)
        writes[e.name] = buffer_written_bytes(cascade, group.einsums, e.name, repeat)
    memo[key] = (reads, writes)
    return reads, writes
