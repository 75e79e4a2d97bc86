"""Load one layer of a dense hybrid family's checkpoint (Nemotron-H, OLMo-Hybrid) into the
tensor layouts of its layer cascade, through the shared loader core
(:mod:`mambalaya.workloads.hf_loader`).

* Nemotron-H (``NemotronHBlock``, keys under ``backbone.layers.{i}.`` or ``layers.{i}.``):
  ``norm.weight`` and the mixer: the Mamba-2 mixer's ``mixer.in_proj``, ``mixer.conv1d``, ...
  (a ``Mamba2Block``'s keys: :func:`~mambalaya.workloads.hf_weights_mamba2.load_mamba2_layer`),
  the attention's ``mixer.{q,k,v,o}_proj.weight``, or the MLP's ``mixer.{up,down}_proj.weight``.
* OLMo-Hybrid (``model.layers.{i}.``): a Gated DeltaNet layer holds ``input_layernorm``,
  ``linear_attn.*`` (:func:`~mambalaya.workloads.hf_weights_gdn.gdn_weights`),
  ``post_attention_layernorm`` (the MLP's pre-norm) and ``mlp.{gate,up,down}_proj``; an
  attention layer ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm`` and the two post-norms
  ``post_attention_layernorm``, ``post_feedforward_layernorm`` around ``mlp.*``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.workloads.attention import weights_from_projections
from mambalaya.workloads.hf_loader import LayerKeys, WeightLoadError, as_layout, read_layer, resolve_dtype
from mambalaya.workloads.hf_weights_mamba2 import load_mamba2_layer
from mambalaya.workloads.nemotron_h import NemotronHModel

_NH_ATTENTION = ("norm.weight", "mixer.q_proj.weight", "mixer.k_proj.weight", "mixer.v_proj.weight",
                 "mixer.o_proj.weight")
_NH_MLP = ("norm.weight", "mixer.up_proj.weight", "mixer.down_proj.weight")
_NH_SCOPE = "mambalaya models dense Nemotron-H layers with no projection biases."
NEMOTRON_H_KEYS: dict[str, LayerKeys] = {
    "attention": LayerKeys(family="Nemotron-H attention", required=_NH_ATTENTION,
                           block="a Nemotron-H attention block (norm, NemotronHAttention)", scope=_NH_SCOPE,
                           unsupported={k.replace("weight", "bias"): "a bias, which mambalaya does not model"
                                        for k in _NH_ATTENTION[1:]}),
    "mlp": LayerKeys(family="Nemotron-H MLP", required=_NH_MLP,
                     block="a Nemotron-H MLP block (norm, NemotronHMLP)", scope=_NH_SCOPE,
                     unsupported={k.replace("weight", "bias"): "a bias, which mambalaya does not model"
                                  for k in _NH_MLP[1:]}),
}


def _check_layer(layer: Any, n_layers: int, family: str) -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < n_layers:
        raise WeightLoadError(f"Layer {layer!r} is not a layer of this {family} config (layers 0..{n_layers - 1}).")
    return int(layer)


def load_nemotron_h_layer(source: Any, layer: int, config: NemotronHModel, dtype: Any = "float32"
                          ) -> dict[str, np.ndarray]:
    """Layer ``layer`` of a Nemotron-H checkpoint (a state_dict, ``.safetensors``/``.bin`` file,
    shard index or model directory) as the weights of its layer cascade, each C-contiguous of
    ``dtype``; the config says the layer's type and fixes the shapes."""
    out_dtype = resolve_dtype(dtype, "Nemotron-H")
    layer = _check_layer(layer, config.n_layers, "Nemotron-H")
    kind = config.layer_types[layer]
    if kind == "mamba":
        weights = load_mamba2_layer(source, layer, "float64", ngroups=config.mamba_ngroups, d_state=config.mamba_d_state)
        return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}
    tensors = read_layer(source, layer, NEMOTRON_H_KEYS[kind])
    tensors.require_floating()
    d = config.d_model
    if kind == "mlp":
        f = config.d_ff
        tensors.require_shapes({"norm.weight": (d,), "mixer.up_proj.weight": (f, d), "mixer.down_proj.weight": (d, f)},
                               f"hidden_size={d}, intermediate_size={f}")
        weights = {"WN": tensors["norm.weight"], "WU": tensors["mixer.up_proj.weight"].T,
                   "WDN": tensors["mixer.down_proj.weight"].T}
    else:
        att = config.attention_config()
        e = att.head_channels
        tensors.require_shapes({"norm.weight": (d,), "mixer.q_proj.weight": (att.n_heads * e, d),
                                "mixer.k_proj.weight": (att.n_kv_heads * e, d),
                                "mixer.v_proj.weight": (att.n_kv_heads * e, d),
                                "mixer.o_proj.weight": (d, att.n_heads * e)},
                               f"hidden_size={d}, num_attention_heads={att.n_heads}, "
                               f"num_key_value_heads={att.n_kv_heads}, head_dim={e}")
        try:
            weights = weights_from_projections(att, norm=tensors["norm.weight"], q_proj=tensors["mixer.q_proj.weight"],
                                               k_proj=tensors["mixer.k_proj.weight"],
                                               v_proj=tensors["mixer.v_proj.weight"],
                                               o_proj=tensors["mixer.o_proj.weight"])
        except SpecError as err:  # pragma: no cover - the shapes were checked above
            raise WeightLoadError(f"{tensors.where}: {err}") from None
    return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}


__all__ = ["NEMOTRON_H_KEYS", "load_nemotron_h_layer"]
