"""Test support: run one transformers ``Mamba2Block`` (CPU torch path) as the reference.

Not a test file. :func:`run_hf_mamba2_block` builds one Mamba-2 block with seeded random
weights (every parameter: norms, in/out projections, conv, dt_bias, A_log, D), runs a prefill
(optionally fed in several pieces) and then decode steps through transformers' cache, and
returns numpy arrays (weights, inputs, outputs, states in mambalaya's layouts).

Notes on transformers 5.24 (``models/mamba2/modeling_mamba2.py``, ``cache_utils.py``):

* ``Mamba2Block`` builds its mixer with ``initialize_mixer_weights=False``: ``dt_bias``,
  ``A_log`` and ``D`` are ``torch.empty`` garbage until set, so every parameter is set here.
* A prefill (no cached state, or ``seq_len > 1``) takes ``mamba2_chunk_scan``: the chunked SSD
  algorithm, which pads ``seq_len`` with zeros to a multiple of ``chunk_size`` and starts from
  the cached recurrent state if there is one (a second prefill piece continues the sequence;
  the conv then sees the cached last K inputs concatenated in front). A decode step
  (``seq_len == 1`` with a state) takes ``causal_conv1d_update`` and
  ``mamba2_selective_state_update`` (the recurrence).
* ``time_step_limit`` defaults to ``(0, inf)``: the clamp after softplus is a no-op.
* ``MambaRMSNormGated`` gates first (``y * silu(z)``) then normalises each of the ``ngroups``
  groups of ``d_inner/ngroups`` channels (``norm_before_gate=False``).
* The conv state is ``[B, E+2GN, K]`` (the last K conv inputs, oldest first); the SSM state is
  ``[B, H, P, N]``. The scans compute in float32 whatever the model dtype.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")  # never pull kernels from the hub

from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_layer, mamba2_states_from_hf  # noqa: E402

__all__ = ["build_hf_mamba2_block", "random_mamba2_state_dict", "run_hf_mamba2_block"]


def random_mamba2_state_dict(
    *, d_model: int, d_state: int, headdim: int, ngroups: int, expand: int, d_conv: int, seed: int
) -> dict[str, np.ndarray]:
    """A seeded random Mamba2Block state_dict (float64 numpy, transformers names and layouts).

    Norm weights and D in [0.5, 1.5], A_log = log(uniform(1, 16)), dt_bias = softplus^-1 of a
    log-uniform dt in [1e-3, 1e-1], projections ~ N(0, 1/fan_in), conv ~ N(0, 1/K).
    """
    rng = np.random.default_rng(seed)
    D, N, P, G, K = d_model, d_state, headdim, ngroups, d_conv
    E = expand * D
    H = E // P
    conv_dim = E + 2 * G * N
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), size=H))
    return {
        "norm.weight": rng.uniform(0.5, 1.5, size=D),
        "mixer.dt_bias": dt + np.log(-np.expm1(-dt)),
        "mixer.A_log": np.log(rng.uniform(1.0, 16.0, size=H)),
        "mixer.D": rng.uniform(0.5, 1.5, size=H),
        "mixer.conv1d.weight": rng.normal(0.0, 1.0 / math.sqrt(K), size=(conv_dim, 1, K)),
        "mixer.conv1d.bias": rng.normal(0.0, 0.1, size=conv_dim),
        "mixer.in_proj.weight": rng.normal(0.0, 1.0 / math.sqrt(D), size=(2 * E + 2 * G * N + H, D)),
        "mixer.norm.weight": rng.uniform(0.5, 1.5, size=E),
        "mixer.out_proj.weight": rng.normal(0.0, 1.0 / math.sqrt(E), size=(D, E)),
    }


def _check_torch_path() -> None:
    for pkg in ("mamba_ssm", "causal_conv1d"):
        if importlib.util.find_spec(pkg) is not None:
            raise RuntimeError(
                f"{pkg} is installed; transformers would use its kernels instead of the torch reference path."
            )


def build_hf_mamba2_block(
    state_dict: dict[str, np.ndarray],
    *,
    d_model: int,
    d_state: int,
    headdim: int,
    ngroups: int,
    expand: int,
    d_conv: int,
    chunk_size: int,
    norm_eps: float = 1e-5,
    dtype: str = "float32",
):
    """A transformers ``Mamba2Block`` (eval mode, CPU torch path) holding ``state_dict``."""
    _check_torch_path()
    import torch
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Block

    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    config = Mamba2Config(
        hidden_size=d_model,
        num_heads=expand * d_model // headdim,
        head_dim=headdim,
        state_size=d_state,
        n_groups=ngroups,
        expand=expand,
        conv_kernel=d_conv,
        chunk_size=chunk_size,
        num_hidden_layers=1,
        vocab_size=16,
        use_bias=False,
        use_conv_bias=True,
        layer_norm_epsilon=norm_eps,
        residual_in_fp32=False,  # keep the residual add in the run dtype
        time_step_limit=(0.0, float("inf")),
    )
    block = Mamba2Block(config, layer_idx=0)
    if dtype == "float64":
        block = block.double()
    block.eval()
    with torch.no_grad():
        missing, unexpected = block.load_state_dict(
            {k: torch.from_numpy(np.asarray(v)).to(torch_dtype) for k, v in state_dict.items()}, strict=True
        )
    assert not missing and not unexpected
    return block


def run_hf_mamba2_block(
    *,
    d_model: int,
    d_state: int = 8,
    headdim: int = 8,
    ngroups: int = 1,
    expand: int = 2,
    d_conv: int = 4,
    chunk_size: int = 4,
    batch: int,
    seq_len: int,
    n_decode: int,
    prefill_pieces: Sequence[int] | None = None,
    dtype: str = "float32",
    seed: int = 0,
) -> dict[str, Any]:
    """Run one transformers ``Mamba2Block``: a prefill of ``seq_len`` tokens (fed in pieces of
    ``prefill_pieces`` tokens if given), then ``n_decode`` decode steps.

    Returns numpy arrays (all of ``dtype``):

    * ``state_dict`` (transformers names), ``weights`` (through :func:`load_mamba2_layer`)
    * ``x_prefill`` [B,L,D], ``y_prefill`` [B,L,D] (block output incl. the residual)
    * ``x_decode`` / ``y_decode``: lists of ``n_decode`` arrays [B,1,D]
    * ``states_prefill``: mambalaya-layout states ``{"CSX0", "CSB0", "CSC0", "H0"}`` after the
      prefill; ``states_decode``: a list of such dicts, one after each decode step
    * ``config``: the keyword arguments of :class:`~mambalaya.workloads.blocks.mamba2.Mamba2Config`
    """
    import torch
    from transformers import DynamicCache

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    pieces = list(prefill_pieces) if prefill_pieces is not None else [seq_len]
    if sum(pieces) != seq_len or min(pieces) < 1:
        raise ValueError(f"prefill_pieces {pieces} must be positive and sum to seq_len {seq_len}")
    if len(pieces) > 1 and min(pieces[1:]) < 2:
        raise ValueError("a prefill piece after the first needs >= 2 tokens (1 token takes the decode path)")
    dims = dict(d_model=d_model, d_state=d_state, headdim=headdim, ngroups=ngroups, expand=expand, d_conv=d_conv)
    sd64 = random_mamba2_state_dict(**dims, seed=seed)
    block = build_hf_mamba2_block(sd64, **dims, chunk_size=chunk_size, dtype=dtype)

    rng = np.random.default_rng(seed + 1_000_003)
    np_dtype = np.dtype(dtype)
    x_prefill = rng.standard_normal((batch, seq_len, d_model)).astype(np_dtype)
    x_decode = [rng.standard_normal((batch, 1, d_model)).astype(np_dtype) for _ in range(n_decode)]
    cache = DynamicCache(config=block.config)

    def states() -> dict[str, np.ndarray]:
        conv = cache.get_conv_state(0)
        ssm = cache.get_recurrent_state(0)
        return mamba2_states_from_hf(conv.clone(), ssm.clone(), dtype=dtype)

    with torch.no_grad():
        outs, start = [], 0
        for n in pieces:
            piece = torch.from_numpy(np.ascontiguousarray(x_prefill[:, start:start + n]))
            outs.append(block(piece, cache=cache).numpy().astype(np_dtype))
            start += n
        states_prefill = states()
        y_decode, states_decode = [], []
        for x in x_decode:
            y_decode.append(block(torch.from_numpy(x), cache=cache).numpy().astype(np_dtype))
            states_decode.append(states())

    state_dict = {k: v.detach().cpu().numpy().copy() for k, v in block.state_dict().items()}
    return {
        "config": dict(dims, chunk_size=chunk_size, norm_eps=float(block.config.layer_norm_epsilon)),
        "state_dict": state_dict,
        "weights": load_mamba2_layer(state_dict, dtype=dtype, ngroups=ngroups),
        "x_prefill": x_prefill,
        "y_prefill": np.concatenate(outs, axis=1),
        "x_decode": x_decode,
        "y_decode": y_decode,
        "states_prefill": states_prefill,
        "states_decode": states_decode,
    }
