"""Test support: run a small transformers ``JambaModel`` or ``GraniteMoeHybridModel`` (CPU,
float32, eager attention) as the reference for the MoE hybrid layer types. Not a test file.

:func:`run_hf_moe` builds the model with seeded random weights (as ``hf_reference_bamba``),
feeds random embeddings for a prefill and decode steps through one ``DynamicCache``, and
records each decoder layer's input and output (forward hooks) and, after every step, each
layer's cache: keys and values ``[B, G, L, E]`` of an attention layer, the conv state
``[B, channels, K]`` and the SSM state of a Mamba layer.
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


def build_hf_model(family: str, **fields: Any):
    from transformers import GraniteMoeHybridConfig, JambaConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridModel
    from transformers.models.jamba.modeling_jamba import JambaModel

    if family == "jamba":
        config = JambaConfig(**{"attn_implementation": "eager", **fields})
        return config, JambaModel(config).eval()
    config = GraniteMoeHybridConfig(**{"attn_implementation": "eager", **fields})
    return config, GraniteMoeHybridModel(config).eval()


def run_hf_moe(family: str, *, batch: int = 2, seq_len: int = 8, n_decode: int = 3, seed: int = 0,
               **fields: Any) -> dict[str, Any]:
    import torch

    config, model = build_hf_model(family, **fields)
    sd = _random_state_dict(model, seed)
    for name in list(sd):
        if name.endswith("A_log") and sd[name].ndim == 2:  # Jamba's [E, N] A_log: S4D-like, positive A
            sd[name] = np.log(np.random.default_rng(seed).uniform(1.0, 16.0, size=sd[name].shape))
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)

    def caches(cache: Any, k: int) -> dict[str, np.ndarray]:
        lc = cache.layers[k]
        if hasattr(lc, "keys") and not hasattr(lc, "conv_states"):
            return {"key": lc.keys.numpy().copy(), "value": lc.values.numpy().copy()}
        return {"conv": lc.conv_states[0].numpy().copy(), "ssm": lc.recurrent_states[0].numpy().copy()}

    records, _ = drive_layers(model, config, caches, batch=batch, seq_len=seq_len, n_decode=n_decode, seed=seed)
    return {"config": config.to_dict(), "state_dict": {k: v.astype(np.float32) for k, v in sd.items()},
            "layers": records}
