"""The picks of many candidate groups at once: for every segment of a search, the candidate its
objective ranks first, computed over the concatenated candidate tables with a handful of numpy
passes instead of one short pass per segment.

It answers the same question as :func:`mambalaya.model.search._pick` on the kept candidates, in
the same order: with an architecture, the least latency (candidates within the tie tolerance of
a segment's best tie), then the least traffic, the fewest steps, the least latency, the least
footprint and the lowest index; without one, the least traffic, the fewest steps, the least
footprint and the lowest index; only candidates whose footprint bound fits the buffer compete.
The caller checks each pick's legality and re-costs the rare segment whose first pick breaks a
rule with the single-segment search (``tests/test_search.py`` compares the two).

Only the latency objective without an on-chip bandwidth, and the traffic objective, are picked
here: the others rank by the on-chip bytes too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from mambalaya.arch.spec import spec_key
from mambalaya.model.candidates import GroupCostModel
from mambalaya.model.latency import combine


@dataclass(frozen=True)
class SegmentPick:
    """The first candidate of one segment: its flat index in the segment's full table and its
    closed-form costs (latency None without an architecture)."""

    flat: int
    traffic_bytes: float
    footprint_bound_bytes: float
    latency_s: float | None


@dataclass(frozen=True)
class _Table:
    """The kept candidates of several segments, concatenated in segment order."""

    starts: np.ndarray  # first row of each segment
    segment: np.ndarray  # the segment of each row
    local: np.ndarray  # each row's position in its segment's kept candidates
    traffic: np.ndarray
    fp: np.ndarray
    steps: np.ndarray
    cycles: np.ndarray | None  # on the compute section the table was built for
    n_einsums: np.ndarray


#: Concatenated tables kept for reuse (a sweep runs several points of one layer and buffer in a
#: row); a few, since each holds every kept candidate of a layer again.
_TABLES: OrderedDict[tuple, tuple[Any, _Table]] = OrderedDict()
_TABLES_KEPT = 4

#: Above this many kept candidates in all, the segments are picked one by one (memory: a
#: concatenated table costs about 40 bytes per candidate).
MAX_BATCH_CANDIDATES = 4_000_000


def batch_size(models: list[GroupCostModel]) -> int:
    return sum(m.candidates().kept.size for m in models)


def _table(models: list[GroupCostModel], compute: Any) -> _Table:
    key = (id(models[0].cascade), tuple((m.probe.einsums, tuple(m.ranks)) for m in models),
           None if compute is None else spec_key(compute))
    hit = _TABLES.get(key)
    if hit is not None:
        _TABLES.move_to_end(key)
        return hit[1]
    cands = [m.candidates() for m in models]
    sizes = np.array([c.kept.size for c in cands])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    segment = np.repeat(np.arange(len(models)), sizes)
    table = _Table(
        starts=starts,
        segment=segment,
        local=np.arange(int(sizes.sum())) - starts[segment],
        traffic=np.concatenate([c.kept_traffic for c in cands]),
        fp=np.concatenate([c.kept_fp for c in cands]),
        steps=np.concatenate([c.steps[c.kept_tiling] for c in cands]),
        cycles=None if compute is None else np.concatenate(
            [m.cycles(compute)[c.kept_tiling] for m, c in zip(models, cands)]),
        n_einsums=np.repeat(np.array([len(m.probe.einsums) for m in models]), sizes),
    )
    _TABLES[key] = (models[0].cascade, table)  # the cascade is held so its id stays unique
    while len(_TABLES) > _TABLES_KEPT:
        _TABLES.popitem(last=False)
    return table


def segment_picks(models: list[GroupCostModel], buffer_bytes: int | None, arch: Any,
                  tie_tolerance: float) -> list[SegmentPick | None]:
    """The first candidate of each model's kept candidates in the objective's order (see the
    module doc), or None where no footprint bound fits the buffer."""
    t = _table(models, None if arch is None else arch.compute)
    n = len(t.traffic)
    ok = np.ones(n, dtype=bool) if buffer_bytes is None else t.fp <= buffer_bytes
    latency = None
    if arch is None:
        mask, keys = ok, (t.traffic, t.steps, t.fp)
    else:
        comp = t.cycles / arch.clock_hz
        mem = t.traffic / arch.memory.offchip_bandwidth_bytes_per_s
        latency, _ = combine(arch, comp, mem, 0.0 * t.traffic, t.steps, t.n_einsums)
        best = np.minimum.reduceat(np.where(ok, latency, np.inf), t.starts)
        mask = ok & (latency <= best[t.segment] * (1 + tie_tolerance))
        keys = (t.traffic, t.steps, latency, t.fp)
    rows = np.flatnonzero(mask)
    picks: list[SegmentPick | None] = [None] * len(models)
    if rows.size == 0:
        return picks
    for key in keys:  # narrow the rows of each segment to those least in each key in turn
        values = key[rows]
        seg = t.segment[rows]
        firsts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        least = np.minimum.reduceat(values, firsts)
        rows = rows[values == np.repeat(least, np.diff(np.r_[firsts, len(rows)]))]
    seg = t.segment[rows]
    rows = rows[np.r_[True, seg[1:] != seg[:-1]]]  # the lowest index left in each segment
    cands = [m.candidates() for m in models]
    for row in rows.tolist():
        s = int(t.segment[row])
        local = int(t.local[row])
        picks[s] = SegmentPick(int(cands[s].kept[local]), float(t.traffic[row]), float(t.fp[row]),
                               None if latency is None else float(latency[row]))
    return picks


__all__ = ["MAX_BATCH_CANDIDATES", "SegmentPick", "batch_size", "segment_picks"]
