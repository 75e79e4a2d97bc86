"""FlashAttention's blocked online softmax (``softmax="blocked"``): the recurrence over blocks of
``key_block`` keys computes the three-pass softmax's values and transformers' (prefill with and
without a padded last block, decode steps whose ``L + 1`` keys end in a padded block), on the
shared attention block (Bamba) and on the families that write their own attention lines
(Falcon-H1's parallel block, OLMo-Hybrid's QK-normed block); its value product is a matrix
product on the 2D array, its rescale runs once per block, and on gpu-h100 it is far faster
than the per-key online form."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.cost.contraction import contractions
from mambalaya.cost.latency import layer_latency
from mambalaya.einsum.ir import Role
from mambalaya.einsum.stats import einsum_ops
from mambalaya.errors import SpecError
from mambalaya.execute import carry_states, execute
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads import build_layer, resolve_model
from mambalaya.workloads.blocks.attention import (
    ATTENTION_REGION,
    KEY_BLOCK,
    AttentionConfig,
    append_kv,
    attention_constants,
    attention_layer,
    cache_from_hf,
)
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig
from mambalaya.workloads.blocks.masks import key_block_mask
from mambalaya.workloads.families.bamba import HybridConfig, hybrid_inputs, hybrid_layer
from mambalaya.workloads.families.base import family_inputs
from mambalaya.workloads.families.falcon_h1 import FalconH1Model
from mambalaya.workloads.families.olmo_hybrid import OlmoHybridModel
from mambalaya.workloads.precision import apply_policy

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)

#: The prompt length of every run here; each key block below makes a different padding.
L = 100
#: 32: the last block padded in prefill (100 = 3*32 + 4) and in every decode step; 50: whole
#: blocks in prefill, and a decode step's last block holds one real key (101 = 2*50 + 1); 4:
#: whole blocks in prefill, many blocks.
KEY_BLOCKS = (32, 50, 4)
TOL = 1e-5


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


# --------------------------------------------------------------------------------------------
# the layers: Bamba (the shared attention block), Falcon-H1 and OLMo-Hybrid (their own lines)
# --------------------------------------------------------------------------------------------

BAMBA = HybridConfig(d_model=32, layer_types=("mamba", "attention"), d_ff=48, n_heads=4, n_kv_heads=2, head_dim=8,
                     partial_rotary_factor=0.5, mamba_heads=4, mamba_headdim=16, mamba_d_state=4, vocab_size=8,
                     mamba_chunk_size=4)
FALCON = FalconH1Model(d_model=32, layer_types=("parallel",), vocab_size=16, d_ff=48, n_heads=4, n_kv_heads=2,
                       head_dim=8, rope_theta=1000.0, mamba_d_ssm=64, mamba_heads=8, mamba_d_state=8, mamba_ngroups=2,
                       mamba_chunk_size=4)
OLMO = OlmoHybridModel.of(GatedDeltaNetConfig(d_model=32, layer_types=("linear_attention", "full_attention"),
                                              num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=6, chunk_size=4,
                                              d_ff=48, n_heads=4, n_kv_heads=2, vocab_size=16), rope_theta=500.0)


def _bamba(phase: str, seq_len: int, batch: int, softmax: str, key_block: int):
    return hybrid_layer(BAMBA, "attention", batch=batch, seq_len=seq_len, phase=phase, softmax=softmax,
                        key_block=key_block)


def _family(model):
    layer_type = "parallel" if model is FALCON else "attention"

    def build(phase: str, seq_len: int, batch: int, softmax: str, key_block: int):
        scan = "recurrent" if phase == "prefill" and layer_type in model.SCANNED else None
        return model.layer(layer_type, batch=batch, seq_len=seq_len, phase=phase, scan=scan, softmax=softmax,
                           key_block=key_block)
    return build


OLMO_NOPE = OlmoHybridModel.of(OLMO.mixer, rope_theta=None)

LAYERS = {"bamba": (_bamba, lambda c, state: hybrid_inputs(c, BAMBA, state=state)),
          "falcon-h1": (_family(FALCON), lambda c, state: family_inputs(c, FALCON, state=state)),
          "olmo-hybrid": (_family(OLMO), lambda c, state: family_inputs(c, OLMO, state=state)),
          "olmo-hybrid-nope": (_family(OLMO_NOPE), lambda c, state: family_inputs(c, OLMO_NOPE, state=state))}
#: The layers checked against transformers (OLMo-Hybrid with its default rotary embedding).
HF_LAYERS = ("bamba", "falcon-h1", "olmo-hybrid")


def _output(cascade) -> str:
    return next(t for t, s in cascade.tensors.items() if s.role == Role.OUTPUT)


def _steps(layer, xs: list[np.ndarray], weights: dict, softmax: str, key_block: int, dtype: str
           ) -> tuple[list[np.ndarray], list[dict]]:
    """Run ``xs[0]`` as a prefill and each later input as a decode step carrying the state (KV
    cache, and Falcon-H1's conv and SSM states) with ``layer = (build, inputs)``: the outputs
    and the carried states."""
    build, inputs = layer
    outputs, states, state, heads = [], [], None, []
    for x in xs:
        phase = "prefill" if state is None else "decode"
        seq_len = x.shape[1] if state is None else state["VC0"].shape[1]
        c = build(phase, seq_len, x.shape[0], softmax, key_block)
        results = execute(c, {"X": x, **weights, **inputs(c, state)}, dtype=dtype, keep="all")
        carried = carry_states(c, results)
        carried.update(append_kv(c, {t: state[t] for t in ("KC0A", "KC0B", "VC0") if t in state} if state else None,
                                 results))
        outputs.append(results[_output(c)])
        heads.append(results["AAO" if "AAO" in c.tensors else "AO"])
        states.append(carried)
        state = carried
    return outputs, states, heads


def _random_weights(cascade, seed: int) -> dict[str, np.ndarray]:
    """Random weights; the Mamba mixer's ``A`` (``-exp(A_log)``) negative, or its state would
    grow without bound and drown the attention's share of the output."""
    rng = np.random.default_rng(seed)
    out = {t: rng.normal(0, 0.4, cascade.shape(t)) for t, s in cascade.tensors.items() if s.role == Role.WEIGHT
           and t in cascade.external_tensors()}
    return {t: -np.abs(a) if t == "A" else a for t, a in out.items()}


# --------------------------------------------------------------------------------------------
# blocked == three-pass (float64), every layer, every padding
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("key_block", KEY_BLOCKS)
def test_blocked_softmax_equals_three_pass(layer: str, key_block: int) -> None:
    """A prefill of L = 100 positions then two decode steps (101 and 102 keys): the blocked
    form's attention outputs per head, layer outputs and carried KV caches equal the three-pass
    form's (float64, 1e-12), with the last key block padded in prefill (32), whole (50, 4), and
    padded in decode (every size)."""
    build = LAYERS[layer][0]
    weights = _random_weights(build("prefill", L, 2, "three-pass", KEY_BLOCK), seed=3)
    xs = list(np.split(np.random.default_rng(4).standard_normal((2, L + 2, 32)) * 2.0, [L, L + 1], axis=1))
    blocked = _steps(LAYERS[layer], xs, weights, "blocked", key_block, "float64")
    reference = _steps(LAYERS[layer], xs, weights, "three-pass", KEY_BLOCK, "float64")
    for ours, ref in zip(blocked[0] + blocked[2], reference[0] + reference[2]):
        assert rel_err(ours, ref) <= 1e-12
    for ours, ref in zip(blocked[1], reference[1]):
        assert set(ours) == set(ref) and all(np.array_equal(ours[t], ref[t]) for t in ref if t.startswith(("K", "V")))


def test_the_key_mask_masks_later_and_padded_keys_in_both_phases() -> None:
    """KM[i,tb,tq]: 0 where key tb*TQ+tq <= the query's position, -inf after it; the padded keys
    (>= T) are always after it. A prefill of 5 in blocks of 4 (8 keys, 3 padded); a decode step
    after 5 cached positions (6 keys, 2 padded)."""
    att = AttentionConfig(d_model=16, n_heads=2, n_kv_heads=1)
    prefill = attention_layer(att, batch=1, seq_len=5, softmax="blocked", key_block=4)
    decode = attention_layer(att, batch=1, seq_len=5, phase="decode", softmax="blocked", key_block=4)
    assert prefill.shape("KM") == (5, 2, 4) and decode.shape("KM") == (1, 2, 4)
    mask = attention_constants(prefill, att)["KM"].reshape(5, 8)
    assert np.array_equal(np.isfinite(mask), np.tril(np.ones((5, 8), dtype=bool)))
    assert np.array_equal(np.isfinite(attention_constants(decode, att)["KM"].reshape(8)), np.arange(8) < 6)
    assert np.array_equal(key_block_mask(1, 2, 4, first=5), attention_constants(decode, att)["KM"])
    assert set(np.unique(mask)) == {0.0, -np.inf}


# --------------------------------------------------------------------------------------------
# against transformers
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_runs() -> dict:
    """transformers' Bamba (one attention layer), Falcon-H1 (one parallel layer) and OLMo-Hybrid
    (a Gated DeltaNet then an attention layer), eager attention, float32: a prefill of L = 100
    positions then two decode steps through one cache."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import hf_reference_bamba
    from hf_reference_families import run_hf_layers
    from transformers import FalconH1Config
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Model as HFFalcon
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridModel as HFOlmo

    falcon = FalconH1Config(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_d_ssm=64, mamba_n_heads=8,
                            mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4, attn_implementation="eager",
                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, key_multiplier=0.6)
    olmo = OlmoHybridConfig(vocab_size=16, pad_token_id=0, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2,
                            layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                            rms_norm_eps=1e-6, attn_implementation="eager")
    return {"bamba": hf_reference_bamba.run_hf_bamba(layer_types=["attention"], seq_len=L, n_decode=2, seed=21),
            "falcon-h1": run_hf_layers(HFFalcon, falcon, ["both"], seq_len=L, n_decode=2, seed=22),
            "olmo-hybrid": run_hf_layers(HFOlmo, olmo, ["recurrent", "attention"], seq_len=L, n_decode=2, seed=23)}


def _hf_layer(layer: str, ref: dict) -> tuple[int, dict, AttentionConfig, object]:
    """Our model, the layer index, its weights through our loader, its attention config."""
    from mambalaya.workloads.families.bamba import bamba_config_from_hf
    from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
    from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf
    from mambalaya.workloads.hf.weights_bamba import load_bamba_layer
    from mambalaya.workloads.hf.weights_families import load_falcon_h1_layer, load_olmo_hybrid_layer

    if layer == "bamba":
        model = bamba_config_from_hf(ref["config"])
        return 0, load_bamba_layer(ref["state_dict"], 0, model), model.attention(), model
    if layer == "falcon-h1":
        model = falcon_h1_config_from_hf(ref["config"])
        return 0, load_falcon_h1_layer(ref["state_dict"], 0, model), model.attention_config(), model
    model = olmo_hybrid_config_from_hf(ref["config"])
    return 1, load_olmo_hybrid_layer(ref["state_dict"], 1, model), model.attention_config(), model


@requires_hf
@pytest.mark.parametrize("layer", HF_LAYERS)
@pytest.mark.parametrize("key_block", [32, 50])
def test_blocked_softmax_matches_transformers(hf_runs: dict, layer: str, key_block: int) -> None:
    """The blocked form, the config.json and weights through our reader and loader, equals
    transformers' layer within 1e-5 (float32) for a prefill of 100 positions and two decode
    steps, and the KV cache it carries equals transformers' cache after every step."""
    ref = hf_runs[layer]
    k, weights, att, model = _hf_layer(layer, ref)
    if layer == "bamba":
        build = lambda phase, n, b, sm, kb: hybrid_layer(model, "attention", batch=b, seq_len=n, phase=phase,  # noqa: E731
                                                        softmax=sm, key_block=kb)
        inputs = lambda c, state: hybrid_inputs(c, model, state=state)  # noqa: E731
    else:
        layer_type = model.layer_types[k]

        def build(phase, n, b, sm, kb):
            scan = "recurrent" if phase == "prefill" and layer_type in model.SCANNED else None
            return model.layer(layer_type, batch=b, seq_len=n, phase=phase, scan=scan, softmax=sm, key_block=kb)
        inputs = lambda c, state: family_inputs(c, model, state=state)  # noqa: E731
    outputs, states, _ = _steps((build, inputs), ref["layers"][k]["inputs"], weights, "blocked", key_block, "float32")
    for n, (ours, theirs) in enumerate(zip(outputs, ref["layers"][k]["outputs"])):
        assert rel_err(ours, theirs) <= TOL, (n, rel_err(ours, theirs))
    for ours, cache in zip(states, ref["layers"][k]["caches"]):
        expected = cache_from_hf(att, cache["key"], cache["value"])
        assert all(rel_err(ours[t], expected[t]) <= TOL for t in expected)


@requires_hf
def test_the_runners_take_the_blocked_form(hf_runs: dict) -> None:
    """run_hybrid_layer and run_family_layer, as a user calls them, with softmax="blocked" (the
    default 64-key blocks: 100 and 101 keys both end in a padded block) equal transformers."""
    from mambalaya.execute.layers import run_family_layer, run_hybrid_layer

    for layer in ("bamba", "olmo-hybrid"):
        ref = hf_runs[layer]
        k, weights, _, model = _hf_layer(layer, ref)
        step = None
        for n, x in enumerate(ref["layers"][k]["inputs"]):
            run = run_hybrid_layer if layer == "bamba" else run_family_layer
            step = run(model, k, x, weights, state=None if step is None else step.state, softmax="blocked")
            assert step.cascade.size("TQ") == KEY_BLOCK and "blocked" in step.cascade.description
            assert rel_err(step.output, ref["layers"][k]["outputs"][n]) <= TOL, (layer, n)


# --------------------------------------------------------------------------------------------
# where it runs and what it costs
# --------------------------------------------------------------------------------------------

def test_the_blocked_value_product_runs_on_the_array_and_rescales_once_per_block() -> None:
    """OR's additive term PE[b,i,tb,tq,g,r]*V[b,tb*TQ+tq,g,e] is a matrix product (reduced over
    TQ, generational rank TB on both sides): on the array, B*I*TB*TQ*G*R*E MACs. Its rescale
    OR*CF and LR's are B*I*TB*G*R(*E) multiplies, once per block (the online form's run once per
    key); the block's max and sum are reductions on the lanes. Each count is the share of the
    (query, key block) pairs the causal prefill computes."""
    c = build_layer(resolve_model("bamba-9b"), phase="prefill", seq_len=1000, batch=2, layer_type="attention",
                    softmax="blocked")
    b, i, tb, tq, g, r, e = (c.size(n) for n in ("B", "I", "TB", "TQ", "G", "R", "E"))
    assert (i, tb, tq) == (1000, math.ceil(1000 / 64), 64)
    (product,) = contractions(c, c.einsum("OR"))
    assert product.on_array and product.roles["K"] == ("TQ",)
    ops = einsum_ops(c, c.einsum("OR"))
    from mambalaya.einsum.routing import computed_key_blocks
    share = computed_key_blocks(i, tb, tq)  # the causal prefill skips the key blocks it masks whole

    def seen(dense: int) -> int:
        return round(dense * share)
    assert ops["mac"] == seen(b * i * tb * tq * g * r * e)
    assert ops["mul"] == seen(b * i * tb * g * r * e)  # OR[tb-1]*CF: per block, not per key
    assert einsum_ops(c, c.einsum("LR"))["mul"] == seen(b * i * tb * g * r)
    assert einsum_ops(c, c.einsum("CF"))["exp"] == seen(b * i * tb * g * r)
    assert all(t.on_array for t in contractions(c, c.einsum("SC")))
    assert einsum_ops(c, c.einsum("KBX")) == {"max": seen(b * i * tb * tq * g * r)}
    online = build_layer(resolve_model("bamba-9b"), phase="prefill", seq_len=1000, batch=2, layer_type="attention",
                         softmax="online")
    assert contractions(online, online.einsum("OR")) == ()  # a rank-1 update per key: no MACs at all
    # CF and PE*V per key the query sees (the causal mask's dead keys skipped: einsum.dead_work)
    assert einsum_ops(online, online.einsum("OR"))["mul"] == 2 * b * (1000 * 1001 // 2) * g * r * e
    assert c.regions["attention"] == ATTENTION_REGION["blocked"]
    assert set(ATTENTION_REGION["blocked"]) <= {x.name for x in c.einsums}


def test_blocked_is_well_below_online_on_gpu_h100() -> None:
    """bamba-9b's attention layer, prefill of 8192 positions, batch 1, the ideal mapping on
    gpu-h100: the blocked form runs its value product on the tensor cores and is several times
    faster than the per-key online form (and no slower than the three-pass form's ideal)."""
    gpu, model = load_arch("gpu-h100"), resolve_model("bamba-9b")
    latency = {}
    for softmax in ("online", "blocked", "three-pass"):
        c = build_layer(model, phase="prefill", seq_len=8192, batch=1, layer_type="attention", softmax=softmax)
        latency[softmax] = layer_latency(gpu, c, named_mapping("ideal", c, None)).latency_s
    assert latency["blocked"] < latency["online"] / 4, latency
    assert latency["blocked"] <= latency["three-pass"] * 1.01, latency


def test_blocked_statistics_under_reference_kernels() -> None:
    """Under reference-kernels the block max and sum, running max, rescale factor, running sum and
    running output of the blocked form are float32 as the online form's (FlashAttention's
    row_max, row_sum and acc_o are float); the scores and the value cache keep the model's width."""
    c = apply_policy(_bamba("prefill", 16, 1, "blocked", 8), "reference-kernels", 16, family="bamba")
    assert {t: c.tensors[t].bits for t in ("KBX", "KBS", "MR", "CF", "LR", "OR", "SC", "VN")} == {
        "KBX": 32, "KBS": 32, "MR": 32, "CF": 32, "LR": 32, "OR": 32, "SC": 16, "VN": 16}


def test_refusals() -> None:
    att = AttentionConfig(d_model=16, n_heads=2, n_kv_heads=1)
    with pytest.raises(SpecError, match="causal must be True or False"):
        attention_layer(att, batch=1, seq_len=8, causal="no")  # type: ignore[arg-type]
    for bad in (0, -3, 2.5, True):
        with pytest.raises(SpecError, match="key_block"):
            attention_layer(att, batch=1, seq_len=8, softmax="blocked", key_block=bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="'blocked'"):
        attention_layer(att, batch=1, seq_len=8, softmax="flash")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="key_block"):
        build_layer(resolve_model("bamba-9b"), phase="prefill", seq_len=64, batch=1, layer_type="attention",
                    softmax="online", key_block=32)
    for model in (FALCON, OLMO):
        with pytest.raises(SpecError, match="'blocked'"):
            model.layer(model.layer_types[-1], batch=1, seq_len=8, softmax="flash")


@pytest.mark.parametrize("softmax", ["three-pass", "online", "blocked"])
def test_a_non_causal_prefill_is_softmax_attention_over_every_key(softmax: str) -> None:
    """``causal=False`` (a non-causal kernel's work, as FlashAttention's benchmarks run it): every
    query sees every key, padded keys of the blocked form masked (100 keys in blocks of 32);
    its per-head output equals softmax(Q K^T * scale) V computed here, and differs from the
    causal one."""
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, partial_rotary_factor=0.0)
    heads = {}
    for causal in (False, True):
        c = attention_layer(att, batch=2, seq_len=L, softmax=softmax, key_block=32, causal=causal)
        assert ("(non-causal)" in c.description) == (not causal)
        x = np.random.default_rng(3).normal(size=(2, L, 32))
        results = execute(c, {"X": x, **_random_weights(c, 4), **attention_constants(c, att)}, dtype="float64",
                          keep="all")
        heads[causal] = results["AO"]
    q, k, v = results["QB"], results["KB"], results["V"]  # [b,i,g,r,p], [b,t,g,p], [b,t,g,e]
    scores = np.einsum("bigrp,btgp->bigrt", q, k) * att.head_channels ** -0.5
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("bigrt,btge->bigre", probs, v)
    assert rel_err(heads[False], expected) < 1e-12
    assert rel_err(heads[True], expected) > 1e-3
    if softmax == "blocked":
        none_padded = attention_layer(att, batch=1, seq_len=64, softmax="blocked", key_block=32, causal=False)
        assert "KM" not in none_padded.tensors  # no mask term where no key is masked or padded


# --------------------------------------------------------------------------------------------
# masked key blocks are skipped work (einsum.routing)
# --------------------------------------------------------------------------------------------

def test_computed_key_blocks_count_each_querys_blocks() -> None:
    from fractions import Fraction

    from mambalaya.einsum.routing import computed_key_blocks

    for queries in range(1, 40):
        for block in range(1, 9):
            for blocks in range(1, 9):
                seen = sum(min(blocks, i // block + 1) for i in range(queries))
                assert computed_key_blocks(queries, blocks, block) == Fraction(seen, queries * blocks)
    assert computed_key_blocks(2048, 32, 64) == Fraction(33, 64)  # (TB + 1) / (2 TB)


def test_a_causal_blocked_prefill_skips_the_key_blocks_its_mask_hides_whole() -> None:
    """In a causal blocked prefill, the Einsums over queries and key blocks (scores, block max
    and sum, running statistics and output) do the share of their dense work whose blocks a
    query sees, and the tensors they write move that share, off chip too; the per-head output
    and the projections are not scaled, nor is a non-causal prefill or a decode step (it sees
    every key). The eager three-pass form skips the same mask per key, not per block."""
    from fractions import Fraction

    from mambalaya.einsum.routing import computed_key_blocks, einsum_scale, tensor_scale
    from mambalaya.einsum.stats import einsum_stats

    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    causal = attention_layer(att, batch=1, seq_len=L, softmax="blocked", key_block=32)
    share = computed_key_blocks(L, 4, 32)
    assert share == Fraction(32 * (1 + 2 + 3) + 4 * 4, 100 * 4)
    core = {"SC", "KBX", "MR", "CF", "PE", "KBS", "LR", "OR"}
    for e in causal.einsums:
        assert einsum_scale(causal, e.name) == (share if e.name in core else 1), e.name
    assert {t for t in causal.tensors if tensor_scale(causal, t) != 1} == core | {"KM"}
    full = attention_layer(att, batch=1, seq_len=L, softmax="blocked", key_block=32, causal=False)
    dense = einsum_ops(full, full.einsum("OR"))
    assert einsum_ops(causal, causal.einsum("OR"))["mac"] == round(dense["mac"] * share)
    stats = {e.name: einsum_stats(causal, e) for e in causal.einsums}
    assert stats["SC"].write_bytes == round(causal.elements("SC") * share) * causal.tensors["SC"].bits / 8
    unfused = layer_latency(load_arch("marca-ideal"), causal, named_mapping("unfused", causal, None))
    unfused_full = layer_latency(load_arch("marca-ideal"), full, named_mapping("unfused", full, None))
    assert unfused.offchip_bytes < 0.75 * unfused_full.offchip_bytes
    for other in (full, attention_layer(att, batch=1, seq_len=L, phase="decode", softmax="blocked", key_block=32)):
        assert all(einsum_scale(other, e.name) == 1 for e in other.einsums), other.name
    eager = attention_layer(att, batch=1, seq_len=L, softmax="three-pass")
    per_key = Fraction(L + 1, 2 * L)  # the (query, key) pairs with key <= query
    for e in eager.einsums:
        assert einsum_scale(eager, e.name) == (per_key if e.name in {"SC", "MX", "EX", "SM", "PR", "AO"} else 1), e.name


def test_the_buffer_moves_only_the_unskipped_blocks_operands() -> None:
    """The on-chip buffer follows the same share: unfused, each core Einsum of a causal blocked
    prefill reads that share of the operands over queries and key blocks that the non-causal one
    reads (the key mask, scores, statistics), the others whole (the queries are read for every
    block a query sees; keys and values by an affine index, per key), and writes that share of
    its output; the output projection after the core is not scaled."""
    from mambalaya.cost.buffer import buffer_read_elements, group_buffer_accesses
    from mambalaya.einsum.routing import computed_key_blocks
    from mambalaya.fusion.mapping import FusionGroup

    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    layers = {causal: attention_layer(att, batch=1, seq_len=L, softmax="blocked", key_block=32, causal=causal)
              for causal in (True, False)}
    share = float(computed_key_blocks(L, 4, 32))
    skipped = {"SC": {"KM"}, "PE": {"SC", "MR"}, "OR": {"CF", "PE"}, "O": set()}  # read at [.., i, tb, ..]
    for name in ("SC", "PE", "OR", "O"):
        got = {causal: group_buffer_accesses(c, FusionGroup(name, (name,), ())) for causal, c in layers.items()}
        scale = share if name != "O" else 1.0
        full, e = layers[False], layers[False].einsum(name)
        group = FusionGroup(name, (name,), ())
        expected = sum(buffer_read_elements(full, group, t, [a for a in e.inputs if a.tensor == t])
                       * (share if t in skipped[name] else 1.0) for t in dict.fromkeys(e.input_tensors) if t != name)
        assert math.isclose(got[True].einsum_read_bytes[name], expected, rel_tol=1e-12), name
        assert math.isclose(got[True].einsum_write_bytes[name], got[False].einsum_write_bytes[name] * scale,
                            rel_tol=1e-12)


@pytest.mark.parametrize("softmax,rank", [("blocked", "TB"), ("online", "T")])
def test_the_running_output_reaches_the_buffer_at_the_last_key_only(softmax: str, rank: str) -> None:
    """Fused, the running sum ``LR`` (and the blocked form's running output ``OR``, a product
    over each block's keys) are carried by the lanes that accumulate them, and the per-head
    output reads them at the last key (block) only: the buffer receives that position, whole,
    not every step's, as a FlashAttention kernel keeps its accumulator in registers and writes
    it once. The online form's ``OR``, one lane's element per key, never reaches the buffer
    (registers as a level). The running max ``MR``, which the exponentials read at every step,
    is written at every step. The tiled executor counts the same bytes."""
    from mambalaya.cost.buffer import group_buffer_accesses
    from mambalaya.einsum.routing import tensor_scale
    from mambalaya.execute.tiled import run_tiled
    from mambalaya.fusion.group_analysis import analyse
    from mambalaya.fusion.mapping import FusionGroup, Loop, Mapping

    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    c = attention_layer(att, batch=1, seq_len=L, softmax=softmax, key_block=32)
    core = tuple(e.name for e in c.einsums if e.name in ATTENTION_REGION[softmax])
    last = frozenset({c.size(rank) - 1})
    facts = analyse(c, core)
    kept = {"LR": (rank, last)} | ({"OR": (rank, last)} if softmax == "blocked" else {})
    assert {n: facts.kept_at(c, n) for n in facts.kept} == kept and ("OR" in facts.in_registers) == (softmax == "online")
    group = FusionGroup("attn", core, (Loop("I", 20),))
    accesses = group_buffer_accesses(c, group)
    for name in ("OR", "LR"):
        one_position = c.elements(name) // c.size(rank) * c.tensors[name].bits / 8
        assert accesses.einsum_write_bytes[name] == (one_position if name in kept else 0.0), name
    assert accesses.einsum_write_bytes["MR"] == c.elements("MR") * float(tensor_scale(c, "MR")) * c.tensors["MR"].bits / 8
    rng = np.random.default_rng(0)
    arrays = {t: rng.normal(0, 0.4, c.shape(t)) for t in c.external_tensors()} | attention_constants(c, att)
    rest = tuple(FusionGroup(f"G{n}", (e.name,), ()) for n, e in enumerate(c.einsums) if e.name not in core)
    run = run_tiled(c, Mapping("fused-core", (group, *rest), None), arrays)
    for name in ("OR", "LR", "MR"):
        assert run.buffer_write_bytes[("attn", name)] == accesses.einsum_write_bytes[name], name
