"""Workloads: model configurations (Mamba-1, Mamba-2 and hybrid presets, or custom) and their
layer cascades."""

from __future__ import annotations

from pathlib import Path

from mambalaya.errors import SpecError
from mambalaya.specio import parse_document_text, path_is, read_spec_file
from mambalaya.einsum.cascade import Cascade
from typing import Union

from mambalaya.workloads.blocks.mamba1 import PRESETS as MAMBA1_PRESETS
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer, parse_config
from mambalaya.workloads.blocks.mamba2 import PRESETS as MAMBA2_PRESETS
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer, parse_mamba2_config
from mambalaya.workloads.blocks.gated_deltanet import PRESETS as GDN_PRESETS
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, gdn_layer, parse_gdn_config
from mambalaya.workloads.blocks.gated_deltanet import check_chunk_size_form
from mambalaya.workloads.blocks.attention import KEY_BLOCK
from mambalaya.workloads.families.bamba import PRESETS as HYBRID_PRESETS
from mambalaya.workloads.families.bamba import HybridConfig, hybrid_layer, parse_hybrid_config
from mambalaya.workloads.families.jamba_granite import MOE_FAMILIES, MOE_PRESETS, MoEHybridConfig, moe_family_layer
from mambalaya.workloads.precision import PrecisionPolicy, apply_policy
from mambalaya.workloads.families.base import FamilyModel, build_family_layer
from mambalaya.workloads.families.dense import FAMILY_PRESETS, family_config_from_hf, hybrid_config_from_hf

ModelConfig = Union[Mamba1Config, Mamba2Config, HybridConfig, GatedDeltaNetConfig, MoEHybridConfig, FamilyModel]
#: Families whose models interleave layer types (evaluated per layer type), besides the dense
#: families of :mod:`mambalaya.workloads.families.base` (see :func:`~mambalaya.workloads.families.base.is_hybrid`).
HYBRID_FAMILIES: tuple[str, ...] = ("bamba", *MOE_FAMILIES)

#: Every named model, by preset name.
PRESETS: dict[str, ModelConfig] = {**MAMBA1_PRESETS, **MAMBA2_PRESETS, **HYBRID_PRESETS, **GDN_PRESETS, **MOE_PRESETS,
                                   **FAMILY_PRESETS}

SCANS = ("recurrent", "chunked")


def load_model_config(path: str | Path) -> ModelConfig:
    """A model config from a YAML/JSON file: mambalaya's fields (``d_model``, ``n_layers``,
    ``d_state``, ...) or a transformers / state-spaces ``config.json``."""
    path = Path(path)
    text = read_spec_file(path, "model config")
    # one strict reading: duplicate keys, nesting and size bounded, every problem located
    data = parse_document_text(text, source=str(path), json_document=path.suffix == ".json")
    if not isinstance(data, dict):
        raise SpecError("a model config is a mapping of fields to values", source=str(path))
    own = _own_fields_reader(data)
    if own is not None:  # mambalaya's own fields, naming their family
        return own(data, source=str(path))
    hybrid = family_config_from_hf(data, source=str(path))  # a hybrid family's config.json, by model_type
    if hybrid is not None:
        return hybrid
    if _is_mamba2(data):
        if "d_model" not in data or "ssm_cfg" in data:
            from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_config

            data = _converted(load_mamba2_config, data, path)
        return parse_mamba2_config(data, source=str(path))
    if ("d_model" not in data and ("hidden_size" in data or "model_type" in data)) or "ssm_cfg" in data \
            or "n_layer" in data:  # a transformers or a state-spaces config.json
        from mambalaya.workloads.hf.weights import load_mamba1_config

        data = _converted(load_mamba1_config, data, path)
    return parse_config(data, source=str(path))


def _own_fields_reader(data: dict):
    """The parser of a config in mambalaya's own fields for the hybrid and Gated DeltaNet
    families, by its ``family`` (None for another config). A config that names both a
    ``family`` and a transformers ``model_type`` is read by its family's parser, which refuses
    ``model_type`` as a field it does not have."""
    family = data.get("family")
    if family == "bamba":
        return parse_hybrid_config
    if family in MOE_FAMILIES:
        from mambalaya.workloads.families.jamba_granite import parse_moe_hybrid_config

        return parse_moe_hybrid_config
    return parse_gdn_config if family == "gated_deltanet" else None


def _converted(loader, data: dict, path: Path) -> dict:
    """A transformers / state-spaces config in mambalaya's fields; errors name the file."""
    from mambalaya.workloads.hf.weights import WeightLoadError

    try:
        return loader(data)
    except WeightLoadError as err:
        raise SpecError(str(err).replace("the config dict", "the config"), source=str(path)) from None


def _is_mamba2(data: dict) -> bool:
    ssm = data.get("ssm_cfg") if isinstance(data.get("ssm_cfg"), dict) else {}
    return (
        data.get("family") == "mamba2"
        or data.get("model_type") == "mamba2"
        or ssm.get("layer") == "Mamba2"
        or any(k in data for k in ("headdim", "head_dim", "ngroups", "n_groups", "chunk_size"))
    )


def resolve_model(name_or_path: str) -> ModelConfig:
    """A preset by name, or a config file by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if Path(name_or_path).suffix in (".yaml", ".yml", ".json") or path_is(name_or_path):
        return load_model_config(name_or_path)
    raise SpecError(
        f"unknown model {name_or_path!r}: use a preset ({', '.join(PRESETS)}) or the path of a "
        "YAML/JSON model config"
    )


def build_layer(
    model: ModelConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    bits: int = 16,
    state_io: bool | None = None,
    name: str | None = None,
    scan: str | None = None,
    precision: "str | PrecisionPolicy | None" = None,
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
    ``precision`` (a policy name, file or :class:`PrecisionPolicy`) sets each tensor's width,
    ``design`` widths being ``bits``; without it every tensor is ``bits`` wide (``uniform``).

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
    if isinstance(model, MoEHybridConfig):
        if layer_type is None or layer_type not in model.layer_counts():
            raise SpecError(f"a {model.family} model has layers of types {', '.join(model.layer_counts())}; name the "
                            "one to build (layer_type, --layer-type)")
        if state_io is False:
            raise SpecError("a hybrid model's layers always carry their state and KV cache out; state_io cannot be False")
        cascade = moe_family_layer(model, layer_type, batch=batch, seq_len=seq_len, phase=phase, bits=bits, scan=scan,
                                   softmax=softmax, name=name, key_block=blocks)  # type: ignore[arg-type]
        return cascade if precision is None else apply_policy(cascade, precision, bits, family="bamba")
    if isinstance(model, FamilyModel):
        return build_family_layer(model, phase=phase, seq_len=seq_len, batch=batch, bits=bits, state_io=state_io,
                                  name=name, scan=scan, precision=precision, layer_type=layer_type, softmax=softmax,
                                  key_block=blocks)
    if isinstance(model, HybridConfig):
        if layer_type is None or layer_type not in model.layer_counts():
            what = "name the one to build" if layer_type is None else f"it has no {layer_type!r} layer; name one of them"
            raise SpecError(f"a hybrid model has layers of types {', '.join(model.layer_counts())}; {what} "
                            "(layer_type, --layer-type)")
        if state_io is False:
            raise SpecError("a hybrid model's layers always carry their state and KV cache out; state_io cannot be False")
        cascade = hybrid_layer(model, layer_type, batch=batch, seq_len=seq_len, phase=phase, bits=bits, scan=scan,
                               softmax=softmax, name=name, key_block=blocks)  # type: ignore[arg-type]
        return cascade if precision is None else apply_policy(cascade, precision, bits, family="bamba")
    if layer_type is not None:
        raise SpecError(f"layer_type applies to hybrid models; {model.family} has one layer type")
    if softmax != "three-pass":
        raise SpecError(f"softmax applies to the attention layers of hybrid models; {model.family} has none")
    if isinstance(model, GatedDeltaNetConfig):
        form = scan or ("chunked" if phase == "prefill" else "recurrent")
        cascade = gdn_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits, state_io=state_io,
                            scan=form, name=name)
    elif isinstance(model, Mamba2Config):
        form = scan or ("chunked" if phase == "prefill" else "recurrent")
        cascade = mamba2_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                               state_io=state_io, scan=form, name=name)  # type: ignore[arg-type]
    else:
        if scan not in (None, "recurrent"):
            raise SpecError(f"Mamba-1 has only the recurrent scan, not scan={scan!r}")
        cascade = mamba1_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                               state_io=state_io, name=name)
    if precision is None:
        return cascade
    return apply_policy(cascade, precision, bits, family=model.family)


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


__all__ = ["HYBRID_FAMILIES", "PRESETS", "SCANS", "MoEHybridConfig", "GatedDeltaNetConfig", "HybridConfig", "Mamba1Config", "Mamba2Config", "ModelConfig", "build_layer",
           "hybrid_config_from_hf", "load_model_config", "resolve_model"]
