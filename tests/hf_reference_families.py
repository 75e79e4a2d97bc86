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

__all__ = ["drive_layers", "run_hf_layers"]


def run_hf_layers(model_class: Any, config: Any, kinds: Sequence[str], *, batch: int = 2, seq_len: int = 8,
                  n_decode: int = 3, seed: int = 0) -> dict[str, Any]:
    """``kinds[k]``: ``"attention"`` (KV cache), ``"recurrent"`` (conv and SSM state), ``"both"``
    or ``"stateless"`` for layer ``k``. Returns ``config`` (a dict), ``state_dict`` (numpy float32)
    and per layer ``{"inputs", "outputs", "caches"}``."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config).eval()
    sd = _random_state_dict(model, seed)
    with torch.no_grad():
        model.load_state_dict({k: torch.from_numpy(v).float() for k, v in sd.items()}, strict=True)

    def caches(cache: Any, k: int) -> dict[str, np.ndarray] | None:
        kind = kinds[k]
        entry: dict[str, np.ndarray] = {}
        if kind in ("attention", "both"):
            layer = cache.layers[k]
            entry.update(key=layer.keys.numpy().copy(), value=layer.values.numpy().copy())
        if kind in ("recurrent", "both"):  # "both": one layer with a KV cache and SSM states (Falcon-H1)
            entry.update(conv=cache.get_conv_state(k).numpy().copy(), ssm=cache.get_recurrent_state(k).numpy().copy())
        return entry or None

    records, _ = drive_layers(model, config, caches, batch=batch, seq_len=seq_len, n_decode=n_decode, seed=seed)
    return {"config": config.to_dict(), "state_dict": {k: v.astype(np.float32) for k, v in sd.items()},
            "layers": records}


def drive_layers(model: Any, config: Any, caches: Any, *, batch: int, seq_len: int, n_decode: int,
                 seed: int) -> tuple[list[dict[str, list]], np.ndarray]:
    """Feed random embeddings (seeded by ``seed``) to ``model``: a prefill of ``seq_len``
    positions, then ``n_decode`` one-position steps, through one ``DynamicCache``. Returns per
    decoder layer ``{"inputs", "outputs", "caches"}`` (inputs and outputs by forward hooks;
    after every step, ``caches(cache, k)``'s entry for layer ``k`` where it gives one) and the
    embeddings ``[B, L+n, D]``. The runners of every hybrid family's reference share it."""
    import torch
    from transformers import DynamicCache

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
            for k in range(len(records)):
                entry = caches(cache, k)
                if entry is not None:
                    records[k]["caches"].append(entry)
    return records, x
