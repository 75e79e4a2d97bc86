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
import itertools
import json
import math
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


from mambalaya.arch import MAPPING_NAMES, exponent_number, overlapping_fields
from mambalaya.einsum.cascade import MAX_RANK_SIZE
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.specio import describe_validation_error, kind_of, parse_yaml_text, read_spec_file, show
from mambalaya.experiments.store import PointResult, ResultStore, check_point_outputs, model_fingerprint, point_id
from mambalaya.experiments.sweep_workers import _Costliest, _tune_allocator, _tune_collector
from mambalaya.workloads.families import is_hybrid

#: The most points one sweep spec may hold (about 1 GB of point records in the coordinator).
MAX_SWEEP_POINTS = 1_000_000

POINT_KEYS = ("arch", "model", "phase", "seq_len", "batch", "mapping")
DEFAULTS = {"arch": "mambalaya", "phase": "prefill", "seq_len": 2048, "batch": 64, "mapping": "default"}


@dataclass(frozen=True)
class SweepSpec:
    """A sweep: the cartesian product of ``grid``'s lists, each point with ``fixed``'s values.

    Every field is checked when the spec is made (:func:`check_sweep_fields`), before any point
    runs: a value of the wrong type is one :class:`SpecError` naming the field, not a failure
    of every point (or, worse, a number: ``seq_len: 64.9`` was once run as 64)."""

    name: str
    store: Path
    grid: dict[str, list[Any]]
    fixed: dict[str, Any] = field(default_factory=dict)
    chunk_size: int = 32
    source: str = "<spec>"

    def __post_init__(self) -> None:
        check_sweep_fields(self.grid, self.fixed, source=self.source)

    def points(self) -> list[dict[str, Any]]:
        axes = list(self.grid)
        points = []
        memo: dict[str, bool] = {}
        for combo in itertools.product(*(self.grid[a] for a in axes)):
            p = dict(DEFAULTS)
            p.update(self.fixed)
            p.update(zip(axes, combo))
            if p.get("phase") == "decode" and not _decode_reads_context(str(p.get("model")), memo):
                p["seq_len"] = 1
            points.append(p)
        unique = {point_id(p): p for p in points}  # a Mamba model's decode points at several L collapse
        return list(unique.values())


def _decode_reads_context(model: str, memo: dict[str, bool]) -> bool:
    """Whether a decode step of ``model`` depends on the context length: a hybrid model's
    attention layers read a KV cache of L positions; a pure Mamba model's state is fixed-size.
    A model that does not resolve is left to fail, with its message, when its points run."""
    if model not in memo:
        from mambalaya.workloads import resolve_model

        try:
            memo[model] = is_hybrid(resolve_model(model))
        except MambalayaError:
            memo[model] = False
    return memo[model]


#: The fields of a sweep spec file.
SPEC_FIELDS = ("name", "description", "store", "grid", "fixed", "chunk_size")


def load_sweep_spec(path: str | Path, *, store: str | Path | None = None) -> SweepSpec:
    """Read a sweep spec file (the shared YAML reader: duplicate keys, nesting and aliases
    bounded) and check every field before any point runs (:class:`SweepSpec`)."""
    path = Path(path)
    source = str(path)
    data = parse_yaml_text(read_spec_file(source, "sweep spec"), source=source)
    if not isinstance(data, dict):
        raise SpecError("a sweep spec is a mapping with a 'grid'", source=source)
    unknown = set(data) - set(SPEC_FIELDS)
    if unknown:
        raise SpecError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}; fields: {', '.join(SPEC_FIELDS)}",
                        source=source)
    grid = _read_grid(data.get("grid"), source)
    fixed = data.get("fixed", {})
    fixed = {} if fixed is None else fixed
    if not isinstance(fixed, dict):
        raise SpecError(f"'fixed' must map fields to single values, not {kind_of(fixed)}", source=source)
    fixed = {k: exponent_number(v) for k, v in fixed.items()}
    chunk = data.get("chunk_size", 32)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_SWEEP_POINTS:
        raise SpecError(f"chunk_size must be an integer from 1 to {MAX_SWEEP_POINTS:,}, not {show(chunk)}",
                        source=source)
    for key in ("name", "store", "description"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            raise SpecError(f"{key} must be non-empty text, not {show(data[key])}", source=source)
    store_path = Path(store) if store is not None else path.parent / data.get("store", f"{path.stem}.sqlite")
    return SweepSpec(data.get("name", path.stem), store_path, grid, fixed, chunk, source)


def _read_grid(grid: Any, source: str) -> dict[str, list[Any]]:
    """The spec's ``grid``: each field a non-empty list of scalars, the product of their lengths
    at most :data:`MAX_SWEEP_POINTS` (checked before any value is, so a huge grid is refused at once)."""
    if not isinstance(grid, dict) or not grid:
        raise SpecError("'grid' must map each swept field to a list of values", source=source)
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise SpecError(f"grid.{k} must be a non-empty list, not {'an empty list' if v == [] else show(v)}",
                            source=source)
    combos = math.prod(len(v) for v in grid.values())
    if combos > MAX_SWEEP_POINTS:
        axes = " x ".join(f"{len(v)} {k}" for k, v in grid.items())
        raise SpecError(
            f"the grid has {combos:,} points ({axes}), above the {MAX_SWEEP_POINTS:,} one sweep runs (its points are "
            "held in memory and its store in one SQLite file); split it into several specs, e.g. one per model or design",
            source=source)
    out = {}
    for k, v in grid.items():
        out[k] = v = [exponent_number(x) for x in v]  # 1e-3 is a number, as on --set
        for x in v:
            if x is None or not isinstance(x, (str, int, float)):
                raise SpecError(f"grid.{k} has value {show(x)}; grid values are numbers, text or booleans (a list or "
                                "mapping value goes in 'fixed')", source=source)
    return out


# ----------------------------------------------------------------------------------------------
# checking a sweep's fields (before any point runs)

_TOP_ARCH_FIELDS = ("clock_hz", "bits_per_element", "precision", "power_budget_w")
#: The phases a point runs (:func:`~mambalaya.workloads.build_layer`).
PHASES = ("prefill", "decode")
#: A point's ``mapping``: the design's own, or one of the named mappings.
POINT_MAPPINGS = ("default", *MAPPING_NAMES)
#: The largest ``seq_len`` or ``batch`` a point takes: a rank size the cost model represents exactly.
MAX_POINT_SIZE = MAX_RANK_SIZE


def check_sweep_fields(grid: dict[str, list[Any]], fixed: dict[str, Any], *, source: str = "<spec>") -> None:
    """Every field of a sweep, checked once before any point runs; a problem is one
    :class:`SpecError` naming ``source``, the field and where it is set (``grid.seq_len``,
    ``fixed.clock_hz``):

    * every field is a point field (:data:`POINT_KEYS`) or an architecture field, set in one
      place only (not in both ``grid`` and ``fixed``, nor a table and one of its entries);
    * ``seq_len`` and ``batch`` are integers from 1 to 2^53 (``64.0`` and ``64.9`` are not),
      ``phase`` prefill or decode, ``mapping`` default or a named mapping, ``arch`` a design that
      loads, ``model`` a model that resolves;
    * each architecture field's value is one the spec's own models take (its type, units and
      range): each value is set alone on the sweep's designs and validated. A combination that
      is impossible (a buffer too small for a mapping, levels that do not nest) is not known
      before the point runs, and is that point's stored failure.
    """
    for key in [*grid, *fixed]:
        if not isinstance(key, str) or key not in POINT_KEYS and "." not in key and key not in _TOP_ARCH_FIELDS:
            raise SpecError(
                f"{show(key)} is neither a point field ({', '.join(POINT_KEYS)}) nor an architecture field (dotted, e.g. "
                "memory.onchip_buffer_bytes, or clock_hz / bits_per_element / precision / power_budget_w)", source=source)
    clash = overlapping_fields([*grid, *fixed])
    if clash is not None:
        first, second = clash
        if first == second:
            raise SpecError(f"{first!r} is set both in 'grid' ({_shown_list(grid[first])}) and in 'fixed' "
                            f"({show(fixed[first])}); set each field in one place", source=source)
        places = [f"{'grid' if k in grid else 'fixed'}.{k}" for k in (first, second)]
        raise SpecError(f"{places[0]} and {places[1]} both set {second!r}; set each field in one place", source=source)
    if "model" not in grid and "model" not in fixed:
        raise SpecError("no model: give 'model' in 'grid' (a list of presets or config files) or in 'fixed'",
                        source=source)
    settings = {k: (f"grid.{k}", v) for k, v in grid.items()} | {k: (f"fixed.{k}", [v]) for k, v in fixed.items()}
    for key in POINT_KEYS:
        where, values = settings.get(key, (f"the default {key}", [DEFAULTS.get(key)]))
        for value in values:
            problem = _point_value_problem(key, value)
            if problem:
                raise SpecError(f"{where}: {problem}", source=source)
    _check_models(*settings.get("model", ("", [])), source=source)
    designs = _load_designs(*settings.get("arch", ("the default arch", [DEFAULTS["arch"]])), source=source)
    for key, (where, values) in settings.items():
        if key not in POINT_KEYS:
            _check_arch_field(designs, key, where, values, source)


def _shown_list(values: Any) -> str:
    """A grid's list as a message shows it: ``[1024, 2048]`` (its first values)."""
    if not isinstance(values, list):
        return show(values)
    return "[" + ", ".join(show(v) for v in values[:4]) + (", ..." if len(values) > 4 else "") + "]"


def _point_value_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as a point's ``key`` (None: nothing)."""
    if key in ("seq_len", "batch"):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_POINT_SIZE:
            what = "sequence length (tokens)" if key == "seq_len" else "batch (sequences)"
            return (f"{show(value)} is not a {what}: a size is an integer from 1 to 2^53 "
                    f"({'a fraction is not rounded' if isinstance(value, float) else 'written without quotes or a unit'})")
    elif key == "phase":
        if value not in PHASES:
            return f"{show(value)} is not a phase: one of {', '.join(PHASES)}"
    elif key == "mapping":
        if not isinstance(value, str) or value not in POINT_MAPPINGS:
            return f"{show(value)} is not a mapping: one of {', '.join(POINT_MAPPINGS)}"
    elif not isinstance(value, str) or not value.strip():
        return f"{show(value)} is not the name of a{'n' if key == 'arch' else ''} {key} (non-empty text)"
    return None


def _check_models(where: str, models: list[Any], *, source: str) -> None:
    """Each model resolves (a preset, or a config file that reads), or a :class:`SpecError`."""
    from mambalaya.workloads import resolve_model

    for model in dict.fromkeys(models):
        try:
            resolve_model(model)
        except MambalayaError as err:
            raise SpecError(f"{where}: model {show(model)}: {err}", source=source) from None


def _load_designs(where: str, names: list[Any], *, source: str) -> dict[str, dict[str, Any]]:
    """Each design of the sweep as plain data (:func:`~mambalaya.arch.arch_to_dict`), or a
    :class:`SpecError` naming the one that does not load."""
    from mambalaya.arch import arch_to_dict, load_arch

    designs = {}
    for name in dict.fromkeys(names):
        try:
            designs[name] = arch_to_dict(load_arch(name))
        except MambalayaError as err:
            raise SpecError(f"{where}: design {show(name)}: {err}", source=source) from None
    return designs


def _check_arch_field(designs: dict[str, dict[str, Any]], key: str, where: str, values: list[Any],
                      source: str) -> None:
    """Each value of the architecture field ``key``, set alone on the sweep's designs, is one
    the spec's models take; a value no design takes is a :class:`SpecError`. Only problems of
    the field itself count (its type, units, range, a field or section the designs lack); a
    problem of the field with others is a combination's, left to its points."""
    checked: list[Any] = []
    for value in values:
        if any(type(value) is type(seen) and value == seen for seen in checked):
            continue
        checked.append(value)
        problems = [_arch_field_problem(design, key, value) for design in designs.values()]
        if all(problems):
            on = "" if problems[0].startswith(_VALUE_PROBLEM) else f" (on {', '.join(map(str, designs))})"
            raise SpecError(f"{where}: {problems[0]}{on}", source=source)


#: How a problem of an architecture field's value begins (one of a field the designs lack does not).
_VALUE_PROBLEM = "invalid architecture field"


def _arch_field_problem(design: dict[str, Any], key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as the field ``key`` of ``design`` (plain data), judged by
    the field alone (None: nothing)."""
    from pydantic import ValidationError

    from mambalaya.arch import ArchSpec, set_fields

    parts = key.split(".")
    data = dict(design)
    node = data
    for p in parts[:-1]:  # copied along the field's path only: the design's data is shared
        if not isinstance(node.get(p), dict):
            break
        node[p] = dict(node[p])
        node = node[p]
    try:
        set_fields(data, {key: value})
        ArchSpec.model_validate(data)
    except SpecError as err:
        return err.message
    except ValidationError as err:
        own = [e for e in err.errors(include_url=False)
               if tuple(str(x) for x in e["loc"][: len(parts)]) == tuple(parts)]
        if own:
            alone = ValidationError.from_exception_data(err.title, own)  # type: ignore[arg-type]
            return describe_validation_error(alone, _VALUE_PROBLEM)
    return None


# ----------------------------------------------------------------------------------------------
# the work of one point (runs on a worker)
# ----------------------------------------------------------------------------------------------

_CASCADES: dict[tuple, Any] = {}
#: Layers whose cascades (and memos) a worker keeps; past it they are all dropped (memory).
KEPT_CASCADES = 64
_ARCHS: dict[str, Any] = {}


_POINT_ARCHS: dict[tuple, Any] = {}


def _arch_for(point: dict[str, Any]):
    """The point's architecture: its design with the point's architecture fields set. Memoised
    per design and field values (types included: strict validation tells 1 from 1.0), since
    the points of other layers repeat them; the spec is frozen, so sharing it is safe."""
    key = (point["arch"], tuple(sorted((k, type(v).__name__, v) for k, v in point.items() if k not in POINT_KEYS)))
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
    if base not in _ARCHS:
        _ARCHS[base] = arch_to_dict(load_arch(base))
    data = set_fields(json.loads(json.dumps(_ARCHS[base])), {k: v for k, v in point.items() if k not in POINT_KEYS})
    return arch_from_dict(data, source=f"point {point_id(point)}")


def point_sizes(point: dict[str, Any]) -> tuple[int, int]:
    """A point's ``seq_len`` and ``batch``, each an integer from 1 to 2^53, or a
    :class:`SpecError` (a fraction is never truncated to a size)."""
    for key in ("seq_len", "batch"):
        problem = _point_value_problem(key, point[key])
        if problem:
            raise SpecError(f"point {point_id(point)}: {key}: {problem}")
    return point["seq_len"], point["batch"]


def evaluate_point(point: dict[str, Any]) -> dict[str, Any]:
    """Every output figure of one point (raises on an impossible configuration)."""
    from mambalaya.experiments.evaluate import require_fits, resolve_policy
    from mambalaya.model.architecture_memos import forget_results
    from mambalaya.model.latency import layer_latency
    from mambalaya.model.search import named_mapping
    from mambalaya.workloads import build_layer, resolve_model

    seq_len, batch = point_sizes(point)
    arch = _arch_for(point)
    config = resolve_model(str(point["model"]))
    if is_hybrid(config):
        from mambalaya.experiments.hybrid import evaluate_hybrid, point_outputs

        hv = evaluate_hybrid(arch, str(point["model"]), config, phase=str(point["phase"]), seq_len=seq_len,
                             batch=batch, mapping=None if point["mapping"] == "default" else point["mapping"])
        return {**point_outputs(hv), "buffer_bytes": arch.memory.onchip_buffer_bytes,
                "pes": arch.compute.array_rows * arch.compute.array_cols,
                "bandwidth_bytes_per_s": arch.memory.offchip_bandwidth_bytes_per_s}
    require_fits(arch, str(point["model"]), config, batch=batch, seq_len=seq_len)  # over the DRAM: a failed point
    key = (point["model"], point["phase"], seq_len, batch, arch.bits_per_element,
           arch.precision)
    if key not in _CASCADES:
        if len(_CASCADES) > KEPT_CASCADES:
            for kept in _CASCADES.values():
                forget_results(kept)  # their memos refer back to them: freed now, not frozen (_chunk_task)
            _CASCADES.clear()
        _CASCADES[key] = build_layer(config, phase=point["phase"], seq_len=seq_len,
                                     batch=batch, bits=arch.bits_per_element,
                                     precision=resolve_policy(arch, None))
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
    }


def _power_outputs(arch: Any, cascade: Any, mapping: Any, result: Any) -> dict[str, Any]:
    """A point's energy, average power against the design's budget, and throttled latency, from
    the groups' dynamic energies (memoised across the points that share them) and the leakage
    over the layer's latency (:func:`~mambalaya.model.energy.layer_energy_totals`)."""
    from mambalaya.experiments.evaluate import over_budget
    from mambalaya.model.energy import layer_energy_totals

    energy = layer_energy_totals(arch, cascade, mapping, result)
    return {"layer_energy_j": energy.layer_j, "energy_per_token_j": energy.per_token_j,
            "average_power_w": energy.average_power_w, "power_budget_w": arch.power_budget_w,
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
    processes a sweep starts itself, which live only as long as it), the worker's allocator is
    tuned first (:func:`_tune_allocator`), and what the chunk leaves behind is moved out of
    the cyclic garbage collector's reach afterwards (:func:`gc.freeze`, after a young
    collection). What it leaves is the memos of its layers (cascades, cost models, candidate
    tables: some 25,000 objects a layer) and they live as long as the worker; every full
    collection would traverse them all again, about 0.6 s of a 6.8 s realistic sweep
    (docs/sweeps.md). A cascade and its memos refer to each other, so a cascade the worker
    drops (past :data:`KEPT_CASCADES`) has its memos dropped first, and reference counting frees
    them (frozen, a cycle would stay for the worker's life)."""
    if own_worker:
        _tune_allocator()
        _tune_collector()
    results = evaluate_chunk(points)
    if own_worker:
        gc.collect(1)
        gc.freeze()
    return results


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
    table keeps the contenders of the buffer used last (:data:`~mambalaya.model.picks.FITTED_BUFFERS`)."""
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
        for fut in as_completed(futures):
            record(futures[fut], fut.result())
        return
    costliest = _Costliest(chunks)
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
        local_workers = min(workers or os.cpu_count() or 1, len(chunks))
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
