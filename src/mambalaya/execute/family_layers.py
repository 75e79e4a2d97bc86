"""One call per step of a dense hybrid family's layer (Nemotron-H, Falcon-H1, Zamba2,
OLMo-Hybrid): :func:`run_family_layer` builds the layer type's cascade, gives it every input
(:func:`~mambalaya.workloads.families.base.family_inputs`), runs it and hands back its output in
position order and the state the next step reads, as :func:`~mambalaya.execute.layers.run_hybrid_layer`
does for Bamba."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError
from mambalaya.execute.layers import layer_input
from mambalaya.execute.numpy_exec import carry_states, execute
from mambalaya.workloads.blocks.attention import append_kv
from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions
from mambalaya.workloads.families.base import FamilyModel, family_inputs


@dataclass(frozen=True)
class FamilyStep:
    """One step of one layer: the ``cascade`` run, its ``output`` ``[B, L, D]`` (positions in
    order), the ``state`` the next step reads (SSM and conv states and/or the whole KV cache)
    and every array the run returned."""

    cascade: Cascade
    output: np.ndarray
    state: dict[str, np.ndarray]
    results: dict[str, np.ndarray]


def _cache_length(state: Mapping[str, Any] | None) -> int | None:
    return int(np.shape(state["VC0"])[1]) if state and "VC0" in state else None


def run_family_layer(model: FamilyModel, layer: int | str, x: Any, weights: Mapping[str, np.ndarray], *,
                     state: Mapping[str, np.ndarray] | None = None, scan: str | None = None,
                     softmax: str = "three-pass", dtype: str = "float32",
                     inputs: Mapping[str, Any] | None = None) -> FamilyStep:
    """Run layer ``layer`` (its index, or a layer type) of ``model`` on ``x`` ``[B, L, D]``:
    a prefill from a fresh cache without ``state``, else one decode step continuing from it.
    ``inputs``: the layer's other per-position inputs, by name (Zamba2's hybrid layers read the
    original embeddings ``EMB`` ``[B, L, D]``)."""
    if isinstance(layer, str):
        layer_type = model.check_layer_type(layer)
    elif isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < model.n_layers:
        raise SpecError(f"layer {layer!r} is not a layer of this model (layers 0..{model.n_layers - 1})")
    else:
        layer_type = model.layer_types[int(layer)]
    x, batch, length, phase = layer_input(x, model.d_model, state, "run_family_layer")
    cached = _cache_length(state)
    seq_len = length if phase == "prefill" else (cached if cached is not None else 1)
    if phase == "decode" and layer_type in model.SCANNED:
        scan = None
    cascade = model.layer(layer_type, batch=batch, seq_len=seq_len, phase=phase, scan=scan, softmax=softmax)
    wanted = [t for t in cascade.external_tensors() if cascade.tensors[t].role == Role.INPUT and t != "X"
              and cascade.tensors[t].ranks[:2] == ("B", "I")]
    given = dict(inputs or {})
    if sorted(given) != sorted(wanted):
        raise SpecError(f"cascade {cascade.name} reads the per-position inputs {', '.join(wanted) or 'none'} besides X; "
                        f"inputs= gives {', '.join(sorted(given)) or 'none'}")
    for t, arr in given.items():
        if tuple(np.shape(arr)) != cascade.shape(t):
            raise SpecError(f"input {t} has shape {tuple(np.shape(arr))}; cascade {cascade.name} reads {cascade.shape(t)}")
    arrays = {"X": x, **given, **weights, **family_inputs(cascade, model, state=state)}
    results = execute(cascade, arrays, dtype=dtype)
    out_name = next(t for t, s in cascade.tensors.items() if s.role == Role.OUTPUT)
    output = results[out_name]
    if "C" in cascade.tensors[out_name].ranks:
        output = chunked_output_to_positions(output, length)
    carried = carry_states(cascade, results)
    if "VN" in cascade.tensors:  # an attention block's KV cache, with the new positions appended
        carried.update(append_kv(cascade, {t: state[t] for t in ("KC0A", "KC0B", "VC0") if t in state}
                                 if state else None, results))
    return FamilyStep(cascade, output, carried, results)


__all__ = ["FamilyStep", "run_family_layer"]
