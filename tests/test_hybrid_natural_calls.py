"""A hybrid model run as a user would run it: its config.json read as transformers reads it, its
layers stepped with one call each (``run_hybrid_layer``), and the calls a user trips over either
doing the natural thing or failing with an error that says why, never a wrong number.

The transformers case is the one that once went silently wrong: a ``BambaConfig`` with an
explicit ``head_dim`` (q and o projections not square) and a rotary fraction of 0.25 from
``rope_parameters``, where mambalaya used to rotate half of each head whatever the config said.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.execute.layers import run_hybrid_layer
from mambalaya.workloads.blocks.attention import attention_constants, cache_from_hf, rotary_tables
from mambalaya.workloads.hf.weights_bamba import load_bamba_layer
from mambalaya.workloads.families.bamba import HybridConfig, bamba_config_from_hf, hybrid_inputs, hybrid_layer

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)

ROPE = {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25}


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


@pytest.fixture(scope="module")
def partial_rotary_reference() -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import hf_reference_bamba as hf

    return hf.run_hf_bamba(layer_types=["mamba", "attention"], hidden_size=32, n_heads=4, n_kv_heads=2,
                           mamba_chunk_size=4, seq_len=8, n_decode=3, seed=11, head_dim=24, rope_parameters=ROPE,
                           rms_norm_eps=1e-4)


@requires_hf
@pytest.mark.parametrize("scan", [None, "recurrent"])
@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_partial_rotary_and_explicit_head_dim_match_transformers(partial_rotary_reference: dict, scan, softmax) -> None:
    """Each layer stepped by run_hybrid_layer (prefill of 8, then 3 decode steps carrying the
    state it returns) equals transformers' decoder layer within 1e-5, and the KV cache it
    carries equals transformers' after every step."""
    ref = partial_rotary_reference
    config = bamba_config_from_hf(ref["config"])
    att = config.attention()
    assert (att.head_channels, att.rotary_dim, att.rope_theta, config.norm_eps) == (24, 6, 1000.0, 1e-4)
    for k, layer in enumerate(ref["layers"]):
        weights = load_bamba_layer(ref["state_dict"], k, config)
        step = None
        for n, x in enumerate(layer["inputs"]):
            step = run_hybrid_layer(config, k, x, weights, state=None if step is None else step.state, scan=scan,
                                    softmax=softmax)
            assert step.output.shape == layer["outputs"][n].shape
            assert rel_err(step.output, layer["outputs"][n]) <= 1e-5, (k, n)
            if layer["type"] == "attention":
                cache = cache_from_hf(att, layer["caches"][n]["key"], layer["caches"][n]["value"])
                assert set(step.state) == set(cache)
                for name, value in cache.items():
                    assert rel_err(step.state[name], value) <= 1e-5, (name, n)


SMALL = HybridConfig(d_model=16, layer_types=("mamba", "attention"), d_ff=24, n_heads=4, n_kv_heads=2, head_dim=8,
                     partial_rotary_factor=0.5, mamba_heads=4, mamba_headdim=8, mamba_d_state=4, vocab_size=8,
                     mamba_chunk_size=4)


def test_a_decode_layer_needs_no_length_it_can_know() -> None:
    mamba = hybrid_layer(SMALL, "mamba", batch=2, phase="decode")  # a Mamba step ignores what came before
    assert mamba.size("I") == 1
    cache = {"KC0A": np.zeros((2, 5, 2, 2, 2)), "KC0B": np.zeros((2, 5, 2, 4)), "VC0": np.zeros((2, 5, 2, 8))}
    attention = hybrid_layer(SMALL, "attention", batch=2, phase="decode", state=cache)
    assert attention.size("M") == 5 and attention.size("T") == 6
    with pytest.raises(SpecError, match="decode step reads a KV cache: give the cache"):
        hybrid_layer(SMALL, "attention", batch=2, phase="decode")
    with pytest.raises(SpecError, match="seq_len=4 but the KV cache given holds 5 positions"):
        hybrid_layer(SMALL, "attention", batch=2, phase="decode", seq_len=4, state=cache)
    with pytest.raises(SpecError, match="needs seq_len"):
        hybrid_layer(SMALL, "mamba", batch=2)


def test_attention_constants_take_the_model_config_and_the_cascade_positions() -> None:
    decode = hybrid_layer(SMALL, "attention", batch=1, phase="decode", seq_len=7)
    constants = attention_constants(decode, SMALL)  # the HybridConfig the user holds
    cos, sin = rotary_tables(SMALL.attention(), np.array([7]))
    np.testing.assert_array_equal(constants["COS"], cos)  # position 7, the cache length, not 0
    np.testing.assert_array_equal(constants["SIN"], sin)
    assert attention_constants(decode, SMALL.attention(), start=7).keys() == constants.keys()
    with pytest.raises(SpecError, match="start=0 does not fit .* a decode step after 7 cached positions is at position 7"):
        attention_constants(decode, SMALL, start=0)
    prefill = hybrid_layer(SMALL, "attention", batch=1, seq_len=4)
    with pytest.raises(SpecError, match="a prefill runs from an empty cache, at positions 0 .. L-1"):
        attention_constants(prefill, SMALL, start=3)
    with pytest.raises(SpecError, match="not a dict"):
        attention_constants(prefill, {"d_model": 16})


def test_hybrid_inputs_give_every_input_but_x_and_the_weights() -> None:
    prefill = hybrid_layer(SMALL, "mamba", batch=2, seq_len=8)
    inputs = hybrid_inputs(prefill, SMALL)
    assert set(inputs) == {"LM", "CSX0", "CSB0", "CSC0", "H0"}
    assert all(not inputs[t].any() for t in ("CSX0", "CSB0", "CSC0", "H0"))
    weights = {"X"} | {t for t in prefill.external_tensors() if prefill.tensors[t].role.value == "weight"}
    assert set(prefill.external_tensors()) == weights | set(inputs)
    decode = hybrid_layer(SMALL, "mamba", batch=2, phase="decode")
    with pytest.raises(SpecError, match="is a decode step: it continues from the state its prefill left"):
        hybrid_inputs(decode, SMALL)
    state = {t: np.zeros(decode.shape(t)) for t in ("CSX0", "CSB0", "CSC0", "H0")}
    assert set(hybrid_inputs(decode, SMALL, state=state)) == set(state)
    with pytest.raises(SpecError, match=r"state tensor H0 has shape \(2, 1\); cascade .* reads it as \(2, 1, 4, 8, 4\)"):
        hybrid_inputs(decode, SMALL, state={**state, "H0": np.zeros((2, 1))})
    with pytest.raises(SpecError, match="lacks H0 and has extra nothing"):
        hybrid_inputs(decode, SMALL, state={k: v for k, v in state.items() if k != "H0"})


def test_run_hybrid_layer_gives_positions_whatever_the_scan_form() -> None:
    rng = np.random.default_rng(0)
    cascade = hybrid_layer(SMALL, "mamba", batch=2, seq_len=8)
    weights = {t: rng.standard_normal(cascade.shape(t)) * 0.3 for t in cascade.external_tensors()
               if cascade.tensors[t].role.value == "weight"}
    weights["A"] = -np.abs(weights["A"]) - 0.5
    x = rng.standard_normal((2, 8, 16))
    chunked = run_hybrid_layer(SMALL, 0, x, weights, dtype="float64")
    recurrent = run_hybrid_layer(SMALL, "mamba", x, weights, scan="recurrent", dtype="float64")
    assert "C" in chunked.cascade.ranks and chunked.output.shape == (2, 8, 16)
    np.testing.assert_allclose(chunked.output, recurrent.output, rtol=1e-10, atol=1e-12)
    step = run_hybrid_layer(SMALL, 0, x[:, :1], weights, state=chunked.state, dtype="float64")
    assert step.output.shape == (2, 1, 16) and set(step.state) == set(chunked.state)
    with pytest.raises(SpecError, match="runs one decode step, of one position; x has 8"):
        run_hybrid_layer(SMALL, 0, x, weights, state=chunked.state)
    with pytest.raises(SpecError, match="layer 2 is not a layer of this model"):
        run_hybrid_layer(SMALL, 2, x, weights)


def test_a_form_a_layer_type_cannot_take_is_refused_in_every_hybrid_family() -> None:
    """scan on an attention layer of Bamba, Jamba or Granite 4 (the dense families refused it),
    softmax or key_block on a layer without attention, and an unknown softmax were accepted and
    built the layer as without them; refused by one rule for every hybrid family."""
    from mambalaya.errors import SpecError
    from mambalaya.workloads import PRESETS, build_layer

    def build(model, layer_type, **forms):
        return build_layer(PRESETS[model], phase="prefill", seq_len=256, batch=1, layer_type=layer_type, **forms)

    for model, layer_type in (("bamba-9b", "attention"), ("jamba-v0.1", "attention"),
                              ("granite-4.0-h-tiny", "attention-moe"), ("nemotron-h-8b", "attention")):
        with pytest.raises(SpecError, match="scan applies to the layers with a scan"):
            build(model, layer_type, scan="recurrent")
    for model, layer_type in (("bamba-9b", "mamba"), ("jamba-v0.1", "mamba-moe"), ("nemotron-h-8b", "mlp"),
                              ("zamba2-2.7b", "mamba"), ("olmo-hybrid-7b", "gdn")):
        with pytest.raises(SpecError, match="has no attention"):
            build(model, layer_type, softmax="blocked", key_block=32)
    with pytest.raises(SpecError, match="softmax must be one of"):
        build("nemotron-h-8b", "mlp", softmax="flash")
    assert "attention" in build("bamba-9b", "attention", softmax="blocked").regions
    assert "attention" in build("zamba2-2.7b", "hybrid", softmax="online").regions
