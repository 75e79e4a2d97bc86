"""One step of one layer of a Jamba or Granite 4 hybrid model, as
:func:`~mambalaya.execute.layers.run_hybrid_layer` runs Bamba's: build the cascade, give it
its constants and state, run it, and hand back the output ``[B, L, D]`` and the state the next
step reads (SSM and conv states, or the whole KV cache)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.execute.layers import LayerStep, layer_input
from mambalaya.execute.numpy_exec import carry_states, execute
from mambalaya.workloads.blocks.attention import Softmax, append_kv
from mambalaya.workloads.families.bamba import hybrid_inputs
from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions
from mambalaya.workloads.families.jamba_granite import MLP_PREFIX, MoEHybridConfig, moe_family_layer


def run_moe_family_layer(config: MoEHybridConfig, layer: int, x: Any, weights: Mapping[str, np.ndarray], *,
                         state: Mapping[str, np.ndarray] | None = None, scan: str | None = None,
                         softmax: Softmax = "three-pass", dtype: str = "float32") -> LayerStep:
    """Run layer ``layer`` on ``x`` ``[B, L, D]``: a prefill without ``state``, else one decode step."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < config.n_layers:
        raise SpecError(f"layer {layer!r} is not a layer of this model (layers 0..{config.n_layers - 1})")
    layer_type = config.layer_types[layer]
    x, batch, length, phase = layer_input(x, config.d_model, state, "a layer")
    mamba = layer_type.startswith("mamba")
    if mamba and phase == "prefill" and scan is None and config.family == "granitemoehybrid":
        scan = "chunked" if length % config.mamba_chunk_size == 0 else "recurrent"
    cascade = moe_family_layer(config, layer_type, batch=batch, seq_len=length if phase == "prefill" else None,
                               phase=phase, scan=scan, softmax=softmax, state=state)
    arrays = {"X": x, **weights, **hybrid_inputs(cascade, config, state=state)}  # type: ignore[arg-type]
    results = execute(cascade, arrays, dtype=dtype)
    output = results[MLP_PREFIX + "XO"]
    if "C" in cascade.tensors[MLP_PREFIX + "XO"].ranks:
        output = chunked_output_to_positions(output, length)
    carried = carry_states(cascade, results) if mamba else append_kv(cascade, dict(state) if state else None, results)
    return LayerStep(cascade, output, carried, results)


__all__ = ["run_moe_family_layer"]
