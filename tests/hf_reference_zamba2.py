"""Test support: run a small transformers Zamba2 model (CPU torch path, eager attention) as the
reference for its layers. Not a test file.

As :func:`hf_reference_families.run_hf_layers`, with what Zamba2 needs besides: the state dict
returned is the model's own after loading (transformers ties a shared block's later uses to its
first, so only the values the model holds are the ones it ran with), and the embeddings fed in
are returned (a hybrid layer reads them beside its input).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

from hf_reference_bamba import _random_state_dict  # noqa: E402
from hf_reference_families import drive_layers  # noqa: E402

__all__ = ["run_hf_zamba2"]


def run_hf_zamba2(config: Any, *, batch: int = 2, seq_len: int = 16, n_decode: int = 3, seed: int = 0,
                  state_dict: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Per layer ``{"inputs", "outputs", "caches"}`` (caches after every step: ``conv``, ``ssm``
    and, for a hybrid layer, ``key``/``value`` ``[B, G, L, E]``), ``embeddings`` ``[B, L+n, D]``
    and ``state_dict`` (numpy float64, as the model holds it); ``state_dict`` given: those weights
    instead of seeded ones."""
    import torch
    from transformers import Zamba2Model

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = Zamba2Model(config).eval()
    sd = _random_state_dict(model, seed) if state_dict is None else state_dict
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)
    held = {k: v.detach().double().numpy().copy() for k, v in model.state_dict().items()}

    def caches(cache: Any, k: int) -> dict[str, np.ndarray]:
        entry = {"conv": cache.get_conv_state(k).numpy().copy(), "ssm": cache.get_recurrent_state(k).numpy().copy()}
        if config.layers_block_type[k] == "hybrid":
            entry.update(key=cache.layers[k].keys.numpy().copy(), value=cache.layers[k].values.numpy().copy())
        return entry

    records, x = drive_layers(model, config, caches, batch=batch, seq_len=seq_len, n_decode=n_decode, seed=seed)
    return {"state_dict": held, "embeddings": x, "layers": records}
