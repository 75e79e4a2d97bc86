"""Reading YAML specs (architectures, precision policies) with one-paragraph errors.

Shared by every pydantic-validated spec: :func:`parse_yaml_text` turns broken YAML into a
:class:`~mambalaya.errors.SpecError` with line and column, and
:func:`describe_validation_error` turns a pydantic ``ValidationError`` into one paragraph that
names each offending field path.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
from typing import Any, Callable

import numpy as np
import yaml
from pydantic import ConfigDict, ValidationError

from mambalaya.errors import SpecError


class FieldProblem(ValueError):
    """A validator's complaint about a sub-field (``field`` is a dotted path below the model).

    Model-level validators raise it so the loader can name the offending field
    (``compute.one_d_lanes``) rather than the model holding it (``compute``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(message)


# ---------------------------------------------------------------------------------------------
# Documents: one strict reading of every YAML and JSON file mambalaya reads
#
# Every reader of the package (architecture, model, mapping, sweep, policy, routing, validation
# and sensitivity files, transformers config.json files) parses its text here, so each of them
# refuses the same things: a key given twice in one mapping, nesting deeper than
# MAX_NESTING_DEPTH, a document that expands (through YAML aliases) to more than
# MAX_DOCUMENT_NODES values, an integer of more than MAX_INTEGER_DIGITS digits. What a field
# must hold (types, ranges, required fields) is its model's business: SPEC_MODEL_CONFIG and the
# strict_* functions below.

#: The deepest nesting of mappings and lists a document may have (a shipped spec nests 4 deep, a
#: transformers config.json 3; a recursive YAML alias nests without end and stops here).
MAX_NESTING_DEPTH = 64

#: The most values (mappings, lists and scalars, counting each use of a YAML alias) a document
#: may hold: a shipped spec holds a few hundred, a cascade file at the 16 MiB read limit (an
#: unrolled layer) about 1.3 million. An alias bomb (a list of nine aliases to a list of nine
#: aliases ...) stops here.
MAX_DOCUMENT_NODES = 4_000_000

#: The longest integer a document may spell (Python's own limit on reading integers from text:
#: a 5000-digit integer is no size, count or width of anything mambalaya models).
MAX_INTEGER_DIGITS = 4300

#: Past this many characters a YAML text's syntax is checked (its event stream, in C) before its
#: values are built: a syntax error on the last line of a 10 MB file is then reported in about
#: 2 s instead of the 20 s that building its nodes takes on this project's 2-core machines.
PRESCAN_CHARS = 2**20

#: libyaml's safe loader, where PyYAML was built with it: the same resolver and constructors as
#: ``yaml.safe_load`` over a parser in C (an architecture preset in 1 ms instead of 10).
_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first_line: int, second_line: int, column: int) -> None:
        self.key, self.first_line, self.second_line, self.column = key, first_line, second_line, column
        super().__init__(key)


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a key given twice in one mapping (YAML says keys are unique;
    PyYAML keeps the last silently), and reading numbers as YAML 1.2 does (:data:`_STRICT_INT`,
    :data:`_STRICT_FLOAT`, also under an explicit ``!!int`` or ``!!float`` tag). Keys merged in
    with ``<<`` may be overridden by the mapping's own, as YAML's merge key allows, but a key
    twice in a merged mapping, or in two merged mappings, is refused as well (PyYAML kept the
    last: ``<<: {d_model: 768, d_model: 2048}`` read 2048)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self._keys_given(node)
        return super().construct_mapping(node, deep=deep)

    def _keys_given(self, node: yaml.MappingNode) -> dict[Any, tuple[int, int]]:
        """The keys ``node`` gives, each with its line and column: its own, each once, and those
        its merge keys bring in, each from one merged mapping (its own override them)."""
        own: dict[Any, tuple[int, int]] = {}
        merged: dict[Any, tuple[int, int]] = {}

        def add(found: dict[Any, tuple[int, int]], key: Any, where: tuple[int, int]) -> None:
            try:
                if key in found:
                    raise _DuplicateKey(key, found[key][0], where[0], where[1])
                found[key] = where
            except TypeError:  # an unhashable key: the constructor says so
                pass

        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if isinstance(source, yaml.MappingNode):
                        for key, where in self._keys_given(source).items():
                            add(merged, key, where)
                continue
            key = self.construct_object(key_node, deep=True)
            add(own, key, (key_node.start_mark.line + 1, key_node.start_mark.column + 1))
        return {**merged, **own}


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"

#: Integers as YAML 1.2 spells them (decimal, 0x hex, 0b binary; ``_`` between digits): YAML 1.1's
#: base 60 (``1:04`` is 64) and leading-zero octal (``0100`` is 64) are text, refused where a
#: number is due, not read as another number.
_STRICT_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$")
#: Numbers with a fraction or an exponent, the exponent also without a decimal point or a sign
#: (``1e-5``, ``2.039e12``, which YAML 1.1 reads as text), and the infinities and NaN; no base 60.
_STRICT_FLOAT = re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+"
                           r"|[-+]?[0-9][0-9_]*\.[0-9_]*"
                           r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                           r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")

_BOOL_TAG = "tag:yaml.org,2002:bool"
#: Booleans as YAML 1.2 spells them: YAML 1.1's ``yes``, ``no``, ``on``, ``off``, ``y`` and ``n``
#: are text, refused where a boolean is due (they were read as true and false, where the docs
#: promise ``true`` or ``false`` only).
_STRICT_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")

_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG, _BOOL_TAG)]
    for first, resolvers in _BASE_LOADER.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(_INT_TAG, _STRICT_INT, list("-+0123456789"))
_StrictLoader.add_implicit_resolver(_FLOAT_TAG, _STRICT_FLOAT, list("-+0123456789."))
_StrictLoader.add_implicit_resolver(_BOOL_TAG, _STRICT_BOOL, list("tTfF"))


def _tagged_number(pattern: re.Pattern[str], kind: str, construct: Callable[..., Any]) -> Callable[..., Any]:
    """A constructor for an explicitly tagged number (``!!int 0100``): the tag does not bring
    back YAML 1.1's spellings (leading-zero octal, base 60), which read as other numbers."""
    def strict(loader: Any, node: yaml.ScalarNode) -> Any:
        text = loader.construct_scalar(node)
        if not pattern.match(text) and not (kind == "float" and _STRICT_INT.match(text)):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} tagged !!{kind} is not a YAML 1.2 {kind} (YAML 1.1's leading-zero octal and "
                            f"base-60 spellings read as other numbers and are not read)", node.start_mark)
        return construct(loader, node)
    return strict


_StrictLoader.add_constructor(_INT_TAG, _tagged_number(_STRICT_INT, "int", yaml.SafeLoader.construct_yaml_int))
_StrictLoader.add_constructor(_FLOAT_TAG, _tagged_number(_STRICT_FLOAT, "float", yaml.SafeLoader.construct_yaml_float))


class _StrictDumper(yaml.SafeDumper):
    """The safe dumper quoting text that either the strict loader or YAML 1.1 would read as a
    number (``0E0``, ``1e-5``, ``1:04``, ``0100``), so every YAML file mambalaya writes reads
    back to the values it wrote, here and in any other YAML reader."""


_StrictDumper.yaml_implicit_resolvers = {first: list(resolvers) for first, resolvers in
                                         yaml.SafeDumper.yaml_implicit_resolvers.items()}
_StrictDumper.add_implicit_resolver(_INT_TAG, _STRICT_INT, list("-+0123456789"))
_StrictDumper.add_implicit_resolver(_FLOAT_TAG, _STRICT_FLOAT, list("-+0123456789."))


def dump_yaml(data: Any, **options: Any) -> str:
    """``yaml.safe_dump(data, **options)`` in the spelling :func:`parse_yaml_text` reads back."""
    return yaml.dump(data, Dumper=_StrictDumper, **options)


def parse_yaml_text(text: str, *, source: str) -> Any:
    """The YAML document ``text`` as Python values (the safe loader's types), read once, or a
    :class:`SpecError` naming ``source``, line and column: broken YAML, a key given twice in one
    mapping, and a document past the bounds above (:func:`check_document_bounds`)."""
    data = _read_yaml(text, source, lambda: yaml.load(text, Loader=_StrictLoader))
    check_document_bounds(data, source=source)
    return data


def compose_yaml_text(text: str, *, source: str) -> yaml.Node | None:
    """The YAML document ``text`` as composed nodes (for readers that point into the file, such
    as cascade files), with :func:`parse_yaml_text`'s errors and bounds; checking each mapping's
    keys is the reader's (its nodes are not constructed here)."""
    root = _read_yaml(text, source, lambda: yaml.compose(text, Loader=_StrictLoader))
    check_document_bounds(root, source=source)
    return root


def _read_yaml(text: str, source: str, build: Callable[[], Any]) -> Any:
    """``build()`` (a load or a compose of ``text``), every failure one located SpecError."""
    try:
        if len(text) > PRESCAN_CHARS:  # syntax and size first: events cost a tenth of building the nodes
            _prescan(text, source)
        return build()
    except _DuplicateKey as err:
        raise SpecError(f"key {show(err.key)} is given twice in one mapping (lines {err.first_line} and "
                        f"{err.second_line}); give each key once", source=source, line=err.second_line,
                        column=err.column) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = ", ".join(str(x) for x in (err.context, err.problem) if x)
        bad = first_bad_escape(text)
        if bad is not None and "escape" in what:
            raise _bad_escape_error(text, bad, source) from None
        raise SpecError(
            one_paragraph(f"not valid YAML: {what}"),
            source=source,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow
        before = text[: err.position] if isinstance(text, str) else ""
        raise SpecError(
            f"not valid YAML: character {_char_name(err.character)} is not allowed",
            source=source,
            line=before.count("\n") + 1,
            column=len(before) - (before.rfind("\n") + 1) + 1,
        ) from None
    except yaml.YAMLError as err:
        raise SpecError(one_paragraph(f"not valid YAML: {err}"), source=source) from None
    except RecursionError:
        raise SpecError(f"not valid YAML: nested more than {MAX_NESTING_DEPTH} levels deep", source=source) from None
    except (ValueError, OverflowError) as err:
        # PyYAML's scanner calls chr() on escapes such as "\U00110000" unchecked; its
        # constructors raise ValueError on values such as the date 2001-13-01, and int() on an
        # integer past Python's digit limit
        bad = first_bad_escape(text)
        if bad is None:
            raise SpecError(one_paragraph(f"not valid YAML: {err}"), source=source) from None
        raise _bad_escape_error(text, bad, source) from None


def _prescan(text: str, source: str) -> None:
    """The YAML event stream of ``text``, read in C before any value is built: a syntax error
    (raised as the loader's) or more than :data:`MAX_DOCUMENT_NODES` values is found in seconds,
    without the gigabytes building a 16 MiB document of small values takes."""
    values = 0
    for event in yaml.parse(text, Loader=_BASE_LOADER):
        if isinstance(event, _VALUE_EVENTS):
            values += 1
            if values > MAX_DOCUMENT_NODES:
                raise SpecError(f"the document holds more than {MAX_DOCUMENT_NODES:,} values; it is not a spec "
                                "mambalaya reads", source=source)


_VALUE_EVENTS = (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent, yaml.AliasEvent)


def _bad_escape_error(text: str, offset: int, source: str) -> SpecError:
    before = text[:offset]
    return SpecError("not valid YAML: an escape names no Unicode character", source=source,
                     line=before.count("\n") + 1, column=len(before) - (before.rfind("\n") + 1) + 1)


class _JSONProblem(Exception):
    pass


#: How transformers writes a float JSON cannot spell (``save_pretrained`` of a default
#: ``time_step_limit`` gives ``[0.0, {"__float__": "Infinity"}]``).
_ENCODED_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def decode_special_float(value: Any) -> Any:
    """``value``, or the float a transformers-encoded object spells (``{"__float__": "Infinity"}``
    is ``inf``; ``-Infinity`` and ``NaN`` likewise)."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("__float__"), str) \
            and value["__float__"] in _ENCODED_FLOATS:
        return _ENCODED_FLOATS[value["__float__"]]
    return value


def _json_object(pairs: list[tuple[str, Any]]) -> Any:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JSONProblem(f"key {show(key)} is given twice in one object; give each key once")
        out[key] = value
    return decode_special_float(out)


def _json_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _JSONProblem(f"an integer of {len(digits.lstrip('-')):,} digits (at most {MAX_INTEGER_DIGITS:,})")
    return int(digits)


def parse_json_text(text: str, *, source: str) -> Any:
    """The JSON document ``text`` as Python values, or a :class:`SpecError` naming ``source``
    (and the line and column where the decoder says): a key given twice in one object, an
    integer of more than :data:`MAX_INTEGER_DIGITS` digits, and a document past the bounds of
    :func:`check_document_bounds`. ``NaN``/``Infinity`` literals (Python's ``json`` writes them)
    and transformers' ``{"__float__": "Infinity"}`` objects are floats: which fields may hold
    them is each field's business (:func:`finite_number`)."""
    try:
        data = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int)
    except _JSONProblem as err:
        raise SpecError(f"not valid JSON for mambalaya: {err}", source=source) from None
    except json.JSONDecodeError as err:
        raise SpecError(f"not valid JSON: {err.msg}", source=source, line=err.lineno, column=err.colno) from None
    except RecursionError:
        raise SpecError(f"not valid JSON: nested more than {MAX_NESTING_DEPTH} levels deep", source=source) from None
    except (ValueError, OverflowError) as err:
        raise SpecError(one_paragraph(f"not valid JSON: {err}"), source=source) from None
    check_document_bounds(data, source=source)
    return data


def check_document_bounds(data: Any, *, source: str) -> None:
    """A :class:`SpecError` naming ``source`` if ``data`` (Python values, or composed YAML nodes)
    nests deeper than :data:`MAX_NESTING_DEPTH` or holds more than :data:`MAX_DOCUMENT_NODES`
    values, each use of a shared (aliased) value counted; it stops at the first value past either
    bound, so a document that expands without end is refused in the time of reading the bound."""
    nodes = 1
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = _children(value)
        if not children:
            continue
        if depth >= MAX_NESTING_DEPTH:
            raise SpecError(f"the document nests more than {MAX_NESTING_DEPTH} levels deep (or an alias refers to "
                            "itself); it is not a spec mambalaya reads", source=source)
        nodes += len(children)
        if nodes > MAX_DOCUMENT_NODES:
            raise SpecError(f"the document holds more than {MAX_DOCUMENT_NODES:,} values (each use of a shared "
                            "value, a YAML alias, counted); it is not a spec mambalaya reads", source=source)
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))


_CONTAINERS = (dict, list, tuple, yaml.MappingNode, yaml.SequenceNode)


def _children(value: Any) -> Any:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, yaml.MappingNode):
        return [node for pair in value.value for node in pair]
    if isinstance(value, yaml.SequenceNode):
        return value.value
    return ()


def parse_document_text(text: str, *, source: str, json_document: bool) -> Any:
    """:func:`parse_json_text` or :func:`parse_yaml_text`, by ``json_document``."""
    return parse_json_text(text, source=source) if json_document else parse_yaml_text(text, source=source)


# ---------------------------------------------------------------------------------------------
# Values: what a field holds, read strictly

#: The pydantic configuration of every spec model (architectures, model configs, policies):
#: an integer field takes integers only (not 64.0, 64.9 or "64"), a boolean field takes true or
#: false only (not "no", 0 or 1), a number is finite, and an unknown field is an error.
SPEC_MODEL_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def list_as_tuple(value: Any) -> Any:
    """A list as a tuple, anything else as it is: the ``BeforeValidator`` of a strict model's
    tuple field, which a YAML or JSON document spells as a list."""
    return tuple(value) if isinstance(value, list) else value


def strict_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` if it is an integer (not a bool, not a float such as 64.0) within
    [``minimum``, ``maximum``]; otherwise a :class:`FieldProblem` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise FieldProblem(name, f"must be an integer, not {show(value)}")
    value = int(value)
    _check_range(value, name, minimum, maximum)
    return value


def strict_bool(value: Any, name: str) -> bool:
    """``value`` if it is true or false (not "no", 0 or 1); otherwise a :class:`FieldProblem`."""
    if not isinstance(value, (bool, np.bool_)):
        raise FieldProblem(name, f"must be true or false, not {show(value)}")
    return bool(value)


def finite_number(value: Any, name: str, *, minimum: float | None = None, maximum: float | None = None,
                  allow_inf: bool = False) -> float:
    """``value`` as a float if it is a number (not a bool or text) that is finite (or, with
    ``allow_inf``, an infinity) and within [``minimum``, ``maximum``]; otherwise a
    :class:`FieldProblem` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise FieldProblem(name, f"must be a number, not {show(value)}")
    number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else float("inf")
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise FieldProblem(name, f"must be a finite number, not {show(value)}")
    _check_range(number, name, minimum, maximum)
    return number


def _check_range(value: float, name: str, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise FieldProblem(name, f"must be at least {minimum:g}, not {value:g}")
    if maximum is not None and value > maximum:
        raise FieldProblem(name, f"must be at most {maximum:g}, not {value:g}")


#: A YAML escape naming a code point by eight hex digits (PyYAML does not check its range).
_ESCAPE_U = re.compile(r"\\U([0-9A-Fa-f]{8})")


def first_bad_escape(text: Any) -> int | None:
    """Offset of the first ``\\U`` escape in ``text`` beyond Unicode (``"\\U00110000"``), on
    which PyYAML's scanner calls ``chr()`` unchecked, or None."""
    if not isinstance(text, str):
        return None
    return next((m.start() for m in _ESCAPE_U.finditer(text) if int(m.group(1), 16) > 0x10FFFF), None)


def load_spec_text(text: str, model: type, *, what: str, fields: str, source: str,
                   context: dict[str, Any] | None = None) -> Any:
    """Parse YAML ``text`` and validate it into the pydantic ``model``: every problem is one
    :class:`SpecError` naming ``source`` and the field (``what`` names the kind of spec, e.g.
    "precision policy"; ``fields`` lists its top-level fields for the not-a-mapping message;
    ``context`` is the validators' pydantic validation context)."""
    data = parse_yaml_text(text, source=source)
    if data is None:
        raise SpecError(f"the {what} is empty", source=source)
    if not isinstance(data, dict):
        raise SpecError(f"a {what} is a mapping ({fields}), not {kind_of(data)}", source=source)
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, f"invalid {what}"), source=source) from None


#: The largest spec, config, mapping or policy file mambalaya reads (a transformers config.json
#: is a few KB, the largest shipped spec about 10 KB, a cascade file of a whole layer under 100 KB).
MAX_SPEC_BYTES = 16 * 2**20


def path_is(path: str | os.PathLike[str], kind: str = "any") -> bool:
    """Whether ``path`` names an existing ``kind`` (``"file"``, ``"dir"`` or ``"any"``) entry.
    A name the system cannot look up (too long, a NUL byte in it) names nothing: readers decide
    between a preset name and a path with it, so that such a name is an unknown name, never a
    traceback."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return {"file": stat.S_ISREG, "dir": stat.S_ISDIR}.get(kind, lambda _: True)(info.st_mode)


def read_spec_file(path: str | os.PathLike[str], what: str, *, limit_bytes: int = MAX_SPEC_BYTES) -> str:
    """The UTF-8 text of a spec file, or a :class:`SpecError` naming it. Only a regular file of
    at most ``limit_bytes`` is read: a FIFO, a device (``/dev/urandom``) or a directory is refused
    before anything is read, so no read blocks or runs without end."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket")
            raise SpecError(f"cannot read {what}: it is {kind}, not a regular file", source=str(path))
        if info.st_size > limit_bytes:
            raise SpecError(f"cannot read {what}: it is {info.st_size:,} bytes, over the {limit_bytes:,}-byte limit "
                            "for a spec or config file", source=str(path))
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as err:
        raise SpecError(f"cannot read {what}: {err.strerror or err}", source=str(path)) from None
    except ValueError as err:  # a NUL byte in the name
        raise SpecError(f"cannot read {what}: {err}", source=repr(str(path))) from None
    if len(data) > limit_bytes:
        raise SpecError(f"cannot read {what}: it grew past the {limit_bytes:,}-byte limit while being read",
                        source=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{what} is not UTF-8 text", source=str(path)) from None


_TYPE_WORDS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping of fields",
    "model_attributes_type": "must be a mapping of fields",
    "list_type": "must be a list",
}


def describe_validation_error(
    err: ValidationError, head: str, allowed_fields: Callable[[list[Any]], str] | None = None
) -> str:
    """One paragraph: ``head`` then ``path: problem`` for each distinct problem.

    ``allowed_fields(loc)`` may name the fields allowed where an unknown one was given."""
    problems: list[str] = []
    for e in err.errors(include_url=False):
        loc = list(e["loc"])
        kind = e["type"]
        ctx = e.get("ctx") or {}
        got = f" (got {show(e.get('input'))})"
        is_key = bool(loc) and loc[-1] == "[key]"
        if is_key:
            loc = loc[:-1]
        if kind == "value_error" and isinstance(ctx.get("error"), FieldProblem):
            problem = ctx["error"]
            path = field_path(loc)
            path = f"{path}.{problem.field}" if path else problem.field
            problems.append(f"{path}: {problem.message}")
            continue
        if kind == "missing":
            text = "required field is missing"
        elif kind == "extra_forbidden":
            text = "unknown field" + (allowed_fields(loc) if allowed_fields else "")
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
            bound = next(iter(ctx.values()), "?")
            text = f"must be {op} {bound}{got}"
        elif kind == "invalid_key":
            text = "field names must be strings"
        elif kind == "string_too_short":
            text = "must not be empty"
        elif kind in ("literal_error", "enum"):
            text = f"must be one of {ctx.get('expected', '?')}{got}"
        elif kind == "value_error":
            text = str(ctx.get("error") or e["msg"])
        elif kind in _TYPE_WORDS:
            text = _TYPE_WORDS[kind] + got
        else:
            text = f"{e['msg']}{got}"
        if is_key:
            text = f"key {show(loc[-1]) if loc else ''} {text}".replace("  ", " ")
            loc = loc[:-1]
        path = field_path(loc)
        problems.append(f"{path}: {text}" if path else text)
    unique = list(dict.fromkeys(problems))
    lead = f"{head}: " if len(unique) == 1 else f"{head} ({len(unique)} problems): "
    return one_paragraph(lead + "; ".join(unique))


def allowed_field_names(names: list[str], loc: list[Any]) -> str:
    """`` (allowed: a, b); did you mean a?`` for an unknown field at ``loc``."""
    hint = ""
    if loc and isinstance(loc[-1], str):
        close = difflib.get_close_matches(loc[-1], names, n=1)
        if close:
            hint = f"; did you mean {close[0]}?"
    return f" (allowed: {', '.join(names)}){hint}"


_PLAIN = re.compile(r"^[A-Za-z0-9_\-]+$")


#: The names pydantic gives the members of a union in an error's location (``constrained-int``,
#: ``literal['auto']``, ``function-before[list_as_tuple(), tuple[float, ...]]``): not fields, so
#: a path leaves them out (``dt_rank: must be an integer``, not ``dt_rank.constrained-int: ...``).
_UNION_MEMBER = re.compile(r"^(?:int|float|str|bool|none"  # (not bytes: a collective case's field)
                           r"|constrained-\w+|(?:function-\w+|tagged-union|literal|is-instance|lax-or-strict|"
                           r"json-or-python|chain|nullable|union|list|tuple|dict|set)\[.*\])$", re.DOTALL)


def field_path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and _UNION_MEMBER.match(part):
            continue
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _PLAIN.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{show(part)}]"
    return out


def kind_of(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{show(value)} ({type(value).__name__})"


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and abs(value) >= 10**60:  # repr() refuses past 4,300 digits
        return f"an integer of about {math.floor(math.log10(abs(value))) + 1:,} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _char_name(character: Any) -> str:
    code = character if isinstance(character, int) else ord(character[0]) if character else 0
    return f"U+{code:04X}"


def one_paragraph(text: str) -> str:
    return " ".join(text.split())
