"""Test support: run a small transformers ``BambaModel`` (CPU torch path, eager attention) as the
reference for the hybrid layer types. Not a test file.

:func:`run_hf_bamba` builds a Bamba model with seeded random weights and one layer of each
kind (``layer_types``: ``"mamba"`` or ``"attention"``; every Bamba layer ends in its gated MLP),
feeds random embeddings (``inputs_embeds``: no vocabulary) for a prefill and then decode steps
through one ``DynamicCache``, and records each decoder layer's input and output with forward
hooks, so each layer is compared on its own.

Notes on transformers 5.25 (``models/bamba/modeling_bamba.py``):

* A decoder layer is ``x + mixer(input_layernorm(x))`` then ``h + feed_forward(pre_ff_layernorm(h))``;
  the mixer is ``BambaMixer`` (Mamba-2) or ``BambaAttention``.
* ``partial_rotary_factor`` is forced to 0.5: the first half of each head's channels rotate.
* The attention cache stores keys after the rotary embedding, ``[B, kv_heads, L, head_dim]``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

__all__ = ["run_hf_bamba"]


def _random_state_dict(model, seed: int) -> dict[str, np.ndarray]:
    """Every parameter seeded: norms in [0.5, 1.5], projections ~ N(0, 1/fan_in), the Mamba
    mixer's A_log, dt_bias and D as in hf_reference_mamba2."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight") or name.endswith(".D"):
            out[name] = rng.uniform(0.5, 1.5, size=shape)
        elif name.endswith("A_log"):
            out[name] = np.log(rng.uniform(1.0, 16.0, size=shape))
        elif name.endswith("dt_bias"):
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), size=shape))
            out[name] = dt + np.log(-np.expm1(-dt))
        elif name.endswith("conv1d.weight"):
            out[name] = rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), size=shape)
        elif name.endswith("bias"):
            out[name] = rng.normal(0.0, 0.1, size=shape)
        else:
            out[name] = rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), size=shape)
    return out


def run_hf_bamba(
    *,
    layer_types: Sequence[str],
    hidden_size: int = 32,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    intermediate_size: int = 48,
    mamba_n_heads: int = 8,
    mamba_d_state: int = 8,
    mamba_n_groups: int = 1,
    mamba_chunk_size: int = 4,
    rope_theta: float = 10000.0,
    batch: int = 2,
    seq_len: int = 6,
    n_decode: int = 3,
    seed: int = 0,
    **config_fields: Any,
) -> dict[str, Any]:
    """Run the model; return ``config`` (the transformers config as a dict), ``state_dict``
    (numpy, float32), and per layer ``layers[k] = {"type", "inputs", "outputs", "caches"}``:
    the layer's input and output arrays [B, n, D] for the prefill and each decode step, and for
    an attention layer its cache (``key``, ``value`` [B, G, L, E]) after each of them.
    ``config_fields`` are passed to ``BambaConfig`` as they are (``head_dim``,
    ``rope_parameters``, ``rms_norm_eps``, ...) and win over the arguments above."""
    import torch
    from transformers import BambaConfig, DynamicCache
    from transformers.models.bamba.modeling_bamba import BambaModel

    kinds = {"mamba": "linear_attention", "attention": "full_attention"}
    config = BambaConfig(
        vocab_size=16,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=len(layer_types),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        attn_layer_indices=[k for k, t in enumerate(layer_types) if t == "attention"],
        mamba_n_heads=mamba_n_heads,
        mamba_d_state=mamba_d_state,
        mamba_n_groups=mamba_n_groups,
        mamba_chunk_size=mamba_chunk_size,
        **{"rope_parameters": {"rope_type": "default", "rope_theta": rope_theta}, "attn_implementation": "eager",
           **config_fields},
    )
    assert [kinds[t] for t in layer_types] == list(config.layers_block_type), config.layers_block_type
    torch.manual_seed(seed)
    model = BambaModel(config).eval()
    sd = _random_state_dict(model, seed)
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)

    records: list[dict[str, list]] = [{"inputs": [], "outputs": []} for _ in layer_types]

    def hook(k):
        def record(module, args, kwargs, output):
            records[k]["inputs"].append(args[0].detach().numpy().copy())
            records[k]["outputs"].append(output[0].detach().numpy().copy())
        return record

    for k, layer in enumerate(model.layers):
        layer.register_forward_hook(hook(k), with_kwargs=True)

    rng = np.random.default_rng(seed + 1_000_003)
    x = rng.standard_normal((batch, seq_len + n_decode, hidden_size)).astype(np.float32)
    cache = DynamicCache(config=config)
    caches: list[list[dict[str, np.ndarray]]] = [[] for _ in layer_types]
    with torch.no_grad():
        steps = [(0, seq_len)] + [(seq_len + s, seq_len + s + 1) for s in range(n_decode)]
        for start, stop in steps:
            positions = torch.arange(start, stop).unsqueeze(0)
            model(inputs_embeds=torch.from_numpy(x[:, start:stop]), cache=cache, use_cache=True, position_ids=positions)
            for k, t in enumerate(layer_types):
                if t == "attention":
                    layer_cache = cache.layers[k]
                    caches[k].append({"key": layer_cache.keys.numpy().copy(), "value": layer_cache.values.numpy().copy()})
    return {
        "config": config.to_dict(),
        "state_dict": {k: v.astype(np.float32) for k, v in sd.items()},
        "layers": [dict(type=t, caches=caches[k], **records[k]) for k, t in enumerate(layer_types)],
    }
