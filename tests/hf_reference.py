"""Test support: run one transformers ``MambaBlock`` (CPU torch path) as the reference.

Not a test file. :func:`run_hf_mamba1_block` builds one Mamba-1 block with seeded random
weights, runs a prefill and then decode steps through transformers' cache, and returns numpy
arrays (weights, inputs, outputs, states in mambalaya's layouts) for the executor tests.

Notes on transformers 5.24 (``models/mamba/modeling_mamba.py``, ``cache_utils.py``):

* ``MambaBlock`` builds its mixer with ``initialize_mixer_weights=False``: ``A_log`` and ``D``
  are ``torch.empty`` garbage until set, so every parameter is set here explicitly.
* The cache is ``DynamicCache(config=config)``; Mamba's ``layer_types`` are all
  ``"linear_attention"`` so layer 0 is a ``LinearAttentionLayer``. ``get_conv_state`` /
  ``get_recurrent_state`` return ``None`` before the first (prefill) call; the prefill takes the
  full-sequence path (conv over the whole input, sequential scan from a zero state), decode
  calls (``seq_len == 1`` and a state present, past recording off) take
  ``causal_conv1d_update`` and ``mamba_selective_state_update``.
* The conv state is ``[B, E, K]`` = the last K conv inputs, oldest first (left zero-padded when
  the prefill is shorter than K); its column 0 never reaches an output.
* In a float64 run transformers still rounds to float32 in several places (RMSNorm, A, D and
  dt bias in the prefill, B and the conv output in the prefill scan, the whole decode state
  update): float64 results agree with an exact float64 model only to ~1e-7 relative.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")  # never pull kernels from the hub

from mambalaya.workloads.hf.weights import load_mamba1_layer, mamba1_states_from_hf  # noqa: E402

__all__ = ["build_hf_mamba1_block", "random_mamba1_state_dict", "run_hf_mamba1_block"]


def random_mamba1_state_dict(
    *, d_model: int, d_state: int, d_inner: int, dt_rank: int, d_conv: int, seed: int
) -> dict[str, np.ndarray]:
    """A seeded random MambaBlock state_dict (float64 numpy, transformers names and layouts).

    Every parameter is random and of a sane scale: norm weight and D in [0.5, 1.5], A_log =
    log(uniform(1, 16)), dt_proj bias = softplus^-1 of a log-uniform dt in [1e-3, 1e-1] (as
    Mamba initialises it, but random), projections ~ N(0, 1/fan_in).
    """
    rng = np.random.default_rng(seed)
    D, E, N, R, K = d_model, d_inner, d_state, dt_rank, d_conv
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), size=E))
    return {
        "norm.weight": rng.uniform(0.5, 1.5, size=D),
        "mixer.A_log": np.log(rng.uniform(1.0, 16.0, size=(E, N))),
        "mixer.D": rng.uniform(0.5, 1.5, size=E),
        "mixer.conv1d.weight": rng.normal(0.0, 1.0 / math.sqrt(K), size=(E, 1, K)),
        "mixer.conv1d.bias": rng.normal(0.0, 0.1, size=E),
        "mixer.in_proj.weight": rng.normal(0.0, 1.0 / math.sqrt(D), size=(2 * E, D)),
        "mixer.x_proj.weight": rng.normal(0.0, 1.0 / math.sqrt(E), size=(R + 2 * N, E)),
        "mixer.dt_proj.weight": rng.uniform(-(R**-0.5), R**-0.5, size=(E, R)),
        "mixer.dt_proj.bias": dt + np.log(-np.expm1(-dt)),
        "mixer.out_proj.weight": rng.normal(0.0, 1.0 / math.sqrt(E), size=(D, E)),
    }


def _check_torch_path() -> None:
    """The CPU reference must be transformers' pure-torch path, not a CUDA/hub kernel."""
    for pkg in ("mamba_ssm", "causal_conv1d"):
        if importlib.util.find_spec(pkg) is not None:
            raise RuntimeError(
                f"{pkg} is installed; transformers would use its kernels instead of the torch "
                "reference path. Run the reference in an environment without it."
            )


def build_hf_mamba1_block(
    state_dict: dict[str, np.ndarray],
    *,
    d_model: int,
    d_state: int,
    expand: int,
    d_conv: int,
    dt_rank: int,
    norm_eps: float = 1e-5,
    dtype: str = "float32",
):
    """A transformers ``MambaBlock`` (eval mode, CPU torch path) holding ``state_dict``."""
    _check_torch_path()
    import torch
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaBlock

    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    config = MambaConfig(
        hidden_size=d_model,
        state_size=d_state,
        expand=expand,
        conv_kernel=d_conv,
        time_step_rank=dt_rank,
        num_hidden_layers=1,
        vocab_size=16,
        use_bias=False,
        use_conv_bias=True,
        layer_norm_epsilon=norm_eps,
        residual_in_fp32=False,  # keep the residual add in the run dtype (True casts to fp32)
        use_mambapy=False,
        use_associative_scan=False,
    )
    block = MambaBlock(config, layer_idx=0)
    if dtype == "float64":
        block = block.double()
    block.eval()
    with torch.no_grad():
        missing, unexpected = block.load_state_dict(
            {k: torch.from_numpy(np.asarray(v)).to(torch_dtype) for k, v in state_dict.items()}, strict=True
        )
    assert not missing and not unexpected
    return block


def run_hf_mamba1_block(
    *,
    d_model: int,
    d_state: int = 16,
    expand: int = 2,
    d_conv: int = 4,
    dt_rank: int | str = "auto",
    batch: int,
    seq_len: int,
    n_decode: int,
    dtype: str = "float32",
    seed: int = 0,
) -> dict[str, Any]:
    """Run one transformers ``MambaBlock``: a prefill of ``seq_len`` tokens, then ``n_decode`` steps.

    Returns numpy arrays (all of ``dtype``):

    * ``state_dict``: the block's state_dict (``norm.weight``, ``mixer.in_proj.weight``, ...)
    * ``weights``: the same through :func:`load_mamba1_layer` (WN, WX, ..., WO)
    * ``dims``: ``{"B", "I", "D", "E", "N", "R", "K", "J"}`` (I = ``seq_len``); ``norm_eps``
    * ``x_prefill`` [B,L,D], ``y_prefill`` [B,L,D] (block output incl. the residual)
    * ``x_decode`` / ``y_decode``: lists of ``n_decode`` arrays [B,1,D]
    * ``states_prefill``: ``{"H": [B,E,N], "CS": [B,J,E]}`` after the prefill (the prefill
      starts from zero states)
    * ``states_decode``: list of ``n_decode`` such dicts, after each decode step
    """
    import torch
    from transformers import DynamicCache

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if seq_len < 1:
        raise ValueError("seq_len must be >= 1 (decode steps continue a prefill)")
    E = expand * d_model
    R = math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)
    sd64 = random_mamba1_state_dict(
        d_model=d_model, d_state=d_state, d_inner=E, dt_rank=R, d_conv=d_conv, seed=seed
    )
    block = build_hf_mamba1_block(
        sd64, d_model=d_model, d_state=d_state, expand=expand, d_conv=d_conv, dt_rank=R, dtype=dtype
    )
    config = block.config

    rng = np.random.default_rng(seed + 1_000_003)
    np_dtype = np.dtype(dtype)
    x_prefill = rng.standard_normal((batch, seq_len, d_model)).astype(np_dtype)
    x_decode = [rng.standard_normal((batch, 1, d_model)).astype(np_dtype) for _ in range(n_decode)]

    cache = DynamicCache(config=config)

    def states() -> dict[str, np.ndarray]:
        conv = cache.get_conv_state(0)
        ssm = cache.get_recurrent_state(0)
        s = mamba1_states_from_hf(conv.clone(), ssm.clone(), dtype=dtype)
        return {"H": s["H0"], "CS": s["CS0"]}

    with torch.no_grad():
        y_prefill = block(torch.from_numpy(x_prefill), cache=cache)
        states_prefill = states()
        y_decode, states_decode = [], []
        for x in x_decode:
            y_decode.append(block(torch.from_numpy(x), cache=cache).numpy().astype(np_dtype))
            states_decode.append(states())

    state_dict = {k: v.detach().cpu().numpy().copy() for k, v in block.state_dict().items()}
    return {
        "norm_eps": float(config.layer_norm_epsilon),
        "dims": {
            "B": batch, "I": seq_len, "D": d_model, "E": E, "N": d_state,
            "R": R, "K": d_conv, "J": d_conv - 1,
        },
        "state_dict": state_dict,
        "weights": load_mamba1_layer(state_dict, dtype=dtype),
        "x_prefill": x_prefill,
        "y_prefill": y_prefill.numpy().astype(np_dtype),
        "x_decode": x_decode,
        "y_decode": y_decode,
        "states_prefill": states_prefill,
        "states_decode": states_decode,
    }
