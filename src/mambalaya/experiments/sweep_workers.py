"""What a sweep's own local worker processes set for themselves (:func:`tune_allocator`,
:func:`tune_collector`), and the order the coordinator hands them chunks in
(:class:`Costliest`). Speed only: no number a point gets depends on either."""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
from collections import Counter
from typing import Any, Callable

from mambalaya.experiments.store import PointResult


#: glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD and M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: The values a sweep's own workers run with: arrays up to 32 MiB come from the heap (a
#: candidate-table pass holds at most BUILD_BATCH_CELLS = 2^20 cells, 8 MiB an array), and up to
#: 64 MiB of freed heap is kept for the next ones, not handed back. Measured choices, not model
#: constants: with the trim threshold alone (the mmap threshold left at glibc's 128 KiB) the
#: page faults went up fourfold, with the mmap threshold alone up by two thirds.
ALLOCATOR_MMAP_THRESHOLD_BYTES = 32 << 20
ALLOCATOR_TRIM_THRESHOLD_BYTES = 64 << 20


@functools.lru_cache(maxsize=1)
def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one, else the
    machine's count): how many local worker processes a run starts by default, the sweep's and
    the hybrid suite's alike."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def tune_allocator() -> bool:
    """Have glibc's malloc keep the memory of freed numpy arrays for the next ones, in this
    process (a worker of the sweep's own cluster); True where mallopt accepted both
    thresholds (``tests/test_sweep.py`` checks their effect). By default each
    large temporary of the candidate tables (hundreds of kilobytes to megabytes) is mapped
    afresh or handed back when freed, and each page is faulted in and zeroed again: a realistic
    sweep (coordinator and workers) took 270,000–290,000 page faults and about 0.9 s of system
    time, about half of that with these thresholds (docs/sweeps.md). Elsewhere (not Linux, or a C library without
    mallopt) nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD_BYTES) == 1)


#: The young-generation threshold of the cyclic garbage collector in a sweep's own workers
#: (Python's default is 700 allocations): a point allocates hundreds of thousands of short-lived
#: objects that reference counting frees, and each young collection traverses the objects
#: allocated since the last. Measured, not a model constant: the *any* grid in one process took
#: 16.0 s of CPU with the default and 15.6 s with this (15.7 s with the collector off).
COLLECTOR_YOUNG_THRESHOLD = 50_000


@functools.lru_cache(maxsize=1)
def tune_collector() -> tuple[int, ...]:
    """Raise this process's young-generation collection threshold to
    :data:`COLLECTOR_YOUNG_THRESHOLD` (once: a worker of the sweep's own cluster or of the hybrid
    suite, and every command's own process, :func:`mambalaya.cli.common.user_errors`); returns
    the thresholds now set. On zamba2-2.7b's prefill, one length after another in one process,
    an evaluation took 4.2-4.4 s with the default threshold and 3.7-4.0 s with this. Cycles among a chunk's garbage are still collected, only less often;
    what a chunk keeps (its layers' memos, which do refer back to their cascades) is not
    garbage, and is frozen once the chunk ends (:func:`_chunk_task`)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(COLLECTOR_YOUNG_THRESHOLD, middle, old)
    return gc.get_threshold()


def run_tuned(task: Callable[..., Any], *args: Any) -> Any:
    """``task(*args)`` in a worker process a run starts itself (the sweep's own cluster, the
    hybrid suite's pool), tuned first (:func:`tune_allocator`, :func:`tune_collector`); what the
    task leaves behind (its layers' memos, which live as long as the worker) is moved out of the
    cyclic collector's reach afterwards (:func:`gc.freeze`, after a young collection), so that
    no full collection traverses it again. Speed only: the result is the task's."""
    tune_allocator()
    tune_collector()
    result = task(*args)
    gc.collect(1)
    gc.freeze()
    return result


class Costliest:
    """Which pending chunk to submit next. First, in the chunks' order, one chunk of each model
    and phase not submitted yet (so that every kind is measured early); then the one whose
    points are expected to take longest, at the seconds per point measured so far for each of
    their models and phases (a kind submitted but not yet measured counts as the slowest
    measured)."""

    def __init__(self, chunks: list[list[dict[str, Any]]]) -> None:
        self.kinds = [Counter(self._kind(p) for p in chunk) for chunk in chunks]  # points per kind, per chunk
        self.pending = list(range(len(chunks)))
        self.seconds: dict[tuple[str, str], list[float]] = {}
        self.submitted: set[tuple[str, str]] = set()

    @staticmethod
    def _kind(point: dict[str, Any]) -> tuple[str, str]:
        return str(point.get("model")), str(point.get("phase"))

    def learn(self, results: list[PointResult]) -> None:
        for r in results:
            total = self.seconds.setdefault(self._kind(r.point), [0.0, 0])
            total[0] += r.seconds
            total[1] += 1

    def take(self) -> int:
        new = [j for j in self.pending if not self.submitted.issuperset(self.kinds[j])]
        k = new[0] if new else self.pending[0]
        if not new and self.seconds:
            rates = {kind: s / n for kind, (s, n) in self.seconds.items()}
            slowest = max(rates.values())
            expected = [sum(n * rates.get(kind, slowest) for kind, n in self.kinds[j].items()) for j in self.pending]
            k = self.pending[max(range(len(expected)), key=lambda i: (expected[i], -i))]
        self.pending.remove(k)
        self.submitted.update(self.kinds[k])
        return k
