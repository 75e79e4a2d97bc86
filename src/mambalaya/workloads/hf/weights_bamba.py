"""Load the real weights of one Bamba layer into the tensor layouts of its layer cascade
(:func:`~mambalaya.workloads.families.bamba.hybrid_layer`), through the shared loader core
(:mod:`mambalaya.workloads.hf.loader`).

A Bamba layer (transformers' ``BambaDecoderLayer``, keys under ``model.layers.{i}.``) holds
``input_layernorm.weight``, ``pre_ff_layernorm.weight``, ``feed_forward.{gate,up,down}_proj.weight``
and either the Mamba-2 mixer ``mamba.*`` (the names of ``Mamba2Mixer``: converted by
:func:`~mambalaya.workloads.hf.weights_mamba2.load_mamba2_layer`) or the attention
``self_attn.{q,k,v,o}_proj.weight`` (converted by
:func:`~mambalaya.workloads.blocks.attention.weights_from_projections`). The MLP's weights take the
layer cascade's ``FF_`` prefix: ``FF_WN``, ``FF_WG`` [D,F], ``FF_WU`` [D,F], ``FF_WDN`` [F,D].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.attention import weights_from_projections
from mambalaya.workloads.hf.loader import LayerKeys, WeightLoadError, as_layout, read_layer, resolve_dtype
from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_layer
from mambalaya.workloads.families.bamba import HybridConfig, hybrid_weights

_COMMON = ("input_layernorm.weight", "pre_ff_layernorm.weight", "feed_forward.gate_proj.weight",
           "feed_forward.up_proj.weight", "feed_forward.down_proj.weight")
_MAMBA = ("mamba.in_proj.weight", "mamba.conv1d.weight", "mamba.conv1d.bias", "mamba.dt_bias", "mamba.A_log",
          "mamba.D", "mamba.norm.weight", "mamba.out_proj.weight")
_ATTENTION = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight")
_BIASES = {f"{part}.bias": "a bias, which mambalaya does not model (attention_bias, mlp_bias and "
           "mamba_proj_bias are False in every Bamba checkpoint)"
           for part in ("feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj", "self_attn.q_proj",
                        "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mamba.in_proj", "mamba.out_proj")}
_SCOPE = "mambalaya models Bamba layers with no projection biases and a conv bias."

KEYS: dict[str, LayerKeys] = {
    "mamba": LayerKeys(family="Bamba Mamba", required=_COMMON + _MAMBA,
                       block="a Bamba Mamba layer (input_layernorm, BambaMixer, pre_ff_layernorm, feed_forward)",
                       scope=_SCOPE, unsupported={**_BIASES, **{k: "it is an attention weight, but the config makes "
                                                                  "this a Mamba layer" for k in _ATTENTION}}),
    "attention": LayerKeys(family="Bamba attention", required=_COMMON + _ATTENTION,
                           block="a Bamba attention layer (input_layernorm, BambaAttention, pre_ff_layernorm, "
                                 "feed_forward)",
                           scope=_SCOPE, unsupported={**_BIASES, **{k: "it is a Mamba weight, but the config makes "
                                                                      "this an attention layer" for k in _MAMBA}}),
}


def load_bamba_layer(source: Any, layer: int, config: HybridConfig, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """Layer ``layer`` of a Bamba checkpoint (a state_dict, a ``.safetensors``/``.bin`` file, a
    shard index or a model directory) as the weights of its layer cascade, each C-contiguous of
    ``dtype``. ``config`` says whether the layer is Mamba or attention and fixes the shapes."""
    out_dtype = resolve_dtype(dtype, "Bamba")
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < config.n_layers:
        raise WeightLoadError(f"Layer {layer!r} is not a layer of this Bamba config (layers 0..{config.n_layers - 1}).")
    kind = config.layer_types[int(layer)]
    tensors = read_layer(source, layer, KEYS[kind])
    tensors.require_floating()
    d, f = config.d_model, config.d_ff
    tensors.require_shapes({"input_layernorm.weight": (d,), "pre_ff_layernorm.weight": (d,),
                            "feed_forward.gate_proj.weight": (f, d), "feed_forward.up_proj.weight": (f, d),
                            "feed_forward.down_proj.weight": (d, f)},
                           f"hidden_size={d}, intermediate_size={f}")
    mlp = {"WN": tensors["pre_ff_layernorm.weight"], "WG": tensors["feed_forward.gate_proj.weight"].T,
           "WU": tensors["feed_forward.up_proj.weight"].T, "WDN": tensors["feed_forward.down_proj.weight"].T}
    if kind == "attention":
        att = config.attention()
        e = att.head_channels
        tensors.require_shapes({"self_attn.q_proj.weight": (att.n_heads * e, d),
                                "self_attn.k_proj.weight": (att.n_kv_heads * e, d),
                                "self_attn.v_proj.weight": (att.n_kv_heads * e, d),
                                "self_attn.o_proj.weight": (d, att.n_heads * e)},
                               f"hidden_size={d}, num_attention_heads={att.n_heads}, "
                               f"num_key_value_heads={att.n_kv_heads}, head_dim={e}")
        try:
            mixer = weights_from_projections(att, norm=tensors["input_layernorm.weight"],
                                             q_proj=tensors["self_attn.q_proj.weight"],
                                             k_proj=tensors["self_attn.k_proj.weight"],
                                             v_proj=tensors["self_attn.v_proj.weight"],
                                             o_proj=tensors["self_attn.o_proj.weight"])
        except SpecError as err:  # pragma: no cover - the shapes were checked above
            raise WeightLoadError(f"{tensors.where}: {err}") from None
    else:
        block = {"norm.weight": tensors["input_layernorm.weight"]}
        block.update({"mixer." + k[len("mamba."):]: tensors[k] for k in _MAMBA})
        mixer = load_mamba2_layer(block, layer, "float64", ngroups=config.mamba_ngroups, d_state=config.mamba_d_state)
    weights = hybrid_weights(mixer, mlp)
    return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}


__all__ = ["KEYS", "load_bamba_layer"]
