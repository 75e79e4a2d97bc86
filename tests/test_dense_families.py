"""Dense hybrid families (Nemotron-H, OLMo-Hybrid as a whole model) against transformers: small
random models (float32, CPU, eager attention), every layer type's output and carried state after
a prefill and decode steps; the presets' parameter counts against the published ones and against
transformers' modules built on the meta device; config.json dispatch and refusals."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.workloads import PRESETS, build_layer, load_model_config, resolve_model
from mambalaya.workloads.blocks.attention import cache_from_hf
from mambalaya.execute.layers import run_family_layer
from mambalaya.workloads.hf.weights_families import load_nemotron_h_layer
from mambalaya.workloads.hf.weights_mamba2 import mamba2_states_from_hf
from mambalaya.workloads.families.nemotron_h import (
    PUBLISHED_PARAMETERS_B as NH_PUBLISHED,
    NemotronHModel,
    nemotron_h_config_from_hf,
)

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)
TOL = 1e-5


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ours) - ref)) / np.max(np.abs(ref)))


def _meta_parameters(model_class, config) -> int:
    import torch

    with torch.device("meta"):
        model = model_class(config)
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# Nemotron-H
# --------------------------------------------------------------------------------------------

NH_TYPES = ["linear_attention", "full_attention", "mlp", "linear_attention", "full_attention"]


def _nemotron_hf_config(**fields):
    from transformers import NemotronHConfig

    base = dict(vocab_size=16, hidden_size=32, layers_block_type=NH_TYPES, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=48, mamba_num_heads=8, mamba_head_dim=8,
                n_groups=2, ssm_state_size=8, chunk_size=4, conv_kernel=4, layer_norm_epsilon=1e-5,
                attn_implementation="eager")
    return NemotronHConfig(**{**base, **fields})


@pytest.fixture(scope="module")
def nemotron_reference() -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHModel as HFModel
    from hf_reference_families import run_hf_layers

    kinds = {"linear_attention": "recurrent", "full_attention": "attention", "mlp": "stateless"}
    return run_hf_layers(HFModel, _nemotron_hf_config(), [kinds[t] for t in NH_TYPES], seq_len=8, n_decode=3,
                         seed=5)


def _steps_match(config, k: int, layer: dict, weights: dict, scan: str, softmax: str, expected_state) -> None:
    """Layer ``k`` run on each recorded input (a prefill, then decode steps carrying our state):
    its output equals transformers' within TOL, and its carried state equals transformers'
    cache converted by ``expected_state(cache)``. ``expected_state`` None: a layer that carries
    no state (each step then runs as a prefill of its positions)."""
    state = None
    for n, x in enumerate(layer["inputs"]):
        step = run_family_layer(config, k, x, weights, state=state, scan=scan if n == 0 else None, softmax=softmax)
        err = rel_err(step.output, layer["outputs"][n])
        assert err <= TOL, (k, n, err)
        if expected_state is None:
            assert step.state == {}
            continue
        expected = expected_state(layer["caches"][n])
        assert set(step.state) == set(expected), (set(step.state), set(expected))
        for t in expected:
            assert rel_err(step.state[t], expected[t]) <= TOL, (k, n, t, rel_err(step.state[t], expected[t]))
        state = step.state


@requires_hf
@pytest.mark.parametrize("scan,softmax", [("chunked", "three-pass"), ("recurrent", "online")])
def test_nemotron_h_layers_match_transformers(nemotron_reference: dict, scan: str, softmax: str) -> None:
    """Every Nemotron-H layer type (Mamba-2, NoPE attention, squared-ReLU MLP), from the
    config.json through our reader and the weights through our loader: the output of a prefill of
    8 tokens and 3 decode steps equals transformers' within 1e-5 (relative to the largest value),
    and the carried conv + SSM states and KV cache equal transformers' cache after every step."""
    config = nemotron_h_config_from_hf(nemotron_reference["config"])
    assert config.layer_types == ("mamba", "attention", "mlp", "mamba", "attention")
    for k, kind in enumerate(config.layer_types):
        layer = nemotron_reference["layers"][k]
        weights = load_nemotron_h_layer(nemotron_reference["state_dict"], k, config)
        expected_state = {
            "attention": lambda cache: cache_from_hf(config.attention_config(), cache["key"], cache["value"]),
            "mamba": lambda cache: mamba2_states_from_hf(cache["conv"], cache["ssm"]),
        }.get(kind)  # an MLP carries none
        _steps_match(config, k, layer, weights, scan, softmax, expected_state)


@requires_hf
def test_nemotron_h_wrong_mixer_would_fail(nemotron_reference: dict) -> None:
    """The comparison can fail: a gated SiLU MLP (Bamba's) in place of the squared ReLU, or the
    attention with a rotary embedding, is far from transformers' output."""
    from mambalaya.workloads.blocks.attention import AttentionConfig, attention_layer, attention_constants
    from mambalaya.execute import execute

    config = nemotron_h_config_from_hf(nemotron_reference["config"])
    layer = nemotron_reference["layers"][1]
    x = layer["inputs"][0]
    w = load_nemotron_h_layer(nemotron_reference["state_dict"], 1, config)
    roped = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, partial_rotary_factor=1.0)
    c = attention_layer(roped, batch=x.shape[0], seq_len=x.shape[1])
    from mambalaya.workloads.blocks.attention import weights_from_projections

    sd = nemotron_reference["state_dict"]
    wr = weights_from_projections(roped, norm=sd["layers.1.norm.weight"], q_proj=sd["layers.1.mixer.q_proj.weight"],
                                  k_proj=sd["layers.1.mixer.k_proj.weight"], v_proj=sd["layers.1.mixer.v_proj.weight"],
                                  o_proj=sd["layers.1.mixer.o_proj.weight"])
    out = execute(c, {"X": x, **wr, **attention_constants(c, roped)}, dtype="float32")["XO"]
    assert rel_err(out, layer["outputs"][0]) > 1e-3
    assert set(w) == {"WN", "WQB", "WKB", "WV", "WO"}  # no rotated channels


@requires_hf
def test_nemotron_h_8b_parameters() -> None:
    """nemotron-h-8b: the count from our module shapes equals transformers' NemotronHModel +
    LM head built on the meta device from the same config, and the published 8B (within 2%)."""
    cfg = PRESETS["nemotron-h-8b"]
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHModel as HFModel

    hf = _nemotron_hf_config(hidden_size=4096, layers_block_type=[
        {"mamba": "linear_attention", "attention": "full_attention", "mlp": "mlp"}[t] for t in cfg.layer_types],
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=21504, mamba_num_heads=128,
        mamba_head_dim=64, n_groups=8, ssm_state_size=128, chunk_size=128, vocab_size=131072)
    assert nemotron_h_config_from_hf({**hf.to_dict(), "model_type": "nemotron_h"}) == cfg
    head = hf.vocab_size * hf.hidden_size  # NemotronHForCausalLM's untied lm_head
    assert cfg.model_parameters() == _meta_parameters(HFModel, hf) + head == 8_100_852_736
    assert abs(cfg.model_parameters() / 1e9 - NH_PUBLISHED["nemotron-h-8b"]) / NH_PUBLISHED["nemotron-h-8b"] < 0.02
    assert cfg.layer_counts() == {"mamba": 24, "attention": 4, "mlp": 24}


def test_nemotron_h_config_json_refusals(tmp_path) -> None:
    """The older pattern string is read; an unknown layer type, an impossible MoE grouping, a
    bias, another activation, a zero head width and an unknown field are each one SpecError
    naming the field; MoE layers are read (tests/test_nemotron_h_moe.py checks them)."""
    base = {"model_type": "nemotron_h", "hidden_size": 64, "hybrid_override_pattern": "M*-M",
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
            "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "vocab_size": 100}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base))
    cfg = load_model_config(path)
    assert isinstance(cfg, NemotronHModel) and cfg.layer_types == ("mamba", "attention", "mlp", "mamba")
    cases = {
        "hybrid_override_pattern[1]": {"hybrid_override_pattern": "MXM"},
        "n_group": {"layers_block_type": ["moe", "mlp"], "n_group": 3},
        "layers_block_type[1]": {"layers_block_type": ["mlp", "linear"]},
        "mlp_bias": {"mlp_bias": True},
        "mlp_hidden_act": {"mlp_hidden_act": "silu"},
        "time_step_limit": {"time_step_limit": [0.0, 0.1]},
        "flux_capacitor": {"flux_capacitor": 1},
        "mamba_head_dim": {"mamba_head_dim": 0},
    }
    for field, change in cases.items():
        with pytest.raises(SpecError) as err:
            nemotron_h_config_from_hf({**base, **change})
        assert f"field {field}" in str(err.value) or f"fields {field}" in str(err.value) \
            or field in str(err.value), (field, str(err.value))
    assert nemotron_h_config_from_hf({**base, "hybrid_override_pattern": "ME"}).layer_types == ("mamba", "moe")


def test_unknown_model_type_is_refused(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(SpecError, match="model_type"):
        load_model_config(path)


@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1", "zamba2", "olmo_hybrid", "mamba3", 7])
def test_a_model_file_naming_a_family_without_own_fields_is_refused_by_name(tmp_path, family) -> None:
    """A mambalaya model file naming a dense hybrid family (read from its config.json alone) or
    no family at all was read as a Mamba-1 file and refused for its family field ("must be
    'mamba1'") and a missing n_layers: now its family is named, with what is read instead."""
    path = tmp_path / "model.yaml"
    path.write_text(f"family: {family}\nd_model: 512\nn_layers: 2\n")
    with pytest.raises(SpecError) as err:
        load_model_config(path)
    text = str(err.value)
    assert str(path) in text and f"field family is {family!r}" in text and "Mamba-1" not in text
    assert "gated_deltanet" in text and ("config.json" in text)
    if family in ("nemotron_h", "falcon_h1", "zamba2", "olmo_hybrid"):  # its preset named
        assert any(name in text for name, m in PRESETS.items() if getattr(m, "family", None) == family)


def test_nemotron_h_preset_builds_and_evaluates_every_layer_type() -> None:
    cfg = resolve_model("nemotron-h-8b")
    for t in ("mamba", "attention", "mlp"):
        for phase in ("prefill", "decode"):
            c = build_layer(cfg, phase=phase, seq_len=256, batch=1, layer_type=t, precision="reference-kernels")
            assert c.einsums
    with pytest.raises(SpecError, match="layer_type"):
        build_layer(cfg, phase="prefill", seq_len=256, batch=1)
    with pytest.raises(SpecError, match="scan"):
        build_layer(cfg, phase="prefill", seq_len=256, batch=1, layer_type="mlp", scan="chunked")


# --------------------------------------------------------------------------------------------
# OLMo-Hybrid, the whole model
# --------------------------------------------------------------------------------------------

OH_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


def _olmo_hf_config(**fields):
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig

    base = dict(vocab_size=16, pad_token_id=0, hidden_size=32, intermediate_size=48, num_hidden_layers=len(OH_TYPES),
                num_attention_heads=4, num_key_value_heads=2, layer_types=OH_TYPES, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6, rms_norm_eps=1e-6,
                attn_implementation="eager")
    return OlmoHybridConfig(**{**base, **fields})


@pytest.fixture(scope="module", params=["rope", "nope"])
def olmo_reference(request) -> dict:
    """transformers' OlmoHybridModel with the default rotary embedding (theta 500 here), or with
    none (``rope_theta`` null: NoPE)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridModel as HFModel
    from hf_reference_families import run_hf_layers

    kinds = {"linear_attention": "recurrent", "full_attention": "attention"}
    rope = {"rope_type": "default", "rope_theta": 500.0 if request.param == "rope" else None}
    return run_hf_layers(HFModel, _olmo_hf_config(rope_parameters=rope), [kinds[t] for t in OH_TYPES], seq_len=8,
                         n_decode=3, seed=9)


@requires_hf
@pytest.mark.parametrize("scan,softmax", [("chunked", "three-pass"), ("recurrent", "online")])
def test_olmo_hybrid_layers_match_transformers(olmo_reference: dict, scan: str, softmax: str) -> None:
    """Both OLMo-Hybrid layer types with their MLPs (Gated DeltaNet pre-norm; attention with
    QK-norm, no rotary, post-norm), config.json and weights through our reader and loader: the
    output of a prefill of 8 tokens and 3 decode steps equals transformers' within 1e-5, and the
    carried conv + recurrent states and the KV cache (normalised keys, values) equal its cache."""
    from mambalaya.workloads.hf.weights_families import load_olmo_hybrid_layer
    from mambalaya.workloads.hf.weights_gdn import gdn_state_from_hf
    from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf

    config = olmo_hybrid_config_from_hf(olmo_reference["config"])
    config = config.model_copy(update={"mixer": config.mixer.model_copy(update={"chunk_size": 4})})
    assert config.layer_types == ("gdn", "attention", "gdn", "attention")
    for k, kind in enumerate(config.layer_types):
        layer = olmo_reference["layers"][k]
        weights = load_olmo_hybrid_layer(olmo_reference["state_dict"], k, config)
        if kind == "attention":
            expected_state = lambda cache: cache_from_hf(config.attention_config(), cache["key"], cache["value"])  # noqa: E731
        else:
            expected_state = lambda cache: gdn_state_from_hf(config.mixer, cache["conv"], cache["ssm"])  # noqa: E731
        _steps_match(config, k, layer, weights, scan, softmax, expected_state)


@requires_hf
def test_olmo_hybrid_post_norm_matters(olmo_reference: dict) -> None:
    """The comparison can fail: without the attention's post-norm (its weight all ones and the
    norm skipped is not the same) the output is far from transformers'."""
    from mambalaya.workloads.hf.weights_families import load_olmo_hybrid_layer
    from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf

    config = olmo_hybrid_config_from_hf(olmo_reference["config"])
    weights = load_olmo_hybrid_layer(olmo_reference["state_dict"], 1, config)
    x = olmo_reference["layers"][1]["inputs"][0]
    wrong = {**weights, "WQN": np.ones_like(weights["WQN"])}  # q_norm weight dropped
    step = run_family_layer(config, 1, x, wrong)
    assert rel_err(step.output, olmo_reference["layers"][1]["outputs"][0]) > 1e-3


@requires_hf
def test_olmo_hybrid_7b_parameters() -> None:
    """olmo-hybrid-7b: our count = transformers' OlmoHybridModel + LM head on the meta device,
    and the published 7B within 7%."""
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridModel as HFModel
    from mambalaya.workloads.families.olmo_hybrid import PUBLISHED_PARAMETERS_B, olmo_hybrid_config_from_hf

    cfg = PRESETS["olmo-hybrid-7b"]
    hf = OlmoHybridConfig()
    assert olmo_hybrid_config_from_hf({**hf.to_dict(), "model_type": "olmo_hybrid"}) == cfg
    assert cfg.model_parameters() == _meta_parameters(HFModel, hf) + hf.vocab_size * hf.hidden_size
    assert abs(cfg.model_parameters() / 1e9 - PUBLISHED_PARAMETERS_B["olmo-hybrid-7b"]) / 7.0 < 0.07
    assert cfg.layer_counts() == {"gdn": 24, "attention": 8}


def test_olmo_hybrid_refusals() -> None:
    from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf

    base = {"model_type": "olmo_hybrid", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "intermediate_size": 64, "vocab_size": 100}
    assert olmo_hybrid_config_from_hf(base).layer_counts() == {"gdn": 3, "attention": 1}
    assert olmo_hybrid_config_from_hf(base).rope_theta == 10000.0  # as OlmoHybridConfig standardises it
    assert olmo_hybrid_config_from_hf({**base, "rope_parameters": {"rope_theta": None}}).rope_theta is None
    with pytest.raises(SpecError, match="field rope_parameters.rope_type"):
        olmo_hybrid_config_from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}})
    with pytest.raises(SpecError, match="field rope_parameters.partial_rotary_factor"):
        olmo_hybrid_config_from_hf({**base, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}})
    with pytest.raises(SpecError, match="field attention_bias"):
        olmo_hybrid_config_from_hf({**base, "attention_bias": True})
    with pytest.raises(SpecError, match=r"field layer_types\[1\] is 'mlp'"):
        olmo_hybrid_config_from_hf({**base, "layer_types": ["linear_attention", "mlp", "full_attention",
                                                            "linear_attention"]})
    cfg = resolve_model("olmo-hybrid-7b")
    with pytest.raises(SpecError, match="chunk size"):
        build_layer(cfg, phase="prefill", seq_len=100, batch=1, layer_type="gdn", scan="chunked")


# --------------------------------------------------------------------------------------------
# the hybrid suite and the command line
# --------------------------------------------------------------------------------------------

@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_hybrid_suite_runs_every_dense_family(tmp_path) -> None:
    """`reproduce --suite hybrid` includes every family by default; Nemotron-H and OLMo-Hybrid
    evaluate on every design, each layer type under its mapping (MLP layers unfused on the
    fixed Mamba mappings), and the speedups are the latency ratios."""
    from typer.testing import CliRunner

    import pandas as pd

    from mambalaya.cli import app
    from mambalaya.experiments.hybrid_suite import HYBRID_MODELS, HybridSuiteConfig

    assert HybridSuiteConfig().models == HYBRID_MODELS == ("bamba-9b", "nemotron-h-8b", "olmo-hybrid-7b", "falcon-h1-7b",
                                                         "zamba2-2.7b", "jamba-v0.1", "granite-4.0-h-tiny")
    out = CliRunner().invoke(app, ["reproduce", "--suite", "hybrid", "--models", "nemotron-h-8b,olmo-hybrid-7b",
                                   "--seq-lens", "2048", "--batch", "1", "--no-figures", "--workers", "1", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    latency = pd.read_csv(tmp_path / "hybrid" / "hybrid_latency.csv")
    assert len(latency) == 2 * 2 * 4
    nh = latency[(latency["model"] == "nemotron-h-8b") & (latency["phase"] == "prefill")].set_index("arch")
    assert nh.loc["geens-ideal", "mlp_mapping"] == "unfused" and nh.loc["geens-ideal", "mamba_mapping"] == "ssm-ri"
    assert nh.loc["mambalaya", "mlp_mapping"] == "optimal"
    total = sum(nh.loc["mambalaya", f"{t}_layer_latency_s"] * nh.loc["mambalaya", f"{t}_layers"]
                for t in ("mamba", "attention", "mlp"))
    assert np.isclose(total, nh.loc["mambalaya", "model_latency_s"])
    oh = latency[(latency["model"] == "olmo-hybrid-7b") & (latency["arch"] == "mambalaya")]
    assert set(oh["gdn_layers"]) == {24} and set(oh["attention_layers"]) == {8}
    speedups = pd.read_csv(tmp_path / "hybrid" / "hybrid_speedups.csv")
    assert (speedups["speedup"] > 0).all() and len(speedups) == 2 * 2 * 3
    report = (tmp_path / "hybrid" / "report.md").read_text()
    assert "## nemotron-h-8b" in report and "## olmo-hybrid-7b" in report


def test_cli_lists_and_evaluates_the_presets() -> None:
    from typer.testing import CliRunner

    from mambalaya.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["models", "--format", "csv"])
    assert listed.exit_code == 0
    for name in ("nemotron-h-8b", "olmo-hybrid-7b", "falcon-h1-7b"):
        assert name in listed.output
        for phase in ("prefill", "decode"):
            arch = "geens-ideal" if phase == "decode" else "marca-ideal"  # the optimal search: the suite test
            out = runner.invoke(app, ["evaluate", "--model", name, "--arch", arch, "--phase", phase,
                                      "-L", "256", "--batch", "1"])
            assert out.exit_code == 0 and "model (" in out.output, out.output[-500:]


# --------------------------------------------------------------------------------------------
# Falcon-H1
# --------------------------------------------------------------------------------------------

FH_MULTIPLIERS = dict(attention_in_multiplier=0.7, attention_out_multiplier=1.3, key_multiplier=0.6,
                      ssm_in_multiplier=1.2, ssm_out_multiplier=0.8, mlp_multipliers=[0.9, 1.4],
                      ssm_multipliers=[1.1, 0.7, 1.5, 0.6, 1.3], embedding_multiplier=2.0, lm_head_multiplier=0.5)


def _falcon_hf_config(**fields):
    from transformers import FalconH1Config

    base = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=8,
                mamba_n_groups=2, mamba_chunk_size=4, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, attn_implementation="eager",
                **FH_MULTIPLIERS)
    return FalconH1Config(**{**base, **fields})


@pytest.fixture(scope="module", params=[False, True], ids=["no-mamba-norm", "mamba-norm"])
def falcon_reference(request) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Model as HFModel
    from hf_reference_families import run_hf_layers

    cfg = _falcon_hf_config(mamba_rms_norm=request.param, mamba_norm_before_gate=False)
    return run_hf_layers(HFModel, cfg, ["both", "both"], seq_len=8, n_decode=3, seed=13)


@requires_hf
@pytest.mark.parametrize("scan,softmax", [("chunked", "three-pass"), ("recurrent", "online")])
def test_falcon_h1_parallel_layer_matches_transformers(falcon_reference: dict, scan: str, softmax: str) -> None:
    """A Falcon-H1 layer (Mamba-2 and attention side by side on one normed input, then the MLP) as
    ONE cascade, every multiplier set to a value other than 1 and folded into the weights by our
    loader, the config.json through our reader: the output of a prefill of 8 tokens and 3 decode
    steps equals transformers' within 1e-5, and the carried conv + SSM states and the KV cache
    equal transformers' cache after every step; with and without the mixer's gated RMSNorm."""
    from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
    from mambalaya.workloads.hf.weights_families import load_falcon_h1_layer

    data = falcon_reference["config"]
    config = falcon_h1_config_from_hf(data)
    assert config.layer_types == ("parallel", "parallel")
    for k in range(2):
        layer = falcon_reference["layers"][k]
        weights = load_falcon_h1_layer(falcon_reference["state_dict"], k, config)
        _steps_match(config, k, layer, weights, scan, softmax, lambda cache: {  # both states in one layer
            **mamba2_states_from_hf(cache["conv"], cache["ssm"]),
            **cache_from_hf(config.attention_config(), cache["key"], cache["value"])})


@requires_hf
def test_falcon_h1_multipliers_matter(falcon_reference: dict) -> None:
    """The comparison can fail: the same weights without the multipliers folded in are far from
    transformers' output."""
    from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
    from mambalaya.workloads.hf.weights_families import load_falcon_h1_layer

    config = falcon_h1_config_from_hf(falcon_reference["config"])
    layer = falcon_reference["layers"][0]
    for name in ("key_multiplier", "ssm_in_multiplier", "attention_out_multiplier"):
        wrong = config.model_copy(update={"multipliers": config.multipliers.model_copy(update={name: 1.0})})
        weights = load_falcon_h1_layer(falcon_reference["state_dict"], 0, wrong)
        step = run_family_layer(config, 0, layer["inputs"][0], weights, scan="recurrent")
        assert rel_err(step.output, layer["outputs"][0]) > 1e-3, name


@requires_hf
def test_falcon_h1_7b_parameters() -> None:
    """falcon-h1-7b: our count = transformers' FalconH1Model + LM head on the meta device from
    the same config, and the published 7B within 10%."""
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Model as HFModel
    from mambalaya.workloads.families.falcon_h1 import PUBLISHED_PARAMETERS_B, falcon_h1_config_from_hf

    cfg = PRESETS["falcon-h1-7b"]
    hf = _falcon_hf_config(hidden_size=3072, num_hidden_layers=44, num_attention_heads=12, num_key_value_heads=2,
                           head_dim=128, intermediate_size=12288, vocab_size=130048, mamba_d_ssm=3072,
                           mamba_n_heads=24, mamba_d_state=256, mamba_n_groups=1, mamba_chunk_size=128,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e11})
    read = falcon_h1_config_from_hf(hf.to_dict())  # with the test's multipliers: they change no count
    assert read.model_copy(update={"multipliers": cfg.multipliers}) == cfg
    assert cfg.model_parameters() == _meta_parameters(HFModel, hf) + hf.vocab_size * hf.hidden_size
    assert abs(cfg.model_parameters() / 1e9 - PUBLISHED_PARAMETERS_B["falcon-h1-7b"]) / 7.0 < 0.10


def test_falcon_h1_refusals() -> None:
    from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf

    base = {"model_type": "falcon_h1", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "mamba_d_ssm": 64, "mamba_n_heads": 8,
            "mamba_d_state": 8, "vocab_size": 16}
    assert falcon_h1_config_from_hf(base).layer_counts() == {"parallel": 2}
    for field, change in {"mamba_n_heads": {"mamba_d_ssm": 48, "mamba_n_heads": 5},
                          "attention_bias": {"attention_bias": True},
                          "rope_parameters": {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
                          "sliding_window_size": {"sliding_window_size": 4}}.items():
        with pytest.raises(SpecError, match=f"field {field}"):
            falcon_h1_config_from_hf({**base, **change})
