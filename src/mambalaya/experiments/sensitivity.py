"""Sensitivity of ratios between designs to every documented assumption.

A sensitivity spec (YAML, ``mambalaya/data/sensitivity/h100-like.yaml`` ships) lists the
assumptions of a group of designs: an architecture field (``compute.mfu_units``), a multiplier
on a cost table (``factor: true``), or a run field (``precision``, ``batch``, ``scan``), each
with a ``low`` and a ``high`` value and the ``reason`` for that range. A *setting* moves one
assumption to one value, on every design at once, and everything else stays at its base.

For each setting the designs are evaluated (each with its own mapping, built for the changed
design) and the ratios of interest recomputed from the latency rows: the paper's headline
ratios (:func:`mambalaya.experiments.claims.headline_ratios`) for ``reproduce``, or one design
over a baseline for ``mambalaya sensitivity``.

**What would it take.** For a published ratio far from ours, each numeric assumption is
searched over its range (on a logarithmic scale where both ends are positive): if the ratio
crosses the published value between two evaluated values, bisection finds the value at which
it is reached (to a relative tolerance of 2%); otherwise the value in range that comes closest
is reported. The single assumption that comes closest wins; "none within range" is said when
none reaches the published value. A categorical assumption (the scan form, the precision
policy, an overlap switch) has no values in between: when its values fall on both sides of the
published ratio, the table says it straddles it. The search assumes the ratio varies
monotonically between the evaluated points, which it checks only at those points.
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Union

import pandas as pd
from pydantic import BaseModel, Field, ValidationError, model_validator

from mambalaya.arch import ArchSpec, arch_from_dict, arch_to_dict, field_paths, load_arch, set_fields
from mambalaya.arch.keys import NOT_LATENCY_FIELDS
from mambalaya.search.memos import forget_architecture_results
from mambalaya.arch.quantities import BYTE_UNITS, parse_float_quantity  # byte sizes such as "24MiB" in a spec
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.evaluate import Evaluation, check_settings_read, evaluate, evaluate_best_scan
from mambalaya.einsum.parse import MAX_SIZE
from mambalaya.specio import (SPEC_MODEL_CONFIG, FieldProblem, describe_validation_error, load_spec_text, read_spec_file,
                              show, strict_int)
from mambalaya.workloads import ModelConfig, has_scan_forms
from mambalaya.workloads.precision import load_policy

RUN_FIELDS = ("precision", "batch", "scan")
Value = Union[bool, int, float, str]


class Assumption(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    key: str = Field(min_length=1)
    label: str = ""
    low: Value
    high: Value
    reason: str = Field(min_length=1)
    factor: bool = False  # low/high multiply every non-zero entry of a cost table

    @model_validator(mode="after")
    def _known_field(self) -> "Assumption":
        if self.key not in RUN_FIELDS and self.key not in field_paths():
            raise FieldProblem("key", f"{self.key!r} is neither a run field ({', '.join(RUN_FIELDS)}) nor an architecture field")
        for end in ("low", "high"):  # (a 400-digit integer was a traceback where it met a float)
            value = getattr(self, end)
            if _is_number(value) and not (abs(value) <= 1e300 and math.isfinite(value)):
                raise FieldProblem(end, f"must be a finite number of a sensible size, not {show(value)}")
        if self.factor and not (_is_number(self.low) and _is_number(self.high) and self.low > 0 and self.high > 0):
            raise FieldProblem("low", "a factor's low and high must be positive numbers")
        if self.key == "scan" and {self.low, self.high} - {"chunked", "recurrent"}:
            raise FieldProblem("low", "scan takes chunked or recurrent")
        if self.key == "batch":  # a size: an integer, never truncated
            for end in ("low", "high"):
                strict_int(getattr(self, end), end, minimum=1, maximum=MAX_SIZE)
        if self.key == "precision":
            for end in ("low", "high"):
                if not isinstance(getattr(self, end), str):
                    raise FieldProblem(end, f"a precision policy is named by text, not {show(getattr(self, end))}")
        return self

    @property
    def name(self) -> str:
        return self.label or self.key

    @property
    def numeric(self) -> bool:
        return _is_number(self.low) and _is_number(self.high) or self.key == "memory.onchip_buffer_bytes"


class SensitivitySpec(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    name: str = Field(min_length=1)
    description: str = ""
    designs: list[str] = Field(min_length=1)
    assumptions: list[Assumption] = Field(min_length=1)

    @model_validator(mode="after")
    def _each_once(self) -> "SensitivitySpec":
        """A design, an assumption's row name, and an assumption's setting (key, ends, factor) each
        once: a repeat ran the same settings again and printed their rows twice."""
        if len(set(self.designs)) != len(self.designs):
            again = next(d for i, d in enumerate(self.designs) if d in self.designs[:i])
            raise FieldProblem("designs", f"name {again!r} twice; give each design once")
        names: dict[str, int] = {}
        settings: dict[str, int] = {}
        for i, a in enumerate(self.assumptions):
            setting = repr((a.key, a.factor, a.low, a.high))
            for seen, value, what in ((settings, setting, f"the setting of {a.key} from {show(a.low)} to {show(a.high)}"),
                                      (names, a.name, f"the row name {a.name!r} (a label tells two settings of one "
                                                      "key apart)")):
                if value in seen:
                    raise FieldProblem(f"assumptions.{i}", f"repeats {what} of assumptions.{seen[value]}: its tornado "
                                                           "rows would print twice; give each assumption once")
                seen[value] = i
        return self


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_sensitivity_spec(name_or_path: str | Path = "h100-like") -> SensitivitySpec:
    """A shipped sensitivity spec by name, or a YAML file."""
    shipped = resources.files("mambalaya").joinpath("data/sensitivity")
    if isinstance(name_or_path, str) and f"{name_or_path}.yaml" in {entry.name for entry in shipped.iterdir()}:
        return _load_shipped(name_or_path)
    source = str(name_or_path)
    return _validated(read_spec_file(source, "sensitivity spec (shipped: h100-like)"), source, Path(source).parent)


@lru_cache(maxsize=8)
def _load_shipped(name: str) -> SensitivitySpec:
    text = resources.files("mambalaya").joinpath("data/sensitivity", f"{name}.yaml").read_text(encoding="utf-8")
    return _validated(text, f"{name}.yaml (shipped sensitivity spec)")


def _validated(text: str, source: str, folder: Path | None = None) -> SensitivitySpec:
    spec = load_spec_text(text, SensitivitySpec, what="sensitivity spec", fields="name, designs, assumptions",
                          source=source)
    if folder is not None:
        spec = _files_beside(spec, folder, source)
    check_on_designs(spec, source)
    return spec


def _files_beside(spec: SensitivitySpec, folder: Path, source: str) -> SensitivitySpec:
    """``spec`` with the files it names (a design, a precision policy at an assumption's end) read
    beside its own file, as every spec's paths are: one file gave two tornadoes from two folders.
    Validated again, so that the spec's rules hold on the paths it names (``mine.yaml`` and
    ``./mine.yaml`` were one design, run twice)."""
    from mambalaya.arch import path_beside, shipped_archs
    from mambalaya.workloads.precision import shipped_policies

    designs = [path_beside(d, folder, shipped_archs()) for d in spec.designs]
    assumptions = [{**a.model_dump(), "low": path_beside(a.low, folder, shipped_policies()),
                    "high": path_beside(a.high, folder, shipped_policies())} if a.key == "precision" else a.model_dump()
                   for a in spec.assumptions]
    try:
        return SensitivitySpec.model_validate({**spec.model_dump(), "designs": designs, "assumptions": assumptions})
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, "invalid sensitivity spec"), source=source) from None


def check_on_designs(spec: SensitivitySpec, source: str) -> None:
    """Each assumption's ends make valid designs of ``spec.designs`` (a caller that runs other
    designs than the file names checks them again here: a kernels field on a design without a
    kernels section was once a traceback after the base run)."""
    for n, a in enumerate(spec.assumptions):
        if a.numeric and a.key != "memory.onchip_buffer_bytes" and a.low == a.high:
            raise SpecError(f"assumptions[{n}] ({a.key}): low and high are both {a.low!r}: no range to move over",
                            source=source)
        if a.numeric and a.key != "memory.onchip_buffer_bytes" and a.low > a.high:
            raise SpecError(f"assumptions[{n}] ({a.key}): low {a.low!r} is above high {a.high!r}", source=source)
    try:
        designs = [load_arch(d) for d in spec.designs]
    except SpecError as err:
        raise SpecError(f"designs: {getattr(err, 'message', err)}", source=source) from None
    for n, a in enumerate(spec.assumptions):  # an architecture field no evaluation reads moves nothing
        if a.key not in RUN_FIELDS and not a.factor:  # (memory.pe_local_bytes_per_cycle drew a zero-width row)
            try:
                check_settings_read(designs, [a.key], option=f"assumptions[{n}] ({a.key}):")
            except SpecError as err:
                raise SpecError(str(getattr(err, "message", err)), source=source) from None
    for n, a in enumerate(spec.assumptions):  # the values must make valid designs
        for end in ("low", "high"):
            try:
                for design in designs:
                    with_setting(design, a, getattr(a, end))
                if a.key == "precision":
                    load_policy(str(getattr(a, end)))
            except SpecError as err:
                raise SpecError(f"assumptions[{n}].{end} ({a.key} = {getattr(a, end)!r}) on designs "
                                f"{', '.join(spec.designs)}: {err}", source=source) from None


# ---------------------------------------------------------------------------------------------
# settings


def with_setting(spec: ArchSpec, assumption: Assumption, value: Value) -> ArchSpec:
    """``spec`` with the assumption's architecture field at ``value`` (run fields: unchanged)."""
    if assumption.key in RUN_FIELDS:
        return spec
    data = arch_to_dict(spec)
    node = data
    *parents, leaf = assumption.key.split(".")
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
        if node is None:  # (once a traceback after the base run)
            raise SpecError(f"{spec.name} has no {p} section, so {assumption.key} cannot be set on it")
    if assumption.factor:
        if not isinstance(node.get(leaf), dict):
            raise SpecError(f"{assumption.key} is a single value on {spec.name}, not a cost table: 'factor: true' "
                            "multiplies every entry of a table; give the value itself")
        node[leaf] = {k: v * float(value) for k, v in node[leaf].items()}
    else:  # as --set and a sweep set it (the other form of a bandwidth nulled: alternative_forms)
        set_fields(data, {assumption.key: value}, what="sensitivity assumption")
    return arch_from_dict(data, source=f"{spec.name} with {assumption.key} = {value!r}")


def base_value(assumption: Assumption, spec: ArchSpec, run: "RunSetup") -> Value:
    """The value the assumption takes unmoved: the design's own, or the run's."""
    if assumption.factor:
        return 1.0
    if assumption.key == "precision":
        return run.precision or spec.precision
    if assumption.key == "batch":
        return run.batch
    if assumption.key == "scan":
        return "best"
    node: Any = arch_to_dict(spec)
    for part in assumption.key.split("."):
        node = node[part]
    if node is None and assumption.key == "compute.one_d_lanes":
        return spec.compute.one_d_lanes_effective
    if node is None and assumption.key == "memory.onchip_bandwidth_bytes_per_cycle":
        return spec.memory.buffer_bandwidth_bytes_per_cycle  # from the banks (None: unbounded)
    return node


def shared_base(assumption: Assumption, specs: dict[str, ArchSpec], run: "RunSetup") -> tuple[bool, Value]:
    """``(True, value)`` where every design takes the assumption at one value unmoved (then a
    setting at that value is the base run), else ``(False, text)`` naming each design's: a
    setting at one design's value moves the others (a run comparing MFU counts of 256 and 1024
    once left both unmoved at 256, printing the base ratio where the designs were equal)."""
    values = {d: base_value(assumption, spec, run) for d, spec in specs.items()}
    keys = {repr(_key(v)) for v in values.values()}
    if len(keys) == 1:
        return True, next(iter(values.values()))
    return False, ", ".join(f"{d} {v}" for d, v in values.items())


def numeric_value(assumption: Assumption, value: Value) -> float:
    """A numeric assumption's value as a number (byte sizes such as ``24MiB`` included)."""
    if _is_number(value):
        return float(value)
    return float(parse_float_quantity(value, BYTE_UNITS, "a byte size"))


@dataclass(frozen=True)
class RunSetup:
    """What every setting shares: models, lengths, batch, tokens generated, precision."""

    models: tuple[str, ...]
    configs: dict[str, ModelConfig]
    seq_lens: tuple[int, ...]
    batch: int = 64
    generated_tokens: int = 1024
    precision: str | None = None  # None: each design's own policy
    phases: tuple[str, ...] = ("prefill", "generation")


def evaluate_setting(specs: dict[str, ArchSpec], run: RunSetup, assumption: Assumption | None,
                     value: Value | None, phases: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Latency rows (model, phase, seq_len, arch, layer_latency_s, model_latency_s, ...) of every
    design under one setting (``assumption`` None: the base)."""
    designs = {d: (with_setting(s, assumption, value) if assumption is not None else s) for d, s in specs.items()}
    precision, batch, scan = run.precision, run.batch, None
    if assumption is not None and assumption.key == "precision":
        precision = str(value)
    if assumption is not None and assumption.key == "batch":
        batch = int(value)  # type: ignore[arg-type]
    if assumption is not None and assumption.key == "scan":
        scan = str(value)
    rows = []
    for model in run.models:
        cfg = run.configs[model]
        for phase in phases or run.phases:
            if phase == "prefill":
                points = run.seq_lens
            else:
                points = (1,)
            for L in points:
                for d, spec in designs.items():
                    row = {"model": model, "phase": phase, "seq_len": L if phase == "prefill" else 1, "arch": d,
                           "precision": precision or spec.precision}
                    try:
                        ev = _evaluate(spec, model, cfg, "prefill" if phase == "prefill" else "decode", L, batch,
                                       precision, scan)
                    except MambalayaError as err:  # e.g. a forced scan form that does not fit the buffer
                        rows.append({**row, "layer_latency_s": math.nan, "model_latency_s": math.nan,
                                     "offchip_bytes": math.nan, "mapping": "", "error": str(err)})
                        continue
                    r = ev.result
                    rows.append({**row, "layer_latency_s": r.latency_s, "model_latency_s": r.model_latency_s,
                                 "offchip_bytes": r.offchip_bytes, "mapping": ev.mapping.name, "error": ""})
    return rows


def _evaluate(spec: ArchSpec, model: str, cfg: ModelConfig, phase: str, L: int, batch: int,
              precision: str | None, scan: str | None) -> Evaluation:
    if scan is not None and has_scan_forms(cfg) and phase == "prefill":
        return evaluate(spec, model, cfg, phase=phase, seq_len=L, batch=batch, scan=scan, precision=precision)
    return evaluate_best_scan(spec, model, cfg, phase=phase, seq_len=L, batch=batch, precision=precision)


RatioFn = Callable[[pd.DataFrame], dict[str, float]]


@dataclass
class SensitivityResult:
    """``rows``: one per (assumption, end, ratio): the value and the ratio at it, beside the base.
    ``take``: the what-would-it-take rows."""

    base: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)
    take: list[dict[str, Any]] = field(default_factory=list)


def run_sensitivity(
    spec: SensitivitySpec,
    run: RunSetup,
    ratios: RatioFn,
    *,
    published: dict[str, float] | None = None,
    far: float = 0.25,
    progress: Callable[[str], None] | None = None,
    prefetched: dict[tuple[str, Any], Any] | None = None,
    models_of: Callable[[str], tuple[str, ...]] | None = None,
    executor: Any = None,
) -> SensitivityResult:
    """Every assumption at its low and high value; then, for each ratio in ``published`` more
    than ``far`` away from ours, what single assumption in range would take it there.

    ``prefetched`` maps ``(assumption key, value)`` to a future of :func:`evaluate_setting`'s
    rows, computed elsewhere (see :func:`prefetch_settings`). ``models_of(ratio)`` names the
    models a ratio depends on, so that the what-would-it-take search evaluates only those (the
    ratio function must then accept tables of a subset of the models). With ``executor`` (the
    one that ran the prefetched settings), the what-would-it-take searches run two at a time:
    one evaluating here, one in the executor's processes."""
    tick = progress or (lambda _m: None)
    specs = {d: load_arch(d) for d in spec.designs}
    prefetched = dict(prefetched or {})
    tick("sensitivity: base")
    base = ratios(pd.DataFrame(evaluate_setting(specs, run, None, None)))
    result = SensitivityResult(base)
    cache: dict[tuple[str, Any], dict[str, float]] = {}

    def here(setup: RunSetup, a: Assumption, value: Value) -> list[dict[str, Any]]:
        return evaluate_setting(specs, setup, a, value)

    def there(setup: RunSetup, a: Assumption, value: Value) -> list[dict[str, Any]]:
        return executor.submit(setting_task, list(spec.designs), setup, a, value).result()

    def at(a: Assumption, value: Value, models: tuple[str, ...] | None = None, rows_of=here) -> dict[str, float]:
        """The ratios with ``a`` at ``value``; ``models`` restricts the evaluation to the models
        a ratio needs (the bisection's points), whose ratios alone are then returned;
        ``rows_of`` evaluates a setting (here, or in the executor)."""
        shared, b = shared_base(a, specs, run)
        if shared and _key(value) == _key(b):
            return base
        key = (a.key, _key(value))
        if key in cache:
            return cache[key]
        sub = (a.key, _key(value), models)
        if models is not None and sub in cache:
            return cache[sub]
        tick(f"sensitivity: {a.name} = {value}")
        found = prefetched.pop(key, None)
        if found is not None and not found.cancel():  # running or done elsewhere: wait for it
            cache[key] = ratios(pd.DataFrame(found.result()))
            return cache[key]
        setup = run if models is None else replace(run, models=models)
        got = ratios(pd.DataFrame(rows_of(setup, a, value)))
        cache[key if models is None else sub] = got
        return got

    settings = [(a, end) for a in applicable(spec, run) for end in ("low", "high")]
    for a, end in reversed(settings):  # the last first: prefetching workers take the first, so the two meet halfway
        at(a, getattr(a, end))
    for a, end in settings:
        value = getattr(a, end)
        _, b = shared_base(a, specs, run)
        for ratio, v in at(a, value).items():
            result.rows.append({"assumption": a.name, "key": a.key, "end": end, "value": value, "base_value": b,
                                "ratio": ratio, "ours": v, "base": base.get(ratio), "reason": " ".join(a.reason.split())})
    if published:
        evaluators = (at,) if executor is None else (at, functools.partial(at, rows_of=there))
        result.take = _what_would_it_take(spec, run, specs, base, published, far, evaluators, models_of)
    return result


def applicable(spec: SensitivitySpec, run: RunSetup) -> list[Assumption]:
    """The spec's assumptions that apply to the run (the scan form only to models with two forms,
    :func:`~mambalaya.workloads.has_scan_forms`)."""
    forms = any(has_scan_forms(run.configs[m]) for m in run.models)
    return [a for a in spec.assumptions if a.key != "scan" or forms]


def setting_task(designs: list[str], run: RunSetup, assumption: Assumption | None,
                 value: Value | None) -> list[dict[str, Any]]:
    """:func:`evaluate_setting` of the named designs, as a task for another process (what it
    returns is rows only); afterwards the process forgets the per-architecture results of its
    layers, keeping their tables (no later setting asks for this architecture)."""
    from mambalaya.experiments.evaluate import LAYERS

    rows = evaluate_setting({d: load_arch(d) for d in designs}, run, assumption, value)
    for cascade in LAYERS.values():  # no other setting asks for this one's architecture (memory)
        forget_architecture_results(cascade)
    return rows


def prefetch_settings(spec: SensitivitySpec, run: RunSetup, executor) -> dict[tuple[str, Any], Any]:
    """Submit every low and high setting that differs from the base to ``executor`` (a
    ``concurrent.futures`` executor); pass the result to :func:`run_sensitivity`. The
    latency-blind settings are left to the caller's process (answered from the memos of its
    base run)."""
    specs = {d: load_arch(d) for d in spec.designs}
    out = {}
    for a in applicable(spec, run):
        if latency_blind(a):
            continue
        shared, b = shared_base(a, specs, run)
        for end in ("low", "high"):
            value = getattr(a, end)
            key = (a.key, _key(value))
            if not (shared and _key(value) == _key(b)) and key not in out:
                out[key] = executor.submit(setting_task, list(spec.designs), run, a, value)
    return out


def latency_blind(assumption: Assumption) -> bool:
    """Whether the assumption sets a field the latency model never reads (an energy, the node, an
    area, a budget): its settings reuse every search of the base (:func:`~mambalaya.arch.keys.latency_key`)."""
    return assumption.key.split(".")[0] in NOT_LATENCY_FIELDS


def _key(value: Any) -> Any:
    return round(value, 12) if isinstance(value, float) else value


def _what_would_it_take(spec, run, specs, base, published, far, evaluators, models_of) -> list[dict[str, Any]]:
    far_ratios = {ratio: target for ratio, target in published.items()
                  if (ours := base.get(ratio)) is not None and math.isfinite(ours) and abs(ours - target) / target > far}
    searches = [(ratio, a) for ratio in far_ratios for a in applicable(spec, run)]

    def search(job: tuple[str, Assumption], at: Callable) -> dict[str, Any]:
        ratio, a = job
        models = models_of(ratio) if models_of else None
        return _closest(a, shared_base(a, specs, run), ratio, far_ratios[ratio], base[ratio],
                        lambda x, v: at(x, v, models))

    found = dict(zip(searches, _run_searches(searches, search, evaluators)))
    rows = []
    for ratio, target in far_ratios.items():
        ours = base[ratio]
        candidates = [found[(ratio, a)] for a in applicable(spec, run)]
        reached = [c for c in candidates if c["reaches"]]
        straddle = [c for c in candidates if c.get("between")]
        pool = reached or candidates
        best = min(pool, key=lambda c: (abs(c["ratio_at"] - target) / target, c["assumption"]))
        if reached:
            verdict = (f"reaches {target:g}x at {best['key']} = {_fmt(best['value'])} (base {_fmt(best['base_value'])}; "
                       f"{best['ratio_at']:.2f}x there)")
        elif straddle:
            best = straddle[0]
            (v0, r0), (v1, r1) = best["between"]
            verdict = (f"no numeric assumption in range reaches it; the categorical {best['key']} straddles it: "
                       f"{r0:.2f}x at {_fmt(v0)}, {r1:.2f}x at {_fmt(v1)}")
        else:
            verdict = (f"none within range: the closest is {best['key']} = {_fmt(best['value'])}, "
                       f"giving {best['ratio_at']:.2f}x")
        rows.append({
            "ratio": ratio, "published": target, "ours": ours, "gap": (ours - target) / target,
            "closest_assumption": best["assumption"], "key": best["key"],
            "value_needed": best["value"] if best["reaches"] else None,
            "closest_value_in_range": best["value"], "ratio_at_value": best["ratio_at"],
            "base_value": best["base_value"], "verdict": verdict,
            "all": "; ".join(f"{c['assumption']}: {c['ratio_at']:.2f}x at {_fmt(c['value'])}" for c in candidates),
        })
    return rows


def _run_searches(jobs: list, search: Callable, evaluators: tuple[Callable, ...]) -> list[Any]:
    """``search(job, at)`` of every job, in order, with one thread per evaluator taking the next
    job as it frees (one evaluator: in turn, here). Each result depends only on its job: the
    evaluators give the same ratios (the same code on the same settings)."""
    if len(evaluators) == 1:
        return [search(job, evaluators[0]) for job in jobs]
    results: list[Any] = [None] * len(jobs)
    lock = threading.Lock()
    pending = iter(range(len(jobs)))

    def worker(at: Callable) -> None:
        while True:
            with lock:
                n = next(pending, None)
            if n is None:
                return
            results[n] = search(jobs[n], at)

    with ThreadPoolExecutor(max_workers=len(evaluators)) as threads:
        for done in [threads.submit(worker, at) for at in evaluators]:
            done.result()  # re-raises an evaluation's error
    return results


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _closest(a: Assumption, base: tuple[bool, Value], ratio: str, target: float, at_base: float, at) -> dict[str, Any]:
    """The value of ``a`` in its range that brings ``ratio`` closest to ``target``, bisecting
    where the ratio crosses it. ``base`` is :func:`shared_base`: the base run is a point of the
    range only where every design takes one value."""
    shared, b = base
    points: list[tuple[Any, float]] = [(b, at_base)] if shared else []
    for end in ("low", "high"):
        v = getattr(a, end)
        points.append((v, at(a, v).get(ratio, math.nan)))
    info = {"assumption": a.name, "key": a.key, "base_value": b}
    if a.numeric:
        points.sort(key=lambda p: numeric_value(a, p[0]) if p[0] != "best" else 0.0)
        for (v0, r0), (v1, r1) in zip(points, points[1:]):
            if (r0 - target) * (r1 - target) <= 0 and r0 != r1:
                value, got = bisect_assumption(a, v0, r0, v1, r1, ratio, target, at)
                return {**info, "value": value, "ratio_at": got, "reaches": True}
    finite = [p for p in points if math.isfinite(p[1])]
    v, r = min(finite, key=lambda p: abs(p[1] - target)) if finite else (b, math.nan)
    below = [p for p in finite if p[1] < target]
    above = [p for p in finite if p[1] > target]
    between = (max(below, key=lambda p: p[1]), min(above, key=lambda p: p[1])) if below and above else None
    return {**info, "value": v, "ratio_at": r, "reaches": bool(finite) and abs(r - target) / target <= 0.02,
            "between": None if a.numeric else between}


def bisect_assumption(a: Assumption, v0, r0, v1, r1, ratio, target, at, steps: int = 6) -> tuple[Any, float]:
    """The value of ``a`` between ``v0`` and ``v1`` (where ``ratio`` is ``r0`` and ``r1``) whose
    ``ratio`` comes closest to ``target``: a bisection (geometric between positive ends) of at
    most ``steps`` evaluations ``at(a, value)``, stopping within 2%; an integer field's values stay
    integers."""
    x0, x1 = numeric_value(a, v0), numeric_value(a, v1)
    # an integer field (the spec refuses 128.0 for compute.array_rows): both ends given as integers, or a
    # field whose ends may be spelt otherwise (a byte size as text)
    integral = (a.key in ("compute.mfu_units", "compute.one_d_lanes", "memory.onchip_buffer_bytes", "batch")
                or (type(a.low) is int and type(a.high) is int))
    log = x0 > 0 and x1 > 0
    best = (v0, r0) if abs(r0 - target) < abs(r1 - target) else (v1, r1)
    for _ in range(steps):
        if abs(best[1] - target) / target <= 0.02:
            break
        mid = math.sqrt(x0 * x1) if log else (x0 + x1) / 2
        value: Value = int(round(mid)) if integral else mid
        if integral and value in (int(round(x0)), int(round(x1))):
            break
        r = at(a, value).get(ratio, math.nan)
        if not math.isfinite(r):
            break
        if abs(r - target) < abs(best[1] - target):
            best = (value, r)
        if (r0 - target) * (r - target) <= 0:
            x1, r1 = mid, r
        else:
            x0, r0 = mid, r
    return best


def pair_label(model: str, phase: str, design: str, baseline: str) -> str:
    return f"{model} {phase}: {design} over {baseline}"


def pair_ratio(design: str, baseline: str) -> RatioFn:
    """The speedup of ``design`` over ``baseline``: per model and phase, the mean over L."""
    def ratios(df: pd.DataFrame) -> dict[str, float]:
        out = {}
        for (model, phase), g in df.groupby(["model", "phase"]):
            t = g.pivot_table(index="seq_len", columns="arch", values="layer_latency_s", dropna=False)
            out[pair_label(model, phase, design, baseline)] = float((t[baseline] / t[design]).mean())
        return out
    return ratios


def sensitivity_frame(result: SensitivityResult) -> pd.DataFrame:
    return pd.DataFrame(result.rows)


__all__ = [
    "Assumption",
    "RunSetup",
    "applicable",
    "bisect_assumption",
    "check_on_designs",
    "latency_blind",
    "SensitivityResult",
    "SensitivitySpec",
    "evaluate_setting",
    "load_sensitivity_spec",
    "pair_label",
    "pair_ratio",
    "prefetch_settings",
    "run_sensitivity",
    "setting_task",
    "with_setting",
]
