"""A model's layer as a cascade, every tensor at the design's width: the presets, and the one
builder every model family goes through (:func:`layer_cascade`). A precision policy's widths are
applied on top of it (:func:`mambalaya.workloads.build_layer`); this module does not know
policies, so the policies' own checks can build layers (:mod:`mambalaya.workloads.shipped`)."""

from __future__ import annotations

from typing import Any, Union

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.workloads.checks import chunk_padding_free_form
from mambalaya.workloads.blocks.attention import KEY_BLOCK, check_softmax
from mambalaya.workloads.blocks.gated_deltanet import PRESETS as GDN_PRESETS
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, check_chunk_size_form, gdn_layer
from mambalaya.workloads.blocks.mamba1 import PRESETS as MAMBA1_PRESETS
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer
from mambalaya.workloads.blocks.mamba2 import PRESETS as MAMBA2_PRESETS
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.families.bamba import PRESETS as HYBRID_PRESETS
from mambalaya.workloads.families.bamba import HybridConfig, hybrid_layer
from mambalaya.workloads.families.base import FamilyModel, build_family_layer, is_hybrid, scanned_layer_types
from mambalaya.workloads.families.dense import FAMILY_PRESETS
from mambalaya.workloads.families.jamba_granite import MOE_FAMILIES, MOE_PRESETS, MoEHybridConfig, moe_family_layer

ModelConfig = Union[Mamba1Config, Mamba2Config, HybridConfig, GatedDeltaNetConfig, MoEHybridConfig, FamilyModel]
#: Families whose models interleave layer types (evaluated per layer type), besides the dense
#: families of :mod:`mambalaya.workloads.families.base` (see :func:`~mambalaya.workloads.families.base.is_hybrid`).
HYBRID_FAMILIES: tuple[str, ...] = ("bamba", *MOE_FAMILIES)

#: Every named model, by preset name.
PRESETS: dict[str, ModelConfig] = {**MAMBA1_PRESETS, **MAMBA2_PRESETS, **HYBRID_PRESETS, **GDN_PRESETS, **MOE_PRESETS,
                                   **FAMILY_PRESETS}

SCANS = ("recurrent", "chunked")
#: The (non-hybrid) families whose prefill runs in either scan form (:data:`SCANS`): Mamba-2's SSD or
#: recurrent scan, the gated delta rule's chunked or recurrent form. A hybrid model's layer types
#: choose their own (:func:`~mambalaya.workloads.families.base.scanned_layer_types`).
SCAN_FORM_FAMILIES = ("mamba2", "gated_deltanet")


def has_scan_forms(model: Any) -> bool:
    """Whether ``model``'s prefill has two scan forms to choose between (:data:`SCAN_FORM_FAMILIES`):
    the one rule behind every command's "the faster form" (a gated delta rule's model once ran
    its chunked form whichever was faster, a Mamba-2 model the faster)."""
    return getattr(model, "family", "mamba1") in SCAN_FORM_FAMILIES


def precision_family(model: Any, layer_type: str | None = None) -> str:
    """The precision policy family (``mamba1``, ``mamba2``, ``bamba``, ``gated_deltanet``) whose
    entries set the widths of ``model``'s ``layer_type`` layer: a dense hybrid family's own choice
    (:meth:`FamilyModel.precision_family`), ``bamba`` for Bamba and the mixture-of-experts
    hybrids, otherwise the model's family."""
    if isinstance(model, FamilyModel):
        return model.precision_family(layer_type or "")
    return "bamba" if is_hybrid(model) else model.family


def layer_cascade(
    model: ModelConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    bits: int = 16,
    state_io: bool | None = None,
    name: str | None = None,
    scan: str | None = None,
    layer_type: str | None = None,
    softmax: str = "three-pass",
    chunk_size: int | None = None,
    key_block: int | None = None,
) -> Cascade:
    """One layer of ``model`` as a cascade.

    A hybrid model has several layer types: ``layer_type`` (``mamba`` or ``attention``) names
    the one to build, and ``softmax`` its attention's form (``three-pass``, ``online`` or
    ``blocked``; see :func:`~mambalaya.workloads.blocks.attention.attention_layer`). ``key_block``
    sets the blocked form's block of keys (default
    :data:`~mambalaya.workloads.blocks.attention.KEY_BLOCK`, FlashAttention-2's 64); it is
    refused with another form.

    ``scan`` picks Mamba-2's scan form: ``chunked`` (the SSD algorithm, the default in prefill)
    or ``recurrent`` (the only form of a decode step); Mamba-1 has only the recurrent scan. A
    Gated DeltaNet model (``olmo-hybrid``) has the same two: ``chunked`` (the WY/UT chunked
    delta rule, the default in prefill) and ``recurrent`` (:mod:`~mambalaya.workloads.blocks.gated_deltanet`).
    Every tensor is ``bits`` wide: :func:`mambalaya.workloads.build_layer` applies a precision
    policy on top (the family whose entries apply: :func:`precision_family`).

    ``chunk_size`` sets the chunk length of a Gated DeltaNet layer's chunked form (a
    ``gated_deltanet`` model, or the ``gdn`` layers of an OLMo-Hybrid model) in place of its
    config's ``chunk_size`` (default 64, transformers'); it is refused by name for a layer or
    form without those chunks.
    """
    if key_block is not None and softmax != "blocked":
        raise SpecError(f"key_block sets the blocked softmax's block of keys; softmax={softmax!r} has no key blocks")
    blocks = KEY_BLOCK if key_block is None else key_block
    if chunk_size is not None:
        model = _with_gdn_chunk_size(model, chunk_size, phase=phase, scan=scan, layer_type=layer_type)
    if isinstance(model, (MoEHybridConfig, FamilyModel, HybridConfig)):
        check_softmax(softmax)  # (an unknown form was accepted on a layer without attention)
        if isinstance(model, FamilyModel):
            cascade = build_family_layer(model, phase=phase, seq_len=seq_len, batch=batch, bits=bits, state_io=state_io,
                                         name=name, scan=scan, layer_type=layer_type, softmax=softmax, key_block=blocks)
        else:
            _check_hybrid_layer(model, layer_type, state_io)
            if scan is not None and layer_type not in scanned_layer_types(model):  # as the dense families refuse it
                raise SpecError(f"scan applies to the layers with a scan ({', '.join(scanned_layer_types(model))}); a "
                                f"{layer_type} layer has none")
            build = moe_family_layer if isinstance(model, MoEHybridConfig) else hybrid_layer
            cascade = build(model, layer_type, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                            scan=scan, softmax=softmax, name=name, key_block=blocks)  # type: ignore[arg-type]
        if (softmax != "three-pass" or key_block is not None) and "attention" not in cascade.regions:
            raise SpecError(f"softmax and key_block set an attention's form; {model.family}'s "  # (once ignored)
                            f"{layer_type} layer has no attention")
        return cascade
    if layer_type is not None:
        raise SpecError(f"layer_type applies to hybrid models; {model.family} has one layer type")
    if softmax != "three-pass":
        raise SpecError(f"softmax applies to the attention layers of hybrid models; {model.family} has none")
    # (a layer's gate, norm, output projection and residual once counted the chunked scan's padded rows:
    # the hybrid families' rule, on every layer that runs more than its scan on the positions)
    after_scan = "the layer's gate, norm, output projection and residual would then count the padded rows too"
    if isinstance(model, GatedDeltaNetConfig):
        form = chunk_padding_free_form(scan, phase, seq_len, model.chunk_size, after_scan)
        cascade = gdn_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits, state_io=state_io,
                            scan=form, name=name)
    elif isinstance(model, Mamba2Config):
        form = chunk_padding_free_form(scan, phase, seq_len, model.chunk_size, after_scan)
        cascade = mamba2_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                               state_io=state_io, scan=form, name=name)  # type: ignore[arg-type]
    else:
        if scan not in (None, "recurrent"):
            raise SpecError(f"Mamba-1 has only the recurrent scan, not scan={scan!r}")
        cascade = mamba1_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                               state_io=state_io, name=name)
    return cascade


def _check_hybrid_layer(model: Any, layer_type: str | None, state_io: bool | None) -> None:
    """A Bamba or mixture-of-experts hybrid's layer: a layer type it has, its state carried out."""
    if layer_type is None or layer_type not in model.layer_counts():
        what = "name the one to build" if layer_type is None else f"it has no {layer_type!r} layer; name one of them"
        raise SpecError(f"a {model.family} model has layers of types {', '.join(model.layer_counts())}; {what} "
                        "(layer_type, --layer-type)")
    if state_io is False:
        raise SpecError("a hybrid model's layers always carry their state and KV cache out; state_io cannot be False")


def _with_gdn_chunk_size(model: ModelConfig, chunk_size: int, *, phase: str, scan: str | None,
                         layer_type: str | None) -> ModelConfig:
    """``model`` with its Gated DeltaNet chunk length set to ``chunk_size`` (the ``chunk_size``
    of :func:`build_layer`), checked against the layer and form it would set."""
    form = scan or ("chunked" if phase == "prefill" else "recurrent")  # build_layer's default form
    if isinstance(model, GatedDeltaNetConfig):
        return model.with_chunk_size(check_chunk_size_form(chunk_size, scan=form, phase=phase))
    mixer = getattr(model, "mixer", None)
    if isinstance(model, FamilyModel) and isinstance(mixer, GatedDeltaNetConfig):  # OLMo-Hybrid's gdn layers
        model.check_layer_type(layer_type)
        if layer_type not in model.SCANNED:
            raise SpecError(f"chunk_size sets the chunk length of the Gated DeltaNet layers' chunked form "
                            f"({', '.join(model.SCANNED)}); the {layer_type} layers have none; leave chunk_size out")
        size = check_chunk_size_form(chunk_size, scan=form, phase=phase)
        return model.model_copy(update={"mixer": mixer.with_chunk_size(size)})
    raise SpecError(f"chunk_size sets the chunk length of a Gated DeltaNet layer's chunked form; a "
                    f"{getattr(model, 'family', type(model).__name__)} model has no Gated DeltaNet layer (a Mamba-2 "
                    "layer's chunk length is its config's chunk_size, mamba_chunk_size in a hybrid model)")


__all__ = ["HYBRID_FAMILIES", "PRESETS", "SCANS", "ModelConfig", "layer_cascade", "precision_family"]
