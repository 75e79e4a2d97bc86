"""What every layer builder and model-config parser checks, in one place: a config validated
into its pydantic model with one SpecError naming each field at fault, and a layer's phase,
batch, length and width."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mambalaya.arch.quantities import MAX_ELEMENT_BITS
from mambalaya.errors import SpecError
from mambalaya.specio import describe_validation_error

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def validated_config(model: type[ConfigT], data: Any, *, what: str, source: str) -> ConfigT:
    """``model.model_validate(data)``, or one SpecError ``invalid {what} config: field: problem; ...``
    naming ``source`` (a model-level problem is named ``config``). The fields a model lists in
    ``FILE_REQUIRED_FIELDS`` (those whose class default is no published default, such as a
    model's layer count) must be given."""
    missing = [name for name in getattr(model, "FILE_REQUIRED_FIELDS", ()) if isinstance(data, dict) and name not in data]
    problems = [f"{name}: required field is missing (it has no published default)" for name in missing]
    try:
        config = model.model_validate(data)
    except ValidationError as err:
        problems.insert(0, describe_validation_error(err, f"invalid {what} config"))
        raise SpecError("; ".join(problems), source=source) from None
    if problems:
        raise SpecError(f"invalid {what} config: " + "; ".join(problems), source=source)
    return config


def check_layer_args(phase: str, *, batch: Any, seq_len: Any, bits: Any) -> None:
    """A layer's phase is ``prefill`` or ``decode`` and its batch, length and width are positive
    integers; otherwise one SpecError naming the argument."""
    if phase not in ("prefill", "decode"):
        raise SpecError(f"phase must be 'prefill' or 'decode', not {phase!r}")
    for label, value in (("batch", batch), ("seq_len", seq_len), ("bits", bits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{label} must be a positive integer, not {value!r}")
    if bits > MAX_ELEMENT_BITS:
        raise SpecError(f"bits must be at most {MAX_ELEMENT_BITS} (IEEE double precision, the widest element a design "
                        f"or a precision policy may give), not {bits}")


__all__ = ["check_layer_args", "validated_config"]


def chunk_padding_free_form(scan: str | None, phase: str, seq_len: int | None, chunk_size: int, why: str) -> str:
    """The scan form of a layer that runs more than its scan on the positions (default: chunked
    in prefill, recurrent in decode). The chunked scan pads ``L`` to a multiple of the chunk
    size, which the rest of such a layer would count too: a clear error there, ``why`` saying
    what would count the padded rows."""
    form = scan or ("chunked" if phase == "prefill" else "recurrent")
    if form == "chunked" and seq_len % chunk_size:  # type: ignore[operator]
        raise SpecError(f"the chunked scan pads L = {seq_len} to a multiple of the chunk size {chunk_size}, and {why}; "
                        "use the recurrent scan (scan='recurrent', --scan recurrent) or a multiple of the chunk size")
    return form
