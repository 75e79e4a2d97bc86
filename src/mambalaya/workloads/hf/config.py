"""Reading a transformers ``config.json``: the file itself, its fields read by type
(:class:`ConfigFile`), its fields audited against what mambalaya models
(:mod:`mambalaya.workloads.hf.fields`), and the config beside a weights file.

**One typed reading of every field.** Every family reader (Mamba-1, Mamba-2, Bamba, Nemotron-H,
Falcon-H1, Zamba2, OLMo-Hybrid, Jamba, Granite 4) reads each field it uses through one
:class:`ConfigFile` method, which takes only what transformers 5.25's typed config classes take
(``huggingface_hub``'s strict dataclasses) and refuses the rest with one error naming the file
and the field:

* an integer field takes a JSON integer: not ``64.0`` (transformers refuses a float there too),
  not ``"64"``, not ``true``; and no more than :data:`MAX_SIZE` (:data:`MAX_LAYERS` for a
  layer count, so nothing is ever built per layer past it);
* a number field takes a finite JSON number (an integer too: pydantic's strict floats and
  Python take ``1`` for ``1.0``, where transformers asks for ``1.0``); never NaN, an infinity
  or an integer too large for a float, except the upper bound of ``time_step_limit``, whose
  transformers default is infinite (saved as ``{"__float__": "Infinity"}``);
* a boolean field takes ``true`` or ``false`` only (not ``"no"``, ``0`` or ``1``);
* a string, a list of strings (a layer pattern, at most :data:`MAX_LAYERS` long, each entry a
  known layer type), a list of integers or numbers, and a mapping (``rope_parameters``), each
  checked for its shape before any entry is used.

A config given as a dict (``hybrid_config_from_hf(dict)``) is read exactly as a file:
:meth:`ConfigFile.of` bounds its nesting and size and decodes transformers'
``{"__float__": "Infinity"}`` objects as the file reader does (:func:`decoded_floats`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mambalaya.errors import MambalayaError, SpecError
from mambalaya.specio import (
    FieldProblem,
    check_document_bounds,
    decode_special_float,
    finite_number,
    parse_json_text,
    read_spec_file,
    strict_bool,
    strict_int,
)
from mambalaya.workloads.hf.field_types import field_type_problem
from mambalaya.workloads.hf.fields import NO_CLAMP, TRANSFORMERS_VERSION, ConfigFields, shown
from mambalaya.workloads.hf.loader import WeightLoadError

#: The most layers a config.json may give (``num_hidden_layers``, or the length of a layer
#: pattern): published models have at most a few hundred; a count past this is a typo or a test
#: of the reader, and refusing it (before any list of layers is built) keeps every per-layer list
#: a reader or a model config holds small: 10**9 layers are refused at once, not built.
MAX_LAYERS = 10_000

#: The largest size any integer field may give (a width, head count, vocabulary, ...): 2**40,
#: far past any model (the widest have hidden sizes of a few ten thousand), and small enough that
#: the products of sizes the cost model forms (parameter counts, bytes moved) stay finite floats.
MAX_SIZE = 2**40


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def decoded_floats(data: Any) -> Any:
    """``data`` with every transformers-encoded float (``{"__float__": "Infinity"}``) replaced by
    the float it spells, as :func:`mambalaya.specio.parse_json_text` reads a file; ``data`` must
    be bounded (:func:`~mambalaya.specio.check_document_bounds`) first."""
    if isinstance(data, Mapping) and isinstance(data.get("__float__"), str):
        data = decode_special_float(data)
    if isinstance(data, Mapping):
        return {key: decoded_floats(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(decoded_floats(value) for value in data)
    return data


def read_config_json(path_or_dict: Any, label: str) -> tuple[dict[str, Any], str]:
    """A model config as a dict, from a dict or a local ``config.json`` (or its directory), and
    where it came from (for error messages); ``label`` names the model family in errors. A file
    is read by :func:`~mambalaya.specio.parse_json_text`; a dict is bounded and decoded the same
    way (:func:`decoded_floats`)."""
    if isinstance(path_or_dict, Mapping):
        where = "the config dict"
        try:
            check_document_bounds(path_or_dict, source=where)
        except SpecError as exc:
            raise WeightLoadError(f"Cannot read the {label} config: {exc}.") from None
        return decoded_floats(path_or_dict), where
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise WeightLoadError(
            f"Cannot read a {label} config from a {type(path_or_dict).__name__}: give a dict or the "
            "path of a config.json (or of its directory)."
        )
    path = Path(path_or_dict).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = parse_json_text(read_spec_file(path, f"{label} config"), source=str(path))
    except SpecError as exc:
        raise WeightLoadError(f"Cannot read the {label} config: {exc}.") from None
    if not isinstance(cfg, dict):
        raise WeightLoadError(f"The {label} config {path} is not a JSON object.")
    return cfg, str(path)


_ABSENT = object()


def _integer_words(minimum: int) -> str:
    return {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")


def _number_words(above: float | None, minimum: float | None, maximum: float | None) -> str:
    if above == 0 and maximum is None:
        return "a positive finite number"
    if minimum == 0 and maximum is None and above is None:
        return "a non-negative finite number"
    low = f"({above:g}" if above is not None else f"[{minimum:g}" if minimum is not None else "(-inf"
    high = f"{maximum:g}]" if maximum is not None else "inf)"
    return f"a finite number in {low}, {high}"


@dataclass(frozen=True)
class ConfigFile:
    """The fields of one config.json (or of one mapping inside it, ``prefix`` naming it, e.g.
    ``"rope_parameters."``), each read by type: an absent field takes ``defaults`` (the config
    class's defaults). Every problem is one error naming ``source`` and the field: a
    :class:`~mambalaya.errors.SpecError`, or with ``loader`` a
    :class:`~mambalaya.workloads.hf.loader.WeightLoadError` (the weight loaders' readers)."""

    data: Mapping[str, Any]
    source: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    prefix: str = ""
    loader: bool = False

    @classmethod
    def of(cls, data: Any, source: str, *, defaults: Mapping[str, Any] | None = None, what: str = "model",
           loader: bool = False) -> "ConfigFile":
        """A reader of ``data`` (a config.json read as a dict), its nesting and size bounded and
        transformers' encoded floats decoded (:func:`decoded_floats`); ``what`` names the family in
        the not-a-mapping error."""
        reader = cls({}, source, loader=loader)
        if not isinstance(data, Mapping):
            raise reader.error(f"a {what} config is a mapping of fields to values, not {shown(data)}")
        try:
            check_document_bounds(data, source=source)
        except SpecError as exc:
            raise reader.error(exc.message) from None
        return cls(decoded_floats(data), source, defaults or {}, loader=loader)

    # -- errors ----------------------------------------------------------------------------

    def error(self, message: str) -> MambalayaError:
        """One error naming the file (``message`` names the field)."""
        if self.loader:
            return WeightLoadError(f"In {self.source}, {message}.")
        return SpecError(message, source=self.source)

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def _problem(self, key: str, words: str, value: Any) -> MambalayaError:
        return self.error(f"field {self.name(key)} must be {words}, not {shown(value)}")

    # -- raw values ------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether the config gives ``key`` (a null counts)."""
        return key in self.data

    def given(self, key: str) -> bool:
        """Whether the config gives ``key`` a value other than null."""
        return self.data.get(key) is not None

    def value(self, key: str) -> Any:
        """The raw value of ``key``: the config's, else the default's (None without one)."""
        return self.data[key] if key in self.data else self.defaults.get(key)

    # -- typed values ----------------------------------------------------------------------

    def integer(self, key: str, *, minimum: int = 1, maximum: int = MAX_SIZE, value: Any = _ABSENT) -> int:
        """An integer field (``value``: one already taken from it, e.g. through an alias)."""
        value = self.value(key) if value is _ABSENT else value
        try:
            number = strict_int(value, self.name(key))
        except FieldProblem:
            number = minimum - 1
        if number < minimum:
            raise self._problem(key, _integer_words(minimum), value)
        if number > maximum:
            what = f"layers than mambalaya reads (at most {maximum:,})" if maximum == MAX_LAYERS else \
                f"than any size mambalaya reads (at most {maximum:,})"
            raise self.error(f"field {self.name(key)} is {shown(value)}, more {what}")
        return number

    def layer_count(self, key: str, value: Any = _ABSENT) -> int:
        """A number of layers: a positive integer up to :data:`MAX_LAYERS`."""
        return self.integer(key, maximum=MAX_LAYERS, value=value)

    def integer_or(self, key: str, when_null: Any, **bounds: Any) -> Any:
        """An integer field that may be null (absent, it takes its default), then ``when_null``
        (the value the config class computes for a null, such as ``num_attention_heads`` for a null
        ``num_key_value_heads``)."""
        return when_null if self.value(key) is None else self.integer(key, **bounds)

    def integer_or_auto(self, key: str, **bounds: Any) -> int | None:
        """An integer field that may be ``"auto"`` (None: the reader computes it)."""
        return None if self.value(key) == "auto" else self.integer(key, **bounds)

    def number(self, key: str, *, above: float | None = None, minimum: float | None = None,
               maximum: float | None = None, value: Any = _ABSENT) -> float:
        """A finite number field; ``above`` is an exclusive lower bound, ``minimum`` and
        ``maximum`` inclusive bounds."""
        value = self.value(key) if value is _ABSENT else value
        try:
            number = finite_number(value, self.name(key), minimum=minimum, maximum=maximum)
        except FieldProblem:
            number = math.nan
        if math.isnan(number) or (above is not None and not number > above):
            raise self._problem(key, _number_words(above, minimum, maximum), value)
        return number

    def positive_number(self, key: str) -> float:
        return self.number(key, above=0)

    def boolean(self, key: str) -> bool:
        """A boolean field: true or false only."""
        value = self.value(key)
        try:
            return strict_bool(value, self.name(key))
        except FieldProblem:
            raise self._problem(key, "true or false", value) from None

    def text(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        """A string field, one of ``choices`` when given."""
        value = self.value(key)
        if not isinstance(value, str):
            raise self._problem(key, "a string", value)
        if choices is not None and value not in choices:
            raise self.error(f"field {self.name(key)} is {shown(value)}, not one of {', '.join(map(repr, choices))}")
        return value

    def with_aliases(self, aliases: Mapping[str, str], config_class: str) -> "ConfigFile":
        """This config with each alias of ``aliases`` (alias -> field: a transformers config
        class's ``attribute_map``, or the older names its ``__post_init__`` renames) read as its
        field: an alias alone gives the field its value; an alias and its field given the same
        value are one field; given different values, the file says two things of one field and
        is refused naming both (transformers 5.25 takes the alias's, whatever the keys' order in
        the file; mambalaya once took the field's, silently). ``save_pretrained`` writes only the
        field."""
        data = dict(self.data)
        for alias, target in aliases.items():
            if alias not in data:
                continue
            value = data.pop(alias)
            if target in data and not same_value(data[target], value):
                raise self.error(
                    f"fields {self.name(alias)} = {shown(value)} and {self.name(target)} = {shown(data[target])} "
                    f"name one value ({alias} is {config_class}'s alias of {target}; transformers "
                    f"{TRANSFORMERS_VERSION} would take {alias}'s) and differ: give one of them")
            data[target] = value
        return ConfigFile(data, self.source, self.defaults, self.prefix, self.loader)

    def section(self, key: str) -> "ConfigFile":
        """A mapping field (null or absent: empty) as a reader of its own fields."""
        value = self.value(key)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self._problem(key, "a mapping", value)
        for name in value:
            if not isinstance(name, str):
                raise self.error(f"field {self.name(key)} has the key {shown(name)}; its keys are strings")
        return ConfigFile(value, self.source, prefix=f"{self.name(key)}.", loader=self.loader)

    def _list(self, key: str, value: Any, what: str) -> list:
        if not isinstance(value, (list, tuple)) or not value:
            raise self._problem(key, f"a non-empty list of {what}", value)
        if len(value) > MAX_LAYERS:
            raise self.error(f"field {self.name(key)} lists {len(value):,} {what}, more than mambalaya reads (at "
                             f"most {MAX_LAYERS:,})")
        return list(value)

    def layer_types(self, key: str, names: Mapping[str, str], family: str) -> tuple[str, ...] | None:
        """A list of layer types (None when absent or null), each one of ``names`` (transformers'
        name -> mambalaya's), as mambalaya's names; ``family`` names the model in errors."""
        value = self.value(key)
        if value is None:
            return None
        listed = self._list(key, value, "layer types")
        return tuple(self.layer_type(key, k, entry, names, family) for k, entry in enumerate(listed))

    def layer_type(self, key: str, index: int, entry: Any, names: Mapping[str, str], family: str) -> str:
        """Entry ``index`` of the layer-type list ``key`` as mambalaya's name of it."""
        if not isinstance(entry, str) or entry not in names:
            raise self.error(f"field {self.name(key)}[{index}] is {shown(entry)}, not a layer type of {family} "
                             f"(known: {', '.join(repr(t) for t in names)})")
        return names[entry]

    def integers(self, key: str, *, minimum: int = 0, maximum: int = MAX_SIZE) -> tuple[int, ...]:
        """A list of integers (null or absent: empty), at most :data:`MAX_LAYERS` long."""
        value = self.value(key)
        if value is None or value == []:
            return ()
        listed = self._list(key, value, "integers")
        return tuple(self.integer(f"{key}[{k}]", minimum=minimum, maximum=maximum, value=v)
                     for k, v in enumerate(listed))

    def numbers(self, key: str, length: int, **bounds: Any) -> tuple[float, ...]:
        """A list of ``length`` finite numbers."""
        value = self.value(key)
        if not isinstance(value, (list, tuple)) or len(value) != length:
            raise self._problem(key, f"a list of {length} numbers", value)
        return tuple(self.number(f"{key}[{k}]", value=v, **bounds) for k, v in enumerate(value))

    def require_no_clamp(self, key: str = "time_step_limit", *, nullable: bool = True) -> None:
        """``time_step_limit`` (or ``dt_limit``) clamps nothing: absent (every class's default is
        ``(0.0, inf)``, which ``save_pretrained`` writes ``[0.0, {"__float__": "Infinity"}]``),
        ``[lower <= 0, inf]``, or null where the class takes null (``nullable``)."""
        if key not in self.data:
            return
        value = self.data[key]
        if value is None and not nullable or not NO_CLAMP.ok(value):
            raise self.error(f"field {self.name(key)} is {shown(value)}; mambalaya models the unclamped time step "
                             f"{NO_CLAMP.what}")

    def require(self, key: str, expected: Any, why: str) -> None:
        """A field whose one modelled value is ``expected`` (the same type: 1 is not true)."""
        if key in self.data and not same_value(self.data[key], expected):
            raise self.error(f"field {self.name(key)} is {shown(self.data[key])}; mambalaya models "
                             f"{shown(expected)} ({why})")


def check_known_fields(cfg: ConfigFile, config_class: str, read: set, inert: set, modelled: dict) -> None:
    """Every field of a family's config.json is one mambalaya reads, one that cannot change a
    layer (``inert``; its value must still have the type transformers' ``config_class`` checks,
    :func:`~mambalaya.workloads.hf.field_types.field_type_problem`), or one whose value it models
    (``modelled``: field -> (value, why), the value of the same type: ``1`` is not ``true``);
    anything else is refused by name. The readers of the families whose tables are sets of
    names (Jamba, Granite 4, Nemotron-H, Falcon-H1, Zamba2, OLMo-Hybrid) all check through it."""
    for key in cfg.data:
        if key not in read and key not in inert and key not in modelled:
            raise cfg.error(f"field {key} is not a field of transformers {TRANSFORMERS_VERSION}'s {config_class} that "
                            "mambalaya knows; it cannot tell whether it changes a layer")
        if key in inert and (wrong_type := field_type_problem(config_class, key, cfg.data[key])):
            raise cfg.error(wrong_type)
    for key, (value, why) in modelled.items():
        cfg.require(key, value, why)


def same_value(value: Any, expected: Any) -> bool:
    """``value == expected`` with the same type (``1`` is not ``True``, ``0`` not ``False``)."""
    return type(value) is type(expected) and value == expected


def default_rope_theta(cfg: ConfigFile, *, default: float = 10000.0, nope: bool = False) -> float | None:
    """The rotary base of a config whose rotary embedding must be transformers' ``default`` type
    over whole heads: ``rope_parameters.rope_theta``, else a top-level ``rope_theta``, else
    ``default``. ``rope_parameters`` may hold only ``rope_type`` (``type``), ``rope_theta`` and a
    ``partial_rotary_factor`` of 1; with ``nope``, a null ``rope_theta`` means no position
    embedding (None)."""
    rope = cfg.section("rope_parameters")
    for key in ("rope_type", "type"):
        if rope.has(key) and rope.text(key) != "default":
            raise rope.error(f"field {rope.name(key)} is {shown(rope.data[key])}; mambalaya models the default "
                             "rotary embedding only (no frequency scaling)")
    for key in rope.data:
        if key not in ("rope_type", "type", "rope_theta", "partial_rotary_factor"):
            raise rope.error(f"field {rope.name(key)} is {shown(rope.data[key])}; mambalaya models the default "
                             "rotary embedding over whole heads, which reads only rope_type, rope_theta and "
                             "partial_rotary_factor")
    if rope.has("partial_rotary_factor") and rope.number("partial_rotary_factor", above=0, maximum=1) != 1:
        raise rope.error(f"field rope_parameters.partial_rotary_factor is {shown(rope.data['partial_rotary_factor'])}"
                         "; mambalaya models the rotary embedding over whole heads here")
    for reader in (rope, cfg):
        if reader.has("rope_theta"):
            if nope and reader.data["rope_theta"] is None:
                return None
            return reader.positive_number("rope_theta")
    return default


def positive_int(value: Any, name: str, where: str) -> int:
    """``value`` as an int if it is a positive integer (numpy integers included, not 64.0) up to
    :data:`MAX_SIZE`; else a WeightLoadError naming ``name`` and ``where``."""
    return ConfigFile({}, where, loader=True).integer(name, value=value)


def config_format(cfg: Mapping[str, Any], where: str, family: str) -> str:
    """``"transformers"`` (``hidden_size`` or a ``model_type``) or ``"state-spaces"``
    (``d_model``): which class's fields and defaults a config is read with."""
    if "hidden_size" in cfg or "model_type" in cfg:
        if "d_model" in cfg:
            raise WeightLoadError(f"{where} has both hidden_size/model_type (transformers) and d_model "
                                  f"(state-spaces); a {family} config.json is one or the other.")
        return "transformers"
    if "d_model" in cfg:
        return "state-spaces"
    raise WeightLoadError(f"{where} has no d_model: looked for 'hidden_size' (a transformers config) and "
                          f"'d_model' (a state-spaces config).")


def audit_config(cfg: Mapping[str, Any], fields: ConfigFields, where: str, *, prefix: str = "") -> None:
    """Every field of ``cfg`` read, supported or inert (:mod:`~mambalaya.workloads.hf.fields`),
    else a WeightLoadError naming the field."""
    problem = fields.problem(cfg, prefix=prefix)
    if problem:
        raise WeightLoadError(f"In {where}, {problem}.")


@dataclass(frozen=True)
class ConfigReading:
    """How a family reads one config format: the format's field tables (``ssm_fields`` for a
    state-spaces ``ssm_cfg``), its class defaults, the keys that must be present, and which
    config key gives each of mambalaya's fields (``keys``)."""

    fields: ConfigFields
    defaults: Mapping[str, Any]
    keys: Mapping[str, str]
    ssm_fields: ConfigFields | None = None
    required: tuple[str, ...] = ()


def read_config_fields(cfg: Mapping[str, Any], ssm: Mapping[str, Any], where: str,
                       reading: ConfigReading) -> dict[str, tuple[str, Any]]:
    """Each of mambalaya's fields as ``(the config's name for it, its value)``: every field of
    ``cfg`` (and of ``ssm_cfg``) audited first, then each value taken from the config, else from
    ``ssm_cfg``, else from the class defaults. A null is refused where the class has a default
    other than null (transformers' typed configs refuse it: it is no value, not the default)."""
    audit_config(cfg, reading.fields, where)
    scopes: list[Mapping[str, Any]] = [reading.defaults]
    if reading.ssm_fields is not None:
        audit_config(ssm, reading.ssm_fields, where, prefix="ssm_cfg.")
        scopes.append(ssm)
    scopes.append(cfg)
    for scope, prefix in ((ssm, "ssm_cfg."), (cfg, "")):
        for key in reading.keys.values():
            if key in scope and scope[key] is None and reading.defaults.get(key) is not None:
                raise WeightLoadError(f"In {where}, field {prefix}{key} is null; give its value (the class default "
                                      f"is {reading.defaults[key]!r}, which a null does not ask for).")
    values = {k: v for scope in scopes for k, v in scope.items() if v is not None}
    for key in reading.required:
        if key not in values:
            raise WeightLoadError(f"{where} has no {key} (a state-spaces config names it).")
    for key in reading.keys.values():
        if key not in values:
            raise WeightLoadError(f"In {where}, field {key} is {'null' if key in cfg else 'absent'} and has no "
                                  "default; give its value.")
    in_ssm = set(reading.ssm_fields.read) if reading.ssm_fields is not None else set()
    return {ours: (f"ssm_cfg.{key}" if key in in_ssm else key, values[key]) for ours, key in reading.keys.items()}


#: mamba_ssm's ``MambaConfig.pad_vocab_size_multiple`` default (state-spaces/mamba,
#: ``mamba_ssm/models/config_mamba.py``): a state-spaces config.json without the field is padded to it.
STATE_SPACES_PAD_VOCAB_MULTIPLE = 8


def padded_vocab(cfg: Mapping[str, Any], vocab_size: int, where: str) -> int:
    """A state-spaces ``vocab_size`` padded up to ``pad_vocab_size_multiple`` (the embedding's
    rows; absent, mamba_ssm's default :data:`STATE_SPACES_PAD_VOCAB_MULTIPLE`: once left unpadded),
    as mamba_ssm's ``MambaLMHeadModel`` and the transformers conversion do."""
    mult = positive_int(cfg.get("pad_vocab_size_multiple", STATE_SPACES_PAD_VOCAB_MULTIPLE),
                        "pad_vocab_size_multiple", where)
    return -(-vocab_size // mult) * mult


def ssm_cfg_of(cfg: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """A state-spaces config's ``ssm_cfg`` (null or absent: empty); a WeightLoadError if it is not
    a mapping."""
    ssm = cfg.get("ssm_cfg")
    if ssm is None:
        return {}
    if not isinstance(ssm, Mapping):
        raise WeightLoadError(f"In {where}, field ssm_cfg must be a mapping, not {shown(ssm)}.")
    return ssm


def config_beside(source: Any) -> Path | None:
    """The ``config.json`` next to a weight file or in a model directory, if ``source`` is a path
    and there is one."""
    if isinstance(source, Mapping) or not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source).expanduser()
    config = (path if path.is_dir() else path.parent) / "config.json"
    return config if config.is_file() else None


__all__ = ["check_known_fields", "MAX_LAYERS", "MAX_SIZE", "ConfigFile", "ConfigReading", "audit_config", "config_beside", "config_format",
           "decoded_floats", "default_rope_theta", "padded_vocab", "positive_int",
           "read_config_fields", "read_config_json", "same_value", "shown", "ssm_cfg_of"]
