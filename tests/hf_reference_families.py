"""Test support: run a small transformers model of a dense hybrid family (Nemotron-H, OLMo-Hybrid)
on the CPU torch path with eager attention, as the reference for every layer type. Not a test file.

:func:`run_hf_layers` seeds every parameter (as ``hf_reference_bamba`` does), feeds random
embeddings (``inputs_embeds``) for a prefill and then decode steps through one ``DynamicCache``,
and records each decoder layer's input and output with forward hooks, and after every step its
carried state: ``key``/``value`` ``[B, G, L, E]`` of an attention layer, ``conv``/``ssm`` of a
recurrent (Mamba-2 or Gated DeltaNet) layer.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

from hf_reference_bamba import _random_state_dict  # noqa: E402

__all__ = ["run_hf_layers"]


def run_hf_layers(model_class: Any, config: Any, kinds: Sequence[str], *, batch: int = 2, seq_len: int = 8,
                  n_decode: int = 3, seed: int = 0) -> dict[str, Any]:
    """``kinds[k]``: ``"attention"`` (KV cache), ``"recurrent"`` (conv and SSM state), ``"both"``
    or ``"stateless"`` for layer ``k``. Returns ``config`` (a dict), ``state_dict`` (numpy float32)
    and per layer ``{"inputs", "outputs", "caches"}``."""
    import torch
    from transformers import DynamicCache

    torch.manual_seed(seed)
    model = model_class(config).eval()
    sd = _random_state_dict(model, seed)
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)
    records: list[dict[str, list]] = [{"inputs": [], "outputs": [], "caches": []} for _ in kinds]

    def hook(k: int):
        def record(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            records[k]["inputs"].append(x.detach().numpy().copy())
            out = output[0] if isinstance(output, tuple) else output
            records[k]["outputs"].append(out.detach().numpy().copy())
        return record

    for k, layer in enumerate(model.layers):
        layer.register_forward_hook(hook(k), with_kwargs=True)
    hidden = config.hidden_size
    rng = np.random.default_rng(seed + 1_000_003)
    x = rng.standard_normal((batch, seq_len + n_decode, hidden)).astype(np.float32)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        for start, stop in [(0, seq_len)] + [(seq_len + s, seq_len + s + 1) for s in range(n_decode)]:
            model(inputs_embeds=torch.from_numpy(x[:, start:stop]), cache=cache, use_cache=True,
                  position_ids=torch.arange(start, stop).unsqueeze(0))
            for k, kind in enumerate(kinds):
                if kind in ("attention", "both"):
                    layer = cache.layers[k]
                    records[k]["caches"].append({"key": layer.keys.numpy().copy(), "value": layer.values.numpy().copy()})
                if kind in ("recurrent", "both"):
                    entry = {"conv": cache.get_conv_state(k).numpy().copy(),
                             "ssm": cache.get_recurrent_state(k).numpy().copy()}
                    if kind == "both":  # one layer with a KV cache and SSM states (Falcon-H1)
                        records[k]["caches"][-1].update(entry)
                    else:
                        records[k]["caches"].append(entry)
    return {"config": config.to_dict(), "state_dict": {k: v.astype(np.float32) for k, v in sd.items()},
            "layers": records}
