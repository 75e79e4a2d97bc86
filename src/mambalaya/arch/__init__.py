"""Architecture specs for the latency model: loading, listing, tabulating.

Shipped specs live in ``mambalaya/arch/specs/*.yaml``; :func:`load_arch` takes one of their
names (``mambalaya``, ``marca-ideal``, ...) or a path to a YAML file. Every user-facing problem
is a :class:`~mambalaya.errors.SpecError` whose message is one paragraph naming the field path
(``compute.array_rows: must be > 0 (got -4)``) and, for broken YAML, the line and column.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from mambalaya.arch.spec import (
    DEFAULT_UNARY_COST_CYCLES,
    FUSION_CLASSES,
    MAPPING_NAMES,
    UNARY_FUNCTIONS,
    ArchSpec,
    ComputeSpec,
    MappingPolicy,
    MemorySpec,
    field_paths,
)
from mambalaya.errors import SpecError
from mambalaya.specio import allowed_field_names, describe_validation_error, dump_yaml, kind_of as _kind, parse_yaml_text, path_is, read_spec_file

__all__ = [
    "ArchSpec",
    "ComputeSpec",
    "MemorySpec",
    "MappingPolicy",
    "UNARY_FUNCTIONS",
    "DEFAULT_UNARY_COST_CYCLES",
    "MAPPING_NAMES",
    "FUSION_CLASSES",
    "load_arch",
    "loads_arch",
    "names_a_file",
    "path_beside",
    "arch_from_dict",
    "arch_to_dict",
    "arch_to_yaml",
    "arch_rows",
    "shipped_archs",
    "field_paths",
    "overlapping_fields",
    "parse_setting",
    "setting_fields",
    "SECTION_FIELDS",
    "set_fields",
    "with_settings",
    "core_design",
]

_SPEC_DIR = "specs"
_SECTIONS: dict[str, type[BaseModel]] = {"compute": ComputeSpec, "memory": MemorySpec, "mappings": MappingPolicy}


# ---------------------------------------------------------------------------------------------
# loading


def shipped_archs() -> list[str]:
    """Names of the architecture specs shipped with mambalaya, sorted."""
    folder = resources.files(__name__).joinpath(_SPEC_DIR)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_arch(name_or_path: str | os.PathLike[str]) -> ArchSpec:
    """Load a shipped spec by name (see :func:`shipped_archs`) or a YAML file by path."""
    if isinstance(name_or_path, str) and name_or_path in shipped_archs():
        resource = resources.files(__name__).joinpath(_SPEC_DIR, f"{name_or_path}.yaml")
        return loads_arch(resource.read_text(encoding="utf-8"), source=f"{name_or_path}.yaml (shipped)")
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise SpecError(f"an architecture is named by a string or a path, not {type(name_or_path).__name__}")
    path = Path(name_or_path)
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, os.PathLike) or text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if not looks_like_path and not path_is(path, "file"):
        raise SpecError(
            f"unknown architecture {text!r}; shipped: {', '.join(shipped_archs())} (or give the path of a YAML file)"
        )
    if not path_is(path):
        raise SpecError(f"cannot read architecture file: No such file or directory (shipped specs, loaded by name: "
                        f"{', '.join(shipped_archs())})", source=str(path))
    return _files_beside(loads_arch(read_spec_file(path, "architecture file"), source=str(path)), path)


def names_a_file(value: str) -> bool:
    """Whether a spec's value names a file rather than a shipped entry: a YAML file name or a path."""
    return value.endswith((".yaml", ".yml")) or os.sep in value or "/" in value


def path_beside(value: Any, folder: Path, shipped: Any = ()) -> Any:
    """``value`` read beside ``folder`` where it is a relative path naming a file (not one of the
    ``shipped`` names): a file a spec names is relative to the spec's folder, never to the folder
    a command happens to run in; anything else as given."""
    if not isinstance(value, str) or value in shipped or not names_a_file(value) or Path(value).is_absolute():
        return value
    return str((folder / value).resolve())


def _files_beside(spec: ArchSpec, path: Path) -> ArchSpec:
    """``spec`` with the policy file it names read beside it (:func:`path_beside`), as a sweep
    spec's paths are read beside their own."""
    beside = path_beside(spec.precision, path.parent)
    return spec if beside == spec.precision else spec.model_copy(update={"precision": beside})


def loads_arch(text: str, *, source: str = "<string>") -> ArchSpec:
    """Parse and validate an architecture spec from YAML text."""
    data = parse_yaml_text(text, source=source)
    if data is None:
        raise SpecError("the architecture spec is empty", source=source)
    return arch_from_dict(data, source=source)


def arch_from_dict(data: Any, *, source: str = "<dict>") -> ArchSpec:
    """Validate a plain dict (as read from YAML) into an :class:`ArchSpec`."""
    if not isinstance(data, dict):
        raise SpecError(
            "an architecture spec must be a mapping of fields (name, clock_hz, compute, memory, mappings, ...), "
            f"not {_kind(data)}",
            source=source,
        )
    try:
        return ArchSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_describe(err), source=source) from None


def _describe(err: ValidationError) -> str:
    return describe_validation_error(err, "invalid architecture spec", _allowed_fields)


def _allowed_fields(loc: list[Any]) -> str:
    model: type[BaseModel] | None = ArchSpec
    for part in loc[:-1]:
        model = _SECTIONS.get(part) if model is ArchSpec and isinstance(part, str) else None
        if model is None:
            return ""
    return allowed_field_names(list(model.model_fields), loc)


# ---------------------------------------------------------------------------------------------
# changing fields (--set FIELD=VALUE, sweep points)

TOP_LEVEL_FIELDS = ("name", "description", "clock_hz", "bits_per_element", "precision", "power_budget_w")


def _is_section(annotation: Any) -> bool:
    """Whether a field's annotation is a section model (``ComputeSpec``, ``EnergySpec | None``)."""
    return any(isinstance(a, type) and issubclass(a, BaseModel) for a in (get_args(annotation) or (annotation,)))


#: The spec's sections (``compute``, ``memory``, ``energy``, ...): set field by field, never whole.
SECTION_FIELDS: tuple[str, ...] = tuple(n for n, f in ArchSpec.model_fields.items() if _is_section(f.annotation))

#: The field that records where each value came from: written by :func:`with_settings`, not set.
_SOURCES_FIELD = "sources"


def set_fields(data: dict[str, Any], values: dict[str, Any], *, what: str = "architecture field") -> dict[str, Any]:
    """``data`` (an :func:`arch_to_dict`) with each dotted field of ``values`` replaced. Refused,
    with one paragraph naming the field: a name that is not a dotted field name, a field the
    spec does not have (or an optional section it lacks), ``sources`` (the spec's record of
    where values came from), a whole section (``compute``: its fields are set one at a time)
    and a table (``compute.unary_cost_cycles``, ``memory.levels``) given anything but a mapping.
    Values are validated, with their units parsed, when the dict is read back
    (:func:`arch_from_dict`)."""
    for key, value in values.items():
        _set_field(data, key, value, what)
    for key, value in values.items():
        for other in alternative_forms(key) if value is not None else ():
            if other not in values:
                _null_field(data, other)
    return data


def alternative_forms(key: str) -> list[str]:
    """The fields giving ``key``'s quantity in its other form: a bandwidth is a figure
    (``memory.onchip_bandwidth_bytes_per_cycle``, a level's ``bandwidth_bytes_per_cycle``) or the
    organisation it comes from (banks and their port bytes), never both (a spec giving both is
    refused: one would be unread). Setting one form (``--set``, a sweep axis, a sensitivity end)
    nulls the other, so the setting is what the numbers read: a figure set on a banked buffer
    replaces its banks, banks set on a level given by its figure replace the figure (which once
    silently won: ``--set memory.levels.l2.banks=10`` changed nothing on ``gpu-h100``)."""
    parts = key.split(".")
    onchip = {"memory.onchip_bandwidth_bytes_per_cycle": ["memory.onchip_banks", "memory.onchip_bank_port_bytes"],
              "memory.onchip_banks": ["memory.onchip_bandwidth_bytes_per_cycle"],
              "memory.onchip_bank_port_bytes": ["memory.onchip_bandwidth_bytes_per_cycle"]}
    if key in onchip:
        return onchip[key]
    if len(parts) == 4 and parts[:2] == ["memory", "levels"]:
        level = ".".join(parts[:3])
        if parts[3] == "bandwidth_bytes_per_cycle":
            return [f"{level}.banks", f"{level}.bank_port_bytes"]
        if parts[3] in ("banks", "bank_port_bytes"):
            return [f"{level}.bandwidth_bytes_per_cycle"]
    return []


def _null_field(data: dict[str, Any], key: str) -> None:
    """``key`` (a field :func:`_set_field` has checked the parents of) set to null where the
    spec holds it."""
    *parents, leaf = key.split(".")
    node: Any = data
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.get(leaf) is not None:
        node[leaf] = None


def _set_field(data: dict[str, Any], key: Any, value: Any, what: str) -> None:
    parts = key.split(".") if isinstance(key, str) else []
    if not parts or not all(p.strip() for p in parts):
        raise SpecError(f"{what} {key!r} is not a field name (a dotted name such as memory.onchip_buffer_bytes)")
    if parts[0] == _SOURCES_FIELD:
        raise SpecError(f"{what} {key!r} cannot be set: '{_SOURCES_FIELD}' is the spec's record of where each value "
                        "came from, which --set writes itself; set the field itself")
    if len(parts) == 1 and key in SECTION_FIELDS:
        example = f"{key}.{next(iter(_section_fields(key)), 'FIELD')}"
        raise SpecError(f"{what} {key!r} is a whole section, not a field: set its fields one at a time "
                        f"(e.g. {example}=VALUE)")
    node = data
    *parents, leaf = parts
    for p in parents:
        p = _table_key(node, p)
        if not isinstance(node.get(p), dict):
            why = (f"{p!r} is one value here ({node[p]!r}), not a section or table" if node.get(p) is not None
                   else f"{data.get('name', 'this spec')} has no {p!r} section" if p in node or p in ArchSpec.model_fields
                   else f"{p!r} is not a section here (fields here: {', '.join(sorted(map(str, node)))})")
            raise SpecError(f"{what} {key!r} does not exist: {why}")
        node = node[p]
    leaf = _table_key(node, leaf)
    # a new key inside a table field (energy.mfu_pj.exp, compute.unary_cost_cycles.exp) is fine
    if leaf not in node and len(parents) < 2 and (parents or leaf not in TOP_LEVEL_FIELDS):
        raise SpecError(f"{what} {key!r} does not exist (fields here: {', '.join(sorted(map(str, node)))})")
    table = node.get(leaf)
    if isinstance(table, dict) and not isinstance(value, dict):
        entries = f"entries: {', '.join(sorted(map(str, table)))}" if table else "empty here"
        raise SpecError(f"{what} {key!r} is a table ({entries}), not one value (got {_kind(value)}): set one entry "
                        f"({key}.NAME=VALUE) or give the whole table as a mapping")
    node[leaf] = value


def _table_key(node: dict[Any, Any], part: str) -> Any:
    """A dotted name's part as ``node`` keys it: a width entry (energy.mac_pj.16) is the table's own
    integer key, not a second "16"."""
    if part not in node and part.isascii() and part.isdigit() and int(part) in node:
        return int(part)
    return part


def _section_fields(section: str) -> list[str]:
    """The field names of a section's model (``compute`` -> array_rows, array_cols, ...)."""
    annotation = ArchSpec.model_fields[section].annotation
    model = next(a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel))
    return list(model.model_fields)


def overlapping_fields(keys: Any) -> tuple[str, str] | None:
    """The first two of ``keys`` (dotted field names) that set the same field: equal names, or
    one naming a table or section the other sets an entry of (``compute.unary_cost_cycles`` and
    ``compute.unary_cost_cycles.exp``); None if every key sets a field of its own."""
    seen: dict[str, str] = {}
    for key in keys:
        name = str(key).strip()
        if name in seen:
            return seen[name], key
        seen[name] = key
    for key in list(seen.values()):
        parts = str(key).strip().split(".")
        for n in range(1, len(parts)):
            prefix = ".".join(parts[:n])
            if prefix in seen:
                return seen[prefix], key
    return None


#: A number with an exponent that YAML 1.1 (PyYAML) reads as text: one without a decimal point
#: (``1e-3``) or without the exponent's sign (``2.039e12``).
_EXPONENT_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)[eE][+-]?\d+")


def parse_setting(text: str, option: str = "--set") -> tuple[str, Any]:
    """``FIELD=VALUE`` as (field, value); the value is read as YAML by the shared reader
    (:func:`~mambalaya.specio.parse_yaml_text`: a key given twice, or a value nested or aliased
    past its bounds, is refused): ``16MiB`` stays text for the spec's unit parsing,
    ``[weight-stationary]`` is a list, ``true`` a boolean. A value that is not YAML at all is
    taken as its text (the field's own validation then says what it takes)."""
    field, sep, raw = text.partition("=")
    field = field.strip()
    if not sep or not field or not raw.strip():
        raise SpecError(f"{option} {text!r}: expected FIELD=VALUE, e.g. {option} memory.onchip_buffer_bytes=16MiB")
    try:
        value = parse_yaml_text(raw, source=f"{option} {field}")
    except SpecError:
        if not _is_broken_yaml(raw):
            raise
        value = raw.strip()
    return field, exponent_number(value)


def setting_fields(settings: Iterable[str]) -> list[str]:
    """The field each ``FIELD=VALUE`` of ``settings`` sets, in order (their values unread)."""
    return [text.partition("=")[0].strip() for text in settings]


def _is_broken_yaml(text: str) -> bool:
    """Whether ``text`` is not YAML at all (so a ``--set`` value is taken as text), as opposed
    to YAML the shared reader refuses (a duplicate key, a document past its bounds)."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        return True
    except (ValueError, OverflowError, RecursionError):
        return False
    return False


def exponent_number(value: Any) -> Any:
    """``value``, or the number it spells when it is text such as ``2e-6``, ``1E12`` or
    ``2.039e12``, which YAML 1.1 (PyYAML) reads as text (:data:`_EXPONENT_NUMBER`). A number too
    large for a float (``1e400``) is ``inf``, which the spec's finite fields then refuse."""
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def with_settings(spec: ArchSpec, settings: list[str] | tuple[str, ...], option: str = "--set") -> ArchSpec:
    """``spec`` with each ``FIELD=VALUE`` of ``settings`` applied, validated again; errors name
    the option and the field. A field set twice (or a table and one of its entries) is refused,
    naming both settings: the last would otherwise win silently."""
    if not settings:
        return spec
    parsed = [parse_setting(t, option) for t in settings]
    clash = overlapping_fields(key for key, _ in parsed)
    if clash is not None:
        first, second = clash
        texts = [next(t for (k, _), t in zip(parsed, settings) if k == key) for key in (first, second)]
        if first == second:
            texts = [t for (k, _), t in zip(parsed, settings) if k == first][:2]
            raise SpecError(f"{option} {first} is given twice ({option} {texts[0]} and {option} {texts[1]}); "
                            "give each field once")
        raise SpecError(f"{option} {texts[0]} and {option} {texts[1]} both set {second!r}; give each field once")
    values = dict(parsed)
    data = set_fields(arch_to_dict(spec), values, what=f"{option}: architecture field")
    sources = data.setdefault("sources", {})
    known = set(field_paths())
    for key, value in values.items():  # the printed source says where the value came from
        path = key
        while path not in known and "." in path:  # a table entry (energy.mfu_pj.exp): its table's source
            path = path.rsplit(".", 1)[0]
        before = sources.get(path)
        note = f"set on the command line ({option} {key}={value})"
        sources[path] = note + (f"; the spec's source: {before}" if before else "")
    return arch_from_dict(data, source=f"{spec.name} with {option} " + " ".join(settings))


# ---------------------------------------------------------------------------------------------
# output


def core_design(spec: ArchSpec, streams: int | None = None) -> ArchSpec:
    """One core of a multi-core design (its ``cores`` section) as a design of its own: the spec's
    compute and on-chip memory, ``1/streams`` of the chip's off-chip bandwidth (``streams``: the
    cores that stream at once, default all of them), ``1/count`` of its power budget, the chip's
    memory capacity (shared: a core's part never exceeds the model, which the chip is checked to
    hold), and the network on chip as the system joining the cores
    (:meth:`~mambalaya.arch.system.CoresSpec.network`)."""
    cores = spec.cores
    if cores is None:
        raise ValueError(f"{spec.name} has no cores section")
    n = cores.count
    streams = n if streams is None else streams
    if not 1 <= streams <= n:
        raise ValueError(f"streams is 1 to the {n} cores, not {streams}")
    data = arch_to_dict(spec)
    data.pop("cores")
    memory = data["memory"]
    memory["offchip_bandwidth_bytes_per_s"] = memory["offchip_bandwidth_bytes_per_s"] / streams
    if data.get("power_budget_w") is not None:
        data["power_budget_w"] = data["power_budget_w"] / n
    data["system"] = cores.network().model_dump(mode="python")
    data["name"] = f"{spec.name}-core"
    data["description"] = (f"one of the {n} cores of {spec.name}, with 1/{streams} of its off-chip bandwidth ({streams} "
                           f"cores streaming at once), 1/{n} of its power budget and its shared memory; "
                           f"{spec.description}").strip()
    data["sources"] = {k: v for k, v in spec.sources.items() if k != "cores" and not k.startswith("cores.")}
    return arch_from_dict(data, source=f"{spec.name}'s cores")


def arch_to_dict(spec: ArchSpec) -> dict[str, Any]:
    """The spec as plain data (numbers in base units); :func:`arch_from_dict` reads it back."""
    return spec.model_dump(mode="python")


def arch_to_yaml(spec: ArchSpec) -> str:
    """The spec as YAML text that :func:`loads_arch` reads back to an equal spec."""
    data = arch_to_dict(spec)
    text = dump_yaml(data, sort_keys=False, allow_unicode=True, width=100)
    if yaml.safe_load(text) != data:  # PyYAML folds a NEL (U+0085) in single quotes: escape instead
        text = dump_yaml(data, sort_keys=False, allow_unicode=False, width=100)
    return text


_UNITS: dict[str, str] = {
    "name": "",
    "clock_hz": "Hz",
    "bits_per_element": "bits",
    "precision": "",
    "power_budget_w": "W",
    "compute.array_rows": "PEs",
    "compute.array_cols": "PEs",
    "compute.one_d_mode": "",
    "compute.one_d_lanes": "lanes",
    "compute.one_d_ops_per_lane_per_cycle": "ops/lane/cycle",
    "compute.vector_lanes": "ops/cycle",
    "compute.mfu_units": "MFUs",
    "compute.unary_cost_cycles": "cycles/result",
    "compute.unary_cost_pe_ops": "ops/result",
    "compute.dataflows": "",
    "kernels.min_kernel_s": "s",
    "technology.node_nm": "nm",
    "technology.reference_node_nm": "nm",
    "technology.energy_scale": "",
    "technology.area_scale": "",
    "technology.logic_leakage_w_per_mm2": "W/mm^2",
    "technology.sram_leakage_w_per_mib": "W/MiB",
    "area.mfu_um2": "um^2",
    "area.register_um2_per_bit": "um^2/bit",
    "area.sram_um2_per_bit": "um^2/bit",
    "area.overhead_fraction": "",
    "kernels.compute_fraction": "",
    "kernels.offchip_fraction": "",
    "kernels.sm_count": "SMs",
    "system.link_bandwidth_bytes_per_s": "B/s",
    "system.link_latency_s": "s",
    "system.collective_latency_s": "s",
    "system.in_network_reduction": "",
    "system.link_energy_pj_per_bit": "pJ/bit",
    "system.unit": "",
    "cores.count": "cores",
    "cores.noc_bandwidth_bytes_per_s": "B/s",
    "cores.noc_latency_s": "s",
    "cores.noc_energy_pj_per_bit": "pJ/bit",
    "cores.placement": "",
    "kernels.sm_offchip_bytes_per_s": "B/s per SM",
    "kernels.scan_sm_cycles_per_step": "SM-cycles per step",
    "compute.dataflow_switch_cycles": "cycles",
    "compute.stationary_double_buffered": "",
    "compute.gemm_in_1d_mode": "",
    "compute.overlap_compute_units": "",
    "compute.pipeline_wind_up_cycles": "cycles",
    "memory.onchip_buffer_bytes": "bytes",
    "memory.offchip_bandwidth_bytes_per_s": "B/s",
    "memory.onchip_bandwidth_bytes_per_cycle": "B/cycle",
    "memory.onchip_banks": "banks",
    "memory.onchip_bank_port_bytes": "B/cycle/bank",
    "memory.pe_local_bytes": "bytes/PE",
    "memory.pe_local_bytes_per_cycle": "B/cycle/PE",
    "memory.offchip_capacity_bytes": "bytes",
    "memory.overlap_compute_and_memory": "",
    "energy.dram_pj_per_bit": "pJ/bit",
    "energy.buffer_read_pj_per_bit": "pJ/bit",
    "energy.buffer_write_pj_per_bit": "pJ/bit",
    "energy.buffer_reference_bytes": "bytes",
    "energy.buffer_size_exponent": "",
    "energy.register_pj_per_bit": "pJ/bit",
    "mappings.default": "",
    "mappings.fusion_classes": "",
}


_LEVEL_UNITS = {"capacity_bytes": "bytes", "banks": "banks", "bank_port_bytes": "B/cycle/bank",
                "bandwidth_bytes_per_cycle": "B/cycle"}


def _source(spec: ArchSpec, path: str, given: bool) -> str:
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in spec.sources:
            return spec.sources[key]
    return "" if given else "default"


def arch_rows(spec: ArchSpec) -> list[dict[str, Any]]:
    """One row per value of the spec, then the derived peaks: ``field``, ``value``, ``unit``, ``source``.

    ``source`` is the spec's ``sources`` entry for the field (or its nearest section), else
    ``"default"`` for a value the file did not set, else ``""``.
    """
    rows: list[dict[str, Any]] = []

    def add(path: str, value: Any, given: bool, unit: str | None = None) -> None:
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) or "(none)"
        unit = _UNITS.get(path, "") if unit is None else unit
        rows.append({"field": path, "value": value, "unit": unit, "source": _source(spec, path, given)})

    add("name", spec.name, True)
    add("clock_hz", spec.clock_hz, "clock_hz" in spec.model_fields_set)
    add("bits_per_element", spec.bits_per_element, "bits_per_element" in spec.model_fields_set)
    add("precision", spec.precision, "precision" in spec.model_fields_set)
    add("power_budget_w", spec.power_budget_w if spec.power_budget_w is not None else "(none)",
        "power_budget_w" in spec.model_fields_set)
    for section in ("compute", "memory", "mappings"):
        model = getattr(spec, section)
        for name in type(model).model_fields:
            path = f"{section}.{name}"
            value = getattr(model, name)
            given = section in spec.model_fields_set and name in model.model_fields_set
            if path == "memory.levels":
                for level_name, level in value.items():
                    for key in type(level).model_fields:
                        if getattr(level, key) is not None:  # the organisation the level gives
                            add(f"{path}.{level_name}.{key}", getattr(level, key), given, _LEVEL_UNITS[key])
            elif isinstance(value, dict):
                for fn in UNARY_FUNCTIONS:
                    if fn in value:
                        add(f"{path}.{fn}", value[fn], given, _UNITS[path])
            else:
                add(path, value, given)
    if spec.energy is not None:
        for name in type(spec.energy).model_fields:
            path = f"energy.{name}"
            value = getattr(spec.energy, name)
            if isinstance(value, dict):
                for key, v in value.items():
                    add(f"{path}.{key}", v, True, "pJ" if name != "mfu_pj" else "pJ/result")
            else:
                add(path, value, True)
    for section, unit in (("kernels", None), ("system", None), ("cores", None), ("technology", None), ("area", "um^2")):
        model = getattr(spec, section)
        if model is None:
            continue
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, dict):
                for key, v in value.items():
                    add(f"{section}.{name}.{key}", v, True, unit)
            else:
                add(f"{section}.{name}", value, True)
    n = spec.cores.count if spec.cores is not None else 1  # a multi-core chip's peaks are its cores' together
    chip, each = ("cores.count * ", f" (the chip's {n} cores; one core's {spec.peak_macs_per_s:g} MAC/s)") if n > 1 else ("", "")
    derived = [
        ("derived.one_d_lanes", spec.compute.one_d_lanes_effective, "lanes", "1D-mode lanes (array_rows * array_cols unless one_d_lanes is set; 0 without 1D mode)"
         + (" of each core" if n > 1 else "")),
        ("derived.peak_macs_per_s", n * spec.peak_macs_per_s, "MAC/s", f"{chip}array_rows * array_cols * clock_hz{each}"),
        ("derived.peak_elementwise_ops_per_s", n * spec.peak_elementwise_ops_per_s, "ops/s",
         f"{chip}(1D lanes * ops/lane/cycle, or vector_lanes without a 1D mode) * clock_hz"),
        ("derived.peak_bandwidth", spec.peak_bandwidth, "B/s", "memory.offchip_bandwidth_bytes_per_s"),
        ("derived.onchip_bandwidth_bytes_per_cycle",
         spec.memory.buffer_bandwidth_bytes_per_cycle if spec.memory.buffer_bandwidth_bytes_per_cycle is not None else "unbounded",
         "B/cycle", "memory.onchip_bandwidth_bytes_per_cycle if given, else memory.onchip_banks * memory.onchip_bank_port_bytes"),
        *((f"derived.levels.{n}.bandwidth_bytes_per_cycle", level.bytes_per_cycle, "B/cycle",
           f"memory.levels.{n}.bandwidth_bytes_per_cycle if given, else its banks * bank_port_bytes")
          for n, level in spec.memory.levels.items()),
        ("derived.ridge_point_ops_per_byte", n * spec.ridge_point_ops_per_byte, "ops/byte",
         "2 * peak_macs_per_s / peak_bandwidth" + (" (the chip's, as each core's share of the bandwidth gives it)"
                                                   if n > 1 else "")),
    ]
    for path, value, unit, how in derived:
        rows.append({"field": path, "value": value, "unit": unit, "source": f"derived: {how}"})
    return rows
