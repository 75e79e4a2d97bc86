"""One call per step of a hybrid model's layer (Bamba: :func:`run_hybrid_layer`; Jamba and
Granite 4: :func:`run_moe_family_layer`; Nemotron-H, Falcon-H1, Zamba2 and OLMo-Hybrid:
:func:`run_family_layer`): build its cascade, give it every input, run it,
and hand back its output in position layout and the state the next step reads.

Running a layer by hand takes five pieces that are easy to get wrong: the cascade of the right
phase and length, the constants (rotary tables at the step's own positions, causal masks), zero
states for a fresh prefill, the chunked scan's ``[B, C, Q, D]`` output put back in position
order, and the carried state. :func:`run_hybrid_layer` does all five::

    config = hybrid_config_from_hf(json.load(open("config.json")))
    weights = load_bamba_layer(state_dict, k, config)
    step = run_hybrid_layer(config, k, prompt, weights)              # prefill, [B, L, D]
    for x in new_tokens:                                             # each [B, 1, D]
        step = run_hybrid_layer(config, k, x, weights, state=step.state)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.execute.numpy_exec import carry_states, execute
from mambalaya.workloads.blocks.attention import Softmax, append_kv
from mambalaya.workloads.families.bamba import MLP_PREFIX, HybridConfig, hybrid_inputs, hybrid_layer
from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions
from mambalaya.einsum.ir import Role
from mambalaya.workloads.families.base import FamilyModel, family_inputs
from mambalaya.workloads.families.jamba_granite import MLP_PREFIX as MOE_MLP_PREFIX
from mambalaya.workloads.families.jamba_granite import MoEHybridConfig, moe_family_layer



@dataclass(frozen=True)
class LayerStep:
    """One step of one layer: the ``cascade`` run, its ``output`` ``[B, L, D]`` (positions in
    order, whatever the scan form), the ``state`` the next step reads (SSM and conv states, or
    the whole KV cache) and every array the run returned (``results``)."""

    cascade: Cascade
    output: np.ndarray
    state: dict[str, np.ndarray]
    results: dict[str, np.ndarray]


def layer_input(x: Any, d_model: int, state: Any, runner: str, hint: str = "") -> tuple[np.ndarray, int, int, str]:
    """``x`` as an array with its batch, its length and the phase a layer runner takes from it
    (a prefill without ``state``, else a decode step of one position); a clear error where
    ``x`` is not ``[batch, positions, d_model]`` or a decode step has more than one position.
    ``runner`` names the caller in that error, ``hint`` adds to it."""
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[2] != d_model:
        raise SpecError(f"x has shape {x.shape}; a layer of this model reads [batch, positions, {d_model}]")
    batch, length = int(x.shape[0]), int(x.shape[1])
    phase = "prefill" if state is None else "decode"
    if phase == "decode" and length != 1:
        raise SpecError(f"with a state, {runner} runs one decode step, of one position; x has {length}{hint}")
    return x, batch, length, phase


def run_hybrid_layer(
    config: HybridConfig,
    layer: int | str,
    x: Any,
    weights: Mapping[str, np.ndarray],
    *,
    state: Mapping[str, np.ndarray] | None = None,
    scan: str | None = None,
    softmax: Softmax = "three-pass",
    dtype: str = "float32",
) -> LayerStep:
    """Run layer ``layer`` (its index in ``config``, or a layer type) on ``x`` ``[B, L, D]``.

    Without ``state`` this is a prefill from a fresh cache; with it, a decode step of one
    position continuing from that state (the previous step's :attr:`LayerStep.state`). A Mamba
    prefill uses ``scan`` (default: chunked when ``L`` is a multiple of the chunk size, else
    recurrent; both compute the same values)."""
    layer_type = _layer_type(config, layer)
    x, batch, length, phase = layer_input(x, config.d_model, state, "run_hybrid_layer",
                                          " (an attention prefill starts from an empty cache: leave state out for a prompt)")
    if layer_type == "mamba" and phase == "prefill" and scan is None:
        scan = "chunked" if length % config.mamba_chunk_size == 0 else "recurrent"
    cascade = hybrid_layer(config, layer_type, batch=batch, seq_len=length if phase == "prefill" else None,
                           phase=phase, scan=scan, softmax=softmax, state=state)
    arrays = {"X": x, **weights, **hybrid_inputs(cascade, config, state=state)}
    results = execute(cascade, arrays, dtype=dtype)
    output = results[MLP_PREFIX + "XO"]
    if "C" in cascade.tensors[MLP_PREFIX + "XO"].ranks:
        output = chunked_output_to_positions(output, length)
    carried = append_kv(cascade, dict(state) if state else None, results) if layer_type == "attention" \
        else carry_states(cascade, results)
    return LayerStep(cascade, output, carried, results)


def _layer_type(config: HybridConfig, layer: int | str) -> str:
    if isinstance(layer, str):
        if layer not in config.layer_counts():
            raise SpecError(f"this model has no {layer!r} layer (its layer types: {', '.join(config.layer_counts())})")
        return layer
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < config.n_layers:
        raise SpecError(f"layer {layer!r} is not a layer of this model (layers 0..{config.n_layers - 1})")
    return config.layer_types[int(layer)]


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
    output = results[MOE_MLP_PREFIX + "XO"]
    if "C" in cascade.tensors[MOE_MLP_PREFIX + "XO"].ranks:
        output = chunked_output_to_positions(output, length)
    carried = carry_states(cascade, results) if mamba else append_kv(cascade, dict(state) if state else None, results)
    return LayerStep(cascade, output, carried, results)


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


__all__ = ["FamilyStep", "LayerStep", "layer_input", "run_family_layer", "run_hybrid_layer", "run_moe_family_layer"]
