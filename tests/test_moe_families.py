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
    from mambalaya.execute.layers import run_moe_family_layer
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf
    from mambalaya.workloads.hf.weights_moe import load_moe_family_layer

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
    from mambalaya.workloads.blocks.attention import cache_from_hf

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


# --------------------------------------------------------------------------------------------
# cost: the routed work, the expert weights a pass reads, decode is weight-bound

def _moe_cfg(**kw):
    from mambalaya.workloads.blocks.moe import MoEConfig

    return MoEConfig(**{"d_model": 64, "d_ff": 96, "n_experts": 16, "top_k": 2, "router": "softmax-topk", **kw})


def test_routed_einsums_count_only_the_selected_experts() -> None:
    """The experts' MACs are tokens*top_k*D*F per projection (not tokens*n_experts*...), the
    combine tokens*top_k*D; the router stays dense (every expert's logit, every comparison)."""
    from mambalaya.einsum.stats import cascade_stats
    from mambalaya.workloads.blocks.moe import moe_layer

    b, L, d, f, n, k = 3, 5, 64, 96, 16, 2
    per = {r.name: r for r in cascade_stats(moe_layer(_moe_cfg(), batch=b, seq_len=L)).einsums}
    assert per["GT"].ops["mac"] == per["UP"].ops["mac"] == b * L * k * d * f
    assert per["EO"].ops["mac"] == b * L * k * f * d
    assert per["MO"].ops["mac"] == b * L * k * d
    assert per["LG"].ops["mac"] == b * L * d * n and per["NB"].ops["step"] == b * L * n * n


@pytest.mark.parametrize("batch, read", [(1, 2), (4, 8), (8, 16), (64, 16)])
def test_decode_reads_the_weights_of_min_experts_tokens_topk(batch: int, read: int) -> None:
    """Uniform routing: a decode step reads min(n_experts, batch*top_k) experts' weights, once."""
    from mambalaya.search.mappings import named_mapping
    from mambalaya.cost.traffic import mapping_traffic
    from mambalaya.workloads.blocks.moe import moe_layer

    c = moe_layer(_moe_cfg(), batch=batch, seq_len=1, phase="decode")
    assert c.params["moe_experts_read"] == read
    traffic = mapping_traffic(c, named_mapping("unfused", c, None))
    expert_bytes = 64 * 96 * 2  # one expert's one projection, 16-bit
    for w in ("WG", "WU", "WDN"):
        assert traffic.by_tensor[w][0] == read * expert_bytes


def test_moe_decode_is_weight_bound_on_the_experts_used() -> None:
    """jamba-v0.1's MoE block, one decode step at batch 1 on the Mambalaya design: the two
    selected experts' weights (2/16 of all) are more than 95% of the MoE block's off-chip bytes,
    and more than 70% of the whole Mamba + MoE layer's with the optimal mapping."""
    from mambalaya.arch import load_arch, with_settings
    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.workloads import PRESETS
    from mambalaya.workloads.blocks.moe import moe_layer

    cfg = PRESETS["jamba-v0.1"]
    moe = moe_layer(cfg.moe(), batch=1, seq_len=1, phase="decode")
    from mambalaya.search.mappings import named_mapping
    from mambalaya.cost.traffic import mapping_traffic

    traffic = mapping_traffic(moe, named_mapping("unfused", moe, None))
    experts = sum(traffic.by_tensor[w][0] for w in ("WG", "WU", "WDN"))
    assert experts / traffic.offchip_bytes > 0.95
    assert experts == 2 * 3 * cfg.d_model * cfg.d_ff * 2
    roomy = with_settings(load_arch("mambalaya"), ["memory.offchip_capacity_bytes=200GB"])  # jamba-v0.1: ~103 GB
    ev = evaluate_hybrid(roomy, "jamba-v0.1", cfg, phase="decode", seq_len=1024, batch=1)
    layer = ev.layers["mamba-moe"].result
    # the whole Mamba+MoE layer: the Mamba-1 mixer's weights are most of the rest (77% here)
    assert layer.offchip_bytes >= experts and experts / layer.offchip_bytes > 0.7


def test_routing_histogram_file(tmp_path) -> None:
    """A histogram file sets the experts read (those with tokens, at most tokens*top_k); bad ones
    are one SpecError naming the entry."""
    from mambalaya.workloads.blocks.moe import load_routing_histogram

    good = tmp_path / "h.yaml"
    good.write_text("fractions: [0.5, 0.25, 0.25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n")
    hist = load_routing_histogram(good, 16, 2)
    assert _moe_cfg(routing=hist).experts_read(64) == 3 and _moe_cfg(routing=hist).experts_read(1) == 2
    cases = {"[0.5, 0.5]": "has 2 fractions but the model has 16 experts",
             "[" + ", ".join(["-0.1"] + ["0.1"] * 11 + ["0"] * 4) + "]": r"routing histogram\[0\] is -0.1",
             "[" + ", ".join(["0.1"] * 16) + "]": "sums to 1.6",
             # a top-2 router cannot send every token to one expert (each token picks 2 distinct ones)
             "[" + ", ".join(["1"] + ["0"] * 15) + "]": r"routing histogram\[0\] is 1, above 1/top_k = 1/2",
             "[" + ", ".join(["0.6", "0.4"] + ["0"] * 14) + "]": r"above 1/top_k = 1/2"}
    for text, message in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(SpecError, match=message):
            load_routing_histogram(bad, 16, 2)


# --------------------------------------------------------------------------------------------
# presets and config.json

@requires_hf
@pytest.mark.parametrize("name", ["jamba-v0.1", "granite-4.0-h-tiny"])
def test_preset_parameters_match_published_and_transformers(name: str) -> None:
    """The count from the shapes rounds to the published total, and equals transformers' module
    built on the meta device from the same config (plus the LM head when untied)."""
    import torch
    import hf_reference_moe as hf
    from mambalaya.workloads.families.jamba_granite import MOE_PRESETS, MOE_PUBLISHED_PARAMETERS_B

    cfg = MOE_PRESETS[name]
    assert round(cfg.model_parameters() / 1e9) == MOE_PUBLISHED_PARAMETERS_B[name][0]
    if name == "jamba-v0.1":
        fields: dict = {}
    else:
        fields = dict(hidden_size=1536, num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4,
                      intermediate_size=512, shared_intermediate_size=1024, num_local_experts=64, num_experts_per_tok=6,
                      vocab_size=100352, tie_word_embeddings=True, mamba_d_state=128, mamba_n_heads=48, mamba_d_head=64,
                      layer_types=["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)])
    with torch.device("meta"):
        config, model = hf.build_hf_model(cfg.family, **fields)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
    assert sum(p.numel() for p in model.parameters()) + head == cfg.model_parameters()
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    assert moe_config_from_hf(config.to_dict()).model_copy(update={"norm_eps": cfg.norm_eps}).layer_types == cfg.layer_types


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["mamba", "cross_attention"]}, r"field layer_types\[1\] is 'cross_attention'"),
    ({"num_experts_per_tok": 6}, "num_experts_per_tok = 6 exceeds num_local_experts = 5"),
    ({"hidden_act": "gelu"}, "field hidden_act is 'gelu'"),
    ({"router_jitter": 0.1}, "field router_jitter is not a field"),
    ({"position_embedding_type": "alibi"}, "field position_embedding_type is 'alibi'"),
])
def test_granite_config_errors(tmp_path, change: dict, message: str) -> None:
    from mambalaya.workloads import load_model_config

    data = {"model_type": "granitemoehybrid", **GRANITE_SMALL, **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=message):
        load_model_config(path)


def test_unknown_model_type_is_refused() -> None:
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    with pytest.raises(SpecError, match="field model_type is 'mixtral'"):
        moe_config_from_hf({"model_type": "mixtral", **GRANITE_SMALL})


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok = 5 exceeds num_experts = 4"),
    ({"layers_block_type": ["mamba", "mamba", "mamba", "attention"]}, "field layers_block_type disagrees"),
    ({"attn_layer_offset": 2}, "attn_layer_offset = 2 must be smaller than attn_layer_period = 2"),
    ({"mamba_proj_bias": True}, "field mamba_proj_bias is True"),
])
def test_jamba_config_errors(tmp_path, change: dict, message: str) -> None:
    from mambalaya.workloads import load_model_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "jamba", **JAMBA_SMALL, **change}))
    with pytest.raises(SpecError, match=message):
        load_model_config(path)


def test_evaluate_takes_a_routing_histogram_file_and_refuses_it_without_experts(tmp_path) -> None:
    """--routing FILE: two hot experts of 16 in a batch-64 decode step read two experts' weights,
    not all 16, so the MoE layers move far fewer bytes; a model without experts is refused."""
    import re

    from test_cli import invoke

    hist = tmp_path / "hot.yaml"
    hist.write_text("fractions: [0.5, 0.5" + ", 0" * 14 + "]\nsource: two hot experts\n")
    runs = {}
    for label, extra in (("uniform", ()), ("hot", ("--routing", str(hist)))):
        out = invoke("evaluate", "--model", "jamba-v0.1", "--phase", "decode", "-B", "64", *extra,
                     "--set", "memory.offchip_capacity_bytes=200GB")  # jamba-v0.1 needs about 106 GB
        assert out.exit_code == 0, out.output
        runs[label] = int(re.search(r"off-chip ([\d,]+) B per pass", out.output).group(1).replace(",", ""))
    assert runs["hot"] < runs["uniform"] / 3
    out = invoke("evaluate", "--model", "mamba-130m", "--routing", str(hist))
    assert out.exit_code == 1 and "no mixture-of-experts layer" in out.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("fractions: [0.5, 0.6" + ", 0" * 14 + "]\n")
    out = invoke("evaluate", "--model", "jamba-v0.1", "--phase", "decode", "--routing", str(bad))
    assert out.exit_code == 1 and "bad.yaml" in out.output
    # a model file with its own histogram and --routing: the option replaced the file's without a word
    from mambalaya.specio import dump_yaml
    from mambalaya.workloads import PRESETS

    own = tmp_path / "jamba.yaml"
    own.write_text(dump_yaml({**PRESETS["jamba-v0.1"].model_dump(mode="json"), "routing": [0.5, 0.5] + [0.0] * 14}))
    out = invoke("evaluate", "--model", str(own), "--phase", "decode", "--routing", str(hist))
    assert out.exit_code == 1 and "gives its own routing histogram" in out.output


def test_an_expert_with_a_tiny_share_is_not_a_whole_expert_read() -> None:
    """A measured histogram has no exact zeros: six experts at about 1/6 and 58 at 1e-9 once read all
    64 experts' weights (any non-zero fraction counted), twice the six-expert decode. Each of a pass's
    token-expert choices lands on an expert with its fraction, so the expected experts reached are
    sum(1 - (1 - f)^choices): six here, as with the 58 at exactly 0; a uniform histogram at a large
    batch reaches them all, and never more than the choices."""
    from mambalaya.einsum.routing import experts_reached

    six = [(1 - 58e-9) / 6] * 6
    assert experts_reached(six + [1e-9] * 58, 64, 6) == experts_reached(six + [0.0] * 58, 64, 6) == 6
    assert experts_reached([1 / 64] * 64, 64, 6) == 64 and experts_reached([1 / 64] * 64, 1, 6) == 6
    assert experts_reached([0.5, 0.5] + [0.0] * 14, 1, 2) == 2


def test_one_token_reaches_its_top_k_distinct_experts() -> None:
    """A token sends each expert at most one of its top-k choices, so one token reaches k experts
    whatever the histogram: six hot experts of a top-6 router at 1/6 each (the independent draws
    alone gave 4) or twelve at 1/12 (5), and a device's experts under expert parallelism at least
    the choices they receive over the tokens."""
    from mambalaya.einsum.routing import experts_reached

    assert experts_reached([1 / 6] * 6 + [0.0] * 58, 1, 6) == 6
    assert experts_reached([1 / 12] * 12 + [0.0] * 52, 1, 6) == 6
    assert experts_reached([1 / 12] * 4, 1, 6) == 2  # a device's four of them: two of the token's six choices
    assert experts_reached([1 / 64] * 64, 1, 6) == 6


def test_a_hot_histogram_reads_the_experts_a_decode_token_reaches(tmp_path) -> None:
    """granite-4.0-h-tiny's decode of one token under six hot experts reads six experts'
    weights, as under uniform routing (it read four)."""
    import json as json_mod

    from typer.testing import CliRunner

    from mambalaya.cli import app

    hot = tmp_path / "hot6.yaml"
    hot.write_text("fractions: [" + ", ".join(["0.16666666666666666"] * 6 + ["0"] * 58) + "]\n")
    run = lambda *extra: CliRunner().invoke(app, ["evaluate", "--arch", "gpu-h100", "--model", "granite-4.0-h-tiny",  # noqa: E731
                                                  "--phase", "decode", "-L", "256", "-B", "1", "-f", "json", *extra])
    hot_run, uniform = run("--routing", str(hot)), run()
    assert hot_run.exit_code == 0 and uniform.exit_code == 0, hot_run.output + uniform.output
    bytes_of = lambda out: json_mod.loads(out)["layers"]["mamba-moe"]["totals"]["offchip_bytes"]  # noqa: E731
    assert bytes_of(hot_run.output) == bytes_of(uniform.output)


def test_a_field_of_the_mixer_a_family_lacks_is_refused() -> None:
    """A Jamba file (Mamba-1 mixers) with Granite's Mamba-2 heads, or a Granite file with Jamba's
    dt rank, was accepted and read by nothing (the title even printed the heads); a Mamba-2 file
    whose d_ssm and expand disagree had expand dropped."""
    from mambalaya.errors import SpecError
    from mambalaya.workloads.blocks.mamba2 import parse_mamba2_config
    from mambalaya.workloads import PRESETS
    from mambalaya.workloads.families.jamba_granite import parse_moe_hybrid_config

    jamba = PRESETS["jamba-v0.1"].model_dump(mode="json")
    with pytest.raises(SpecError, match="mamba_heads, mamba_headdim are fields of Granite 4's Mamba-2 mixer"):
        parse_moe_hybrid_config({**jamba, "mamba_heads": 128, "mamba_headdim": 64})
    granite = PRESETS["granite-4.0-h-tiny"].model_dump(mode="json")
    with pytest.raises(SpecError, match="mamba_dt_rank is a field of Jamba's Mamba-1 mixer"):
        parse_moe_hybrid_config({**granite, "mamba_dt_rank": 7})
    with pytest.raises(SpecError, match="d_ssm .1536. and expand"):
        parse_mamba2_config({"d_model": 768, "n_layers": 2, "expand": 4, "d_ssm": 1536})
    assert parse_mamba2_config({"d_model": 768, "n_layers": 2, "expand": 2, "d_ssm": 1536}).d_inner == 1536
