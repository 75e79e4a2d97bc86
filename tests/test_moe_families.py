"""Mixture-of-experts hybrids (Jamba, Granite 4): every layer type through our executor against
transformers (small random configs, float32, CPU, eager attention) in prefill and decode steps,
with the carried states; the cost model's routing; presets and config.json reading."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from mambalaya.errors import SpecError

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)

JAMBA_SMALL = dict(vocab_size=16, hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                   expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_dt_rank=4,
                   rms_norm_eps=1e-5)
GRANITE_SMALL = dict(vocab_size=16, hidden_size=32, intermediate_size=24, shared_intermediate_size=20,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=5,
                     num_experts_per_tok=3, layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_state=8,
                     mamba_chunk_size=4, residual_multiplier=0.7, attention_multiplier=0.3, rms_norm_eps=1e-5)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _run_all(ref: dict, family: str, scan: str | None = None, softmax: str = "three-pass") -> None:
    from mambalaya.execute.moe_layers import run_moe_family_layer
    from mambalaya.workloads.hf_config_moe import moe_config_from_hf
    from mambalaya.workloads.hf_weights_moe import load_moe_family_layer

    config = moe_config_from_hf(dict(ref["config"]))
    assert config.family == family
    for k, layer in enumerate(ref["layers"]):
        weights = load_moe_family_layer(ref["state_dict"], k, config)
        state = None
        for n, (x, expected, cache) in enumerate(zip(layer["inputs"], layer["outputs"], layer["caches"])):
            step = run_moe_family_layer(config, k, x, weights, state=state, scan=scan if n == 0 else None,
                                        softmax=softmax)  # type: ignore[arg-type]
            assert rel_err(step.output, expected) <= 1e-5, (k, n, config.layer_types[k], rel_err(step.output, expected))
            state = step.state
            _check_state(config, k, state, cache)


def _check_state(config, k: int, state: dict, cache: dict) -> None:
    from mambalaya.workloads.attention import cache_from_hf

    if "key" in cache:
        expected = cache_from_hf(config.attention(), cache["key"], cache["value"])
        assert set(state) == set(expected)
        assert all(rel_err(state[t], expected[t]) <= 1e-5 for t in expected)
        return
    conv, ssm = cache["conv"], cache["ssm"]  # [B, channels, K], the SSM state
    ours_ssm = state["H0"].reshape(ssm.shape)
    assert rel_err(ours_ssm, ssm) <= 1e-5
    tail = conv[:, :, 1:]  # the last K-1 inputs of the conv, which our conv state holds
    if "CS0" in state:  # Jamba: Mamba-1, CS0[b,j,e]
        ours_conv = state["CS0"].transpose(0, 2, 1)
    else:  # Granite: Mamba-2, x then B then C channels
        parts = [state[t] for t in ("CSX0", "CSB0", "CSC0")]
        ours_conv = np.concatenate([p.reshape(p.shape[0], p.shape[1], -1) for p in parts], axis=2).transpose(0, 2, 1)
    assert rel_err(ours_conv, tail) <= 1e-5


@pytest.fixture(scope="module")
def jamba_reference() -> dict:
    pytest.importorskip("transformers")
    import hf_reference_moe as hf

    return hf.run_hf_moe("jamba", seq_len=8, n_decode=3, seed=5, **JAMBA_SMALL)


@pytest.fixture(scope="module")
def granite_reference() -> dict:
    pytest.importorskip("transformers")
    import hf_reference_moe as hf

    return hf.run_hf_moe("granitemoehybrid", seq_len=8, n_decode=3, seed=7, **GRANITE_SMALL)


@requires_hf
@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_jamba_layers_match_transformers(jamba_reference: dict, softmax: str) -> None:
    """All four Jamba layer types (Mamba-1 with dt/B/C norms or attention without position
    embedding; dense MLP or MoE with softmax-then-top-2, not renormalised): prefill of 8 then 3
    decode steps equal transformers within 1e-5, and so do the carried SSM/conv states and KV cache."""
    _run_all(jamba_reference, "jamba", softmax=softmax)


@requires_hf
@pytest.mark.parametrize("scan", ["chunked", "recurrent"])
def test_granite_layers_match_transformers(granite_reference: dict, scan: str) -> None:
    """Granite 4 hybrid's Mamba-2 and attention layers (attention_multiplier as the score scale,
    residual_multiplier on both branches), each with the top-3-then-softmax MoE of 5 experts and
    the shared MLP: outputs and carried states equal transformers within 1e-5."""
    _run_all(granite_reference, "granitemoehybrid", scan=scan)
