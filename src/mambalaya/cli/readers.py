"""How the command line reads the values it does not leave to typer, each kind by one function
every option of that kind goes through:

* a size (``--seq-len``, ``--batch``, ``--bits``, ``--unroll-scan``, ``--generated-tokens``,
  ``--n-layers``, ``--workers``, and each entry of ``--seq-lens``): ASCII digits only, at least 1
  (:func:`size_problem`): ``64.0``, ``1e3``, ``1_000``, ``+64``, `` 64`` and ``６４`` are refused,
  never rounded or trimmed;
* a comma-separated list (``--archs``, ``--models``, ``--seq-lens``, ``--sensitivity-seq-lens``):
  no empty entry, no entry given twice (:func:`read_list`); spaces around an entry are dropped;
* a ratio (``--published``): a positive finite decimal number (:func:`ratio_parser`);
* any text option: not empty (:func:`empty_text_problem`, run by every command's
  :func:`~mambalaya.cli.common.user_errors`), so ``--buffer ''`` is not silently the default.

A single size or ratio is read while typer parses the command line (a usage error, exit 2,
like any other malformed option); a list is read by the command (``error: ...``, exit 1).
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any, Callable, get_args, get_origin, Annotated

import typer

from mambalaya.errors import MambalayaError

#: The largest size any option takes (a signed 64-bit integer): the model refuses what it cannot
#: count exactly (a rank over 2^53) with its own message.
MAX_SIZE = 2**63 - 1

_DECIMAL = re.compile(r"[-+]?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|[-+]?\.[0-9]+([eE][-+]?[0-9]+)?")


def size_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a size (a positive integer written in ASCII digits, or an
    ``int`` default), or None if nothing is."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return f"must be a positive integer, not {value!r}"
    text = str(value)
    if not (text.isascii() and text.isdigit()):
        return f"must be a positive integer written in the digits 0-9 (such as 64; not 64.0, 1e3, 1_000 or +64), not {text!r}"
    if len(text.lstrip("0")) > len(str(MAX_SIZE)) or int(text) > MAX_SIZE:
        return f"must be at most {MAX_SIZE:,} (2^63 - 1), not {text}"
    if int(text) < 1:
        return f"must be at least 1, not {text}"
    return None


def read_size(value: Any, what: str) -> int:
    """``value`` as a size (:func:`size_problem`), or a :class:`MambalayaError` naming ``what``."""
    problem = size_problem(value)
    if problem is not None:
        raise MambalayaError(f"{what} {problem}")
    return int(value)


def size_parser(value: Any) -> int | None:
    """typer's ``parser`` of a size option: the size, or a usage error saying what is wrong;
    ``None`` (an optional size not given) passes."""
    if value is None:
        return None
    problem = size_problem(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return int(value)


def ratio_parser(value: Any) -> float | None:
    """typer's ``parser`` of a ratio option (``--published 4.9``): a positive finite number
    written in decimal (``4.9``, ``1e-3``); ``nan``, ``inf``, ``0``, a negative number and one so
    small it reads as 0 (``1e-400``) are usage errors. ``None`` (not given) passes."""
    if value is None:
        return None
    text = str(value)
    if not (isinstance(value, (str, float, int)) and not isinstance(value, bool) and _DECIMAL.fullmatch(text)):
        raise typer.BadParameter(f"must be a positive finite number written in decimal (such as 4.9 or 1e-3), not {text!r}")
    number = float(text)
    if not math.isfinite(number):
        raise typer.BadParameter(f"must be a finite number, not {text} (it is too large to represent)")
    if number <= 0:
        underflow = number == 0 and re.search("[1-9]", re.split("[eE]", text)[0]) is not None
        raise typer.BadParameter(f"must be a positive ratio, not {text}" + (" (so small it reads as 0)" if underflow else ""))
    return number


def read_list(text: str, what: str) -> list[str]:
    """The entries of a comma-separated option (``mambalaya,marca-ideal``), spaces around each
    dropped: an empty entry (``a,,b``, a trailing comma, nothing at all) or an entry given twice
    is a :class:`MambalayaError` naming ``what``."""
    entries = [entry.strip() for entry in text.split(",")]
    if not all(entries):
        raise MambalayaError(f"{what} {text!r} has an empty entry; give a comma-separated list such as a,b "
                             "(no empty entry, no trailing comma)")
    twice = sorted({e for e in entries if entries.count(e) > 1})
    if twice:
        raise MambalayaError(f"{what} gives {', '.join(twice)} more than once ({text!r}); give each value once")
    return entries


def read_int_list(text: str, what: str) -> list[int]:
    """A comma-separated list of distinct sizes (``2048,16384``): :func:`read_list`, each entry a
    size (:func:`size_problem`); a :class:`MambalayaError` naming ``what`` otherwise."""
    entries = read_list(text, what)
    for entry in entries:
        problem = size_problem(entry)
        if problem is not None:
            raise MambalayaError(f"{what} must be a comma-separated list of positive integers ({text!r}): "
                                 f"entry {entry!r} {problem}")
    values = [int(e) for e in entries]
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise MambalayaError(f"{what} gives {', '.join(map(str, twice))} more than once ({text!r}); give each value once")
    return values


def option_names(command: Callable[..., Any]) -> dict[str, str]:
    """Each parameter of a typer command with the name the user typed for it (``fmt`` ->
    ``--format``, a positional argument -> its metavar or upper-case name)."""
    names: dict[str, str] = {}
    try:
        parameters = inspect.signature(command, eval_str=True).parameters
    except (NameError, TypeError, ValueError):  # an annotation that does not evaluate: the bare names
        return names
    for name, parameter in parameters.items():
        info = next((m for m in get_args(parameter.annotation)[1:] if hasattr(m, "param_decls")), None) \
            if get_origin(parameter.annotation) is Annotated else None
        if isinstance(info, typer.models.ArgumentInfo):
            names[name] = info.metavar or name.upper()
            continue
        # inside Annotated, typer.Option's first declaration ("--arch" of ("--arch", "-a")) is its default
        first = getattr(info, "default", None)
        declared = [d for d in (first, *(getattr(info, "param_decls", None) or ()))
                    if isinstance(d, str) and d.startswith("-")]
        longest = max(declared, key=len) if declared else "--" + name.replace("_", "-")
        names[name] = longest.split("/")[0]
    return names


def empty_text_problem(command: Callable[..., Any], arguments: dict[str, Any]) -> str | None:
    """The error for a text option of ``command`` given as empty text (``--buffer ''``), which
    would otherwise read as "not given", or None if none is."""
    empty = [name for name, value in arguments.items() if isinstance(value, str) and not value.strip()]
    if not empty:
        return None
    shown = option_names(command).get(empty[0], empty[0])
    default = ", or leave the option out for its default" if shown.startswith("-") else ""
    return f"{shown} is given as empty text ({arguments[empty[0]]!r}); give it a value{default}"
