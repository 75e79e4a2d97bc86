"""Reading YAML specs (architectures, precision policies) with one-paragraph errors.

Shared by every pydantic-validated spec: :func:`parse_yaml_text` turns broken YAML into a
:class:`~mambalaya.errors.SpecError` with line and column, and
:func:`describe_validation_error` turns a pydantic ``ValidationError`` into one paragraph that
names each offending field path.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import stat
from typing import Any, Callable

import yaml
from pydantic import ValidationError

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


#: libyaml's safe loader, where PyYAML was built with it: the same resolver and constructors as
#: ``yaml.safe_load`` over a parser in C (an architecture preset in 1 ms instead of 10).
_C_SAFE_LOADER = getattr(yaml, "CSafeLoader", None)


def parse_yaml_text(text: str, *, source: str) -> Any:
    """``yaml.safe_load(text)``, or a :class:`SpecError` naming ``source``, line and column.
    Parsed by libyaml's safe loader where there is one; text it does not accept is parsed
    again by PyYAML's, whose errors are the ones reported."""
    if _C_SAFE_LOADER is not None:
        with contextlib.suppress(Exception):  # PyYAML's own loader says what is wrong, below
            return yaml.load(text, Loader=_C_SAFE_LOADER)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = ", ".join(str(x) for x in (err.context, err.problem) if x)
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
        raise SpecError("not valid YAML: nested too deeply", source=source) from None
    except (ValueError, OverflowError) as err:
        # PyYAML's scanner calls chr() on escapes such as "\U00110000" unchecked; its
        # constructors raise ValueError on values such as the date 2001-13-01
        bad = first_bad_escape(text)
        if bad is None:
            raise SpecError(one_paragraph(f"not valid YAML: {err}"), source=source) from None
        before = text[:bad]
        raise SpecError("not valid YAML: an escape names no Unicode character", source=source,
                        line=before.count("\n") + 1, column=len(before) - (before.rfind("\n") + 1) + 1) from None


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


def field_path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
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
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _char_name(character: Any) -> str:
    code = character if isinstance(character, int) else ord(character[0]) if character else 0
    return f"U+{code:04X}"


def one_paragraph(text: str) -> str:
    return " ".join(text.split())
