"""A Jamba or Granite 4 hybrid ``config.json`` read as transformers 5.25's ``JambaConfig`` and
``GraniteMoeHybridConfig`` read it: an omitted field takes the class default, the layer pattern
comes from the fields the class builds it from, and every field is read, refused unless it has
a value mambalaya models, or listed as unable to change a layer; any other field is refused by
name. Each problem is one SpecError naming the field."""

from __future__ import annotations

import math
from typing import Any

from mambalaya.workloads.hf.config import ConfigFile, check_known_fields, default_rope_theta, shown
from mambalaya.workloads.hf.fields import TRANSFORMERS_COMMON_INERT, TRANSFORMERS_VERSION
from mambalaya.workloads.families.jamba_granite import MoEHybridConfig, parse_moe_hybrid_config

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
#: Per family, its config class's ``attribute_map`` (alias -> field), transformers 5.25.
ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {"jamba": {"num_local_experts": "num_experts"},
                                             "granitemoehybrid": {"layers_block_type": "layer_types"}}
_REFUSED: dict[str, dict[str, Any]] = {  # field -> the one value mambalaya models
    "jamba": {"hidden_act": "silu", "mamba_conv_bias": True, "mamba_proj_bias": False, "sliding_window": None},
    "granitemoehybrid": {"hidden_act": "silu", "mamba_conv_bias": True, "mamba_proj_bias": False,
                         "attention_bias": False},
}
#: Per family, the fields beyond transformers' common ones that cannot change a layer (with why).
INERT_FIELDS: dict[str, dict[str, str]] = {
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
    "jamba": set(JAMBA_DEFAULTS) | {"num_local_experts", "layers_block_type", "layer_types", "head_dim"},
    "granitemoehybrid": set(GRANITE_DEFAULTS) | {"layers_block_type", "head_dim"},
}
#: The transformers config class of each family this module reads.
CONFIG_CLASSES = {"jamba": "JambaConfig", "granitemoehybrid": "GraniteMoeHybridConfig"}
_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def _listed_types(cfg: ConfigFile, key: str, n: int) -> tuple[str, ...] | None:
    listed = cfg.layer_types(key, _KINDS, "this family")
    if listed is not None and len(listed) != n:
        raise cfg.error(f"field {key} must list one layer type per layer ({n}), not {len(listed)}")
    return listed


def _attention_heads(cfg: ConfigFile) -> dict[str, Any]:
    """The attention's heads as both families' attention reads them (transformers 5.25,
    ``JambaAttention`` and ``GraniteMoeHybridAttention``: ``self.head_dim = getattr(config,
    "head_dim", config.hidden_size // config.num_attention_heads)``; neither config class
    declares the field, so it is there only when config.json gives it). Given, it is the head
    width whatever hidden_size is (a null fails transformers' ``nn.Linear``, so it is refused);
    absent, the heads must divide hidden_size (transformers would floor the quotient)."""
    heads, hidden = cfg.integer("num_attention_heads"), cfg.integer("hidden_size")
    if cfg.has("head_dim"):
        if cfg.value("head_dim") is None:
            raise cfg.error("field head_dim is null: transformers' attention takes the field as it is when "
                            "config.json has it and cannot size its projections with a null; leave it out for "
                            "hidden_size // num_attention_heads")
        return {"n_heads": heads, "head_dim": cfg.integer("head_dim")}
    if hidden % heads:
        raise cfg.error(f"field num_attention_heads = {heads} does not divide hidden_size = {hidden} (and no "
                        "head_dim is given)")
    return {"n_heads": heads}


def _jamba(cfg: ConfigFile) -> dict[str, Any]:
    n = cfg.layer_count("num_hidden_layers")
    experts = cfg.integer("num_experts")  # (num_local_experts read as it: ATTRIBUTE_MAPS)
    periods = {}
    for kind in ("attn", "expert"):
        period = cfg.integer(f"{kind}_layer_period")
        offset = cfg.integer(f"{kind}_layer_offset", minimum=0)
        if offset >= period:
            raise cfg.error(f"field {kind}_layer_offset = {offset} must be smaller than {kind}_layer_period = {period}")
        periods[kind] = (period, offset)
    mixers = tuple("attention" if i % periods["attn"][0] == periods["attn"][1] else "mamba" for i in range(n))
    for key in ("layers_block_type", "layer_types"):
        said = _listed_types(cfg, key, n)
        if said is not None and said != mixers:
            raise cfg.error(f"field {key} disagrees with attn_layer_period/attn_layer_offset, from which transformers "
                            f"{TRANSFORMERS_VERSION}'s JambaConfig builds the layers (it cannot set {key})")
    moe = [experts > 1 and i % periods["expert"][0] == periods["expert"][1] for i in range(n)]
    top_k = cfg.integer("num_experts_per_tok")
    if any(moe) and top_k > experts:
        raise cfg.error(f"field num_experts_per_tok = {top_k} exceeds num_experts = {experts}")
    return {
        "family": "jamba", "d_model": cfg.integer("hidden_size"),
        "layer_types": tuple(t + ("-moe" if m else "") for t, m in zip(mixers, moe)),
        "d_ff": cfg.integer("intermediate_size"), "n_experts": experts, "top_k": top_k, **_attention_heads(cfg),
        # JambaConfig refuses a null num_key_value_heads (its field is a plain int): so does this reader
        "n_kv_heads": cfg.integer("num_key_value_heads"),
        "mamba_d_state": cfg.integer("mamba_d_state"), "mamba_d_conv": cfg.integer("mamba_d_conv"),
        "mamba_expand": cfg.integer("mamba_expand"), "mamba_dt_rank": cfg.integer_or_auto("mamba_dt_rank"),
        "vocab_size": cfg.integer("vocab_size"), "tie_embeddings": cfg.boolean("tie_word_embeddings"),
        "norm_eps": cfg.positive_number("rms_norm_eps"),
    }


def _granite(cfg: ConfigFile) -> dict[str, Any]:
    n = cfg.layer_count("num_hidden_layers")
    said = _listed_types(cfg, "layer_types", n)  # (layers_block_type read as it: ATTRIBUTE_MAPS)
    mixers = said or ("mamba",) * n  # GraniteMoeHybridConfig: every layer linear_attention when absent
    experts = cfg.integer("num_local_experts", minimum=0)
    top_k = cfg.integer("num_experts_per_tok", minimum=0)
    if experts and top_k > experts:
        raise cfg.error(f"field num_experts_per_tok = {top_k} exceeds num_local_experts = {experts}")
    if experts and not top_k:
        raise cfg.error("field num_experts_per_tok is 0 but the model has experts")
    position = cfg.value("position_embedding_type")
    if position not in (None, "rope", "nope"):
        raise cfg.error(f"field position_embedding_type is {shown(position)}; transformers builds a rotary embedding "
                        "for 'rope' and none otherwise (None, 'nope')")
    theta = default_rope_theta(cfg)
    cfg.require_no_clamp("time_step_limit")
    hidden, attention = cfg.integer("hidden_size"), _attention_heads(cfg)
    heads, head_dim = attention["n_heads"], attention.get("head_dim")
    if head_dim is not None and head_dim > 4 and head_dim % 2:  # transformers' RotaryEmbeddingConfigMixin.validate_rope
        raise cfg.error(f"field head_dim = {head_dim} is odd: transformers {TRANSFORMERS_VERSION}'s "
                        "GraniteMoeHybridConfig refuses an odd head_dim above 4, whatever position_embedding_type "
                        "says (it checks its rotary parameters, which it always sets, against whole heads)")
    expand, mheads = cfg.integer("mamba_expand"), cfg.integer("mamba_n_heads")
    if (expand * hidden) % mheads:
        raise cfg.error(f"field mamba_n_heads = {mheads} does not divide mamba_expand * hidden_size")
    d_head = cfg.integer_or_auto("mamba_d_head")
    return {
        "family": "granitemoehybrid", "d_model": hidden,
        "layer_types": tuple(t + ("-moe" if experts else "") for t in mixers),
        "d_ff": cfg.integer("intermediate_size"), "n_experts": experts, "top_k": top_k if experts else 0,
        "shared_d_ff": cfg.integer("shared_intermediate_size"), **attention,
        "n_kv_heads": cfg.integer_or("num_key_value_heads", heads),
        "rope": position == "rope", "rope_theta": theta,
        "attention_multiplier": cfg.positive_number("attention_multiplier"),
        "residual_multiplier": cfg.positive_number("residual_multiplier"),
        "mamba_d_state": cfg.integer("mamba_d_state"), "mamba_d_conv": cfg.integer("mamba_d_conv"),
        "mamba_expand": expand, "mamba_heads": mheads,
        "mamba_headdim": expand * hidden // mheads if d_head is None else d_head,
        "mamba_ngroups": cfg.integer("mamba_n_groups"), "mamba_chunk_size": cfg.integer("mamba_chunk_size"),
        "vocab_size": cfg.integer("vocab_size"), "tie_embeddings": cfg.boolean("tie_word_embeddings"),
        "norm_eps": cfg.positive_number("rms_norm_eps"),
    }


def moe_config_from_hf(data: dict, *, source: str = "config.json") -> MoEHybridConfig:
    """A :class:`MoEHybridConfig` from a Jamba or Granite 4 hybrid ``config.json`` (as a dict),
    every field read by type (:class:`~mambalaya.workloads.hf.config.ConfigFile`)."""
    cfg = ConfigFile.of(data, source, what="MoE hybrid")
    family = cfg.value("model_type")
    if family not in ("jamba", "granitemoehybrid"):
        raise cfg.error(f"field model_type is {shown(family)}; the MoE hybrid families modelled are 'jamba' and "
                        "'granitemoehybrid'")
    cfg = ConfigFile(cfg.data, source, JAMBA_DEFAULTS if family == "jamba" else GRANITE_DEFAULTS).with_aliases(
        ATTRIBUTE_MAPS[family], CONFIG_CLASSES[family])
    refused = f"the one value in the {family} layers it models"
    check_known_fields(cfg, CONFIG_CLASSES[family], _READ[family], set(INERT_FIELDS[family]) | set(TRANSFORMERS_COMMON_INERT),
                       {key: (value, refused) for key, value in _REFUSED[family].items()})
    fields = _jamba(cfg) if family == "jamba" else _granite(cfg)
    return parse_moe_hybrid_config(fields, source=source)


__all__ = ["ATTRIBUTE_MAPS", "CONFIG_CLASSES", "GRANITE_DEFAULTS", "INERT_FIELDS", "JAMBA_DEFAULTS", "moe_config_from_hf"]
