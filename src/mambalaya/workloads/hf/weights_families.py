"""Load one layer of a dense hybrid family's checkpoint (Nemotron-H, OLMo-Hybrid) into the
tensor layouts of its layer cascade, through the shared loader core
(:mod:`mambalaya.workloads.hf.loader`).

* Nemotron-H (``NemotronHBlock``, keys under ``backbone.layers.{i}.`` or ``layers.{i}.``):
  ``norm.weight`` and the mixer: the Mamba-2 mixer's ``mixer.in_proj``, ``mixer.conv1d``, ...
  (a ``Mamba2Block``'s keys: :func:`~mambalaya.workloads.hf.weights_mamba2.load_mamba2_layer`),
  the attention's ``mixer.{q,k,v,o}_proj.weight``, the MLP's ``mixer.{up,down}_proj.weight``,
  or the MoE block's ``mixer.gate.weight`` [X, D] -> ``WR`` [D, X], ``mixer.gate.e_score_correction_bias``
  -> ``EB``, ``mixer.experts.up_proj`` [X, F, A] -> ``WU`` [X, A, F], ``mixer.experts.down_proj``
  [X, A, F] -> ``WDN`` [X, F, A], ``mixer.shared_experts.{up,down}_proj.weight`` -> ``WSU``/``WSD``
  and, with ``moe_latent_size``, ``mixer.fc{1,2}_latent_proj.weight`` -> ``WL1``/``WL2`` (``A`` is
  the latent size, else the hidden size).
* Falcon-H1 (``model.layers.{i}.``): ``input_layernorm``, ``mamba.*`` (the Mamba-2 mixer's
  names, ``norm.weight`` only with ``mamba_rms_norm``), ``self_attn.{q,k,v,o}_proj``,
  ``pre_ff_layernorm`` and ``feed_forward.{gate,up,down}_proj``; every multiplier is folded into
  the weight it scales (:mod:`~mambalaya.workloads.families.falcon_h1`).
* OLMo-Hybrid (``model.layers.{i}.``): a Gated DeltaNet layer holds ``input_layernorm``,
  ``linear_attn.*`` (:func:`~mambalaya.workloads.hf.weights_gdn.gdn_weights`),
  ``post_attention_layernorm`` (the MLP's pre-norm) and ``mlp.{gate,up,down}_proj``; an
  attention layer ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm`` and the two post-norms
  ``post_attention_layernorm``, ``post_feedforward_layernorm`` around ``mlp.*``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.attention import weights_from_projections
from mambalaya.workloads.hf.loader import LayerKeys, WeightLoadError, as_layout, read_layer, resolve_dtype
from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_layer
from mambalaya.workloads.families.falcon_h1 import FalconH1Model
from mambalaya.workloads.families.nemotron_h import NemotronHModel
from mambalaya.workloads.families.olmo_hybrid import OlmoHybridModel
from mambalaya.workloads.families.zamba2 import Zamba2Model

_NH_ATTENTION = ("norm.weight", "mixer.q_proj.weight", "mixer.k_proj.weight", "mixer.v_proj.weight",
                 "mixer.o_proj.weight")
_NH_MLP = ("norm.weight", "mixer.up_proj.weight", "mixer.down_proj.weight")
_NH_SCOPE = "mambalaya models Nemotron-H layers with no projection biases."
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
_NH_MOE = ("norm.weight", "mixer.gate.weight", "mixer.gate.e_score_correction_bias", "mixer.experts.up_proj",
           "mixer.experts.down_proj", "mixer.shared_experts.up_proj.weight", "mixer.shared_experts.down_proj.weight")
_NH_LATENT = ("mixer.fc1_latent_proj.weight", "mixer.fc2_latent_proj.weight")


def _nemotron_h_moe_keys(latent: bool) -> LayerKeys:
    """The keys of a Nemotron-H MoE layer (``NemotronHMoE``), with the latent projections when
    the config sets ``moe_latent_size``."""
    biases = {k.replace("weight", "bias"): "a bias, which mambalaya does not model"
              for k in (*_NH_MOE[5:], *_NH_LATENT)}
    extra = {} if latent else {k: "a latent projection, but the config sets no moe_latent_size" for k in _NH_LATENT}
    return LayerKeys(family="Nemotron-H MoE", required=_NH_MOE + (_NH_LATENT if latent else ()),
                     block="a Nemotron-H MoE block (norm, NemotronHMoE)", scope=_NH_SCOPE,
                     unsupported={**biases, **extra})


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
    if kind == "moe":
        weights = _nemotron_h_moe(source, layer, config)
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


def _nemotron_h_moe(source: Any, layer: int, config: NemotronHModel) -> dict[str, np.ndarray]:
    """A Nemotron-H MoE layer's tensors in the MoE cascade's layouts (module doc)."""
    moe = config.moe_config()
    latent = moe.latent_size is not None
    tensors = read_layer(source, layer, _nemotron_h_moe_keys(latent))
    tensors.require_floating()
    d, x, f, v, a = moe.d_model, moe.n_experts, moe.d_ff, moe.shared_d_ff, moe.expert_width
    shapes = {"norm.weight": (d,), "mixer.gate.weight": (x, d), "mixer.gate.e_score_correction_bias": (x,),
              "mixer.experts.up_proj": (x, f, a), "mixer.experts.down_proj": (x, a, f),
              "mixer.shared_experts.up_proj.weight": (v, d), "mixer.shared_experts.down_proj.weight": (d, v)}
    if latent:
        shapes.update({"mixer.fc1_latent_proj.weight": (a, d), "mixer.fc2_latent_proj.weight": (d, a)})
    tensors.require_shapes(shapes, f"hidden_size={d}, n_routed_experts={x}, moe_intermediate_size={f}, "
                                   f"moe_shared_expert_intermediate_size={v}, moe_latent_size={moe.latent_size}")
    weights = {"WN": tensors["norm.weight"], "WR": tensors["mixer.gate.weight"].T,
               "EB": tensors["mixer.gate.e_score_correction_bias"],
               "WU": np.transpose(tensors["mixer.experts.up_proj"], (0, 2, 1)),
               "WDN": np.transpose(tensors["mixer.experts.down_proj"], (0, 2, 1)),
               "WSU": tensors["mixer.shared_experts.up_proj.weight"].T,
               "WSD": tensors["mixer.shared_experts.down_proj.weight"].T}
    if latent:
        weights.update(WL1=tensors["mixer.fc1_latent_proj.weight"].T, WL2=tensors["mixer.fc2_latent_proj.weight"].T)
    return weights


_OH_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_OH_GDN = ("input_layernorm.weight", "post_attention_layernorm.weight", *_OH_MLP,
           *(f"linear_attn.{k}" for k in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight",
                                          "a_proj.weight", "b_proj.weight", "o_proj.weight", "conv1d.weight", "A_log",
                                          "dt_bias", "o_norm.weight")))
_OH_ATTENTION = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight", *_OH_MLP,
                 *(f"self_attn.{k}.weight" for k in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))
_OH_SCOPE = "mambalaya models OLMo-Hybrid layers with no projection biases."
OLMO_HYBRID_KEYS: dict[str, LayerKeys] = {
    "gdn": LayerKeys(family="OLMo-Hybrid Gated DeltaNet", required=_OH_GDN, scope=_OH_SCOPE,
                     block="an OLMo-Hybrid linear-attention layer (input_layernorm, linear_attn, "
                           "post_attention_layernorm, mlp)",
                     unsupported={k: "an attention weight, but the config makes this a linear-attention layer"
                                  for k in _OH_ATTENTION if k.startswith("self_attn")}),
    "attention": LayerKeys(family="OLMo-Hybrid attention", required=_OH_ATTENTION, scope=_OH_SCOPE,
                           block="an OLMo-Hybrid attention layer (self_attn, post_attention_layernorm, mlp, "
                                 "post_feedforward_layernorm)",
                           unsupported={k.replace("weight", "bias"): "a bias, which mambalaya does not model"
                                        for k in _OH_ATTENTION if "_proj" in k}),
}


def load_olmo_hybrid_layer(source: Any, layer: int, config: OlmoHybridModel, dtype: Any = "float32"
                           ) -> dict[str, np.ndarray]:
    """Layer ``layer`` of an OLMo-Hybrid checkpoint as the weights of its layer cascade (the MLP
    block's with the ``FF_`` prefix), each C-contiguous of ``dtype``."""
    from mambalaya.workloads.hf.weights_gdn import gdn_weights

    out_dtype = resolve_dtype(dtype, "OLMo-Hybrid")
    layer = _check_layer(layer, config.n_layers, "OLMo-Hybrid")
    kind = config.layer_types[layer]
    tensors = read_layer(source, layer, OLMO_HYBRID_KEYS[kind])
    tensors.require_floating()
    m = config.mixer
    d, f = m.d_model, m.d_ff
    tensors.require_shapes({"mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
                            "mlp.down_proj.weight": (d, f), "post_attention_layernorm.weight": (d,)},
                           f"hidden_size={d}, intermediate_size={f}")
    mlp = {"FF_WG": tensors["mlp.gate_proj.weight"].T, "FF_WU": tensors["mlp.up_proj.weight"].T,
           "FF_WDN": tensors["mlp.down_proj.weight"].T}
    if kind == "gdn":
        mixer = {k[len("linear_attn."):]: tensors[k] for k in _OH_GDN if k.startswith("linear_attn.")}
        try:
            weights = gdn_weights(m, mixer, tensors["input_layernorm.weight"], dtype="float64")
        except SpecError as err:
            raise WeightLoadError(f"{tensors.where}: {err}") from None
        weights.update(mlp, FF_WN=tensors["post_attention_layernorm.weight"])
    else:
        hd = m.head_dim or d // m.n_heads
        g, r = m.n_kv_heads, m.n_heads // m.n_kv_heads
        tensors.require_shapes({"self_attn.q_proj.weight": (m.n_heads * hd, d), "self_attn.k_proj.weight": (g * hd, d),
                                "self_attn.v_proj.weight": (g * hd, d), "self_attn.o_proj.weight": (d, m.n_heads * hd),
                                "self_attn.q_norm.weight": (m.n_heads * hd,), "self_attn.k_norm.weight": (g * hd,),
                                "post_feedforward_layernorm.weight": (d,)},
                               f"hidden_size={d}, num_attention_heads={m.n_heads}, num_key_value_heads={g}, "
                               f"head_dim={hd}")
        ch = (2, hd // 2) if config.rope_theta is not None else (hd,)  # rotated: halves x frequencies
        weights = {"WQ": tensors["self_attn.q_proj.weight"].T.reshape(d, g, r, *ch),
                   "WK": tensors["self_attn.k_proj.weight"].T.reshape(d, g, *ch),
                   "WV": tensors["self_attn.v_proj.weight"].T.reshape(d, g, hd),
                   "WQN": tensors["self_attn.q_norm.weight"].reshape(g, r, *ch),
                   "WKN": tensors["self_attn.k_norm.weight"].reshape(g, *ch),
                   "WO": tensors["self_attn.o_proj.weight"].T.reshape(g, r, hd, d),
                   "WPN": tensors["post_attention_layernorm.weight"],
                   **mlp, "FF_WN": tensors["post_feedforward_layernorm.weight"]}
    return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}


_FH_MAMBA = ("mamba.in_proj.weight", "mamba.conv1d.weight", "mamba.conv1d.bias", "mamba.dt_bias", "mamba.A_log",
             "mamba.D", "mamba.out_proj.weight")
_FH_COMMON = ("input_layernorm.weight", "pre_ff_layernorm.weight", "feed_forward.gate_proj.weight",
              "feed_forward.up_proj.weight", "feed_forward.down_proj.weight", "self_attn.q_proj.weight",
              "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", *_FH_MAMBA)


def falcon_h1_keys(config: FalconH1Model) -> LayerKeys:
    norm = ("mamba.norm.weight",) if config.mamba_rms_norm else ()
    return LayerKeys(family="Falcon-H1", required=_FH_COMMON + norm, scope="mambalaya models Falcon-H1 layers with "
                     "no projection biases and a conv bias.",
                     block="a Falcon-H1 layer (input_layernorm, mamba, self_attn, pre_ff_layernorm, feed_forward)",
                     unsupported={"mamba.norm.weight": "the mixer's gated RMSNorm, but the config has mamba_rms_norm "
                                                       "false"})


def load_falcon_h1_layer(source: Any, layer: int, config: FalconH1Model, dtype: Any = "float32"
                         ) -> dict[str, np.ndarray]:
    """Layer ``layer`` of a Falcon-H1 checkpoint as the weights of its one-cascade layer, with the
    config's multipliers (``config.multipliers``, read from its config.json) folded into the
    weights they scale. To fold other multipliers, load with a config that holds them
    (``config.model_copy(update={"multipliers": ...})``)."""
    from mambalaya.workloads.blocks.attention import weights_from_projections

    if isinstance(dtype, dict):
        raise WeightLoadError("load_falcon_h1_layer takes the multipliers from config.multipliers (read from the "
                              "config.json with the rest); its fourth argument is the dtype")
    out_dtype = resolve_dtype(dtype, "Falcon-H1")
    layer = _check_layer(layer, config.n_layers, "Falcon-H1")
    tensors = read_layer(source, layer, falcon_h1_keys(config))
    tensors.require_floating()
    c, mu = config, config.multipliers
    d, f, e, gn = c.d_model, c.d_ff, c.mamba_d_ssm, c.mamba_ngroups * c.mamba_d_state
    tensors.require_shapes({"mamba.in_proj.weight": (2 * e + 2 * gn + c.mamba_heads, d),
                            "feed_forward.gate_proj.weight": (f, d), "feed_forward.down_proj.weight": (d, f)},
                           f"hidden_size={d}, mamba_d_ssm={e}, intermediate_size={f}")
    z, x, b, cc, dt = mu.ssm_multipliers
    mup = np.concatenate([np.full(e, z), np.full(e, x), np.full(gn, b), np.full(gn, cc), np.full(c.mamba_heads, dt)])
    block = {"norm.weight": tensors["input_layernorm.weight"],
             "mixer.norm.weight": tensors["mamba.norm.weight"] if c.mamba_rms_norm else np.ones(e)}
    block.update({"mixer." + k[len("mamba."):]: tensors[k] for k in _FH_MAMBA})
    block["mixer.in_proj.weight"] = tensors["mamba.in_proj.weight"] * (mu.ssm_in_multiplier * mup)[:, None]
    block["mixer.out_proj.weight"] = tensors["mamba.out_proj.weight"] * mu.ssm_out_multiplier
    weights = load_mamba2_layer(block, layer, "float64", ngroups=c.mamba_ngroups, d_state=c.mamba_d_state)
    if not c.mamba_rms_norm:
        weights.pop("WGN")
    att, a_in = c.attention_config(), mu.attention_in_multiplier
    try:
        proj = weights_from_projections(att, norm=np.ones(d), q_proj=tensors["self_attn.q_proj.weight"] * a_in,
                                        k_proj=tensors["self_attn.k_proj.weight"] * (a_in * mu.key_multiplier),
                                        v_proj=tensors["self_attn.v_proj.weight"] * a_in,
                                        o_proj=tensors["self_attn.o_proj.weight"] * mu.attention_out_multiplier)
    except SpecError as err:
        raise WeightLoadError(f"{tensors.where}: {err}") from None
    gate, down = mu.mlp_multipliers
    weights.update(WAQ=proj["WQA"], WAK=proj["WKA"], WAV=proj["WV"], WAO=proj["WO"],
                   FF_WN=tensors["pre_ff_layernorm.weight"], FF_WG=tensors["feed_forward.gate_proj.weight"].T * gate,
                   FF_WU=tensors["feed_forward.up_proj.weight"].T,
                   FF_WDN=tensors["feed_forward.down_proj.weight"].T * down)
    return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}


def _zamba2_tensor(state: Any, key: str, shape: tuple[int, ...]) -> np.ndarray:
    for prefix in ("model.", ""):
        if prefix + key in state:
            value = state[prefix + key]
            arr = np.asarray(value.detach().float().numpy() if hasattr(value, "detach") else value, dtype=np.float64)
            if arr.shape != shape:
                raise WeightLoadError(f"Zamba2 weight {prefix + key} has shape {arr.shape}; the config gives {shape}")
            return arr
    raise WeightLoadError(f"the Zamba2 state dict has no {key} (nor model.{key})")


def load_zamba2_layer(state: Any, layer: int, config: Zamba2Model, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """Layer ``layer`` of a Zamba2 state dict (``Zamba2ForCausalLM``'s ``model.layers.*`` or
    ``Zamba2Model``'s ``layers.*``; tensors or arrays) as the weights of its cascade. A hybrid
    layer's shared block is read where the checkpoint keeps it, under the first hybrid layer of
    that block (transformers ties the later uses to it); its adapters are the use's (index
    ``j``, the layer's rank among the hybrid layers)."""
    out_dtype = resolve_dtype(dtype, "Zamba2")
    layer = _check_layer(layer, config.n_layers, "Zamba2")
    c, hybrid = config, config.layer_types[layer] == "hybrid"
    d, f, r, hd = c.d_model, c.d_ff, c.adapter_rank, c.head_dim
    y, v, e = c.n_kv_heads, c.n_heads // c.n_kv_heads, c.expand * c.d_model
    at = f"layers.{layer}.mamba_decoder." if hybrid else f"layers.{layer}."
    gn, k = c.mamba_ngroups * c.mamba_d_state, c.mamba_d_conv
    conv = e + 2 * gn
    shapes = {"mamba.in_proj.weight": (e + conv + c.mamba_heads, d), "mamba.conv1d.weight": (conv, 1, k),
              "mamba.conv1d.bias": (conv,), "mamba.dt_bias": (c.mamba_heads,), "mamba.A_log": (c.mamba_heads,),
              "mamba.D": (c.mamba_heads,), "mamba.norm.weight": (e,), "mamba.out_proj.weight": (d, e)}
    block = {"norm.weight": _zamba2_tensor(state, at + "input_layernorm.weight", (d,))}
    block.update({"mixer." + name[len("mamba."):]: _zamba2_tensor(state, at + name, shape)
                  for name, shape in shapes.items()})
    weights = load_mamba2_layer(block, layer, "float64", ngroups=c.mamba_ngroups, d_state=c.mamba_d_state)
    if hybrid:
        mem, use = c.shared_block_of(layer)
        first = c.hybrid_layer_ids[mem]
        sb = f"layers.{first}.shared_transformer."

        def t(key: str, shape: tuple[int, ...]) -> np.ndarray:
            return _zamba2_tensor(state, sb + key, shape)

        q = t("self_attn.q_proj.weight", (c.n_heads * hd, 2 * d)).T
        kk = t("self_attn.k_proj.weight", (y * hd, 2 * d)).T
        vv = t("self_attn.v_proj.weight", (y * hd, 2 * d)).T
        norm = t("input_layernorm.weight", (2 * d,))
        gate_up = t("feed_forward.gate_up_proj.weight", (2 * f, d))
        lm0 = t(f"feed_forward.gate_up_proj_adapter_list.{use}.0.weight", (r, d))
        lm1 = t(f"feed_forward.gate_up_proj_adapter_list.{use}.1.weight", (2 * f, r))
        weights.update(
            WAN=norm[:d], WAE=norm[d:], WAQ=q[:d].reshape(d, y, v, 2, hd // 2), WAQE=q[d:].reshape(d, y, v, 2, hd // 2),
            WAK=kk[:d].reshape(d, y, 2, hd // 2), WAKE=kk[d:].reshape(d, y, 2, hd // 2), WAV=vv[:d].reshape(d, y, hd),
            WAVE=vv[d:].reshape(d, y, hd), WAO=t("self_attn.o_proj.weight", (d, c.n_heads * hd)).T.reshape(y, v, hd, d),
            WFN=t("pre_ff_layernorm.weight", (d,)), WFG=gate_up[:f].T, WFU=gate_up[f:].T,
            WFD=t("feed_forward.down_proj.weight", (d, f)).T, WLM=lm0.T, WLG=lm1[:f].T, WLU=lm1[f:].T,
            WTL=_zamba2_tensor(state, f"layers.{layer}.linear.weight", (d, d)).T)
        if c.attention_adapter:
            for p, shape in (("Q", (y, v, 2, hd // 2)), ("K", (y, 2, hd // 2)), ("V", (y, hd))):
                a0 = t(f"self_attn.linear_{p.lower()}_adapter_list.{use}.0.weight", (r, 2 * d)).T
                a1 = t(f"self_attn.linear_{p.lower()}_adapter_list.{use}.1.weight", (2 * d, r)).T
                weights.update({f"WL{p}X": a0[:d], f"WL{p}E": a0[d:], f"WL{p}U": a1.reshape(r, *shape)})
    return {name: as_layout(np.asarray(arr), out_dtype) for name, arr in weights.items()}


__all__ = ["NEMOTRON_H_KEYS", "OLMO_HYBRID_KEYS", "falcon_h1_keys", "load_falcon_h1_layer", "load_nemotron_h_layer",
           "load_olmo_hybrid_layer", "load_zamba2_layer"]
