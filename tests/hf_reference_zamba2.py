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

__all__ = ["run_hf_zamba2"]


def run_hf_zamba2(config: Any, *, batch: int = 2, seq_len: int = 16, n_decode: int = 3, seed: int = 0,
                  state_dict: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Per layer ``{"inputs", "outputs", "caches"}`` (caches after every step: ``conv``, ``ssm``
    and, for a hybrid layer, ``key``/``value`` ``[B, G, L, E]``), ``embeddings`` ``[B, L+n, D]``
    and ``state_dict`` (numpy float64, as the model holds it); ``state_dict`` given: those weights
    instead of seeded ones."""
    import torch
    from transformers import DynamicCache, Zamba2Model

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = Zamba2Model(config).eval()
    sd = _random_state_dict(model, seed) if state_dict is None else state_dict
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)
    held = {k: v.detach().double().numpy().copy() for k, v in model.state_dict().items()}
    records: list[dict[str, list]] = [{"inputs": [], "outputs": [], "caches": []} for _ in model.layers]

    def hook(k: int):
        def record(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            records[k]["inputs"].append(x.detach().numpy().copy())
            out = output[0] if isinstance(output, tuple) else output
            records[k]["outputs"].append(out.detach().numpy().copy())
        return record

    for k, layer in enumerate(model.layers):
        layer.register_forward_hook(hook(k), with_kwargs=True)
    rng = np.random.default_rng(seed + 1_000_003)
    x = rng.standard_normal((batch, seq_len + n_decode, config.hidden_size)).astype(np.float32)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        for start, stop in [(0, seq_len)] + [(seq_len + s, seq_len + s + 1) for s in range(n_decode)]:
            model(inputs_embeds=torch.from_numpy(x[:, start:stop]), cache=cache, use_cache=True,
                  position_ids=torch.arange(start, stop).unsqueeze(0))
            for k, kind in enumerate(config.layers_block_type):
                entry = {"conv": cache.get_conv_state(k).numpy().copy(),
                         "ssm": cache.get_recurrent_state(k).numpy().copy()}
                if kind == "hybrid":
                    entry.update(key=cache.layers[k].keys.numpy().copy(), value=cache.layers[k].values.numpy().copy())
                records[k]["caches"].append(entry)
    return {"state_dict": held, "embeddings": x, "layers": records}
