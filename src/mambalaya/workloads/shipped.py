"""Every form of every shipped layer: one preset per model family (presets of a family share
their Einsums), each layer type, phase, scan form, softmax form and (a single-block model's
prefill) with and without carried state.

A rule about the Einsums (which unit runs a contraction, which tensors a precision policy may
name, which statistics a reference kernel keeps in float32) is proved on all of them, not on the
layer an issue happened to name: :func:`shipped_layers` is that walk, each layer with the family
of a precision policy that sets its widths (:func:`~mambalaya.workloads.layers.precision_family`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.attention import SOFTMAX_FORMS
from mambalaya.workloads.families.base import is_hybrid, scanned_layer_types
from mambalaya.workloads.layers import PRESETS, layer_cascade, precision_family


@dataclass(frozen=True)
class ShippedLayer:
    """One form of one preset's layer and the precision family that sets its widths."""

    preset: str
    layer_type: str | None
    phase: str
    scan: str | None
    softmax: str | None
    state_io: bool | None
    precision_family: str
    cascade: Cascade


def _forms(config: Any, layer_type: str | None) -> Iterator[tuple[str, str | None, bool | None]]:
    """(phase, scan, state_io) of every form a layer type may have."""
    scanned = layer_type in scanned_layer_types(config) if layer_type else config.family != "mamba1"
    carried: tuple[bool | None, ...] = (None,) if is_hybrid(config) else (False, True)
    for phase, scans, states in (("prefill", ("chunked", "recurrent") if scanned else (None,), carried),
                                 ("decode", (None,), (None,))):
        for scan in scans:
            for state_io in states:
                yield phase, scan, state_io


def shipped_layers(*, seq_len: int = 256, batch: int = 1, refusals: set[str] | None = None) -> Iterator[ShippedLayer]:
    """Every form of every shipped family's layers (one preset per family), at ``seq_len`` and
    ``batch`` (a rule about Einsums does not depend on the sizes; 256 is a multiple of every
    preset's chunk length), every tensor at the design's width (a policy's widths go on top:
    :func:`~mambalaya.workloads.precision.apply_policy` with the layer's ``precision_family``).
    A hybrid's layer is built in every softmax form where it has an attention region, in the
    default form otherwise (the others would repeat it). A form a layer does not have (Jamba's
    Mamba-1 layers have no chunked scan) is skipped, its refusal's first clause added to
    ``refusals``."""
    families: dict[str, str] = {}
    for name, cfg in PRESETS.items():
        families.setdefault(cfg.family, name)
    for name in families.values():
        cfg = PRESETS[name]
        for layer_type in (list(cfg.layer_counts()) if is_hybrid(cfg) else [None]):
            chosen = {"layer_type": layer_type} if layer_type else {}
            family = precision_family(cfg, layer_type)
            for phase, scan, state_io in _forms(cfg, layer_type):
                try:
                    cascade = layer_cascade(cfg, phase=phase, seq_len=seq_len, batch=batch, scan=scan,
                                            state_io=state_io, **chosen)
                except SpecError as err:  # a form the layer does not have
                    if refusals is not None:
                        refusals.add(str(err).split(":")[0])
                    continue
                if not is_hybrid(cfg):
                    yield ShippedLayer(name, layer_type, phase, scan, None, state_io, family, cascade)
                    continue
                yield ShippedLayer(name, layer_type, phase, scan, SOFTMAX_FORMS[0], state_io, family, cascade)
                for softmax in SOFTMAX_FORMS[1:] if "attention" in cascade.regions else ():
                    other = layer_cascade(cfg, phase=phase, seq_len=seq_len, batch=batch, scan=scan,
                                          state_io=state_io, softmax=softmax, **chosen)
                    yield ShippedLayer(name, layer_type, phase, scan, softmax, state_io, family, other)


__all__ = ["ShippedLayer", "shipped_layers"]
