"""Attention and MLP cascades, and the layer types of a hybrid model (Bamba): the executor
against transformers' BambaModel (random weights, CPU), the two softmax forms against each
other, and the cascades' statistics against hand formulas."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mambalaya.einsum import dump_cascade, loads_cascade
from mambalaya.einsum.stats import cascade_stats
from mambalaya.errors import SpecError
from mambalaya.execute import carry_states, execute
from mambalaya.search.mappings import named_mapping
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads.blocks.attention import (
    CACHE_IN,
    CACHE_OUT,
    AttentionConfig,
    append_kv,
    attention_constants,
    attention_layer,
    cache_from_hf,
    parse_attention_config,
    weights_from_projections,
)
from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _layer_weights(sd: dict, k: int, prefix: str) -> dict[str, np.ndarray]:
    head = f"layers.{k}.{prefix}"
    return {name[len(head):]: v for name, v in sd.items() if name.startswith(head)}


def _mlp_block(config: dict, sd: dict, k: int, x: np.ndarray) -> np.ndarray:
    mlp = MLPConfig(d_model=config["hidden_size"], d_ff=config["intermediate_size"], norm_eps=config["rms_norm_eps"])
    c = mlp_layer(mlp, batch=x.shape[0], seq_len=x.shape[1])
    ff = _layer_weights(sd, k, "feed_forward.")
    weights = {"WN": sd[f"layers.{k}.pre_ff_layernorm.weight"], "WG": ff["gate_proj.weight"].T,
               "WU": ff["up_proj.weight"].T, "WDN": ff["down_proj.weight"].T}
    return execute(c, {"X": x, **weights}, dtype="float32")["XO"]


def _attention_config(config: dict) -> AttentionConfig:
    return AttentionConfig(
        d_model=config["hidden_size"], n_heads=config["num_attention_heads"], n_kv_heads=config["num_key_value_heads"],
        rope_theta=config["rope_parameters"]["rope_theta"], partial_rotary_factor=0.5, norm_eps=config["rms_norm_eps"],
    )


def _run_attention_layer(ref: dict, k: int, softmax: str) -> tuple[list[np.ndarray], list[dict]]:
    cfg, sd, layer = ref["config"], ref["state_dict"], ref["layers"][k]
    att = _attention_config(cfg)
    proj = _layer_weights(sd, k, "self_attn.")
    weights = weights_from_projections(
        att, norm=sd[f"layers.{k}.input_layernorm.weight"], q_proj=proj["q_proj.weight"],
        k_proj=proj["k_proj.weight"], v_proj=proj["v_proj.weight"], o_proj=proj["o_proj.weight"],
    )
    outputs, caches, cache = [], [], None
    for n, x in enumerate(layer["inputs"]):
        cached = 0 if cache is None else cache["VC0"].shape[1]
        phase = "prefill" if n == 0 else "decode"
        c = attention_layer(att, batch=x.shape[0], seq_len=x.shape[1] if n == 0 else cached, phase=phase, softmax=softmax)
        arrays = {"X": x, **weights, **attention_constants(c, att, start=cached), **(cache or {})}
        result = execute(c, arrays, dtype="float32")
        outputs.append(_mlp_block(cfg, sd, k, result["XO"]))
        cache = append_kv(c, cache, result)
        caches.append(cache)
    return outputs, caches


def _run_mamba_layer(ref: dict, k: int) -> list[np.ndarray]:
    cfg, sd, layer = ref["config"], ref["state_dict"], ref["layers"][k]
    m2 = Mamba2Config(
        d_model=cfg["hidden_size"], d_state=cfg["mamba_d_state"], headdim=cfg["mamba_d_head"],
        ngroups=cfg["mamba_n_groups"], expand=cfg["mamba_expand"], d_conv=cfg["mamba_d_conv"],
        chunk_size=cfg["mamba_chunk_size"], norm_eps=cfg["rms_norm_eps"],
    )
    block = {"norm.weight": sd[f"layers.{k}.input_layernorm.weight"]}
    block.update({f"mixer.{name}": v for name, v in _layer_weights(sd, k, "mamba.").items()})
    weights = load_mamba2_layer(block, dtype="float32", ngroups=m2.ngroups)
    outputs, states = [], None
    for n, x in enumerate(layer["inputs"]):
        c = mamba2_layer(m2, batch=x.shape[0], seq_len=x.shape[1], phase="prefill" if n == 0 else "decode", state_io=True)
        if states is None:
            states = {t: np.zeros(c.shape(t), dtype=np.float32) for t in ("CSX0", "CSB0", "CSC0", "H0")}
        result = execute(c, {"X": x, **weights, **states}, dtype="float32")
        states = carry_states(c, result)
        outputs.append(_mlp_block(cfg, sd, k, result["XO"]))
    return outputs


@pytest.fixture(scope="module")
def bamba_reference() -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import hf_reference_bamba as hf

    return hf.run_hf_bamba(layer_types=["mamba", "attention", "attention"], n_kv_heads=2, seq_len=8, n_decode=3, seed=3)


@requires_hf
@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_attention_layer_prefill_and_decode_match_transformers(bamba_reference: dict, softmax: str) -> None:
    """Both attention layers of a Bamba model (attention + its gated MLP), prefill of 8 tokens
    then 3 decode steps through the KV cache, equal transformers within 1e-5 (float32); the
    cache we append equals transformers' after every step."""
    for k in (1, 2):
        layer = bamba_reference["layers"][k]
        outputs, caches = _run_attention_layer(bamba_reference, k, softmax)
        errors = [rel_err(a, b) for a, b in zip(outputs, layer["outputs"])]
        assert len(errors) == 4 and max(errors) <= 1e-5, errors
        att = _attention_config(bamba_reference["config"])
        for ours, theirs in zip(caches, layer["caches"]):
            expected = cache_from_hf(att, theirs["key"], theirs["value"])
            assert set(ours) == set(expected)
            assert all(rel_err(ours[t], expected[t]) <= 1e-5 for t in expected)


@requires_hf
def test_mamba_layer_of_the_hybrid_matches_transformers(bamba_reference: dict) -> None:
    """Bamba's Mamba layer is our Mamba-2 cascade (chunked prefill state carried into decode)
    followed by the gated MLP."""
    layer = bamba_reference["layers"][0]
    outputs = _run_mamba_layer(bamba_reference, 0)
    errors = [rel_err(a, b) for a, b in zip(outputs, layer["outputs"])]
    assert len(errors) == 4 and max(errors) <= 1e-5, errors


# --------------------------------------------------------------------------------------------
# the two softmax forms; statistics; text round trip; bad input
# --------------------------------------------------------------------------------------------

def _random_attention_weights(att: AttentionConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    d, e = att.d_model, att.head_channels
    return weights_from_projections(
        att, norm=rng.uniform(0.5, 1.5, d), q_proj=rng.normal(0, d ** -0.5, (att.n_heads * e, d)),
        k_proj=rng.normal(0, d ** -0.5, (att.n_kv_heads * e, d)), v_proj=rng.normal(0, d ** -0.5, (att.n_kv_heads * e, d)),
        o_proj=rng.normal(0, (att.n_heads * e) ** -0.5, (d, att.n_heads * e)),
    )


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("rotary", [0.0, 0.5, 1.0])
def test_online_softmax_equals_three_pass(phase: str, rotary: float) -> None:
    """The one-pass online-softmax cascade computes the three-pass one's values (float64)."""
    rng = np.random.default_rng(17)
    att = AttentionConfig(d_model=24, n_heads=6, n_kv_heads=3, partial_rotary_factor=rotary)
    weights = _random_attention_weights(att, rng)
    seq_len = 11
    results = []
    for softmax in ("three-pass", "online"):
        c = attention_layer(att, batch=2, seq_len=seq_len, phase=phase, softmax=softmax)
        x = np.random.default_rng(5).standard_normal(c.shape("X")) * 3.0
        cache = {t: np.random.default_rng(6).standard_normal(c.shape(t)) for t in ("KC0A", "KC0B", "VC0") if t in c.tensors}
        r = execute(c, {"X": x, **weights, **attention_constants(c, att, start=seq_len if phase == "decode" else 0), **cache},
                    dtype="float64")
        results.append(r)
    assert np.max(np.abs(results[0]["XO"] - results[1]["XO"])) <= 1e-12 * np.max(np.abs(results[0]["XO"]))
    assert np.array_equal(results[0]["VN"], results[1]["VN"])


@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_attention_statistics_equal_hand_formulas(softmax: str) -> None:
    """MACs of QK^T and AV (the online form's multiplies and adds), the projections' MACs, and
    the KV-cache bytes a decode step reads."""
    att = AttentionConfig(d_model=64, n_heads=8, n_kv_heads=2, partial_rotary_factor=0.5)
    b, L, hd, h, g = 3, 20, 8, 8, 2
    pre = cascade_stats(attention_layer(att, batch=b, seq_len=L, softmax=softmax))
    per = {row.name: row for row in pre.einsums}
    # scores: the rotated and the pass-through halves of every head, every (i, t) pair with t <= i
    # (the causal mask's dead pairs are skipped work: einsum.dead_work)
    pairs = L * (L + 1) // 2
    assert per["SC"].ops["mac"] == b * pairs * h * hd
    if softmax == "three-pass":  # AV as a reduction over the keys
        assert per["AO"].ops["mac"] == b * pairs * h * hd
        assert per["MX"].ops["max"] == per["EX"].ops["exp"] == b * pairs * h
    else:  # AV folded into the recurrence: OR[t-1]*CF + PE*V at every key seen, then one divide per output
        assert per["OR"].ops == {"mul": 2 * b * pairs * h * hd, "add": b * pairs * h * hd}
        assert per["MR"].ops == {"max": b * pairs * h} and per["AO"].ops == {"div": b * L * h * hd}
    projections = sum(per[n].ops["mac"] for n in ("QA", "QB", "KA", "KB", "V", "O"))
    assert projections == b * L * 64 * (h * hd + 2 * g * hd) + b * L * h * hd * 64
    dec = attention_layer(att, batch=b, seq_len=L, phase="decode", softmax=softmax)
    assert dec.size("T") == L + 1 and dec.size("M") == L
    per_dec = {row.name: row for row in cascade_stats(dec).einsums}
    assert per_dec["SC"].ops["mac"] == b * 1 * (L + 1) * h * hd
    # a decode step reads the L cached keys and values once and appends one position (16-bit)
    unfused = mapping_traffic(dec, named_mapping("unfused", dec, None))
    cache_reads = sum(v for grp in unfused.groups for t, v in grp.read_bytes.items() if t in CACHE_IN)
    assert cache_reads == 2 * b * L * g * hd * 2
    appended = sum(v for grp in unfused.groups for t, v in grp.write_bytes.items() if t in CACHE_OUT)
    assert appended == 2 * b * g * hd * 2


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_attention_and_mlp_text_round_trip(phase: str, softmax: str) -> None:
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, partial_rotary_factor=0.5)
    c = attention_layer(att, batch=2, seq_len=5, phase=phase, softmax=softmax)
    assert loads_cascade(dump_cascade(c)).einsums == c.einsums
    m = mlp_layer(MLPConfig(d_model=32, d_ff=48), batch=2, seq_len=5, phase=phase)
    assert loads_cascade(dump_cascade(m)).einsums == m.einsums


def test_bad_attention_configs_name_the_field() -> None:
    with pytest.raises(SpecError, match="n_heads = 5 does not divide d_model = 32"):
        parse_attention_config({"d_model": 32, "n_heads": 5, "n_kv_heads": 5})
    with pytest.raises(SpecError, match="n_kv_heads = 3 does not divide n_heads = 4"):
        parse_attention_config({"d_model": 32, "n_heads": 4, "n_kv_heads": 3})
    with pytest.raises(SpecError, match="rotary_dim"):
        parse_attention_config({"d_model": 24, "n_heads": 4, "n_kv_heads": 2, "partial_rotary_factor": 0.5})
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2)
    with pytest.raises(SpecError, match="q_proj has shape"):
        weights_from_projections(att, norm=np.ones(32), q_proj=np.ones((16, 32)), k_proj=np.ones((16, 32)),
                                 v_proj=np.ones((16, 32)), o_proj=np.ones((32, 32)))


# --------------------------------------------------------------------------------------------
# the tiled executor proves the traffic model on attention and MLP cascades
# --------------------------------------------------------------------------------------------

_ATT = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, partial_rotary_factor=0.5)
#: A tiny Bamba-shaped model whose attention block is _ATT, for whole hybrid layers (mixer + MLP).
def _tiny_hybrid():
    from mambalaya.workloads.families.bamba import HybridConfig

    return HybridConfig(d_model=16, layer_types=("mamba", "attention"), d_ff=12, n_heads=4, n_kv_heads=2,
                        mamba_heads=4, mamba_headdim=8, mamba_d_state=2, mamba_chunk_size=2, mamba_d_conv=3,
                        vocab_size=8)


def hybrid_layer_for_tiles(layer_type: str, phase: str, seq_len: int):
    from mambalaya.workloads.families.bamba import hybrid_layer as build

    return build(_tiny_hybrid(), layer_type, batch=1, seq_len=seq_len, phase=phase)


_TILED_CASES = {
    "attention-prefill": (attention_layer(_ATT, batch=2, seq_len=6), 0),
    "attention-prefill-online": (attention_layer(_ATT, batch=2, seq_len=6, softmax="online"), 0),
    "attention-decode": (attention_layer(_ATT, batch=2, seq_len=5, phase="decode"), 5),
    "attention-decode-online": (attention_layer(_ATT, batch=1, seq_len=5, phase="decode", softmax="online"), 5),
    "mlp-prefill": (mlp_layer(MLPConfig(d_model=8, d_ff=12), batch=2, seq_len=5), None),
    # whole hybrid layers: the mixer chained into its MLP
    "hybrid-attention-prefill": (hybrid_layer_for_tiles("attention", "prefill", 4), 0),
    "hybrid-mamba-chunked": (hybrid_layer_for_tiles("mamba", "prefill", 4), None),
    "hybrid-attention-decode": (hybrid_layer_for_tiles("attention", "decode", 3), 3),
}


def _tiled_arrays(key: str) -> dict[str, np.ndarray]:
    c, start = _TILED_CASES[key]
    rng = np.random.default_rng(1)
    arrays = {t: rng.standard_normal(c.shape(t)) * 0.5 for t in c.external_tensors()}
    if start is not None:
        arrays.update(attention_constants(c, _ATT, start=start))
    if "A" in c.tensors:  # a Mamba mixer: a decaying SSM, and the chunked form's causal mask
        from mambalaya.workloads.blocks.mamba2 import mamba2_constants

        arrays["A"] = -np.abs(arrays["A"]) - 0.5
        arrays.update(mamba2_constants(c))
    return arrays


def _check_tiled(key: str, mapping) -> None:
    from mambalaya.execute.tiled import run_tiled

    c, _ = _TILED_CASES[key]
    arrays = _tiled_arrays(key)
    ref = execute(c, arrays)
    run = run_tiled(c, mapping, arrays)
    for t, value in ref.items():
        assert np.max(np.abs(run.outputs[t] - value)) <= 1e-12 * (np.max(np.abs(value)) or 1.0), t
    model = mapping_traffic(c, mapping)
    # to the byte: a masked tensor's live share is a float in the model, summed over its read steps
    # (2016.0000000000002 for 2016 bytes), so equal within float rounding, far below a byte
    same = lambda table: pytest.approx(table, rel=1e-12, abs=1e-9)  # noqa: E731
    for g in model.groups:
        assert run.group_read_bytes(g.group) == same(g.read_bytes), g.group
        assert run.group_write_bytes(g.group) == same(g.write_bytes), g.group
        assert run.onchip_peak_bytes[g.group] <= g.footprint_bytes
    assert run.offchip_bytes == same(model.offchip_bytes)


@pytest.mark.parametrize("key", list(_TILED_CASES))
@pytest.mark.parametrize("name", ["unfused", "stitched", "optimal"])
@pytest.mark.parametrize("buffer", [1024, 1 << 20])
def test_tiled_executor_equals_the_model_on_named_mappings(key: str, name: str, buffer: int) -> None:
    c, _ = _TILED_CASES[key]
    _check_tiled(key, named_mapping(name, c, buffer))


@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_tiled_executor_equals_the_model_on_random_legal_mappings() -> None:
    """Hypothesis draws groupings and fused loops (any rank, any tile, both halo policies) of
    the attention, MLP and whole hybrid-layer cascades; every legal one moves the bytes the
    model predicts."""
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st

    from mambalaya.fusion.mapping import FusionGroup, Loop, Mapping, MappingError, check_mapping

    @st.composite
    def cases(draw):
        key = draw(st.sampled_from(list(_TILED_CASES)))
        c, _ = _TILED_CASES[key]
        names = [e.name for e in c.einsums]
        cuts = draw(st.lists(st.booleans(), min_size=len(names) - 1, max_size=len(names) - 1))
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [len(names)]
        groups = []
        for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
            pool = [r for r in c.ranks if c.size(r) > 1]
            ranks = draw(st.lists(st.sampled_from(pool), unique=True, max_size=3))
            loops = tuple(Loop(r, draw(st.integers(1, c.size(r)))) for r in ranks)
            groups.append(FusionGroup(f"F{n}", tuple(names[a:b]), loops, draw(st.sampled_from(["retain", "recompute"]))))
        return key, Mapping("random", tuple(groups))

    @settings(max_examples=100, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(cases())
    def run(case) -> None:
        key, mapping = case
        try:
            mapping = check_mapping(_TILED_CASES[key][0], mapping)
        except MappingError:
            assume(False)
        _check_tiled(key, mapping)
        checked.append(key)

    checked: list[str] = []
    run()
    assert len(checked) >= 30 and len(set(checked)) == len(_TILED_CASES), sorted(set(_TILED_CASES) - set(checked))


# --------------------------------------------------------------------------------------------
# the hybrid family (Bamba): config, presets, weights through the loader core, whole layers
# --------------------------------------------------------------------------------------------

from mambalaya.einsum.compose import chain_cascades  # noqa: E402
from mambalaya.workloads.hf.weights_bamba import load_bamba_layer  # noqa: E402
from mambalaya.workloads.hf.loader import WeightLoadError  # noqa: E402
from mambalaya.workloads.families.bamba import (  # noqa: E402
    PRESETS as HYBRID_PRESETS,
    PUBLISHED_PARAMETERS_B,
    bamba_config_from_hf,
    hybrid_layer,
)
from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions  # noqa: E402


@requires_hf
@pytest.mark.parametrize("scan", ["chunked", "recurrent"])
@pytest.mark.parametrize("softmax", ["three-pass", "online"])
def test_whole_bamba_layers_from_the_loader_match_transformers(bamba_reference: dict, scan: str, softmax: str) -> None:
    """Each layer as one cascade (mixer then MLP), its config read from transformers'
    config.json and its weights through the loader core, equals transformers' decoder layer in
    prefill and in every decode step (state and KV cache carried), within 1e-5."""
    config = bamba_config_from_hf(bamba_reference["config"])
    assert config.layer_types == ("mamba", "attention", "attention")
    for k, layer in enumerate(bamba_reference["layers"]):
        weights = load_bamba_layer(bamba_reference["state_dict"], k, config)
        state: dict = {}
        for n, x in enumerate(layer["inputs"]):
            phase = "prefill" if n == 0 else "decode"
            if layer["type"] == "attention":
                cached = 0 if n == 0 else state["VC0"].shape[1]
                c = hybrid_layer(config, "attention", batch=x.shape[0], seq_len=x.shape[1] if n == 0 else cached,
                                 phase=phase, softmax=softmax)
                result = execute(c, {"X": x, **weights, **attention_constants(c, config.attention(), start=cached),
                                     **state}, dtype="float32")
                state = append_kv(c, state or None, result)
                y = result["FF_XO"]
            else:
                c = hybrid_layer(config, "mamba", batch=x.shape[0], seq_len=x.shape[1], phase=phase,
                                 scan=scan if n == 0 else None)
                state = state or {t: np.zeros(c.shape(t), dtype=np.float32) for t in ("CSX0", "CSB0", "CSC0", "H0")}
                arrays = {"X": x, **weights, **state}
                if "LM" in c.tensors:
                    from mambalaya.workloads.blocks.mamba2 import mamba2_constants

                    arrays.update(mamba2_constants(c))
                result = execute(c, arrays, dtype="float32")
                state = carry_states(c, result)
                y = result["FF_XO"] if "C" not in c.ranks else chunked_output_to_positions(result["FF_XO"], x.shape[1])
            assert rel_err(y, layer["outputs"][n]) <= 1e-5, (k, n)


def test_bamba_9b_preset_has_the_published_parameter_count() -> None:
    config = HYBRID_PRESETS["bamba-9b"]
    assert config.layer_counts() == {"mamba": 29, "attention": 3}
    assert round(config.model_parameters() / 1e9, 2) == PUBLISHED_PARAMETERS_B["bamba-9b"]
    # by hand: 2 x (128000 x 4096) embeddings; per attention layer q, o 4096x4096 and k, v 4096x1024;
    # per Mamba layer in_proj 4096 x (2*8192 + 2*128 + 128), out_proj 8192 x 4096, conv 8448 x 5, ...
    attention = 4096 + 2 * 4096 * 4096 + 2 * 4096 * 1024
    mamba = 4096 + 4096 * (2 * 8192 + 2 * 128 + 128) + 8448 * 4 + 8448 + 3 * 128 + 8192 + 8192 * 4096
    mlp = 4096 + 3 * 4096 * 14336
    assert config.model_parameters() == 2 * 128000 * 4096 + 3 * (attention + mlp) + 29 * (mamba + mlp) + 4096


def test_bamba_config_json_gives_the_preset_and_bad_fields_are_named() -> None:
    data = {"model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "attn_layer_indices": [9, 18, 27],
            "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_d_state": 128, "mamba_n_groups": 1,
            "mamba_expand": 2, "mamba_d_conv": 4, "mamba_chunk_size": 256, "vocab_size": 128000,
            "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    assert bamba_config_from_hf(data) == HYBRID_PRESETS["bamba-9b"]
    # transformers builds the pattern from attn_layer_indices and cannot set layers_block_type: a
    # list that agrees is accepted, one that does not is refused (it would be another model)
    agreeing = ["full_attention" if i in (9, 18, 27) else "linear_attention" for i in range(32)]
    assert bamba_config_from_hf({**data, "layers_block_type": agreeing}) == HYBRID_PRESETS["bamba-9b"]
    pattern = ["mamba"] * 9 + ["attention"] + ["mamba"] * 22
    with pytest.raises(SpecError, match=r"field layers_block_type lists 32 layers and makes layer 18 mamba, but "
                                        r"transformers .* attn_layer_indices = \[9, 18, 27\]"):
        bamba_config_from_hf({**data, "layers_block_type": pattern})
    with pytest.raises(SpecError, match=r"field layers_block_type\[3\] is 'moe', not a layer type"):
        bamba_config_from_hf({**data, "layers_block_type": ["mamba"] * 3 + ["moe"] + ["mamba"] * 28})
    with pytest.raises(SpecError, match="field num_attention_heads = 30 does not divide hidden_size = 4096"):
        bamba_config_from_hf({**data, "num_attention_heads": 30})
    with pytest.raises(SpecError, match="field attn_layer_indices names layer 32, outside 0..31"):
        bamba_config_from_hf({**data, "attn_layer_indices": [9, 32]})
    with pytest.raises(SpecError, match="field mlp_bias is True"):
        bamba_config_from_hf({**data, "mlp_bias": True})
    with pytest.raises(SpecError, match="field num_key_value_heads = 7 does not divide num_attention_heads = 32"):
        bamba_config_from_hf({**data, "num_key_value_heads": 7})
    # wrong types are one error naming the field, not a traceback
    for key, value, needle in (("hidden_size", "64", "field hidden_size must be a positive integer"),
                               ("mamba_expand", "2", "field mamba_expand must be a positive integer"),
                               ("rope_parameters", [1, 2], "field rope_parameters must be a mapping"),
                               ("layers_block_type", [["mamba"]] * 32, r"field layers_block_type\[0\] is \['mamba'\]"),
                               ("rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "rope_parameters.factor"),
                               ("rope_parameters", {"rope_type": "linear"}, "rope_type is 'linear'"),
                               ("mamba_d_head", 32, "mamba_n_heads \\* mamba_d_head = 4096 is not")):
        with pytest.raises(SpecError, match=needle):
            bamba_config_from_hf({**data, key: value})
    # the chunked scan of a hybrid Mamba layer needs whole chunks (its MLP would count padding)
    with pytest.raises(SpecError, match="pads L = 100 to a multiple of the chunk size 256"):
        hybrid_layer(HYBRID_PRESETS["bamba-9b"], "mamba", batch=1, seq_len=100, scan="chunked")
    assert "C" not in hybrid_layer(HYBRID_PRESETS["bamba-9b"], "mamba", batch=1, seq_len=100, scan="recurrent").ranks


def test_bamba_loader_names_what_does_not_fit() -> None:
    config = bamba_config_from_hf({"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "intermediate_size": 24, "attn_layer_indices": [1],
                                    "mamba_n_heads": 4, "mamba_d_state": 4, "vocab_size": 8})
    rng = np.random.default_rng(0)
    layer1 = {"input_layernorm.weight": (16,), "pre_ff_layernorm.weight": (16,),
              "feed_forward.gate_proj.weight": (24, 16), "feed_forward.up_proj.weight": (24, 16),
              "feed_forward.down_proj.weight": (16, 24), "self_attn.q_proj.weight": (16, 16),
              "self_attn.k_proj.weight": (8, 16), "self_attn.v_proj.weight": (8, 16), "self_attn.o_proj.weight": (16, 16)}
    sd = {f"model.layers.1.{k}": rng.standard_normal(s).astype(np.float32) for k, s in layer1.items()}
    weights = load_bamba_layer(sd, 1, config)
    assert set(weights) == {"WN", "WQA", "WQB", "WKA", "WKB", "WV", "WO", "FF_WN", "FF_WG", "FF_WU", "FF_WDN"}
    bad = dict(sd, **{"model.layers.1.self_attn.k_proj.weight": np.zeros((16, 16), np.float32)})
    with pytest.raises(WeightLoadError, match=r"'model.layers.1.self_attn.k_proj.weight'.*shape \[16, 16\], expected \[8, 16\]"):
        load_bamba_layer(bad, 1, config)
    with pytest.raises(WeightLoadError, match="self_attn.k_proj.weight'.*an attention weight, but the config makes "
                                              "this a Mamba layer"):  # layer 0 of this config is a Mamba layer
        load_bamba_layer({k.replace("layers.1", "layers.0"): v for k, v in sd.items()}, 0, config)
    with pytest.raises(WeightLoadError, match="Layer 5 is not a layer of this Bamba config"):
        load_bamba_layer(sd, 5, config)


def test_chained_cascade_equals_running_the_blocks_one_after_the_other() -> None:
    att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, partial_rotary_factor=0.5)
    first = attention_layer(att, batch=2, seq_len=5)
    second = mlp_layer(MLPConfig(d_model=16, d_ff=24, norm_eps=1e-6), batch=2, seq_len=5)
    chained = chain_cascades(first, second, prefix="FF_")
    rng = np.random.default_rng(2)
    a1 = {t: rng.standard_normal(first.shape(t)) for t in first.external_tensors()}
    a1.update(attention_constants(first, att))
    a2 = {t: rng.standard_normal(second.shape(t)) for t in second.external_tensors() if t != "X"}
    r1 = execute(first, a1)
    r2 = execute(second, {"X": r1["XO"], **a2})
    rc = execute(chained, {**a1, **{"FF_" + k: v for k, v in a2.items()}})
    assert np.array_equal(rc["FF_XO"], r2["XO"]) and "XO" not in chained.output_tensors()
    assert chained.params["FF_eps"] == 1e-6 and chained.params["eps"] == 1e-5  # differing values are renamed
    with pytest.raises(SpecError, match="rank B has size 2 in one and 3 in the other"):
        chain_cascades(first, mlp_layer(MLPConfig(d_model=16, d_ff=24), batch=3, seq_len=5), prefix="FF_")
    with pytest.raises(SpecError, match="exist in both"):
        chain_cascades(first, second, prefix="")


def test_every_hybrid_familys_scanned_layer_refuses_a_chunked_length_its_chunk_does_not_divide() -> None:
    """One rule on every layer that runs more than its scan on the positions: the chunked scan pads
    L to whole chunks, which the gate, norm, projections and residual after it would count too
    (Nemotron-H's and Zamba2's Mamba layers counted 256 rows of output projection for 200 of input).
    Every hybrid preset's scanned layer types refuse it, and build the recurrent form."""
    from mambalaya.workloads import PRESETS, build_layer
    from mambalaya.workloads.families.base import is_hybrid, scanned_layer_types

    checked = 0
    for name, config in PRESETS.items():
        if not is_hybrid(config):
            continue
        for layer_type in scanned_layer_types(config):
            with pytest.raises(SpecError, match="pads L = 100 to a multiple of the chunk size|only the recurrent scan"):
                build_layer(config, phase="prefill", seq_len=100, batch=1, scan="chunked", layer_type=layer_type)
            built = build_layer(config, phase="prefill", seq_len=100, batch=1, scan="recurrent", layer_type=layer_type)
            assert built.size("I") == 100, (name, layer_type)
            checked += 1
    assert checked >= 8
