"""A Gated DeltaNet layer's transformers weights and cache in the cascade's layouts, and an
``olmo_hybrid`` (or ``qwen3_next``-shaped) ``config.json`` read as a
:class:`~mambalaya.workloads.blocks.gated_deltanet.GatedDeltaNetConfig`.

Weights (``OlmoHybridGatedDeltaNet`` parameter names, relative to ``linear_attn.``):
``q_proj``/``k_proj`` ``[G*N, D]``, ``v_proj``/``g_proj`` ``[G*R*P, D]``, ``a_proj``/``b_proj``
``[G*R, D]``, ``o_proj`` ``[D, G*R*P]``, ``conv1d.weight`` ``[2*G*N + G*R*P, 1, K]`` over the
concatenated q, k, v channels, ``A_log`` and ``dt_bias`` ``[G*R]``, ``o_norm.weight`` ``[P]``;
and the block's ``input_layernorm.weight`` ``[D]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.gated_deltanet import FULL, LINEAR, GatedDeltaNetConfig, parse_gdn_config
from mambalaya.workloads.hf.config import ConfigFile, shown
from mambalaya.workloads.hf.loader import to_numpy

#: The keys of one layer (relative to ``linear_attn.``) and their shapes as functions of the config.
_SHAPES = {
    "q_proj.weight": lambda c: (c.key_dim, c.d_model),
    "k_proj.weight": lambda c: (c.key_dim, c.d_model),
    "v_proj.weight": lambda c: (c.value_dim, c.d_model),
    "g_proj.weight": lambda c: (c.value_dim, c.d_model),
    "a_proj.weight": lambda c: (c.num_v_heads, c.d_model),
    "b_proj.weight": lambda c: (c.num_v_heads, c.d_model),
    "o_proj.weight": lambda c: (c.d_model, c.value_dim),
    "conv1d.weight": lambda c: (2 * c.key_dim + c.value_dim, 1, c.d_conv),
    "A_log": lambda c: (c.num_v_heads,),
    "dt_bias": lambda c: (c.num_v_heads,),
    "o_norm.weight": lambda c: (c.v_head_dim,),
}


def gdn_weights(config: GatedDeltaNetConfig, mixer: Mapping[str, Any], norm: Any, *,
                dtype: str = "float32") -> dict[str, np.ndarray]:
    """The cascade's weights from one layer's ``linear_attn`` parameters and its
    ``input_layernorm.weight`` (torch tensors or arrays); a wrong or missing key is a SpecError."""
    c = config
    arr: dict[str, np.ndarray] = {}
    for key, shape in _SHAPES.items():
        if key not in mixer:
            raise SpecError(f"Gated DeltaNet weights lack {key!r} (they have {', '.join(sorted(mixer))})")
        a = to_numpy(mixer[key], key).astype(np.float64)
        if a.shape != shape(c):
            raise SpecError(f"Gated DeltaNet weight {key} has shape {a.shape}; the config makes it {shape(c)}")
        arr[key] = a
    d, g, r, n, p, k = c.d_model, c.num_k_heads, c.heads_per_group, c.k_head_dim, c.v_head_dim, c.d_conv
    conv = arr["conv1d.weight"][:, 0, :]
    out = {
        "WN": to_numpy(norm, "input_layernorm.weight").astype(np.float64).reshape(d),
        "WQ": arr["q_proj.weight"].T.reshape(d, g, n),
        "WK": arr["k_proj.weight"].T.reshape(d, g, n),
        "WV": arr["v_proj.weight"].T.reshape(d, g, r, p),
        "WG": arr["g_proj.weight"].T.reshape(d, g, r, p),
        "WA": arr["a_proj.weight"].T.reshape(d, g, r),
        "WBT": arr["b_proj.weight"].T.reshape(d, g, r),
        "BDT": arr["dt_bias"].reshape(g, r),
        "A": -np.exp(arr["A_log"]).reshape(g, r),
        "WCQ": conv[: c.key_dim].reshape(g, n, k),
        "WCK": conv[c.key_dim: 2 * c.key_dim].reshape(g, n, k),
        "WCV": conv[2 * c.key_dim:].reshape(g, r, p, k),
        "WGN": arr["o_norm.weight"],
        "WO": arr["o_proj.weight"].T.reshape(g, r, p, d),
    }
    return {name: np.ascontiguousarray(v, dtype=dtype) for name, v in out.items()}


def gdn_state_from_hf(config: GatedDeltaNetConfig, conv_state: Any, recurrent_state: Any, *,
                      dtype: str = "float32") -> dict[str, np.ndarray]:
    """A decode step's incoming state from transformers' cache of one layer: ``conv_state``
    ``[B, 2*G*N + G*R*P, W]`` (its last ``K-1`` positions are the ones read again) and
    ``recurrent_state`` ``[B, G*R, N, P]``."""
    c = config
    g, r, n, p, j = c.num_k_heads, c.heads_per_group, c.k_head_dim, c.v_head_dim, c.d_conv - 1
    cs = to_numpy(conv_state, "conv_state").astype(np.float64)
    cs = cs[:, :, cs.shape[2] - j:].transpose(0, 2, 1)  # [B, J, channels], oldest first
    b = cs.shape[0]
    rs = to_numpy(recurrent_state, "recurrent_state").astype(np.float64).reshape(b, g, r, n, p)
    out = {"H0": rs.transpose(0, 1, 2, 4, 3)}
    if j:
        out |= {"CSQ0": cs[:, :, : c.key_dim].reshape(b, j, g, n),
                "CSK0": cs[:, :, c.key_dim: 2 * c.key_dim].reshape(b, j, g, n),
                "CSV0": cs[:, :, 2 * c.key_dim:].reshape(b, j, g, r, p)}
    return {k: np.ascontiguousarray(v, dtype=dtype) for k, v in out.items()}


#: OlmoHybridConfig's defaults (transformers 5.25) for the fields read that have a fixed one (the
#: head counts and head dims default to expressions of the others, written out below).
OLMO_HYBRID_DEFAULTS: dict[str, Any] = {
    "hidden_size": 3840, "num_hidden_layers": 32, "num_attention_heads": 30, "intermediate_size": 11008,
    "vocab_size": 100352, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "linear_allow_neg_eigval": True,
}


def olmo_layer_types(cfg: ConfigFile, n_layers: int) -> tuple[str, ...]:
    """``layer_types`` (transformers' names), else OlmoHybridConfig's pattern: every fourth layer
    full attention, and at least one."""
    types = cfg.layer_types("layer_types", {LINEAR: LINEAR, FULL: FULL}, "OLMo-Hybrid")
    if types is None:
        listed = [FULL if i % 4 == 3 else LINEAR for i in range(n_layers)]
        if FULL not in listed:
            listed[-1] = FULL
        types = tuple(listed)
    elif len(types) != n_layers:
        raise cfg.error(f"field layer_types lists {len(types)} layers but num_hidden_layers is {n_layers}")
    return types


def gdn_config_from_hf(data: dict, *, source: str = "config.json") -> GatedDeltaNetConfig:
    """A :class:`GatedDeltaNetConfig` from a transformers ``olmo_hybrid`` config.json (as a
    dict), with ``OlmoHybridConfig``'s defaults for omitted (or null) fields, every field read by
    type (:class:`~mambalaya.workloads.hf.config.ConfigFile`); every problem is one SpecError
    naming the field."""
    cfg = ConfigFile.of(data, source, defaults=OLMO_HYBRID_DEFAULTS, what="OLMo-Hybrid")
    if cfg.value("model_type") != "olmo_hybrid":
        raise cfg.error(f"field model_type is {shown(cfg.value('model_type'))}; the Gated DeltaNet family reads "
                        "'olmo_hybrid' configs")
    hidden = cfg.integer("hidden_size")
    n_layers = cfg.layer_count("num_hidden_layers")
    heads = cfg.integer("num_attention_heads")
    kv = cfg.integer_or("num_key_value_heads", heads)
    types = olmo_layer_types(cfg, n_layers)
    k_heads, v_heads = cfg.integer_or("linear_num_key_heads", heads), cfg.integer_or("linear_num_value_heads", heads)
    if v_heads % k_heads:
        raise cfg.error(f"field linear_num_key_heads = {k_heads} does not divide linear_num_value_heads = "
                        f"{v_heads} (each key head serves a whole number of value heads)")
    k_dim = cfg.integer("linear_key_head_dim", value=cfg.value("linear_key_head_dim") if cfg.given(
        "linear_key_head_dim") else int(0.75 * hidden / k_heads) or None)
    v_dim = cfg.integer_or("linear_value_head_dim", 2 * k_dim)
    neg = cfg.boolean("linear_allow_neg_eigval")
    cfg.require("hidden_act", "silu", "the conv activation modelled")
    fields = {
        "d_model": hidden, "layer_types": types, "num_k_heads": k_heads, "num_v_heads": v_heads,
        "k_head_dim": k_dim, "v_head_dim": v_dim, "d_conv": cfg.integer("linear_conv_kernel_dim"),
        "beta_scale": 2.0 if neg else 1.0, "norm_eps": cfg.positive_number("rms_norm_eps"),
        "d_ff": cfg.integer("intermediate_size"), "n_heads": heads, "n_kv_heads": kv,
        "head_dim": cfg.integer_or("head_dim", None),
        "vocab_size": cfg.integer("vocab_size"),
        "tie_embeddings": cfg.boolean("tie_word_embeddings"),
    }
    if heads % kv:
        raise cfg.error(f"field num_key_value_heads = {kv} does not divide num_attention_heads = {heads}")
    return parse_gdn_config(fields, source=source)


__all__ = ["OLMO_HYBRID_DEFAULTS", "gdn_config_from_hf", "gdn_state_from_hf", "gdn_weights", "olmo_layer_types"]
