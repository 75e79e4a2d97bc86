"""Option sets declared once, each a dataclass a command receives as one parameter.

* ``@layer_options()`` gives a command the options that name a model layer (``--model --phase
  --seq-len --batch --bits --precision --state-io --scan --layer-type --unroll --softmax``) as one
  :class:`LayerArgs`, its ``layer`` parameter (the cascade and fusion commands).
* ``@design_options()`` gives a command the options that set up a workload on designs
  (``--model --phase --batch --scan --precision --set --routing --softmax``) as one :class:`DesignArgs`,
  its ``run`` parameter (``evaluate`` and ``compare``).

Typer reads a command's options from its signature, so :func:`_option_group` writes those
parameters into the signature it shows (before the command's own) and packs them on the way in."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from pathlib import Path

from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.cli.options import (DEFAULT_BITS, DEFAULT_CASCADE_BATCH, DEFAULT_CASCADE_MODEL, DEFAULT_DESIGN_BATCH,
                                   DEFAULT_DESIGN_MODEL, DEFAULT_SEQ_LEN, ArchPrecisionOpt, BatchOpt, BitsOpt,
                                   LayerTypeOpt, ModelOpt, PhaseOpt, PhaseOption, PrecisionOpt, RoutingOpt, ScanOpt,
                                   SeqLenOpt, SetOpt, SoftmaxOpt, SoftmaxOption, StateIoOpt, UnrollFlag)


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
    softmax: SoftmaxOption | None = None

    def run_fields(self) -> dict[str, Any]:
        """The run's fields for a provenance record (``phase``, ``seq_len``, ``batch``, ``bits``, ``precision``)."""
        return {"phase": self.phase.value, "seq_len": self.seq_len, "batch": self.batch, "bits": self.bits,
                "precision": self.precision or "uniform", **({} if self.softmax is None else {"softmax": self.softmax.value})}

    def title(self, cascade: Any) -> str:
        """``model: phase, I=..., batch=...``: how a table's title names the layer."""
        return f"{self.model}: {self.phase.value}, I={cascade.size('I')}, batch={self.batch}"

    def input_paths(self) -> dict[str, Any]:
        """The options that may name an input file, by option (for :func:`~mambalaya.outputs.check_output_path`)."""
        return {"--model": self.model, "--precision": self.precision}

    def width_options(self) -> list[str]:
        """The options given that set the tensors' widths (``--bits`` off its default, ``--precision``):
        for a command to refuse where nothing it prints depends on a width."""
        return [o for o, moved in (("--bits", self.bits != LayerArgs().bits), ("--precision", self.precision is not None))
                if moved]

    def build(self) -> tuple[Any, Any]:
        """(model config, cascade) of the layer (:func:`mambalaya.cli.common.model_layer`)."""
        from mambalaya.cli.common import model_layer

        return model_layer(self.model, self.phase, self.seq_len, self.batch, self.bits, self.state_io, self.scan,
                            self.unroll, self.precision, self.layer_type,
                            None if self.softmax is None else self.softmax.value)


_LAYER_ANNOTATIONS = {"model": ModelOpt, "phase": PhaseOpt, "seq_len": SeqLenOpt, "batch": BatchOpt, "bits": BitsOpt,
                      "precision": PrecisionOpt, "state_io": StateIoOpt, "scan": ScanOpt, "layer_type": LayerTypeOpt,
                      "unroll": UnrollFlag, "softmax": SoftmaxOpt}


def layer_options(*, state_io: bool = True, unroll: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give the decorated command the layer options (without ``--state-io`` or ``--unroll``
    where it has no use for them) as one ``layer: LayerArgs`` parameter."""
    left_out = ({"state_io"} - ({"state_io"} if state_io else set())) | ({"unroll"} - ({"unroll"} if unroll else set()))
    return _option_group(LayerArgs, _LAYER_ANNOTATIONS, "layer", left_out)


@dataclass(frozen=True)
class DesignArgs:
    """The options that set up a workload on designs, as the command line gave them."""

    model: str = DEFAULT_DESIGN_MODEL
    phase: PhaseOption = PhaseOption.prefill
    batch: int = DEFAULT_DESIGN_BATCH
    scan: str | None = None
    precision: str | None = None
    settings: list[str] | None = None
    routing: Path | None = None
    softmax: SoftmaxOption | None = None

    def input_paths(self) -> dict[str, Any]:
        """The options that may name an input file, by option (for :func:`~mambalaya.outputs.check_output_path`)."""
        return {"--model": self.model, "--precision": self.precision, "--routing": self.routing}

    def softmax_form(self, config: Any) -> str:
        """The attention layers' softmax form (``three-pass`` when not given); ``--softmax`` on a
        model without attention layers is refused, naming the model."""
        from mambalaya.workloads.families.base import is_hybrid

        if self.softmax is None:
            return "three-pass"
        if not is_hybrid(config):
            raise SpecError(f"--softmax {self.softmax.value}: model {self.model!r} has no attention layers (the "
                            "softmax form applies to a hybrid model's attention)")
        return self.softmax.value

    def config(self) -> Any:
        """The model's config, with the ``--routing`` histogram where one is given."""
        from mambalaya.cli.common import with_routing
        from mambalaya.workloads import resolve_model

        return with_routing(resolve_model(self.model), self.routing, self.model)

    def design(self, name: str, devices: int | None = 0, parallel: str | None = "") -> Any:
        """The design ``name`` with the ``--set`` changes (checked for a run over ``devices`` split as
        ``parallel`` says, :func:`~mambalaya.experiments.evaluate.check_settings_read`)."""
        from mambalaya.experiments.evaluate import designs_with

        return designs_with([name], self.settings or (), self.precision, devices=devices, parallel=parallel)[name]


def check_buffer_is_read(buffer: Any, mapping: str | None) -> None:
    """Refuse ``--buffer`` beside ``--mapping ideal``, whose buffer is unbounded (every intermediate
    on chip): it was accepted and changed nothing (``fusion map``, ``cascade diagram``)."""
    if buffer is not None and mapping == "ideal":
        raise MambalayaError("--buffer sizes a mapping's groups; the ideal mapping's buffer is unbounded (every "
                             "intermediate on chip), so the option would change nothing")


_DESIGN_ANNOTATIONS = {"model": ModelOpt, "phase": PhaseOpt, "batch": BatchOpt, "scan": ScanOpt,
                       "precision": ArchPrecisionOpt, "settings": SetOpt, "routing": RoutingOpt, "softmax": SoftmaxOpt}


def design_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give the decorated command the workload options as one ``run: DesignArgs`` parameter."""
    return _option_group(DesignArgs, _DESIGN_ANNOTATIONS, "run", set())


def _option_group(cls: type, annotations: dict[str, Any], param: str,
                  left_out: set[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator that shows ``cls``'s fields (but ``left_out``, which keep their defaults) as
    options and hands the command one ``cls`` as its ``param`` parameter."""
    names = [f.name for f in fields(cls) if f.name not in left_out]
    defaults = {f.name: f.default for f in fields(cls)}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != param]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults[n], annotation=annotations[n])
                 for n in names]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            packed = cls(**{n: kwargs.pop(n) for n in names})
            return command(**{param: packed}, **kwargs)

        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            added + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
        return run

    return decorate


def layer_cascade(layer: LayerArgs) -> tuple[Any, Any]:
    """(model config, cascade) of the layer, as :meth:`LayerArgs.build`; with ``--unroll``, an
    unrolled cascade too large to be of use is refused before a step is built, the error
    naming L (:func:`mambalaya.einsum.unroll.check_unroll_size`)."""
    if not layer.unroll:
        return layer.build()
    config, cascade = replace(layer, unroll=False).build()
    try:
        return config, unroll_recurrences(cascade)
    except SpecError as err:
        raise SpecError(f"--unroll at L = {layer.seq_len:,} ({layer.phase.value}): {err}") from None
