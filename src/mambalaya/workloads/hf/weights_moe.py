"""The weights of one Jamba or Granite 4 hybrid layer (a transformers state_dict, keys under
``layers.{i}.`` or ``model.layers.{i}.``) in the layouts of its layer cascade
(:func:`~mambalaya.workloads.families.jamba_granite.moe_family_layer`; feed-forward tensors ``FF_``).

* Jamba's Mamba mixer ``mamba.*``: ``in_proj`` [2E, D] is ``x`` then the gate ``z``; ``x_proj``
  [R+2N, E] is ``dt``, ``B``, ``C``; ``dt_layernorm``/``b_layernorm``/``c_layernorm`` become
  ``WDLN``/``WBN``/``WCMN``; ``A = -exp(A_log)``.
* Granite's Mamba-2 mixer: as Bamba's (:func:`~mambalaya.workloads.hf.weights_mamba2.load_mamba2_layer`).
* Attention ``self_attn.{q,k,v,o}_proj``: :func:`~mambalaya.workloads.blocks.attention.weights_from_projections`.
* MoE: ``router.weight`` [X, D] -> ``WR`` [D, X]; ``experts.gate_up_proj`` [X, 2F, D] (gate rows
  first) -> ``WG``/``WU`` [X, D, F]; ``experts.down_proj`` [X, D, F] -> ``WDN`` [X, F, D];
  Granite's ``shared_mlp.input_linear`` [2V, D] (gate rows first) and ``output_linear`` [D, V].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.attention import weights_from_projections
from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_layer
from mambalaya.workloads.families.jamba_granite import MLP_PREFIX, MoEHybridConfig

_FF_NORM = {"jamba": "pre_ff_layernorm.weight", "granitemoehybrid": "post_attention_layernorm.weight"}
_MOE = {"jamba": "feed_forward.", "granitemoehybrid": "block_sparse_moe."}


def _layer_dict(state_dict: Mapping[str, Any], layer: int) -> dict[str, np.ndarray]:
    out = {}
    for prefix in (f"layers.{layer}.", f"model.layers.{layer}."):
        out.update({k[len(prefix):]: np.asarray(v, dtype=np.float64) for k, v in state_dict.items()
                    if k.startswith(prefix)})
    return out


def _need(sd: dict[str, np.ndarray], key: str, shape: tuple[int, ...], layer: int) -> np.ndarray:
    if key not in sd:
        raise SpecError(f"layer {layer} has no weight {key!r} (it has {', '.join(sorted(sd)) or 'none'})")
    if tuple(sd[key].shape) != shape:
        raise SpecError(f"weight {key!r} of layer {layer} has shape {tuple(sd[key].shape)}; the config makes it {shape}")
    return sd[key]


def _jamba_mamba(config: MoEHybridConfig, sd: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    m = config.mamba1()
    d, e, n, r, k = m.d_model, m.d_inner, m.d_state, m.dt_rank_value, m.d_conv
    in_proj = _need(sd, "mamba.in_proj.weight", (2 * e, d), layer)
    x_proj = _need(sd, "mamba.x_proj.weight", (r + 2 * n, e), layer)
    return {
        "WN": _need(sd, "input_layernorm.weight", (d,), layer),
        "WX": in_proj[:e].T, "WZ": in_proj[e:].T,
        "WC": _need(sd, "mamba.conv1d.weight", (e, 1, k), layer)[:, 0, :],
        "BC": _need(sd, "mamba.conv1d.bias", (e,), layer),
        "WDL": x_proj[:r].T, "WB": x_proj[r:r + n].T, "WCM": x_proj[r + n:].T,
        "WDT": _need(sd, "mamba.dt_proj.weight", (e, r), layer).T,
        "BDT": _need(sd, "mamba.dt_proj.bias", (e,), layer),
        "A": -np.exp(_need(sd, "mamba.A_log", (e, n), layer)),
        "DS": _need(sd, "mamba.D", (e,), layer),
        "WO": _need(sd, "mamba.out_proj.weight", (d, e), layer).T,
        "WDLN": _need(sd, "mamba.dt_layernorm.weight", (r,), layer),
        "WBN": _need(sd, "mamba.b_layernorm.weight", (n,), layer),
        "WCMN": _need(sd, "mamba.c_layernorm.weight", (n,), layer),
    }


def _moe(config: MoEHybridConfig, sd: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    c = config.moe()
    d, f, x, p = c.d_model, c.d_ff, c.n_experts, _MOE[config.family]
    gate_up = _need(sd, p + "experts.gate_up_proj", (x, 2 * f, d), layer)
    out = {
        "WN": _need(sd, _FF_NORM[config.family], (d,), layer),
        "WR": _need(sd, p + "router.weight", (x, d), layer).T,
        "WG": gate_up[:, :f, :].transpose(0, 2, 1), "WU": gate_up[:, f:, :].transpose(0, 2, 1),
        "WDN": _need(sd, p + "experts.down_proj", (x, d, f), layer).transpose(0, 2, 1),
    }
    if c.shared_d_ff:
        v = c.shared_d_ff
        shared = _need(sd, "shared_mlp.input_linear.weight", (2 * v, d), layer)
        out.update({"WSG": shared[:v].T, "WSU": shared[v:].T,
                    "WSD": _need(sd, "shared_mlp.output_linear.weight", (d, v), layer).T})
    return out


def _mlp(config: MoEHybridConfig, sd: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    d = config.d_model
    norm = _need(sd, _FF_NORM[config.family], (d,), layer)
    if config.family == "granitemoehybrid":
        v = config.shared_d_ff or 0
        shared = _need(sd, "shared_mlp.input_linear.weight", (2 * v, d), layer)
        return {"WN": norm, "WG": shared[:v].T, "WU": shared[v:].T,
                "WDN": _need(sd, "shared_mlp.output_linear.weight", (d, v), layer).T}
    f = config.d_ff
    return {"WN": norm, "WG": _need(sd, "feed_forward.gate_proj.weight", (f, d), layer).T,
            "WU": _need(sd, "feed_forward.up_proj.weight", (f, d), layer).T,
            "WDN": _need(sd, "feed_forward.down_proj.weight", (d, f), layer).T}


def load_moe_family_layer(state_dict: Mapping[str, Any], layer: int, config: MoEHybridConfig,
                          dtype: str = "float32") -> dict[str, np.ndarray]:
    """Layer ``layer`` of a Jamba / Granite 4 hybrid state_dict (arrays or tensors) as the
    weights of its layer cascade; the config gives its type and every shape."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < config.n_layers:
        raise SpecError(f"layer {layer!r} is not a layer of this {config.family} config (0..{config.n_layers - 1})")
    sd = _layer_dict({k: (v.detach().numpy() if hasattr(v, "detach") else v) for k, v in state_dict.items()}, layer)
    kind = config.layer_types[layer]
    if kind.startswith("attention"):
        att = config.attention()
        d, e = config.d_model, att.head_channels
        mixer = weights_from_projections(
            att, norm=_need(sd, "input_layernorm.weight", (d,), layer),
            q_proj=_need(sd, "self_attn.q_proj.weight", (att.n_heads * e, d), layer),
            k_proj=_need(sd, "self_attn.k_proj.weight", (att.n_kv_heads * e, d), layer),
            v_proj=_need(sd, "self_attn.v_proj.weight", (att.n_kv_heads * e, d), layer),
            o_proj=_need(sd, "self_attn.o_proj.weight", (d, att.n_heads * e), layer))
    elif config.family == "jamba":
        mixer = _jamba_mamba(config, sd, layer)
    else:
        block = {"norm.weight": _need(sd, "input_layernorm.weight", (config.d_model,), layer)}
        block.update({"mixer." + k[len("mamba."):]: v for k, v in sd.items() if k.startswith("mamba.")})
        mixer = load_mamba2_layer(block, layer, "float64", ngroups=config.mamba_ngroups, d_state=config.mamba_d_state)
    ffn = _moe(config, sd, layer) if kind.endswith("-moe") else _mlp(config, sd, layer)
    out = {**mixer, **{MLP_PREFIX + k: v for k, v in ffn.items()}}
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.dtype(dtype)) for k, v in out.items()}


__all__ = ["load_moe_family_layer"]
