"""Load the real weights (and states) of one Mamba-1 layer into mambalaya's tensor layouts.

A Mamba-1 layer is the transformers ``MambaBlock``: ``RMSNorm -> MambaMixer -> residual add``.
mambalaya expresses it as a cascade of Einsums over these tensors (B=batch, I=positions,
D=d_model, E=intermediate_size=expand*D, N=state_size, R=time_step_rank, K=conv_kernel, J=K-1):

=======  ========  =====================================================================
name     layout    taken from (transformers / state-spaces ``MambaBlock`` state_dict)
=======  ========  =====================================================================
WN       [D]       ``norm.weight``
WX       [D,E]     ``mixer.in_proj.weight`` [2E,D], rows ``[0,E)`` (x branch), transposed
WZ       [D,E]     ``mixer.in_proj.weight`` [2E,D], rows ``[E,2E)`` (gate z), transposed
WC       [E,K]     ``mixer.conv1d.weight`` [E,1,K], squeezed
BC       [E]       ``mixer.conv1d.bias``
WDL      [E,R]     ``mixer.x_proj.weight`` [R+2N,E], rows ``[0,R)``, transposed
WB       [E,N]     ``mixer.x_proj.weight`` rows ``[R,R+N)``, transposed
WCM      [E,N]     ``mixer.x_proj.weight`` rows ``[R+N,R+2N)``, transposed
WDT      [R,E]     ``mixer.dt_proj.weight`` [E,R], transposed
BDT      [E]       ``mixer.dt_proj.bias``
A        [E,N]     ``-exp(mixer.A_log)``, computed in float64 then cast
DS       [E]       ``mixer.D``
WO       [E,D]     ``mixer.out_proj.weight`` [D,E], transposed
=======  ========  =====================================================================

States (see :func:`mamba1_states_from_hf`):

* ``H0[B,E,N]`` is the SSM state, identical to transformers' recurrent state ``[B,E,N]``.
* ``CS0[B,J,E]`` holds the last ``J=K-1`` inputs of the depthwise conv (the x branch of
  ``in_proj``, before the conv) in time order, oldest first. transformers (5.x,
  ``LinearAttentionLayer``) keeps a conv state ``[B,E,K]`` holding the last ``K`` conv inputs,
  oldest first (zero-padded on the left after a prefill shorter than ``K``). On a decode step
  ``causal_conv1d_update`` concatenates it with the new input (``K+1`` columns), convolves with
  ``padding=0`` and keeps the last output, so column 0 (the oldest input) never reaches an
  output: ``CS0 = conv_state[:, :, 1:].transpose(0, 2, 1)``.

Only the Mamba-1 block without ``in_proj``/``out_proj`` biases (``use_bias=False``) and with a
conv bias (``use_conv_bias=True``) is modelled; anything else raises :class:`WeightLoadError`.
The reading itself (containers, key prefixes, layer selection, checks) is the shared core in
:mod:`mambalaya.workloads.hf.loader`; this module holds only what is Mamba-1's own.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mambalaya.workloads.hf.fields import (
    MAMBA1_DEFAULTS,
    MAMBA1_FIELDS,
    MAMBA1_SSM_CFG_FIELDS,
    MAMBA1_STATE_SPACES_DEFAULTS,
    MAMBA1_STATE_SPACES_FIELDS,
)
from mambalaya.workloads.hf.loader import (
    LayerKeys,
    WeightLoadError,
    a_from_log,
    as_layout,
    fmt_shape,
    read_layer,
    resolve_dtype,
    to_numpy,
)
from mambalaya.workloads.hf.config import (
    ConfigFile,
    ConfigReading,
    config_format,
    padded_vocab,
    read_config_fields,
    read_config_json,
    shown,
    ssm_cfg_of,
)

__all__ = [
    "WEIGHT_NAMES",
    "WeightLoadError",
    "load_mamba1_config",
    "load_mamba1_layer",
    "mamba1_states_from_hf",
    "mamba1_states_to_hf",
    "read_config_json",
]

#: The 13 weight tensors :func:`load_mamba1_layer` returns, in a fixed order.
WEIGHT_NAMES: tuple[str, ...] = (
    "WN", "WX", "WZ", "WC", "BC", "WDL", "WB", "WCM", "WDT", "BDT", "A", "DS", "WO",
)

#: The keys of one MambaBlock, relative to the layer prefix, and what is not modelled.
MAMBA1_KEYS = LayerKeys(
    family="Mamba-1",
    required=(
        "norm.weight",
        "mixer.in_proj.weight",
        "mixer.conv1d.weight",
        "mixer.conv1d.bias",
        "mixer.x_proj.weight",
        "mixer.dt_proj.weight",
        "mixer.dt_proj.bias",
        "mixer.A_log",
        "mixer.D",
        "mixer.out_proj.weight",
    ),
    block="the Mamba-1 block (RMSNorm -> MambaMixer) mambalaya models",
    scope="mambalaya models only a Mamba-1 layer with use_bias=False and use_conv_bias=True.",
    unsupported={
        "mixer.in_proj.bias": "in_proj has a bias (config use_bias=True), which the mambalaya "
        "Mamba-1 cascade does not model",
        "mixer.out_proj.bias": "out_proj has a bias (config use_bias=True), which the mambalaya "
        "Mamba-1 cascade does not model",
        "mixer.x_proj.bias": "x_proj has a bias, which Mamba-1 never has",
        "norm.bias": "the norm has a bias (LayerNorm instead of RMSNorm), which the mambalaya "
        "Mamba-1 cascade does not model",
        "mixer.norm.weight": "the mixer has a gated norm, which means a Mamba-2 layer, not Mamba-1",
        "mixer.dt_bias": "the mixer has dt_bias, which means a Mamba-2 layer, not Mamba-1",
    },
    missing_hints={
        "mixer.conv1d.bias": " (the checkpoint has use_conv_bias=False, which mambalaya does not model)",
    },
)


def load_mamba1_layer(source: Any, layer: int = 0, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """Load layer ``layer`` of a Mamba-1 checkpoint into mambalaya's 13 weight arrays.

    ``source`` is a state_dict in memory (name -> torch tensor or numpy array), or a path to a
    ``.safetensors`` file, a ``.bin``/``.pt`` file, a shard index ``*.index.json``, or a model
    directory (``model.safetensors``, sharded ``model-0000X-of-0000Y.safetensors`` with
    ``model.safetensors.index.json``, or ``pytorch_model.bin``). Keys may be prefixed
    ``backbone.layers.{i}.`` (MambaForCausalLM / state-spaces), ``layers.{i}.`` (MambaModel) or
    be those of a bare ``MambaBlock`` (then ``layer`` only labels error messages).

    Returns ``{name: array}`` for :data:`WEIGHT_NAMES` (layouts in the module docstring), each
    C-contiguous of ``dtype`` (float32 or float64). ``A = -exp(A_log)`` is computed in float64
    before the cast. Raises :class:`WeightLoadError` when the checkpoint does not hold exactly
    a Mamba-1 layer without in/out-projection biases and with a conv bias, or shapes disagree.
    """
    out_dtype = resolve_dtype(dtype, MAMBA1_KEYS.family)
    tensors = read_layer(source, layer, MAMBA1_KEYS)

    # Dimensions: D from the norm, E and N from A_log, K from the conv, R from dt_proj.
    for key, ndim in (("norm.weight", 1), ("mixer.A_log", 2), ("mixer.conv1d.weight", 3),
                      ("mixer.dt_proj.weight", 2)):
        tensors.require_ndim(key, ndim)
    D = tensors["norm.weight"].shape[0]
    E, N = tensors["mixer.A_log"].shape
    K = tensors["mixer.conv1d.weight"].shape[-1]
    R = tensors["mixer.dt_proj.weight"].shape[1]
    tensors.require_shapes(
        {
            "mixer.in_proj.weight": (2 * E, D),
            "mixer.conv1d.weight": (E, 1, K),
            "mixer.conv1d.bias": (E,),
            "mixer.x_proj.weight": (R + 2 * N, E),
            "mixer.dt_proj.weight": (E, R),
            "mixer.dt_proj.bias": (E,),
            "mixer.D": (E,),
            "mixer.out_proj.weight": (D, E),
        },
        "dimensions inferred from norm.weight, A_log, conv1d.weight and dt_proj.weight: "
        f"D={D}, E={E}, N={N}, R={R}, K={K}",
    )
    tensors.require_floating()

    def lay(arr: np.ndarray) -> np.ndarray:
        return as_layout(arr, out_dtype)

    w_in = tensors["mixer.in_proj.weight"]
    w_x = tensors["mixer.x_proj.weight"]
    return {
        "WN": lay(tensors["norm.weight"]),
        "WX": lay(w_in[:E].T),
        "WZ": lay(w_in[E:].T),
        "WC": lay(tensors["mixer.conv1d.weight"][:, 0, :]),
        "BC": lay(tensors["mixer.conv1d.bias"]),
        "WDL": lay(w_x[:R].T),
        "WB": lay(w_x[R:R + N].T),
        "WCM": lay(w_x[R + N:].T),
        "WDT": lay(tensors["mixer.dt_proj.weight"].T),
        "BDT": lay(tensors["mixer.dt_proj.bias"]),
        "A": lay(a_from_log(tensors["mixer.A_log"])),
        "DS": lay(tensors["mixer.D"]),
        "WO": lay(tensors["mixer.out_proj.weight"].T),
    }


def load_mamba1_config(path_or_dict: Any) -> dict[str, Any]:
    """Read a Mamba-1 ``config.json`` (path, model directory, or dict) into mambalaya's names.

    Returns ``{"d_model", "d_state", "expand", "d_conv", "dt_rank", "n_layers", "vocab_size",
    "norm_eps", "tie_embeddings"}``. A transformers config (``hidden_size`` or ``model_type``) is
    read as transformers' ``MambaConfig`` reads it: its fields (hidden_size, state_size, expand,
    conv_kernel, time_step_rank, num_hidden_layers, vocab_size, layer_norm_epsilon,
    tie_word_embeddings) with that class's defaults where absent. A state-spaces config
    (``d_model``) is read as mamba_ssm reads it: d_model, n_layer, vocab_size padded up to
    ``pad_vocab_size_multiple`` (the embedding's row count), tie_embeddings and
    ``ssm_cfg = {d_state, d_conv, expand, dt_rank}`` with mamba_ssm's defaults. ``dt_rank="auto"``
    becomes ``ceil(d_model/16)``. Every other field must be one mambalaya models or one that
    cannot change a layer (:data:`~mambalaya.workloads.hf.fields.MAMBA1_FIELDS` and its
    state-spaces twins); anything else is a WeightLoadError naming the field.
    """
    cfg, where = read_config_json(path_or_dict, "Mamba")
    ssm_cfg = ssm_cfg_of(cfg, where)
    model_type = cfg.get("model_type")
    if (model_type not in (None, "mamba")) or ssm_cfg.get("layer", "Mamba1") != "Mamba1":
        kind = model_type if model_type not in (None, "mamba") else ssm_cfg.get("layer")
        raise WeightLoadError(
            f"{where} describes a {shown(kind)} model; mambalaya loads Mamba-1 ('mamba') layers only."
        )
    fmt = config_format(cfg, where, "Mamba")
    got = read_config_fields(cfg, ssm_cfg, where, _READINGS[fmt])
    values, key = ConfigFile(dict(got.values()), where, loader=True), {ours: name for ours, (name, _) in got.items()}
    out: dict[str, Any] = {k: values.integer(key[k]) for k in ("d_model", "d_state", "d_conv", "vocab_size", "expand")}
    out["n_layers"] = values.layer_count(key["n_layers"])
    dt_rank = values.integer_or_auto(key["dt_rank"])
    out["dt_rank"] = math.ceil(out["d_model"] / 16) if dt_rank is None else dt_rank
    out["norm_eps"] = values.positive_number(key["norm_eps"])
    out["tie_embeddings"] = values.boolean(key["tie_embeddings"])
    file = ConfigFile(cfg, where, loader=True)
    inner = file.integer_or("intermediate_size", None)
    if inner is not None and inner != out["expand"] * out["d_model"]:
        raise WeightLoadError(
            f"{where} is inconsistent: intermediate_size={inner} but expand*hidden_size={out['expand']}*"
            f"{out['d_model']}={out['expand'] * out['d_model']} (transformers builds in_proj from "
            "intermediate_size, the cascade from expand)."
        )
    if fmt == "state-spaces":
        out["vocab_size"] = padded_vocab(cfg, out["vocab_size"], where)
    return {k: out[k] for k in ("d_model", "d_state", "expand", "d_conv", "dt_rank", "n_layers", "vocab_size",
                                "norm_eps", "tie_embeddings")}


#: Which key of each config format gives each of mambalaya's Mamba-1 fields.
_READINGS = {
    "transformers": ConfigReading(
        MAMBA1_FIELDS, MAMBA1_DEFAULTS,
        {"d_model": "hidden_size", "d_state": "state_size", "expand": "expand", "d_conv": "conv_kernel",
         "dt_rank": "time_step_rank", "n_layers": "num_hidden_layers", "vocab_size": "vocab_size",
         "norm_eps": "layer_norm_epsilon", "tie_embeddings": "tie_word_embeddings"}),
    "state-spaces": ConfigReading(
        MAMBA1_STATE_SPACES_FIELDS, MAMBA1_STATE_SPACES_DEFAULTS,
        {"d_model": "d_model", "d_state": "d_state", "expand": "expand", "d_conv": "d_conv", "dt_rank": "dt_rank",
         "n_layers": "n_layer", "vocab_size": "vocab_size", "norm_eps": "norm_epsilon",
         "tie_embeddings": "tie_embeddings"},
        ssm_fields=MAMBA1_SSM_CFG_FIELDS, required=("n_layer", "vocab_size")),
}


def mamba1_states_from_hf(conv_state: Any, ssm_state: Any, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """transformers' per-layer Mamba cache states -> ``{"CS0": [B,J,E], "H0": [B,E,N]}``.

    ``conv_state`` is ``cache.get_conv_state(layer)`` (``[B,E,K]``: the last K conv inputs,
    oldest first; column 0 never reaches an output, so it is dropped) and ``ssm_state`` is
    ``cache.get_recurrent_state(layer)`` (``[B,E,N]``, taken as is). Torch tensors or arrays.
    """
    out_dtype = resolve_dtype(dtype, MAMBA1_KEYS.family)
    conv = to_numpy(conv_state, "conv_state")
    ssm = to_numpy(ssm_state, "ssm_state")
    if conv.ndim != 3 or conv.shape[-1] < 2:
        raise WeightLoadError(
            f"conv_state has shape {fmt_shape(conv.shape)}; expected transformers' [B, E, K] "
            "with K >= 2."
        )
    if ssm.ndim != 3 or ssm.shape[:2] != conv.shape[:2]:
        raise WeightLoadError(
            f"ssm_state has shape {fmt_shape(ssm.shape)}; expected [B, E, N] with B, E = "
            f"{conv.shape[0]}, {conv.shape[1]} as in conv_state {fmt_shape(conv.shape)}."
        )
    return {
        "CS0": np.ascontiguousarray(conv[:, :, 1:].transpose(0, 2, 1), dtype=out_dtype),
        "H0": np.ascontiguousarray(ssm, dtype=out_dtype),
    }


def mamba1_states_to_hf(CS: Any, H: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`mamba1_states_from_hf`: ``(conv_state [B,E,K], ssm_state [B,E,N])``.

    The oldest conv column (index 0), which transformers keeps but never uses, is zero. The
    arrays keep the input dtype.
    """
    cs = to_numpy(CS, "CS")
    h = to_numpy(H, "H")
    if cs.ndim != 3 or h.ndim != 3 or cs.shape[0] != h.shape[0] or cs.shape[2] != h.shape[1]:
        raise WeightLoadError(
            f"States do not fit: CS has shape {fmt_shape(cs.shape)} (expected [B, J, E]) and H "
            f"has shape {fmt_shape(h.shape)} (expected [B, E, N])."
        )
    B, J, E = cs.shape
    conv = np.zeros((B, E, J + 1), dtype=cs.dtype)
    conv[:, :, 1:] = cs.transpose(0, 2, 1)
    return conv, np.ascontiguousarray(h)
