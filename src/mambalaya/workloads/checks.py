"""What every layer builder and model-config parser checks, in one place: a config validated
into its pydantic model with one SpecError naming each field at fault, and a layer's phase,
batch, length and width."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mambalaya.errors import SpecError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def validated_config(model: type[ConfigT], data: Any, *, what: str, source: str) -> ConfigT:
    """``model.model_validate(data)``, or one SpecError ``invalid {what} config: field: problem; ...``
    naming ``source`` (a model-level problem is named ``config``)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in err.errors())
        raise SpecError(f"invalid {what} config: {problems}", source=source) from None


def check_layer_args(phase: str, *, batch: Any, seq_len: Any, bits: Any) -> None:
    """A layer's phase is ``prefill`` or ``decode`` and its batch, length and width are positive
    integers; otherwise one SpecError naming the argument."""
    if phase not in ("prefill", "decode"):
        raise SpecError(f"phase must be 'prefill' or 'decode', not {phase!r}")
    for label, value in (("batch", batch), ("seq_len", seq_len), ("bits", bits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{label} must be a positive integer, not {value!r}")


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
