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
``d_state``) comes from the argument, else from a ``config.json`` next to the weights; with
neither, loading is refused (mamba_ssm's default is 1 group, transformers' is 8: a guess could
split B and C wrongly without a word).

States (see :func:`mamba2_states_from_hf`): transformers keeps a conv state ``[B, E+2GN, K]``
(the last K conv inputs, oldest first; column 0 never reaches an output on a decode step) and
an SSM state ``[B, H, P, N]``. mambalaya's are ``CSX0 [B,J,G,R,P]``, ``CSB0``/``CSC0
[B,J,G,N]`` (J = K-1, the last J conv inputs, oldest first) and ``H0 [B,G,R,P,N]``.

Only the block without in_proj/out_proj biases, with a conv bias, a per-head D and the
gated RMSNorm is modelled; anything else raises :class:`WeightLoadError`. The reading itself
is the shared core in :mod:`mambalaya.workloads.hf.loader`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mambalaya.workloads.hf.fields import (
    MAMBA2_DEFAULTS,
    MAMBA2_FIELDS,
    MAMBA2_SSM_CFG_FIELDS,
    MAMBA2_STATE_SPACES_DEFAULTS,
    MAMBA2_STATE_SPACES_FIELDS,
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
    config_beside,
    config_format,
    padded_vocab,
    positive_int,
    read_config_fields,
    read_config_json,
    shown,
    ssm_cfg_of,
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
    ``G*N`` B/C channels (else the config.json beside the weights; see the module docstring).

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
        raise WeightLoadError(
            f"{where}: the conv's {GN} B and C channels each are ngroups x d_state, and the weights alone do not say "
            "how they split (mamba_ssm's default ngroups is 1, transformers' Mamba2Config's is 8); give ngroups= or "
            "d_state=, or keep the config.json beside the weights."
        )
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
    "chunk_size", "vocab_size", "norm_eps", "tie_embeddings"}`` (the fields of
    :class:`~mambalaya.workloads.blocks.mamba2.Mamba2Config`). A transformers config (``hidden_size`` or
    ``model_type``) is read as transformers' ``Mamba2Config`` reads it: hidden_size,
    num_hidden_layers, state_size, head_dim, num_heads (checked), n_groups, expand,
    conv_kernel, chunk_size, vocab_size, layer_norm_epsilon, tie_word_embeddings, with that class's
    defaults where absent (n_groups 8, for one). A state-spaces config (``d_model``) is read as
    mamba_ssm reads it: d_model, n_layer, vocab_size padded up to ``pad_vocab_size_multiple``,
    tie_embeddings and ``ssm_cfg = {"layer": "Mamba2", d_state, headdim, ngroups, expand, d_conv,
    chunk_size}`` with the Mamba2 mixer's defaults. Every other field must be one mambalaya models
    or one that cannot change a layer (:data:`~mambalaya.workloads.hf.fields.MAMBA2_FIELDS` and its
    state-spaces twins); anything else is a WeightLoadError naming the field.
    """
    cfg, where = read_config_json(path_or_dict, "Mamba-2")
    ssm = ssm_cfg_of(cfg, where)
    model_type = cfg.get("model_type")
    if model_type not in (None, "mamba2"):
        raise WeightLoadError(f"{where} describes a {shown(model_type)} model; this loader reads Mamba-2 configs.")
    fmt = config_format(cfg, where, "Mamba-2")
    if fmt == "state-spaces" and ssm.get("layer", "Mamba1") != "Mamba2":
        raise WeightLoadError(
            f"{where} is a state-spaces config whose ssm_cfg.layer is {shown(ssm.get('layer', 'Mamba1'))}, not 'Mamba2'."
        )
    got = read_config_fields(cfg, ssm, where, _READINGS[fmt])
    values, key = ConfigFile(dict(got.values()), where, loader=True), {ours: name for ours, (name, _) in got.items()}
    out: dict[str, Any] = {k: values.integer(key[k]) for k in got if k not in ("n_layers", "norm_eps", "tie_embeddings")}
    out["n_layers"] = values.layer_count(key["n_layers"])
    out["norm_eps"] = values.positive_number(key["norm_eps"])
    out["tie_embeddings"] = values.boolean(key["tie_embeddings"])
    d_inner = out["expand"] * out["d_model"]
    if fmt == "state-spaces":
        out["vocab_size"] = padded_vocab(cfg, out["vocab_size"], where)
    else:
        heads = ConfigFile(cfg, where, MAMBA2_DEFAULTS, loader=True).integer("num_heads")
        if heads * out["headdim"] != d_inner:
            raise WeightLoadError(
                f"{where} is inconsistent: field num_heads = {heads} times head_dim = {out['headdim']} is not "
                f"expand*hidden_size = {out['expand']}*{out['d_model']}."
            )
    d_ssm = ConfigFile(ssm, where, prefix="ssm_cfg.", loader=True).integer_or("d_ssm", None)
    if d_ssm is not None and d_ssm != d_inner:
        raise WeightLoadError(
            f"In {where}, ssm_cfg.d_ssm = {d_ssm!r} is not expand*d_model = {d_inner}: the channels past d_ssm "
            "skip the SSM, which the Mamba-2 cascade does not model."
        )
    return {k: out[k] for k in ("d_model", "n_layers", "d_state", "headdim", "ngroups", "expand", "d_conv",
                                "chunk_size", "vocab_size", "norm_eps", "tie_embeddings")}


#: Which key of each config format gives each of mambalaya's Mamba-2 fields.
_READINGS = {
    "transformers": ConfigReading(
        MAMBA2_FIELDS, MAMBA2_DEFAULTS,
        {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "d_state": "state_size", "headdim": "head_dim",
         "ngroups": "n_groups", "expand": "expand", "d_conv": "conv_kernel", "chunk_size": "chunk_size",
         "vocab_size": "vocab_size", "norm_eps": "layer_norm_epsilon", "tie_embeddings": "tie_word_embeddings"}),
    "state-spaces": ConfigReading(
        MAMBA2_STATE_SPACES_FIELDS, MAMBA2_STATE_SPACES_DEFAULTS,
        {"d_model": "d_model", "n_layers": "n_layer", "d_state": "d_state", "headdim": "headdim",
         "ngroups": "ngroups", "expand": "expand", "d_conv": "d_conv", "chunk_size": "chunk_size",
         "vocab_size": "vocab_size", "norm_eps": "norm_epsilon", "tie_embeddings": "tie_embeddings"},
        ssm_fields=MAMBA2_SSM_CFG_FIELDS, required=("n_layer", "vocab_size")),
}


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
