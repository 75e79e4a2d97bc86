"""Load the real weights (and states) of one Mamba-2 layer into mambalaya's tensor layouts.

A Mamba-2 layer is transformers' ``Mamba2Block`` (state-spaces' ``Block`` with a ``Mamba2``
mixer): ``RMSNorm -> Mamba2Mixer -> residual add``; both use the same parameter names. With
D = d_model, E = d_inner = H*P, H = nheads = G*R, G = ngroups, N = d_state, K = d_conv and
GN = G*N, head ``h = g*R + r`` and channel ``e = h*P + p``:

=======  ==========  ================================================================
name     layout      taken from (``Mamba2Block`` state_dict)
=======  ==========  ================================================================
WN       [D]         ``norm.weight``
WZ       [D,G,R,P]   ``mixer.in_proj.weight`` [2E+2GN+H, D], rows ``[0,E)`` (z), transposed
WX       [D,G,R,P]   rows ``[E,2E)`` (x)
WB       [D,G,N]     rows ``[2E,2E+GN)`` (B)
WCM      [D,G,N]     rows ``[2E+GN,2E+2GN)`` (C)
WDT      [D,G,R]     rows ``[2E+2GN,2E+2GN+H)`` (dt)
BDT      [G,R]       ``mixer.dt_bias`` [H]
WCX      [G,R,P,K]   ``mixer.conv1d.weight`` [E+2GN,1,K], channels ``[0,E)``
BCX      [G,R,P]     ``mixer.conv1d.bias``, channels ``[0,E)``
WCB/BCB  [G,N,K]/…   conv channels ``[E,E+GN)`` (B)
WCC/BCC  [G,N,K]/…   conv channels ``[E+GN,E+2GN)`` (C)
A        [G,R]       ``-exp(mixer.A_log)`` [H], computed in float64 then cast
DS       [G,R]       ``mixer.D`` [H]
WGN      [G,R,P]     ``mixer.norm.weight`` [E] (the gated RMSNorm)
WO       [G,R,P,D]   ``mixer.out_proj.weight`` [D,E], transposed
=======  ==========  ================================================================

The weights alone fix D, E, H, P, K and G*N but not G and N separately: ``ngroups`` (or
``d_state``) comes from the argument, else from a ``config.json`` next to the weights, else
mamba_ssm's default ``ngroups = 1`` (every state-spaces mamba2 checkpoint).

States (see :func:`mamba2_states_from_hf`): transformers keeps a conv state ``[B, E+2GN, K]``
(the last K conv inputs, oldest first; column 0 never reaches an output on a decode step) and
an SSM state ``[B, H, P, N]``. mambalaya's are ``CSX0 [B,J,G,R,P]``, ``CSB0``/``CSC0
[B,J,G,N]`` (J = K-1, the last J conv inputs, oldest first) and ``H0 [B,G,R,P,N]``.

Only the block without in_proj/out_proj biases, with a conv bias, a per-head D and the
gated RMSNorm is modelled; anything else raises :class:`WeightLoadError`. The reading itself
is the shared core in :mod:`mambalaya.workloads.hf_loader`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mambalaya.workloads.hf_loader import (
    LayerKeys,
    WeightLoadError,
    a_from_log,
    as_layout,
    config_beside,
    fmt_shape,
    pick_config,
    positive_int,
    read_config_json,
    read_layer,
    resolve_dtype,
    to_numpy,
)

__all__ = [
    "WEIGHT_NAMES",
    "WeightLoadError",
    "load_mamba2_config",
    "load_mamba2_layer",
    "mamba2_states_from_hf",
    "mamba2_states_to_hf",
]

#: The 17 weight tensors :func:`load_mamba2_layer` returns, in a fixed order.
WEIGHT_NAMES: tuple[str, ...] = (
    "WN", "WZ", "WX", "WB", "WCM", "WDT", "BDT", "WCX", "BCX", "WCB", "BCB", "WCC", "BCC",
    "A", "DS", "WGN", "WO",
)

#: The keys of one Mamba2Block, relative to the layer prefix, and what is not modelled.
MAMBA2_KEYS = LayerKeys(
    family="Mamba-2",
    required=(
        "norm.weight",
        "mixer.in_proj.weight",
        "mixer.conv1d.weight",
        "mixer.conv1d.bias",
        "mixer.dt_bias",
        "mixer.A_log",
        "mixer.D",
        "mixer.norm.weight",
        "mixer.out_proj.weight",
    ),
    block="the Mamba-2 block (RMSNorm -> Mamba2Mixer)",
    scope="mambalaya models a Mamba-2 layer with use_bias=False, use_conv_bias=True and the gated RMSNorm.",
    unsupported={
        "mixer.in_proj.bias": "in_proj has a bias (use_bias=True), which the mambalaya Mamba-2 cascade does not model",
        "mixer.out_proj.bias": "out_proj has a bias (use_bias=True), which the mambalaya Mamba-2 cascade does not model",
        "norm.bias": "the block norm has a bias (LayerNorm instead of RMSNorm), which is not modelled",
        "mixer.x_proj.weight": "the mixer has x_proj, which means a Mamba-1 layer, not Mamba-2",
        "mixer.dt_proj.weight": "the mixer has dt_proj, which means a Mamba-1 layer, not Mamba-2",
    },
    missing_hints={
        "mixer.conv1d.bias": " (use_conv_bias=False, which mambalaya does not model)",
        "mixer.norm.weight": " (no gated RMSNorm: rmsnorm=False, which mambalaya does not model)",
    },
)


def load_mamba2_layer(
    source: Any,
    layer: int = 0,
    dtype: Any = "float32",
    *,
    ngroups: int | None = None,
    d_state: int | None = None,
) -> dict[str, np.ndarray]:
    """Load layer ``layer`` of a Mamba-2 checkpoint into mambalaya's 17 weight arrays.

    ``source`` is a state_dict in memory (name -> torch tensor or numpy array), or the path of a
    ``.safetensors``/``.bin``/``.pt`` file, a shard index ``*.index.json`` or a model directory.
    Keys may be prefixed ``backbone.layers.{i}.`` (Mamba2ForCausalLM / MambaLMHeadModel),
    ``layers.{i}.`` or be those of a bare ``Mamba2Block``. ``ngroups``/``d_state`` split the
    ``G*N`` B/C channels (see the module docstring for the fallbacks).

    Returns ``{name: array}`` for :data:`WEIGHT_NAMES`, each C-contiguous of ``dtype``.
    """
    out_dtype = resolve_dtype(dtype, MAMBA2_KEYS.family)
    tensors = read_layer(source, layer, MAMBA2_KEYS)
    prefix, where = tensors.prefix, tensors.where
    tensors.require_floating()
    for key, ndim in (("norm.weight", 1), ("mixer.norm.weight", 1), ("mixer.A_log", 1), ("mixer.conv1d.weight", 3),
                      ("mixer.in_proj.weight", 2)):
        tensors.require_ndim(key, ndim)
    if tensors["mixer.D"].ndim != 1 or tensors["mixer.D"].shape != tensors["mixer.A_log"].shape:
        raise WeightLoadError(
            f"Key '{prefix}mixer.D' in {where} has shape {fmt_shape(tensors['mixer.D'].shape)}; mambalaya models one D "
            f"per head ({fmt_shape(tensors['mixer.A_log'].shape)}, D_has_hdim=False)."
        )
    D = tensors["norm.weight"].shape[0]
    E = tensors["mixer.norm.weight"].shape[0]
    H = tensors["mixer.A_log"].shape[0]
    conv_dim, _, K = tensors["mixer.conv1d.weight"].shape
    if E % H or (conv_dim - E) <= 0 or (conv_dim - E) % 2:
        raise WeightLoadError(
            f"{where} is inconsistent: mixer.norm.weight gives d_inner {E}, A_log gives {H} heads and conv1d has "
            f"{conv_dim} channels; expected d_inner a multiple of nheads and conv channels = d_inner + 2*ngroups*d_state."
        )
    P, GN = E // H, (conv_dim - E) // 2

    if ngroups is None and d_state is None:
        config_path = config_beside(source)
        if config_path is not None:
            cfg = load_mamba2_config(config_path)
            ngroups, d_state = cfg["ngroups"], cfg["d_state"]
    if ngroups is None and d_state is None:
        ngroups = 1  # mamba_ssm's Mamba2 default; every state-spaces mamba2 checkpoint
    if ngroups is not None:
        ngroups = positive_int(ngroups, "ngroups", where)
    if d_state is not None:
        d_state = positive_int(d_state, "d_state", where)
    G = ngroups if ngroups is not None else GN // d_state  # type: ignore[operator]
    N = d_state if d_state is not None else GN // G
    if G * N != GN or H % G:
        raise WeightLoadError(
            f"{where} does not fit ngroups={G}, d_state={N}: the conv has {GN} channels each for B and C "
            f"(ngroups*d_state) and there are {H} heads (a multiple of ngroups)."
        )
    R = H // G
    tensors.require_shapes(
        {
            "mixer.in_proj.weight": (2 * E + 2 * GN + H, D),
            "mixer.conv1d.weight": (conv_dim, 1, K),
            "mixer.conv1d.bias": (conv_dim,),
            "mixer.dt_bias": (H,),
            "mixer.out_proj.weight": (D, E),
        },
        f"D={D}, d_inner={E}, nheads={H}, headdim={P}, ngroups={G}, d_state={N}, d_conv={K}",
    )

    def lay(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return as_layout(arr, out_dtype, shape)

    w_in = tensors["mixer.in_proj.weight"]
    rows = np.cumsum([0, E, E, GN, GN, H])
    z, x, b, c, dt = (w_in[rows[n]:rows[n + 1]].T for n in range(5))
    w_conv = tensors["mixer.conv1d.weight"][:, 0, :]
    b_conv = tensors["mixer.conv1d.bias"]
    return {
        "WN": lay(tensors["norm.weight"], (D,)),
        "WZ": lay(z, (D, G, R, P)),
        "WX": lay(x, (D, G, R, P)),
        "WB": lay(b, (D, G, N)),
        "WCM": lay(c, (D, G, N)),
        "WDT": lay(dt, (D, G, R)),
        "BDT": lay(tensors["mixer.dt_bias"], (G, R)),
        "WCX": lay(w_conv[:E], (G, R, P, K)),
        "BCX": lay(b_conv[:E], (G, R, P)),
        "WCB": lay(w_conv[E:E + GN], (G, N, K)),
        "BCB": lay(b_conv[E:E + GN], (G, N)),
        "WCC": lay(w_conv[E + GN:], (G, N, K)),
        "BCC": lay(b_conv[E + GN:], (G, N)),
        "A": lay(a_from_log(tensors["mixer.A_log"]), (G, R)),
        "DS": lay(tensors["mixer.D"], (G, R)),
        "WGN": lay(tensors["mixer.norm.weight"], (G, R, P)),
        "WO": lay(tensors["mixer.out_proj.weight"].T, (G, R, P, D)),
    }


def load_mamba2_config(path_or_dict: Any) -> dict[str, Any]:
    """Read a Mamba-2 ``config.json`` (path, model directory, or dict) into mambalaya's names.

    Returns ``{"d_model", "n_layers", "d_state", "headdim", "ngroups", "expand", "d_conv",
    "chunk_size", "vocab_size", "norm_eps"}`` (the fields of
    :class:`~mambalaya.workloads.mamba2.Mamba2Config`). Accepts transformers keys (hidden_size,
    num_hidden_layers, state_size, head_dim, n_groups, expand, conv_kernel, chunk_size,
    vocab_size, layer_norm_epsilon) and state-spaces keys (d_model, n_layer, vocab_size,
    pad_vocab_size_multiple, ssm_cfg = {"layer": "Mamba2", d_state, headdim, ngroups, expand,
    d_conv, chunk_size}, with mamba_ssm's defaults). A state-spaces ``vocab_size`` is padded up
    to ``pad_vocab_size_multiple`` (the embedding's rows).
    """
    cfg, where = read_config_json(path_or_dict, "Mamba-2")
    ssm = cfg.get("ssm_cfg") or {}
    if not isinstance(ssm, Mapping):
        raise WeightLoadError(f"In {where}, 'ssm_cfg' is not an object: {ssm!r}.")
    model_type = cfg.get("model_type")
    state_spaces = "hidden_size" not in cfg and "d_model" in cfg
    if model_type not in (None, "mamba2", "mamba") or (model_type == "mamba" and ssm.get("layer") != "Mamba2"):
        raise WeightLoadError(f"{where} describes a {model_type!r} model; this loader reads Mamba-2 configs.")
    if state_spaces and ssm.get("layer", "Mamba1") != "Mamba2":
        raise WeightLoadError(
            f"{where} is a state-spaces config whose ssm_cfg.layer is {ssm.get('layer', 'Mamba1')!r}, not 'Mamba2'."
        )
    if cfg.get("attn_layer_idx"):
        raise WeightLoadError(f"{where} has attention layers (attn_layer_idx); mambalaya models pure Mamba-2 stacks.")
    if cfg.get("d_intermediate", 0):
        raise WeightLoadError(f"{where} has MLP blocks (d_intermediate > 0); mambalaya models pure Mamba-2 stacks.")
    for key, bad, why in (
        ("use_bias", True, "in_proj/out_proj biases"),
        ("bias", True, "in_proj/out_proj biases"),
        ("use_conv_bias", False, "no conv bias"),
        ("conv_bias", False, "no conv bias"),
        ("rmsnorm", False, "no gated RMSNorm"),
        ("norm_before_gate", True, "the norm before the gate"),
        ("D_has_hdim", True, "a D per channel"),
    ):
        for scope in (cfg, ssm):
            if scope.get(key, not bad) == bad:
                raise WeightLoadError(f"{where} has {key}={json.dumps(bad)} ({why}), which the Mamba-2 cascade does not model.")
    limit = cfg.get("time_step_limit", ssm.get("dt_limit"))
    if limit is not None:
        lo, hi = (float(v) for v in limit)
        if lo > 0 or hi != math.inf:
            raise WeightLoadError(f"{where} clamps dt to {limit}; the Mamba-2 cascade models no clamp (0, inf).")

    def pick(*keys: tuple[Mapping[str, Any], str], default: Any = None, name: str) -> Any:
        return pick_config(where, *keys, default=default, name=name)

    def num(*keys: tuple[Mapping[str, Any], str], default: Any = None, name: str) -> int:
        return positive_int(pick(*keys, default=default, name=name), name, where)

    d_model = num((cfg, "hidden_size"), (cfg, "d_model"), name="d_model")
    out = {
        "d_model": d_model,
        "n_layers": num((cfg, "num_hidden_layers"), (cfg, "n_layer"), (cfg, "n_layers"), name="n_layers"),
        "d_state": num((cfg, "state_size"), (ssm, "d_state"), (cfg, "d_state"), default=128, name="d_state"),
        "headdim": num((cfg, "head_dim"), (ssm, "headdim"), (cfg, "headdim"), default=64, name="headdim"),
        "ngroups": num((cfg, "n_groups"), (ssm, "ngroups"), (cfg, "ngroups"), default=1, name="ngroups"),
        "expand": num((cfg, "expand"), (ssm, "expand"), default=2, name="expand"),
        "d_conv": num((cfg, "conv_kernel"), (ssm, "d_conv"), (cfg, "d_conv"), default=4, name="d_conv"),
        "chunk_size": num((cfg, "chunk_size"), (ssm, "chunk_size"), default=256, name="chunk_size"),
        "vocab_size": num((cfg, "vocab_size"), name="vocab_size"),
        "norm_eps": float(pick((cfg, "layer_norm_epsilon"), (cfg, "norm_epsilon"), (cfg, "rms_norm_eps"),
                               default=1e-5, name="norm_eps")),
    }
    if state_spaces and "pad_vocab_size_multiple" in cfg:
        mult = positive_int(cfg["pad_vocab_size_multiple"], "pad_vocab_size_multiple", where)
        out["vocab_size"] = -(-out["vocab_size"] // mult) * mult
    heads = cfg.get("num_heads")
    if heads is not None and heads * out["headdim"] != out["expand"] * d_model:
        raise WeightLoadError(
            f"{where} is inconsistent: num_heads*head_dim = {heads}*{out['headdim']} but expand*hidden_size = "
            f"{out['expand']}*{d_model}."
        )
    return out


def mamba2_states_from_hf(conv_state: Any, ssm_state: Any, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """transformers' per-layer Mamba-2 cache states -> ``{"CSX0", "CSB0", "CSC0", "H0"}``.

    ``conv_state`` is ``cache.get_conv_state(layer)`` (``[B, E+2GN, K]``: the last K conv inputs,
    oldest first; column 0 never reaches an output, so it is dropped) and ``ssm_state`` is
    ``cache.get_recurrent_state(layer)`` (``[B, H, P, N]``). ``G = GN / N`` follows from the
    shapes. Torch tensors or arrays.
    """
    out_dtype = resolve_dtype(dtype, MAMBA2_KEYS.family)
    conv = to_numpy(conv_state, "conv_state")
    ssm = to_numpy(ssm_state, "ssm_state")
    if ssm.ndim != 4:
        raise WeightLoadError(f"ssm_state has shape {fmt_shape(ssm.shape)}; expected transformers' [B, H, P, N].")
    B, H, P, N = ssm.shape
    E = H * P
    if conv.ndim != 3 or conv.shape[0] != B or conv.shape[-1] < 2 or (conv.shape[1] - E) <= 0 \
            or (conv.shape[1] - E) % (2 * N):
        raise WeightLoadError(
            f"conv_state has shape {fmt_shape(conv.shape)}; expected [B, E+2*G*N, K] with B={B}, E={E}, N={N} "
            f"and K >= 2 as ssm_state {fmt_shape(ssm.shape)} implies."
        )
    G = (conv.shape[1] - E) // (2 * N)
    if H % G:
        raise WeightLoadError(f"{H} heads are not a multiple of the {G} groups the conv_state implies.")
    R, J = H // G, conv.shape[-1] - 1
    hist = conv[:, :, 1:].transpose(0, 2, 1)  # [B, J, channels], oldest first

    def lay(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return as_layout(arr, out_dtype, shape)

    return {
        "CSX0": lay(hist[:, :, :E], (B, J, G, R, P)),
        "CSB0": lay(hist[:, :, E:E + G * N], (B, J, G, N)),
        "CSC0": lay(hist[:, :, E + G * N:], (B, J, G, N)),
        "H0": lay(ssm, (B, G, R, P, N)),
    }


def mamba2_states_to_hf(CSX: Any, CSB: Any, CSC: Any, H: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`mamba2_states_from_hf`: ``(conv_state [B,E+2GN,K], ssm_state [B,H,P,N])``.

    The oldest conv column (index 0), which transformers keeps but never uses, is zero.
    """
    x, b, c, h = (to_numpy(a, name) for a, name in ((CSX, "CSX"), (CSB, "CSB"), (CSC, "CSC"), (H, "H")))
    if x.ndim != 5 or b.ndim != 4 or c.shape != b.shape or h.ndim != 5 or h.shape[:4] != (x.shape[0], *x.shape[2:]) \
            or b.shape[:3] != x.shape[:3] or h.shape[-1] != b.shape[-1]:
        raise WeightLoadError(
            f"States do not fit: CSX {fmt_shape(x.shape)} (expected [B,J,G,R,P]), CSB {fmt_shape(b.shape)} and CSC "
            f"{fmt_shape(c.shape)} ([B,J,G,N]), H {fmt_shape(h.shape)} ([B,G,R,P,N])."
        )
    B, J, G, R, P = x.shape
    hist = np.concatenate([x.reshape(B, J, -1), b.reshape(B, J, -1), c.reshape(B, J, -1)], axis=2)
    conv = np.zeros((B, hist.shape[2], J + 1), dtype=hist.dtype)
    conv[:, :, 1:] = hist.transpose(0, 2, 1)
    return conv, np.ascontiguousarray(h.reshape(B, G * R, P, h.shape[-1]))
