"""The picks of many candidate groups at once: for every segment of a search, the candidate its
objective ranks first, computed over the concatenated candidate tables with a handful of numpy
passes instead of one short pass per segment.

It answers the same question as :func:`mambalaya.search.picking.pick_least` on the kept candidates, in
the same order: with an architecture, the least latency (candidates within the tie tolerance of
a segment's best tie), then the least traffic, the fewest steps, the least latency, the least
footprint and the lowest index; without one, the least traffic, the fewest steps, the least
footprint and the lowest index; only candidates whose footprint bound fits the buffer compete.
The caller checks each pick's legality and re-costs a segment whose first pick breaks a rule
with the single-segment search (about a quarter of the segments of zamba2-2.7b's hybrid layer;
``tests/test_closed_forms.py`` compares the two).

Only the latency and traffic objectives are picked here: energy and EDP rank by the energy of
the on-chip bytes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mambalaya.arch.kernels import compute_hz, min_group_s, offchip_bytes_per_s
from mambalaya.arch.keys import spec_key
from mambalaya.search.candidates import GroupCostModel, cycles_together, least_traffic_fitting
from mambalaya.cost.latency import scan_floor_s


class SegmentPick(NamedTuple):
    """The first candidate of one segment: its flat index in the segment's full table and its
    closed-form costs (latency None without an architecture). A named tuple: a search makes
    one per segment at every point."""

    flat: int
    traffic_bytes: float
    footprint_bound_bytes: float
    latency_s: float | None


@dataclass
class _Table:
    """The kept candidates of the segments of one layer searched so far, one part per segment
    (its rows: flat index, traffic, footprint bound, tiling) and the segment's tilings (per
    tiling: steps, cycles, on-chip Einsum bytes); a segment met later is added (a larger
    buffer fits longer ones, a lazy search costs more). A pick reads the contenders of the
    segments it asks for only (:meth:`contenders`).

    A table keeps every kept candidate until it holds more than :data:`UNFILTERED_ROWS` rows
    (memory); then its dominated candidates are dropped (:func:`_undominated`), and those of
    segments added later too. Filtering drops only candidates that never come first."""

    compute: Any
    models: list[GroupCostModel] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)  # id(model) -> its segment number
    parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    tilings: list[tuple[np.ndarray, ...]] = field(default_factory=list)  # per segment: steps, cycles, on-chip bytes
    filtered: bool = False
    size: int = 0  # rows in all parts
    # per buffer (None: no buffer), the segments' contenders there (:meth:`contenders`), most recent last
    fitted: dict[int | None, dict[int, tuple[np.ndarray, ...]]] = field(default_factory=dict)

    def _filter(self) -> None:
        """Drop the dominated candidates of every part (the same segments in the same order)."""
        models = self.models
        self.models, self.index, self.parts, self.tilings, self.size, self.filtered = [], {}, [], [], 0, True
        self.fitted = {}
        self.add(models)

    def add(self, models: list[GroupCostModel]) -> None:
        new = list({id(m): m for m in models if id(m) not in self.index}.values())
        if not self.filtered and self.size + batch_size(new) > UNFILTERED_ROWS:  # memory
            self._filter()
        part: list[GroupCostModel] = []
        rows = 0
        for m in new:  # in passes of at most PICK_PASS_ROWS kept candidates (memory), unless one holds more
            size = m.candidates().kept.size
            if part and rows + size > PICK_PASS_ROWS:
                self._add_pass(part)
                part, rows = [], 0
            part.append(m)
            rows += size
        if part:
            self._add_pass(part)

    def rows(self, segments: list[int]) -> tuple[np.ndarray, ...]:
        """The rows of ``segments`` (segment numbers), one after another: each row's position in
        ``segments``, then its flat index, traffic, footprint bound, steps, cycles, Einsums,
        on-chip Einsum bytes and tiling."""
        position, flat, traffic, fp, tiling = _concatenated([self.parts[s] for s in segments])
        steps, cycles, buffer = self._per_tiling(segments, self._tiling_starts(segments)[position] + tiling)
        return position, flat, traffic, fp, steps, cycles, self._einsums(segments)[position], buffer, tiling

    def _tiling_starts(self, segments: list[int]) -> np.ndarray:
        """Where each segment's tilings start in ``segments``' tilings one after another (and,
        last, how many there are in all)."""
        return np.cumsum([0] + [len(self.tilings[s][0]) for s in segments])

    def _per_tiling(self, segments: list[int], at: np.ndarray) -> list[np.ndarray]:
        """Steps, cycles and on-chip Einsum bytes at tilings ``at`` (numbered over ``segments``'
        tilings one after another, :meth:`_tiling_starts`)."""
        return [np.concatenate([self.tilings[s][k] for s in segments])[at] for k in range(3)]

    def _einsums(self, segments: list[int]) -> np.ndarray:
        return np.array([len(self.models[s].probe.einsums) for s in segments], dtype=np.int64)

    def contenders(self, segments: list[int], buffer_bytes: int | None) -> tuple[np.ndarray, ...]:
        """:meth:`rows` of ``segments`` restricted to the rows that can come first at
        ``buffer_bytes``: those whose footprint bound fits, and of those only the least traffic
        of each tiling, the only one of them that can come first
        (:func:`~mambalaya.search.candidates.least_traffic_fitting` says why). Kept per
        segment and buffer, for the :data:`FITTED_BUFFERS` buffers used last: the points of a
        sweep at other bandwidths, and the later rounds of a search, pick them again."""
        fitted = self.fitted.pop(buffer_bytes, None)
        if fitted is None:
            fitted = {}
            while len(self.fitted) >= FITTED_BUFFERS:
                del self.fitted[next(iter(self.fitted))]
        self.fitted[buffer_bytes] = fitted
        missing = [s for s in segments if s not in fitted]
        if missing:
            fitted.update(zip(missing, self._contenders(missing, buffer_bytes)))
        return _concatenated([fitted[s] for s in segments])

    def _contenders(self, segments: list[int], buffer_bytes: int | None) -> list[tuple[np.ndarray, ...]]:
        """Each segment's contenders (:meth:`contenders`), found in one pass over their rows; the
        per-tiling columns are read for the contenders only."""
        position, flat, traffic, fp, tiling = _concatenated([self.parts[s] for s in segments])
        starts = self._tiling_starts(segments)
        at = starts[position] + tiling  # one number per (segment, tiling)
        kept = least_traffic_fitting(at, int(starts[-1]), traffic, fp, buffer_bytes)
        position, tiling = position[kept], tiling[kept]
        steps, cycles, buffer = self._per_tiling(segments, at[kept])
        cols = (flat[kept], traffic[kept], fp[kept], steps, cycles, self._einsums(segments)[position], buffer, tiling)
        cuts = np.searchsorted(position, np.arange(len(segments) + 1))
        return [tuple(c[a:b] for c in cols) for a, b in zip(cuts[:-1], cuts[1:])]

    def _add_pass(self, new: list[GroupCostModel]) -> None:
        """Append the candidates of ``new`` (none in the table yet); in a filtered table only
        the undominated ones, found in one pass over all their candidates: a class is (model,
        steps, cycles, the Einsums' on-chip bytes), so that within a class every latency term
        grows with the traffic."""
        cands = [m.candidates() for m in new]
        tiling_cycles = ([np.zeros(c.n_tilings) for c in cands] if self.compute is None
                         else cycles_together(new, self.compute))
        tiling_buffer = ([np.zeros(c.n_tilings) for c in cands] if self.compute is None
                         else [m.tiling_buffer_bytes() for m in new])
        kept_start = np.cumsum([0] + [c.kept.size for c in cands])
        if self.filtered:
            tiling_class = _classes(np.concatenate([c.steps for c in cands]), np.concatenate(tiling_cycles),
                                    np.repeat(np.arange(len(new)), [c.n_tilings for c in cands]),
                                    np.concatenate(tiling_buffer))
            tiling_start = np.cumsum([0] + [c.n_tilings for c in cands])
            rows = _undominated(np.concatenate([c.kept_traffic for c in cands]),
                                np.concatenate([c.kept_fp for c in cands]),
                                np.concatenate([tiling_class[tiling_start[k] + c.kept_tiling] for k, c in enumerate(cands)]))
        else:
            rows = np.arange(kept_start[-1])
        cuts = np.searchsorted(rows, kept_start)
        for k, m in enumerate(new):
            self.index[id(m)] = len(self.models)
            self.models.append(m)
            c = cands[k]
            mine = rows[cuts[k]:cuts[k + 1]] - kept_start[k]
            if mine.size == c.kept.size:  # every kept candidate: the table's own arrays (read-only)
                self.parts.append((c.kept, c.kept_traffic, c.kept_fp, c.kept_tiling))
            else:
                self.parts.append((c.kept[mine], c.kept_traffic[mine], c.kept_fp[mine], c.kept_tiling[mine]))
            self.tilings.append((c.steps, tiling_cycles[k], tiling_buffer[k]))
            self.size += mine.size


def _concatenated(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Each row's position in ``parts``, then the parts' arrays concatenated column by column."""
    sizes = [len(p[0]) for p in parts]
    position = np.repeat(np.arange(len(parts)), sizes)
    return (position, *(np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))))


def _undominated(traffic: np.ndarray, fp: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """Positions (ascending) of the candidates no other of the same class ``cls`` (steps and
    compute cycles, :func:`_classes`) beats or equals in both traffic and footprint bound (an
    equal one of lower position excepted). Latency grows with the cycles and the traffic at equal steps, so a dropped
    candidate never comes first in the objective's order, for any buffer or bandwidth: its
    dominator fits whenever it does, and comes before it.

    Within a class (steps, cycles), in order of traffic (ties by position), a candidate is kept
    where its footprint is below every earlier one's; of a run of equal traffic only the last
    so kept (the least footprint, first among equals) stays: the order by traffic, footprint
    and position, for a sort on two keys instead of four."""
    if not len(traffic):
        return np.empty(0, dtype=np.int64)
    # by class, then traffic, then position: a stable sort on traffic, then stable ones on the
    # class (radix sorts on its two 16-bit halves), the same order as np.lexsort's, faster
    order = np.argsort(traffic, kind="stable")
    by_class = cls[order]
    if cls.max() < 1 << 32:  # two stable 16-bit radix passes (low half, then high half)
        order = order[np.argsort((by_class & 0xFFFF).astype(np.uint16), kind="stable")]
        order = order[np.argsort((cls[order] >> 16).astype(np.uint16), kind="stable")]
    else:
        order = order[np.argsort(by_class, kind="stable")]
    c, t, f = cls[order], traffic[order], fp[order]
    first = np.r_[True, c[1:] != c[:-1]]
    # one running minimum serves every class once each class's footprints are raised above
    # all later classes' (by whole multiples of a span above every footprint); where that
    # addition is not exact in floats, in 64-bit integers (whole footprints), else integer
    # ranks of the footprints instead
    span = float(f.max()) + 1.0
    raised = f + (c[-1] - c) * span
    if not np.array_equal(raised - (c[-1] - c) * span, f):
        if span * (float(c[-1]) + 1.0) < 2.0**62 and np.array_equal(f, np.floor(f)):
            raised = f.astype(np.int64) + (c[-1] - c) * np.int64(span)
        else:
            ranks = np.unique(f, return_inverse=True)[1].reshape(-1)
            raised = ranks + (c[-1] - c) * (len(f) + 1.0)
    before = np.empty_like(raised)  # the least raised footprint before each row (the first row is kept anyway)
    before[0] = raised[0]
    before[1:] = np.minimum.accumulate(raised)[:-1]
    kept = np.flatnonzero(first | (raised < before))
    superseded = (c[kept[1:]] == c[kept[:-1]]) & (t[kept[1:]] == t[kept[:-1]])
    return np.sort(order[kept[np.r_[~superseded, True]]])


def _classes(steps: np.ndarray, cycles: np.ndarray, model: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """An integer per tiling (of the models' concatenated tilings), equal where its model,
    steps, cycles and on-chip Einsum bytes are."""
    order = np.lexsort((buffer, cycles, steps, model))
    m, s, c, b = model[order], steps[order], cycles[order], buffer[order]
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(np.r_[False, (m[1:] != m[:-1]) | (s[1:] != s[:-1]) | (c[1:] != c[:-1]) | (b[1:] != b[:-1])])
    return ids


#: Kept candidates filtered in one pass when a pick table grows (memory: a pass holds a few
#: arrays of this many; one pass for all of a Mamba layer's groups at L = 2^20 took 26 MB more).
PICK_PASS_ROWS = 1 << 18

#: The most rows a pick table holds unfiltered (memory: four arrays of this many); past it, its
#: dominated candidates are dropped (see :class:`_Table`). Speed and memory only: the picks are
#: the same either way (``tests/test_closed_forms.py``). Filtering every table once it had
#: served 8 picks (until issue 29's last stop) cost more than it saved once a pick reads only
#: contenders: on the *any* sweep grid, 2 workers, the whole command took 8.0-8.3 s with it and
#: 7.6-7.8 s without (with :data:`FITTED_BUFFERS` at 1, 661 MB a worker against 676-692 MB).
#: An unfiltered table's parts are its cost models' own arrays (no copy), so what the bound
#: limits is the transient arrays a round of picks concatenates. At 2^20 rows a hybrid layer's
#: tables were filtered at every length: zamba2-2.7b's prefill (mambalaya, batch 64, at L 2048,
#: 4096, 131072 and 2^20 in one process) took 5.4, 3.7, 5.5 and 4.0 s at 381-592 MB peak; at
#: 2^23, 4.8, 3.3, 5.0 and 4.0 s at 407-637 MB.
UNFILTERED_ROWS = 1 << 23

#: Buffers whose contenders a pick table keeps (:meth:`_Table.contenders`), the most recently
#: used: a sweep's points are ordered by buffer within a layer, so one suffices (speed and
#: memory only; an unfiltered table's contenders are about three times a filtered one's).
FITTED_BUFFERS = 1

#: Above this many kept candidates in all, the segments are picked one by one (memory: the
#: table copies the undominated ones, about a sixth of them on the Mamba layers).
MAX_BATCH_CANDIDATES = 4_000_000


def batch_size(models: list[GroupCostModel]) -> int:
    return sum(m.candidates().kept.size for m in models)


def _table(models: list[GroupCostModel], compute: Any) -> _Table:
    """The layer's table on ``compute``, with ``models`` in it; memoised on the (immutable)
    cascade, like the candidate tables it is made of."""
    memo = models[0].cascade.__dict__.setdefault("_pick_tables_memo", {})
    key = None if compute is None else spec_key(compute)
    if key not in memo:
        memo[key] = _Table(compute)
    memo[key].add(models)
    return memo[key]


def row_latencies(arch: Any, traffic: np.ndarray, steps: np.ndarray, cycles: np.ndarray, n_einsums: np.ndarray,
                  buffer: np.ndarray, scan_s: Any = 0.0) -> np.ndarray:
    """Each candidate's latency on ``arch`` from its off-chip traffic, steps, compute cycles,
    Einsums, on-chip Einsum bytes and its group's scan floor (``scan_s``,
    :func:`~mambalaya.cost.latency.scan_floor_s`): :func:`~mambalaya.cost.latency.combine`, the
    same operations in the same order, so the same floats (``tests/test_closed_forms.py``
    compares them). The convex search's lower bounds use it too, without the floor, which only
    raises a latency (:mod:`mambalaya.search.convex_bounds`)."""
    comp = np.maximum(cycles / compute_hz(arch), scan_s)
    multi = steps > 1
    fill = arch.compute.pipeline_wind_up_cycles * n_einsums / arch.clock_hz * multi
    at_least_one = np.maximum(steps, 1)
    mem = traffic / offchip_bytes_per_s(arch)
    bw = arch.memory.buffer_bandwidth_bytes_per_cycle
    onchip = None if bw is None else (traffic + buffer) / (bw * arch.clock_hz)
    for level in arch.memory.levels.values():  # as latency.onchip_seconds charges them
        staged = traffic / (level.bytes_per_cycle * arch.clock_hz)
        onchip = staged if onchip is None else np.maximum(onchip, staged)
    if arch.memory.overlap_compute_and_memory:
        slowest = np.maximum(comp, mem) if onchip is None else np.maximum(np.maximum(comp, mem), onchip)
        latency = slowest + (np.minimum(comp, mem) / at_least_one * multi + fill)
    else:
        latency = (comp + mem if onchip is None else np.maximum(comp + mem, onchip)) + fill
    return np.maximum(latency, min_group_s(arch)) if min_group_s(arch) else latency


def segment_picks(models: list[GroupCostModel], buffer_bytes: int | None, arch: Any,
                  tie_tolerance: float) -> list[SegmentPick | None]:
    """The first candidate of each model's kept candidates in the objective's order (see the
    module doc), or None where no footprint bound fits the buffer."""
    table = _table(models, None if arch is None else arch.compute)
    segments = list(dict.fromkeys(table.index[id(m)] for m in models))
    # only the rows whose footprint bound fits compete, and of a tiling only its least traffic
    segment, flat, traffic, fp, steps, cycles, n_einsums, buffer, _ = table.contenders(segments, buffer_bytes)
    picks: list[SegmentPick | None] = [None] * len(models)
    if not len(segment):
        return picks
    latency = None
    if arch is None:
        rows, keys = np.arange(len(segment)), (traffic, steps, fp)
    else:
        floors = np.array([scan_floor_s(arch, table.models[s].cascade, table.models[s].probe.einsums)
                           for s in segments])  # by position in segments, as ``segment`` numbers them
        latency = row_latencies(arch, traffic, steps, cycles, n_einsums, buffer, floors[segment])
        firsts = _run_starts(segment)
        best = np.repeat(np.minimum.reduceat(latency, firsts), np.diff(np.append(firsts, len(segment))))
        rows, keys = np.flatnonzero(latency <= best * (1 + tie_tolerance)), (traffic, steps, latency, fp)
    if rows.size == 0:
        return picks
    for key in keys:  # narrow the rows of each segment to those least in each key in turn
        values = key[rows]
        seg = segment[rows]
        firsts = _run_starts(seg)
        least = np.minimum.reduceat(values, firsts)
        rows = rows[values == np.repeat(least, np.diff(np.append(firsts, len(rows))))]
    rows = rows[_run_starts(segment[rows])]  # the lowest index left in each segment
    latencies = [None] * len(rows) if latency is None else latency[rows].tolist()
    found = {segments[k]: SegmentPick(f, t, b, lat) for k, f, t, b, lat in zip(
        segment[rows].tolist(), flat[rows].tolist(), traffic[rows].tolist(), fp[rows].tolist(), latencies)}
    return [found.get(table.index[id(m)]) for m in models]


def _run_starts(values: np.ndarray) -> np.ndarray:
    """Positions where a run of equal values starts (the first always; ``values`` non-empty)."""
    change = np.empty(len(values), dtype=bool)
    change[0] = True
    np.not_equal(values[1:], values[:-1], out=change[1:])
    return np.flatnonzero(change)


__all__ = ["MAX_BATCH_CANDIDATES", "SegmentPick", "batch_size", "row_latencies", "segment_picks"]
