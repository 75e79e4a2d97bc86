"""Design-space sweeps: a grid of points, evaluated in parallel, stored as they finish.

A sweep spec (YAML)::

    name: bandwidth-vs-buffer
    store: sweep.sqlite             # relative to the spec file; --store overrides
    chunk_size: 32                  # points per task (default 32)
    grid:                           # the cartesian product of every list is the sweep
      arch: [mambalaya, marca-ideal]                      # shipped design or arch YAML
      memory.offchip_bandwidth_bytes_per_s: [1e12, 2039e9, 4e12]   # any arch field, dotted
      memory.onchip_buffer_bytes: [8MiB, 32MiB, 128MiB]
      model: [mamba-370m, mamba-1.4b]
      phase: [prefill, decode]
      seq_len: [2048, 16384]
      batch: [64]
      mapping: [default]            # default = the design's own; or unfused, ssm-ri, stitched, optimal, optimal-convex, ideal
    fixed:                          # optional: values every point shares
      compute.mfu_units: 2048
      precision: reference-kernels  # or swept: precision: [uniform, reference-kernels]

Points run in worker processes on this machine by default (the standard library's
``ProcessPoolExecutor``), or on an existing Dask cluster given by ``--scheduler
tcp://HOST:PORT`` (Dask's ``concurrent.futures`` executor); the code path is the same: points
go out in chunks sorted so a chunk shares its cascade, submitted to the executor, and the
coordinator writes each chunk's rows to the :class:`~mambalaya.experiments.store.ResultStore`
in one transaction as it arrives. A rerun skips the points already stored (a spec that grows
its grid adds only the new points); a point that fails (an impossible configuration) is
stored with its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import multiprocessing
import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.evaluate import CostedLayers
from mambalaya.experiments.sweep_spec import FILES_KEY, NON_ARCH_KEYS, SweepSpec, load_sweep_spec, point_value_problem
from mambalaya.experiments.store import PointResult, ResultStore, check_point_outputs, model_fingerprint, point_id
from mambalaya.experiments.sweep_workers import Costliest, run_tuned, usable_cores
from mambalaya.workloads import has_scan_forms
from mambalaya.workloads.families.base import is_hybrid

# ----------------------------------------------------------------------------------------------
# the work of one point (runs on a worker)
# ----------------------------------------------------------------------------------------------

_CASCADES: dict[tuple, Any] = {}
#: Layers whose cascades (and memos) a worker keeps; past it they are all dropped (memory).
KEPT_CASCADES = 64
#: A worker's hybrid layers costed so far (:class:`~mambalaya.experiments.evaluate.CostedLayers`):
#: a decode point's Mamba, MLP or MoE layer at another context length, on the same design, is
#: not searched again. Speed only: the same inputs give the same numbers. The most kept, for memory.
HYBRID_LAYERS = CostedLayers(limit=4096)
_ARCHS: dict[tuple, Any] = {}


_POINT_ARCHS: dict[tuple, Any] = {}


def _arch_for(point: dict[str, Any]):
    """The point's architecture: its design with the point's architecture fields set. Memoised
    per design and field values (types included: strict validation tells 1 from 1.0), since
    the points of other layers repeat them; the spec is frozen, so sharing it is safe."""
    key = (point["arch"], point.get(FILES_KEY),
           tuple(sorted((k, type(v).__name__, v) for k, v in point.items() if k not in NON_ARCH_KEYS)))
    try:
        hash(key)
    except TypeError:  # a value that is not a scalar: left to the spec's own error
        return _build_arch(point)
    if key not in _POINT_ARCHS:
        if len(_POINT_ARCHS) > 1024:
            _POINT_ARCHS.clear()
        _POINT_ARCHS[key] = _build_arch(point)
    return _POINT_ARCHS[key]


def _build_arch(point: dict[str, Any]):
    from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch, set_fields

    base = point["arch"]
    read = (base, point.get(FILES_KEY))  # a design file is read again once its bytes change
    if read not in _ARCHS:
        _ARCHS[read] = arch_to_dict(load_arch(base))
    data = set_fields(json.loads(json.dumps(_ARCHS[read])), {k: v for k, v in point.items() if k not in NON_ARCH_KEYS})
    return arch_from_dict(data, source=f"point {point_id(point)}")


def point_sizes(point: dict[str, Any]) -> tuple[int, int]:
    """A point's ``seq_len`` and ``batch``, each an integer from 1 to 2^53, or a
    :class:`SpecError` (a fraction is never truncated to a size)."""
    for key in ("seq_len", "batch"):
        problem = point_value_problem(key, point[key])
        if problem:
            raise SpecError(f"point {point_id(point)}: {key}: {problem}")
    return point["seq_len"], point["batch"]


def evaluate_point(point: dict[str, Any]) -> dict[str, Any]:
    """Every output figure of one point (raises on an impossible configuration)."""
    from mambalaya.experiments.evaluate import require_fits, run_scan_forms
    from mambalaya.workloads import resolve_model

    seq_len, batch = point_sizes(point)
    arch = _arch_for(point)
    config = resolve_model(str(point["model"]))
    devices, parallel = point.get("devices", 1), point.get("parallel")
    if is_hybrid(config):
        from mambalaya.experiments.hybrid import evaluate_hybrid, point_outputs

        hv = evaluate_hybrid(arch, str(point["model"]), config, phase=str(point["phase"]), seq_len=seq_len,
                             batch=batch, mapping=None if point["mapping"] == "default" else point["mapping"],
                             reuse=HYBRID_LAYERS, devices=devices, parallel=parallel)
        return {**point_outputs(hv), "buffer_bytes": arch.memory.onchip_buffer_bytes,
                "pes": arch.compute.array_rows * arch.compute.array_cols,
                "bandwidth_bytes_per_s": arch.memory.offchip_bandwidth_bytes_per_s}
    if devices > 1 or parallel is not None or arch.cores is not None:  # (a multi-core chip: its cores)
        return _devices_outputs(arch, point, config, seq_len=seq_len, batch=batch, devices=devices, parallel=parallel)
    require_fits(arch, str(point["model"]), config, batch=batch, seq_len=seq_len)  # over the DRAM: a failed point
    if not has_scan_forms(config) or point["phase"] != "prefill":
        return _one_device_outputs(arch, point, config, seq_len=seq_len, batch=batch, scan=None)
    found, errors = run_scan_forms(lambda form: _one_device_outputs(arch, point, config, seq_len=seq_len, batch=batch,
                                                                    scan=form))  # the faster, as every command runs
    if not found:
        raise MambalayaError(f"no scan form maps ({'; '.join(errors)})")
    return min(found, key=lambda outputs: outputs["model_latency_s"])


def _one_device_outputs(arch: Any, point: dict[str, Any], config: Any, *, seq_len: int, batch: int,
                        scan: str | None) -> dict[str, Any]:
    """A one-device point's outputs in one scan form (``scan``: a prefill's with two scan forms, else None),
    its layer built once per model, phase, sizes, width, policy and form and searched per design."""
    from mambalaya.experiments.evaluate import resolve_policy
    from mambalaya.search.memos import forget_results
    from mambalaya.cost.latency import layer_latency
    from mambalaya.search.mappings import named_mapping
    from mambalaya.workloads import build_layer

    key = (point["model"], point.get(FILES_KEY), point["phase"], seq_len, batch, arch.bits_per_element,
           arch.precision, scan)
    if key not in _CASCADES:
        if len(_CASCADES) > KEPT_CASCADES:
            for kept in _CASCADES.values():
                forget_results(kept)  # their memos refer back to them: freed now, not frozen (_chunk_task)
            _CASCADES.clear()
        _CASCADES[key] = build_layer(config, phase=point["phase"], seq_len=seq_len,
                                     batch=batch, bits=arch.bits_per_element,
                                     precision=resolve_policy(arch, None), **({"scan": scan} if scan else {}))
    cascade = _CASCADES[key]
    name = arch.mappings.default if point["mapping"] == "default" else point["mapping"]
    buffer = None if name == "ideal" else arch.memory.onchip_buffer_bytes
    mapping = named_mapping(name, cascade, buffer, arch=arch)
    r = layer_latency(arch, cascade, mapping, n_layers=config.n_layers, per_einsum=False)
    return {
        **(_power_outputs(arch, cascade, mapping, r) if arch.energy is not None else {}),
        "latency_s": r.latency_s,
        "model_latency_s": r.model_latency_s,
        "offchip_bytes": r.offchip_bytes,
        "compute_util": r.compute_util,
        "mem_util": r.mem_util,
        "tokens_per_s": r.tokens_per_s,
        "groups": len(r.groups),
        "peak_footprint_bytes": max(g.traffic.footprint_bytes for g in r.groups),
        "buffer_bytes": arch.memory.onchip_buffer_bytes,
        "pes": arch.compute.array_rows * arch.compute.array_cols,
        "bandwidth_bytes_per_s": arch.memory.offchip_bandwidth_bytes_per_s,
        "mapping_used": mapping.name,
        **({"scan_used": scan} if scan else {}),
    }


def _devices_outputs(arch: Any, point: dict[str, Any], config: Any, *, seq_len: int, batch: int, devices: int,
                     parallel: str | None) -> dict[str, Any]:
    """A point over several devices (``devices``, ``parallel``), or on a multi-core chip: the
    whole evaluation (:func:`~mambalaya.experiments.evaluate.evaluate`). Its latency, energy and
    throttled latency per layer are the model's over its layers (the collectives and every
    device's energy and links included), as a hybrid model's are (:func:`~mambalaya.experiments.hybrid.point_outputs`;
    they were one device's part of a layer here, the model's mean there: one column, two
    meanings in one store); its utilisations one device's (core's), its off-chip bytes a chip's."""
    from mambalaya.experiments.evaluate import evaluate_best_scan, scan_form

    ev = evaluate_best_scan(arch, str(point["model"]), config, phase=str(point["phase"]), seq_len=seq_len, batch=batch,
                            mapping=None if point["mapping"] == "default" else point["mapping"], devices=devices,
                            parallel=parallel)
    t = ev.totals()
    n = config.n_layers
    energy = {} if arch.energy is None else {
        "layer_energy_j": t["model_energy_j"] / n, "energy_per_token_j": t["energy_per_token_j"],
        "average_power_w": t["average_power_w"], "layer_power_w": t["layer_power_w"],
        "power_budget_w": t["power_budget_w"], "over_power_budget": t["over_power_budget"],
        "throttled_latency_s": t["throttled_model_latency_s"] / n}
    return {**energy, "latency_s": t["model_latency_s"] / n,
            **{k: t[k] for k in ("model_latency_s", "compute_util", "mem_util", "tokens_per_s", "groups")},
            "offchip_bytes": t["offchip_bytes"] * ev.layer_parts,
            "peak_footprint_bytes": max(g.traffic.footprint_bytes for g in ev.result.groups),
            "buffer_bytes": arch.memory.onchip_buffer_bytes, "pes": arch.compute.array_rows * arch.compute.array_cols,
            "bandwidth_bytes_per_s": arch.memory.offchip_bandwidth_bytes_per_s, "mapping_used": ev.mapping.name,
            "devices": t.get("devices", 1), "parallel_used": t.get("parallel", "pipeline"),
            "interconnect_s": t.get("interconnect_s", 0.0),
            **({"scan_used": scan_form(ev.cascade)} if has_scan_forms(config)
               and point["phase"] == "prefill" else {})}


def _power_outputs(arch: Any, cascade: Any, mapping: Any, result: Any) -> dict[str, Any]:
    """A point's energy, average power against the design's budget, and throttled latency, from
    the groups' dynamic energies (memoised across the points that share them) and the leakage
    over the layer's latency (:func:`~mambalaya.cost.energy.layer_energy_totals`)."""
    from mambalaya.experiments.evaluate import over_budget
    from mambalaya.cost.energy import layer_energy_totals

    energy = layer_energy_totals(arch, cascade, mapping, result)
    return {"layer_energy_j": energy.layer_j, "energy_per_token_j": energy.per_token_j,
            "average_power_w": energy.average_power_w, "layer_power_w": energy.average_power_w,
            "power_budget_w": arch.power_budget_w,
            "over_power_budget": over_budget(energy.average_power_w, arch.power_budget_w),
            "throttled_latency_s": energy.throttled_latency_s}


def evaluate_chunk(points: list[dict[str, Any]]) -> list[PointResult]:
    """Evaluate points one by one; a failing point is returned with its error, not raised (a
    point whose outputs would leave a store column empty, :func:`check_point_outputs`, too)."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    out = []
    for p in points:
        t0 = time.perf_counter()
        try:
            outputs, error = evaluate_point(p), None
            check_point_outputs(outputs, point=point_id(p))
        except MambalayaError as err:
            outputs, error = None, str(err)
        except Exception as err:  # noqa: BLE001 - a sweep records every failure and goes on
            outputs, error = None, f"{type(err).__name__}: {err}"
        out.append(PointResult(point_id(p), p, outputs, error, time.perf_counter() - t0, worker))
    return out


def _chunk_task(points: list[dict[str, Any]], *, own_worker: bool = False) -> list[PointResult]:
    """A cluster task: :func:`evaluate_chunk`. With ``own_worker`` (set for the worker
    processes a sweep starts itself, which live only as long as it), it runs tuned
    (:func:`~mambalaya.experiments.sweep_workers.run_tuned`: the allocator and collector tuned
    first, what the chunk leaves behind frozen afterwards). What it leaves is the memos of its layers (cascades, cost models, candidate
    tables: some 25,000 objects a layer) and they live as long as the worker; every full
    collection would traverse them all again, about 0.6 s of a 6.8 s realistic sweep
    (docs/sweeps.md). A cascade and its memos refer to each other, so a cascade the worker
    drops (past :data:`KEPT_CASCADES`) has its memos dropped first, and reference counting frees
    them (frozen, a cycle would stay for the worker's life)."""
    return run_tuned(evaluate_chunk, points) if own_worker else evaluate_chunk(points)


# ----------------------------------------------------------------------------------------------
# the coordinator
# ----------------------------------------------------------------------------------------------


#: The point id a failure's message starts with: errors are counted without it.
_POINT_PREFIX = re.compile(r"^point [0-9a-f]+: ")


@dataclass
class SweepSummary:
    store: Path
    total: int
    already_done: int
    computed: int = 0
    failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    #: How many points failed with each error message.
    error_counts: Counter[str] = field(default_factory=Counter)
    #: How many computed points draw more than their design's power budget.
    over_power_budget: int = 0
    #: The tasks the points to compute go out in, and the local worker processes running them
    #: (None on a Dask cluster, which schedules its own).
    chunks: int = 0
    workers: int | None = None
    #: Seconds the points computed so far took, summed over the workers that computed them.
    point_seconds: float = 0.0

    @property
    def points_per_s(self) -> float:
        return self.computed / self.seconds if self.seconds else 0.0

    @property
    def to_compute(self) -> int:
        """Points of the spec not in the store when the sweep started."""
        return self.total - self.already_done

    def estimate_s(self) -> float | None:
        """Seconds the points not yet computed are expected to take, from those computed so
        far: their mean seconds a point (on one worker) times the points left, over the local
        workers (on a Dask cluster: worker-seconds, its workers not being counted). None before
        any point is measured. A rough guide: points of other models, lengths and designs than
        those measured may take longer or shorter."""
        if not self.computed:
            return None
        left = self.to_compute - self.computed
        return self.point_seconds / self.computed * left / (self.workers or 1)

    @property
    def all_failed(self) -> bool:
        """Whether this run computed points and every one of them failed."""
        return self.computed > 0 and self.failed == self.computed

    def commonest_errors(self, n: int = 3) -> list[tuple[str, int]]:
        return self.error_counts.most_common(n)


def _layer_key(p: dict[str, Any]) -> tuple:
    """What a point's cascade depends on (besides the arch's width and precision fields)."""
    return (str(p["model"]), str(p["phase"]), int(p["seq_len"]), int(p["batch"]), str(p.get("precision", "")))


def _chunks(points: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Tasks of about ``size`` points, sorted so a task shares its cascade. The points of one
    layer stay in one task up to 4 x ``size`` (its worker then builds the layer's candidate
    tables once, where two workers would each build them); a larger layer is split evenly.
    Within a layer and design, the points of one buffer size are next to each other: a pick
    table keeps the contenders of the buffer used last (:data:`~mambalaya.search.picks.FITTED_BUFFERS`)."""
    key = lambda p: (*_layer_key(p), str(p["mapping"]), str(p["arch"]),  # noqa: E731
                     str(p.get("memory.onchip_buffer_bytes", "")))
    ordered = sorted(points, key=key)
    layers: list[list[dict[str, Any]]] = []
    for p in ordered:
        if layers and _layer_key(layers[-1][-1]) == _layer_key(p):
            layers[-1].append(p)
        else:
            layers.append([p])
    chunks: list[list[dict[str, Any]]] = []
    for layer in layers:
        if len(layer) > 4 * size:
            parts = -(-len(layer) // size)
            step = -(-len(layer) // parts)
            chunks.extend(layer[i : i + step] for i in range(0, len(layer), step))
        elif chunks and len(chunks[-1]) + len(layer) <= size and len(chunks[-1]) < size // 2:
            chunks[-1].extend(layer)  # small layers share a task
        else:
            chunks.append(list(layer))
    return chunks


def open_client(scheduler: str):
    """A Dask client on the existing cluster at ``scheduler`` (tcp://HOST:PORT)."""
    from distributed import Client

    try:
        return Client(scheduler, timeout="10s")
    except (OSError, TimeoutError) as err:
        raise MambalayaError(f"cannot reach the Dask scheduler at {scheduler}: {err}") from None


#: Times a local sweep replaces its worker processes after one died (killed: out of memory, a
#: signal) and runs the chunks not yet stored again, before it gives up with an error.
LOCAL_POOL_RESTARTS = 3


def _worker_start_method() -> str:
    """How the local worker processes start. On Linux they are forked from this process, which
    has already imported mambalaya and numpy: two workers are ready in milliseconds, where
    spawned ones each import everything again (about 2 s here, a large part of a short sweep).
    Elsewhere (macOS, Windows), where forking a process with threads is unsafe or impossible,
    spawn. ``MAMBALAYA_SWEEP_START_METHOD`` (fork, spawn or forkserver) overrides both."""
    chosen = os.environ.get("MAMBALAYA_SWEEP_START_METHOD")
    if chosen:
        if chosen not in multiprocessing.get_all_start_methods():
            raise MambalayaError(f"MAMBALAYA_SWEEP_START_METHOD={chosen!r} is not a start method of this platform "
                                 f"({', '.join(multiprocessing.get_all_start_methods())})")
        return chosen
    return "fork" if sys.platform.startswith("linux") else "spawn"


_PR_SET_PDEATHSIG = 1  # prctl(2)


def _init_worker(parent: int) -> None:
    """In each local worker process: end with the sweep. SIGTERM ends it at once (a handler
    inherited from the coordinator by the fork is dropped: a broken pool stops its surviving
    workers with SIGTERM), and Ctrl-C is left to the coordinator, which stops the pool. On
    Linux the kernel sends it SIGTERM when the process that started it dies (a killed sweep
    leaves no worker behind); elsewhere the pool's own shutdown ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the sweep died before the line above took effect
            os._exit(1)


@contextlib.contextmanager
def _local_pool(workers: int) -> Iterator[Executor]:
    """A pool of ``workers`` local worker processes. Forked (:func:`_worker_start_method`),
    they start with this process's objects frozen (:func:`gc.freeze`: their cyclic collections
    need not traverse the modules and the spec they inherit); here they are thawed again when
    the pool ends, unless the caller had frozen objects of its own."""
    thaw = gc.get_freeze_count() == 0
    gc.freeze()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(_worker_start_method()),
                               initializer=_init_worker, initargs=(os.getpid(),))
    try:
        yield pool
    finally:
        if thaw:
            gc.unfreeze()
        pool.shutdown(wait=True, cancel_futures=True)


#: How many times a chunk is submitted to a Dask cluster before its failure is the sweep's.
CLUSTER_TRIES = 3


def _submit_chunks(executor: Executor, chunks: list[list[dict[str, Any]]], own_worker: bool,
                   record: Callable[[int, list[PointResult]], None], in_flight: int | None = None) -> None:
    """Submit the chunks to ``executor`` (its :func:`_chunk_task`) and ``record(index,
    results)`` each as it finishes: the one run loop of local and cluster sweeps. With
    ``in_flight`` (a local pool: its workers plus one queued), only that many are submitted at
    a time, the next being the one :class:`_Costliest` expects to take longest, so that the last
    chunks to run are short ones and no worker waits long for the other at the end (a
    scheduling choice only: every chunk runs once, whatever the order). Otherwise (a Dask
    cluster, which schedules its own queue) all at once, in order."""
    if in_flight is None:
        futures = {executor.submit(_chunk_task, chunk, own_worker=own_worker): k for k, chunk in enumerate(chunks)}
        tries = dict.fromkeys(range(len(chunks)), 1)
        while futures:
            for fut in as_completed(list(futures)):
                k = futures.pop(fut)
                try:
                    results = fut.result()
                except Exception:  # a chunk catches its points' errors: this is the cluster's (a worker
                    if tries[k] >= CLUSTER_TRIES:  # lost mid-task; distributed's executor once raised a
                        raise  # ValueError of its own for it): submitted again, a few times
                    tries[k] += 1
                    futures[executor.submit(_chunk_task, chunks[k], own_worker=own_worker)] = k
                    continue
                record(k, results)
        return
    costliest = Costliest(chunks)
    running: dict[Any, int] = {}
    while costliest.pending or running:
        while costliest.pending and len(running) < in_flight:
            k = costliest.take()
            running[executor.submit(_chunk_task, chunks[k], own_worker=own_worker)] = k
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for fut in finished:
            results = fut.result()
            costliest.learn(results)
            record(running.pop(fut), results)


def run_sweep(
    spec: SweepSpec,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    on_progress: Callable[[int, int, SweepSummary], None] | None = None,
    client=None,
) -> SweepSummary:
    """Evaluate every point of ``spec`` not yet in its store; return a summary.

    Locally (the default) on ``workers`` processes (default: one per core; with one, in this
    process); with ``scheduler`` (or a Dask ``client``, which a caller or a test brings), on
    that Dask cluster. ``on_progress(done, total, summary)`` is called once before any point
    runs (the summary holds the points to compute, their chunks and the workers) and after each
    chunk is stored (:meth:`SweepSummary.estimate_s` then estimates the time left).
    """
    t0 = time.perf_counter()
    points = spec.points()
    with ResultStore(spec.store, fingerprint=model_fingerprint()) as store:
        done = store.done_ids()
        todo = [p for p in points if point_id(p) not in done]
        chunks = _chunks(todo, spec.chunk_size)
        on_cluster = client is not None or bool(scheduler)
        local_workers = min(workers or usable_cores(), len(chunks))
        summary = SweepSummary(spec.store, len(points), len(points) - len(todo), chunks=len(chunks),
                               workers=None if on_cluster else local_workers)
        if on_progress:  # (before any point runs: the count, chunks and workers)
            on_progress(summary.already_done, summary.total, summary)
        stored_chunks: set[int] = set()

        def record(k: int, results: list[PointResult]) -> None:
            store.write(results)
            stored_chunks.add(k)
            for r in results:
                summary.computed += 1
                summary.point_seconds += r.seconds
                if r.error is None and r.outputs.get("over_power_budget"):
                    summary.over_power_budget += 1
                if r.error is not None:
                    summary.failed += 1
                    summary.error_counts[_POINT_PREFIX.sub("", r.error)] += 1
                    if len(summary.failures) < 50:
                        summary.failures.append((r.id, r.error))
            if on_progress:
                on_progress(summary.already_done + summary.computed, summary.total, summary)

        if chunks and on_cluster:
            own_client = client is None
            client = client if client is not None else open_client(scheduler)  # type: ignore[arg-type]
            try:
                _submit_chunks(client.get_executor(pure=False), chunks, False, record)
            finally:
                if own_client:
                    client.close()
        elif chunks:
            _run_locally(chunks, local_workers, record, stored_chunks)
    summary.seconds = time.perf_counter() - t0
    return summary


def _record_at(record: Callable[[int, list[PointResult]], None], indices: list[int], j: int,
               results: list[PointResult]) -> None:
    record(indices[j], results)


def _run_locally(chunks: list[list[dict[str, Any]]], workers: int,
                 record: Callable[[int, list[PointResult]], None], stored_chunks: set[int]) -> None:
    """The chunks on ``workers`` local processes (one: in this process). A worker that dies
    (killed: out of memory, a signal) breaks the pool; a new one runs the chunks not yet
    stored, up to :data:`LOCAL_POOL_RESTARTS` times."""
    if workers <= 1:
        for k, chunk in enumerate(chunks):
            record(k, _chunk_task(chunk))
        return
    for _ in range(1 + LOCAL_POOL_RESTARTS):
        pending = [k for k in range(len(chunks)) if k not in stored_chunks]
        if not pending:
            return
        try:
            with _local_pool(min(workers, len(pending))) as pool:
                _submit_chunks(pool, [chunks[k] for k in pending], True, functools.partial(_record_at, record, pending),
                               in_flight=min(workers, len(pending)) + 1)
            return
        except BrokenProcessPool:
            continue
    raise MambalayaError(
        f"the sweep's worker processes died {1 + LOCAL_POOL_RESTARTS} times (killed: out of memory, or a signal); "
        f"{len(stored_chunks)} of {len(chunks)} chunks are stored and a rerun resumes from them; "
        "try fewer --workers or a smaller chunk_size"
    )


__all__ = ["SweepSpec", "SweepSummary", "evaluate_chunk", "evaluate_point", "load_sweep_spec", "run_sweep"]
