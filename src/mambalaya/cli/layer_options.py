"""The layer a command builds, declared once: ``@layer_options()`` gives a command the options
that name a model layer (``--model --phase --seq-len --batch --bits --precision --state-io
--scan --layer-type --unroll``) and hands it one :class:`LayerArgs` as its ``layer`` parameter.

Typer reads a command's options from its signature, so the decorator writes those parameters
into the signature it shows (before the command's own) and packs them on the way in."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable

from mambalaya.cli.options import (DEFAULT_BITS, DEFAULT_CASCADE_BATCH, DEFAULT_CASCADE_MODEL, DEFAULT_SEQ_LEN, BatchOpt,
                                   BitsOpt, LayerTypeOpt, ModelOpt, PhaseOpt, PhaseOption, PrecisionOpt, ScanOpt,
                                   SeqLenOpt, StateIoOpt, UnrollFlag)


@dataclass(frozen=True)
class LayerArgs:
    """The options that name a model layer, as the command line gave them."""

    model: str = DEFAULT_CASCADE_MODEL
    phase: PhaseOption = PhaseOption.prefill
    seq_len: int = DEFAULT_SEQ_LEN
    batch: int = DEFAULT_CASCADE_BATCH
    bits: int = DEFAULT_BITS
    precision: str | None = None
    state_io: bool | None = None
    scan: str | None = None
    layer_type: str | None = None
    unroll: bool = False

    def run_fields(self) -> dict[str, Any]:
        """The run's fields for a provenance record (``phase``, ``seq_len``, ``batch``, ``bits``, ``precision``)."""
        return {"phase": self.phase.value, "seq_len": self.seq_len, "batch": self.batch, "bits": self.bits,
                "precision": self.precision or "uniform"}

    def title(self, cascade: Any) -> str:
        """``model: phase, I=..., batch=...``: how a table's title names the layer."""
        return f"{self.model}: {self.phase.value}, I={cascade.size('I')}, batch={self.batch}"

    def build(self) -> tuple[Any, Any]:
        """(model config, cascade) of the layer (:func:`mambalaya.cli.common._model_layer`)."""
        from mambalaya.cli.common import _model_layer

        return _model_layer(self.model, self.phase, self.seq_len, self.batch, self.bits, self.state_io, self.scan,
                            self.unroll, self.precision, self.layer_type)


_ANNOTATIONS = {"model": ModelOpt, "phase": PhaseOpt, "seq_len": SeqLenOpt, "batch": BatchOpt, "bits": BitsOpt,
                "precision": PrecisionOpt, "state_io": StateIoOpt, "scan": ScanOpt, "layer_type": LayerTypeOpt,
                "unroll": UnrollFlag}


def layer_options(*, state_io: bool = True, unroll: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give the decorated command the layer options (without ``--state-io`` or ``--unroll``
    where it has no use for them) as one ``layer: LayerArgs`` parameter."""
    left_out = {"state_io"} - ({"state_io"} if state_io else set()) | ({"unroll"} - ({"unroll"} if unroll else set()))
    names = [f.name for f in fields(LayerArgs) if f.name not in left_out]
    defaults = {f.name: f.default for f in fields(LayerArgs)}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "layer"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults[n], annotation=_ANNOTATIONS[n])
                 for n in names]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            layer = LayerArgs(**{n: kwargs.pop(n) for n in names})
            return command(layer=layer, **kwargs)

        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            added + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
        return run

    return decorate
