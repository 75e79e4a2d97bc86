"""A Jamba or Granite 4 hybrid ``config.json`` read as transformers 5.25's ``JambaConfig`` and
``GraniteMoeHybridConfig`` read it: an omitted field takes the class default, the layer pattern
comes from the fields the class builds it from, and every field is read, refused unless it has
a value mambalaya models, or listed as unable to change a layer; any other field is refused by
name. Each problem is one SpecError naming the field."""

from __future__ import annotations

import math
from typing import Any

from mambalaya.errors import SpecError
from mambalaya.workloads.hf_fields import TRANSFORMERS_COMMON_INERT, TRANSFORMERS_VERSION
from mambalaya.workloads.moe_families import MoEHybridConfig, parse_moe_hybrid_config

#: JambaConfig's defaults (transformers 5.25, models/jamba/configuration_jamba.py).
JAMBA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "num_experts_per_tok": 2, "num_experts": 16, "expert_layer_period": 2,
    "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
}
#: GraniteMoeHybridConfig's defaults (transformers 5.25, configuration_granitemoehybrid.py).
GRANITE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "attention_multiplier": 1.0, "residual_multiplier": 1.0,
    "num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 1024,
    "position_embedding_type": None, "layer_types": None, "mamba_n_heads": 128, "mamba_n_groups": 1,
    "mamba_d_state": 256, "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": [0.0, math.inf], "rope_parameters": None,
}
_REFUSED: dict[str, dict[str, Any]] = {  # field -> the one value mambalaya models
    "jamba": {"hidden_act": "silu", "mamba_conv_bias": True, "mamba_proj_bias": False, "sliding_window": None},
    "granitemoehybrid": {"hidden_act": "silu", "mamba_conv_bias": True, "mamba_proj_bias": False,
                         "attention_bias": False},
}
_INERT: dict[str, dict[str, str]] = {
    "jamba": {
        "output_router_logits": "what forward returns", "router_aux_loss_coef": "a training loss",
        "max_position_embeddings": "Jamba has no position embedding; the length is the cascade's",
        "attention_dropout": "dropout is off in inference", "use_mamba_kernels": "deprecated, no effect",
        "use_mambapy": "a training fallback of the same scan", "use_associative_scan": "the same scan, reordered",
        "num_logits_to_keep": "the LM head, outside the layers", "calc_logits_for_entire_prompt": "the LM head",
    },
    "granitemoehybrid": {
        "output_router_logits": "what forward returns", "router_aux_loss_coef": "a training loss",
        "max_position_embeddings": "the rotary tables are computed at the cascade's own positions",
        "attention_dropout": "dropout is off in inference",
        "embedding_multiplier": "scales the embeddings before layer 0, outside the layers",
        "logits_scaling": "divides the logits after the last layer, outside the layers",
    },
}
_READ = {
    "jamba": set(JAMBA_DEFAULTS) | {"num_local_experts", "layers_block_type", "layer_types"},
    "granitemoehybrid": set(GRANITE_DEFAULTS) | {"layers_block_type"},
}
_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def _int(data: dict, key: str, defaults: dict, source: str, *, minimum: int = 1) -> int:
    value = data.get(key, defaults.get(key))
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"field {key} must be an integer >= {minimum}, not {value!r}", source=source)
    return value


def _number(data: dict, key: str, defaults: dict, source: str) -> float:
    value = data.get(key, defaults.get(key))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise SpecError(f"field {key} must be a positive number, not {value!r}", source=source)
    return float(value)


def _check_fields(family: str, data: dict, source: str) -> None:
    for key, value in data.items():
        if key in _REFUSED[family]:
            if value != _REFUSED[family][key]:
                raise SpecError(f"field {key} is {value!r}; mambalaya models {family} layers with {key} = "
                                f"{_REFUSED[family][key]!r} only", source=source)
        elif key not in _READ[family] and key not in _INERT[family] and key not in TRANSFORMERS_COMMON_INERT:
            raise SpecError(f"field {key} is not a field of transformers {TRANSFORMERS_VERSION}'s {family} config that "
                            "mambalaya knows; it cannot tell whether it changes a layer", source=source)


def _listed_types(data: dict, key: str, n: int, source: str) -> tuple[str, ...] | None:
    listed = data.get(key)
    if listed is None:
        return None
    if not isinstance(listed, list) or len(listed) != n:
        raise SpecError(f"field {key} must list one layer type per layer ({n}), not {listed!r}", source=source)
    for k, name in enumerate(listed):
        if name not in _KINDS:
            raise SpecError(f"field {key}[{k}] is {name!r}, not a layer type of this family (known: "
                            f"{', '.join(_KINDS)})", source=source)
    return tuple(_KINDS[name] for name in listed)


def _jamba(data: dict, source: str) -> dict[str, Any]:
    d = JAMBA_DEFAULTS
    n = _int(data, "num_hidden_layers", d, source)
    if "num_experts" in data and "num_local_experts" in data and data["num_experts"] != data["num_local_experts"]:
        raise SpecError("fields num_experts and num_local_experts (its alias) disagree", source=source)
    experts = data.get("num_local_experts", data.get("num_experts", d["num_experts"]))
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
        raise SpecError(f"field num_experts must be a positive integer, not {experts!r}", source=source)
    periods = {}
    for kind in ("attn", "expert"):
        period = _int(data, f"{kind}_layer_period", d, source)
        offset = _int(data, f"{kind}_layer_offset", d, source, minimum=0)
        if offset >= period:
            raise SpecError(f"field {kind}_layer_offset = {offset} must be smaller than {kind}_layer_period = {period}",
                            source=source)
        periods[kind] = (period, offset)
    mixers = tuple("attention" if i % periods["attn"][0] == periods["attn"][1] else "mamba" for i in range(n))
    for key in ("layers_block_type", "layer_types"):
        said = _listed_types(data, key, n, source)
        if said is not None and said != mixers:
            raise SpecError(f"field {key} disagrees with attn_layer_period/attn_layer_offset, from which transformers "
                            f"{TRANSFORMERS_VERSION}'s JambaConfig builds the layers (it cannot set {key})", source=source)
    moe = [experts > 1 and i % periods["expert"][0] == periods["expert"][1] for i in range(n)]
    top_k = _int(data, "num_experts_per_tok", d, source)
    if any(moe) and top_k > experts:
        raise SpecError(f"field num_experts_per_tok = {top_k} exceeds num_experts = {experts}", source=source)
    dt_rank = data.get("mamba_dt_rank", "auto")
    if dt_rank != "auto":
        dt_rank = _int(data, "mamba_dt_rank", d, source)
    heads = _int(data, "num_attention_heads", d, source)
    hidden = _int(data, "hidden_size", d, source)
    if hidden % heads:
        raise SpecError(f"field num_attention_heads = {heads} does not divide hidden_size = {hidden}", source=source)
    return {
        "family": "jamba", "d_model": hidden,
        "layer_types": tuple(t + ("-moe" if m else "") for t, m in zip(mixers, moe)),
        "d_ff": _int(data, "intermediate_size", d, source), "n_experts": experts, "top_k": top_k,
        "n_heads": heads,
        "n_kv_heads": heads if data.get("num_key_value_heads", 8) is None else _int(data, "num_key_value_heads", d, source),
        "mamba_d_state": _int(data, "mamba_d_state", d, source), "mamba_d_conv": _int(data, "mamba_d_conv", d, source),
        "mamba_expand": _int(data, "mamba_expand", d, source),
        "mamba_dt_rank": None if dt_rank == "auto" else dt_rank,
        "vocab_size": _int(data, "vocab_size", d, source),
        "tie_embeddings": bool(data.get("tie_word_embeddings", d["tie_word_embeddings"])),
        "norm_eps": _number(data, "rms_norm_eps", d, source),
    }


def _granite(data: dict, source: str) -> dict[str, Any]:
    d = GRANITE_DEFAULTS
    n = _int(data, "num_hidden_layers", d, source)
    said = _listed_types(data, "layer_types", n, source) or _listed_types(data, "layers_block_type", n, source)
    mixers = said or ("mamba",) * n  # GraniteMoeHybridConfig: every layer linear_attention when absent
    experts = _int(data, "num_local_experts", d, source, minimum=0)
    top_k = _int(data, "num_experts_per_tok", d, source, minimum=0)
    if experts and top_k > experts:
        raise SpecError(f"field num_experts_per_tok = {top_k} exceeds num_local_experts = {experts}", source=source)
    if experts and not top_k:
        raise SpecError("field num_experts_per_tok is 0 but the model has experts", source=source)
    position = data.get("position_embedding_type", None)
    if position not in (None, "rope", "nope"):
        raise SpecError(f"field position_embedding_type is {position!r}; transformers builds a rotary embedding for "
                        "'rope' and none otherwise (None, 'nope')", source=source)
    rope = data.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
        raise SpecError(f"field rope_parameters is {rope!r}; mambalaya models the 'default' rotary embedding only",
                        source=source)
    limit = data.get("time_step_limit", [0.0, math.inf])
    if limit is not None and (list(limit)[0] != 0.0 or list(limit)[1] != math.inf):
        raise SpecError(f"field time_step_limit is {limit!r}; mambalaya models the unclamped step (0, inf)", source=source)
    hidden = _int(data, "hidden_size", d, source)
    heads = _int(data, "num_attention_heads", d, source)
    if hidden % heads:
        raise SpecError(f"field num_attention_heads = {heads} does not divide hidden_size = {hidden}", source=source)
    kv = heads if data.get("num_key_value_heads") is None else _int(data, "num_key_value_heads", d, source)
    expand, mheads = _int(data, "mamba_expand", d, source), _int(data, "mamba_n_heads", d, source)
    if (expand * hidden) % mheads:
        raise SpecError(f"field mamba_n_heads = {mheads} does not divide mamba_expand * hidden_size", source=source)
    d_head = data.get("mamba_d_head", "auto")
    d_head = expand * hidden // mheads if d_head == "auto" else _int(data, "mamba_d_head", d, source)
    return {
        "family": "granitemoehybrid", "d_model": hidden,
        "layer_types": tuple(t + ("-moe" if experts else "") for t in mixers),
        "d_ff": _int(data, "intermediate_size", d, source), "n_experts": experts, "top_k": top_k if experts else 0,
        "shared_d_ff": _int(data, "shared_intermediate_size", d, source), "n_heads": heads, "n_kv_heads": kv,
        "rope": position == "rope", "rope_theta": float(rope.get("rope_theta", data.get("rope_theta", 10000.0))),
        "attention_multiplier": _number(data, "attention_multiplier", d, source),
        "residual_multiplier": _number(data, "residual_multiplier", d, source),
        "mamba_d_state": _int(data, "mamba_d_state", d, source), "mamba_d_conv": _int(data, "mamba_d_conv", d, source),
        "mamba_expand": expand, "mamba_heads": mheads, "mamba_headdim": d_head,
        "mamba_ngroups": _int(data, "mamba_n_groups", d, source),
        "mamba_chunk_size": _int(data, "mamba_chunk_size", d, source),
        "vocab_size": _int(data, "vocab_size", d, source),
        "tie_embeddings": bool(data.get("tie_word_embeddings", False)),
        "norm_eps": _number(data, "rms_norm_eps", d, source),
    }


def moe_config_from_hf(data: dict, *, source: str = "config.json") -> MoEHybridConfig:
    """A :class:`MoEHybridConfig` from a Jamba or Granite 4 hybrid ``config.json`` (as a dict)."""
    if not isinstance(data, dict):
        raise SpecError("a model config is a mapping of fields to values", source=source)
    family = data.get("model_type")
    if family not in ("jamba", "granitemoehybrid"):
        raise SpecError(f"field model_type is {family!r}; the MoE hybrid families modelled are 'jamba' and "
                        "'granitemoehybrid'", source=source)
    _check_fields(family, data, source)
    fields = _jamba(data, source) if family == "jamba" else _granite(data, source)
    return parse_moe_hybrid_config(fields, source=source)


__all__ = ["GRANITE_DEFAULTS", "JAMBA_DEFAULTS", "moe_config_from_hf"]
