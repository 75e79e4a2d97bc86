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
