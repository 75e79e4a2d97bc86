"""Sweep specs: the YAML a sweep runs, read whole and checked before any point runs.

A spec names a grid of point fields and architecture fields (see :mod:`mambalaya.experiments.sweep`
for its format); :func:`load_sweep_spec` reads it through the shared strict reader
(:mod:`mambalaya.specio`) and :func:`check_sweep_fields` checks every value once: sizes are
integers, phases and mappings named, designs loaded, models resolved, each architecture value
validated by the spec's own models, and no field set twice (in ``fixed`` and ``grid``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mambalaya.arch import MAPPING_NAMES, arch_to_dict, exponent_number, overlapping_fields
from mambalaya.einsum.cascade import MAX_RANK_SIZE
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.evaluate import NOT_READ_BY_EVALUATIONS, check_settings_read
from mambalaya.experiments.store import point_id
from mambalaya.specio import describe_validation_error, kind_of, parse_yaml_text, read_spec_file, show
from mambalaya.workloads.families.base import is_hybrid


#: The most points one sweep spec may hold (about 1 GB of point records in the coordinator).
MAX_SWEEP_POINTS = 1_000_000

POINT_KEYS = ("arch", "model", "phase", "seq_len", "batch", "mapping")
DEFAULTS = {"arch": "mambalaya", "phase": "prefill", "seq_len": 2048, "batch": 64, "mapping": "default"}
#: Point fields that say how a point runs, present only where a spec gives them: ``devices``
#: (default 1) joined by the design's system section, split as ``parallel`` says (default
#: pipeline; :mod:`mambalaya.experiments.devices`).
RUN_KEYS = ("devices", "parallel")
#: The digest of the files a point names (a design, model or policy file, and the policy file a
#: design names), made by :meth:`SweepSpec.points`, never given: it is stored with the point's
#: inputs and is part of its id, so a file edited since a point was stored makes a new point,
#: never the stored result of the old file (:func:`files_digest`).
FILES_KEY = "files_sha256"
#: Every point field that is not an architecture field.
NON_ARCH_KEYS = POINT_KEYS + RUN_KEYS + (FILES_KEY,)
#: The point fields that may name a file: a design, a model config, a precision policy.
FILE_FIELDS = ("arch", "model", "precision")


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
        digests: dict[str, str] = {}
        for combo in itertools.product(*(self.grid[a] for a in axes)):
            p = dict(DEFAULTS)
            p.update(self.fixed)
            p.update(zip(axes, combo))
            if p.get("phase") == "decode" and not _decode_reads_context(str(p.get("model")), memo):
                p["seq_len"] = 1
            digest = files_digest(p, digests)
            if digest is not None:
                p[FILES_KEY] = digest
            points.append(p)
        unique = {point_id(p): p for p in points}  # a Mamba model's decode points at several L collapse
        return list(unique.values())


def _named_file(key: str, value: Any) -> Path | None:
    """The file a point's ``key`` names, or None where it names a shipped design, preset or policy."""
    from mambalaya.arch import names_a_file, shipped_archs
    from mambalaya.workloads import PRESETS

    if not isinstance(value, str) or key not in FILE_FIELDS:
        return None
    shipped = {"arch": shipped_archs, "model": lambda: PRESETS}.get(key)
    if shipped is not None and value in shipped():
        return None
    return Path(value) if names_a_file(value) or value.endswith(".json") or Path(value).is_file() else None


def files_digest(point: dict[str, Any], memo: dict[str, str] | None = None) -> str | None:
    """A SHA-256 over the files ``point`` names (:data:`FILE_FIELDS`, and the policy file its
    design file names), their paths and bytes; None if it names none (shipped designs, presets
    and policies are covered by the store's model fingerprint). ``memo``: digests per file."""
    import hashlib

    from mambalaya.arch import load_arch, names_a_file

    memo = {} if memo is None else memo
    files = [f for f in (_named_file(k, point.get(k)) for k in FILE_FIELDS) if f is not None]
    design = _named_file("arch", point.get("arch"))
    if design is not None and design.is_file():
        try:
            named = load_arch(design).precision
        except MambalayaError:
            named = ""  # a design that does not load is that point's stored failure
        if names_a_file(named):
            files.append(Path(named))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        key = str(f.resolve())
        if key not in memo:
            memo[key] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "missing"
        h.update(f"{key}\0{memo[key]}\0".encode())
    return h.hexdigest()[:24]


def _beside(value: Any, key: str, folder: Path) -> Any:
    """A spec's value of ``key`` with a relative file path read beside the spec file (as its
    ``store`` is): a sweep runs the files next to it whatever folder it is run from."""
    named = _named_file(key, value)
    if named is None or named.is_absolute():
        return value
    return str((folder / named).resolve())


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
    fixed = {k: _beside(exponent_number(v), k, path.parent) for k, v in fixed.items()}
    grid = {k: [_beside(v, k, path.parent) for v in values] for k, values in grid.items()}
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


#: Architecture fields no sweep point reads, with why: a point runs one device, and its groups
#: have no launch grid (:mod:`mambalaya.cost.launch`), so sweeping them would repeat one result.
#: (``kernels.sm_count`` is read: the scan floor spreads over the SMs, :func:`~mambalaya.cost.latency.scan_floor_s`.)
NOT_READ_BY_POINTS = {
    "system": "the system section joins several devices, and a sweep point runs one (evaluate --devices runs several)",
    **NOT_READ_BY_EVALUATIONS,
}


def check_sweep_fields(grid: dict[str, list[Any]], fixed: dict[str, Any], *, source: str = "<spec>") -> None:
    """Every field of a sweep, checked once before any point runs; a problem is one
    :class:`SpecError` naming ``source``, the field and where it is set (``grid.seq_len``,
    ``fixed.clock_hz``):

    * every field is a point field (:data:`POINT_KEYS`, :data:`RUN_KEYS`) or an architecture field a point reads
      (not one of :data:`NOT_READ_BY_POINTS`), set in one place only (not in both ``grid`` and
      ``fixed``, nor a table and one of its entries);
    * ``seq_len`` and ``batch`` are integers from 1 to 2^53 (``64.0`` and ``64.9`` are not),
      ``phase`` prefill or decode, ``mapping`` default or a named mapping, ``arch`` a design that
      loads, ``model`` a model that resolves;
    * each architecture field's value is one the spec's own models take (its type, units and
      range): each value is set alone on the sweep's designs and validated. A combination that
      is impossible (a buffer too small for a mapping, levels that do not nest) is not known
      before the point runs, and is that point's stored failure.
    """
    for where, key in [*(("grid", k) for k in grid), *(("fixed", k) for k in fixed)]:
        if key == FILES_KEY:
            raise SpecError(f"{where}: {FILES_KEY} is made from the files a point names, not given", source=source)
        if not isinstance(key, str) or key not in NON_ARCH_KEYS and "." not in key and key not in _TOP_ARCH_FIELDS:
            raise SpecError(
                f"{where}: {show(key)} is neither a point field ({', '.join(NON_ARCH_KEYS)}) nor an architecture field "
                "(dotted, e.g. memory.onchip_buffer_bytes, or clock_hz / bits_per_element / precision / power_budget_w)",
                source=source)
        unread = next((f for f in NOT_READ_BY_POINTS if key == f or key.startswith(f + ".")), None)
        several = [v for v in (grid.get("devices") or [fixed.get("devices", 1)]) if v != 1]
        if unread == "system" and several:  # read by the points that run on several devices
            unread = None
        if unread is not None:
            raise SpecError(f"{where}.{key}: {NOT_READ_BY_POINTS[unread]}; a sweep point would not read it, so every "
                            "value would give the same numbers", source=source)
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
    for key, values in grid.items():  # a repeat was one point without a word
        seen: list[Any] = []
        for value in values if isinstance(values, list) else []:
            if any(type(value) is type(other) and value == other for other in seen):
                raise SpecError(f"grid.{key}: {show(value)} is given twice; give each value once", source=source)
            seen.append(value)
    settings = {k: (f"grid.{k}", v) for k, v in grid.items()} | {k: (f"fixed.{k}", [v]) for k, v in fixed.items()}
    for key in POINT_KEYS:
        where, values = settings.get(key, (f"the default {key}", [DEFAULTS.get(key)]))
        for value in values:
            problem = point_value_problem(key, value)
            if problem:
                raise SpecError(f"{where}: {problem}", source=source)
    for key in RUN_KEYS:
        where, values = settings.get(key, ("", []))
        for value in values:
            problem = point_value_problem(key, value)
            if problem:
                raise SpecError(f"{where}: {problem}", source=source)
    _check_models(*settings.get("model", ("", [])), source=source)
    specs = _load_designs(*settings.get("arch", ("the default arch", [DEFAULTS["arch"]])), source=source)
    try:  # (a node moved alone; a power budget on designs without energy: the evaluations' own rule)
        check_settings_read(list(specs.values()), [k for k in settings if isinstance(k, str)], option="sweep field")
    except SpecError as err:
        raise SpecError(getattr(err, "message", str(err)), source=source) from None
    if "area.sram_um2_per_bit" in settings and "area.overhead_fraction" not in settings and all(
            spec.area is None or spec.area.overhead_fraction == 0 for spec in specs.values()):
        raise SpecError(f"{settings['area.sram_um2_per_bit'][0]}: the SRAM's area moves the chip's area alone on these "
                        "designs (their SRAM leaks per MiB, technology.sram_leakage_w_per_mib, and area.overhead_fraction "
                        "is 0), which a sweep point does not store, so every value would give the same numbers",
                        source=source)
    devices = settings.get("devices", ("", [1]))[1]
    if "parallel" in settings and all(d == 1 for d in devices) and all(spec.cores is None for spec in specs.values()):
        raise SpecError(f"{settings['parallel'][0]}: every point runs one device of a design that is not a multi-core "
                        "chip, where every strategy is the one-device evaluation, so every value would give the same "
                        "numbers; give devices (a count above 1, or an axis)", source=source)
    mappings = settings.get("mapping", ("", [DEFAULTS["mapping"]]))[1]
    if "memory.onchip_buffer_bytes" in settings and all(m == "ideal" for m in mappings):  # an unbounded buffer
        raise SpecError(f"{settings['memory.onchip_buffer_bytes'][0]}: the ideal mapping's buffer is unbounded, so "
                        "every value would give the same numbers", source=source)
    designs = {name: arch_to_dict(spec) for name, spec in specs.items()}
    for key, (where, values) in settings.items():
        if key not in NON_ARCH_KEYS:
            _check_arch_field(designs, key, where, values, source)


def _shown_list(values: Any) -> str:
    """A grid's list as a message shows it: ``[1024, 2048]`` (its first values)."""
    if not isinstance(values, list):
        return show(values)
    return "[" + ", ".join(show(v) for v in values[:4]) + (", ..." if len(values) > 4 else "") + "]"


def point_value_problem(key: str, value: Any) -> str | None:
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
    elif key == "devices":
        from mambalaya.arch.system import MAX_DEVICES

        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
            return f"{show(value)} is not a device count: an integer from 1 to {MAX_DEVICES:,}"
    elif key == "parallel":
        from mambalaya.experiments.devices import PARALLEL_STRATEGIES

        if value not in (*PARALLEL_STRATEGIES, "best"):
            return f"{show(value)} is not a parallel strategy: one of {', '.join(PARALLEL_STRATEGIES)} or best"
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


def _load_designs(where: str, names: list[Any], *, source: str) -> dict[str, Any]:
    """Each design of the sweep, or a :class:`SpecError` naming the one that does not load."""
    from mambalaya.arch import load_arch

    designs = {}
    for name in dict.fromkeys(names):
        try:
            designs[name] = load_arch(name)
        except MambalayaError as err:
            raise SpecError(f"{where}: design {show(name)}: {err}", source=source) from None
    return designs


def _check_arch_field(designs: dict[str, dict[str, Any]], key: str, where: str, values: list[Any],
                      source: str) -> None:
    """Each value of the architecture field ``key``, set alone on the sweep's designs, is one
    the spec's models take; a value no design takes is a :class:`SpecError`. Only problems of
    the field itself count (its type, units, range, a field or section the designs lack); a
    problem of the field with others is a combination's, left to its points. Two values that
    read as one (``16MiB`` and ``16777216``) are refused: they were two points of one design,
    counted twice by a plot's mean over the axis."""
    read_as: dict[str, Any] = {}
    for value in values:
        problems = [_arch_field_problem(design, key, value) for design in designs.values()]
        if all(problems):
            on = "" if problems[0].startswith(_VALUE_PROBLEM) else f" (on {', '.join(map(str, designs))})"
            raise SpecError(f"{where}: {problems[0]}{on}", source=source)
        design = next(d for d, problem in zip(designs.values(), problems) if problem is None)
        parsed = repr(_read_value(design, key, value))
        if parsed in read_as:
            raise SpecError(f"{where}: {show(read_as[parsed])} and {show(value)} read as one value ({parsed}); give it "
                            "once (each would be a point of one design)", source=source)
        read_as[parsed] = value


def _read_value(design: dict[str, Any], key: str, value: Any) -> Any:
    """``value`` of the field ``key`` as the design's spec reads it (units parsed); the value as
    written where the design does not take it with its other fields (a combination left to its
    points: :func:`_check_arch_field`)."""
    from pydantic import ValidationError

    from mambalaya.arch import ArchSpec, arch_to_dict, set_fields

    try:
        data = set_fields(arch_to_dict(ArchSpec.model_validate(design)), {key: value})
        node: Any = arch_to_dict(ArchSpec.model_validate(data))
    except (SpecError, ValidationError):
        return value
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, dict) and part not in node and part.isdigit() else node[part]
    return node


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
