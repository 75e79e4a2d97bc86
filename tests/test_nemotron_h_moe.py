"""Nemotron-H's MoE layers (``moe``, pattern ``E``: NVIDIA Nemotron 3 Nano's) and its Mamba width
of its own (``mamba_num_heads * mamba_head_dim`` not a multiple of ``hidden_size``) against
transformers 5.25: small random models (float32, CPU, eager attention), every layer's output and
carried state after a prefill and decode steps; the comparison shown able to fail; the config.json
fields read (saved by transformers and read back), refused by name, and the parameter counts
against transformers' modules on the meta device."""

from __future__ import annotations

import importlib.util
import json
from fractions import Fraction

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.execute.layers import run_family_layer
from mambalaya.workloads.blocks.attention import cache_from_hf
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.families.nemotron_h import NemotronHModel, nemotron_h_config_from_hf
from mambalaya.workloads.hf.weights_families import load_nemotron_h_layer
from mambalaya.workloads.hf.weights_mamba2 import mamba2_states_from_hf

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)
TOL = 1e-5

#: Two small configs. ``grouped``: 8 experts in 4 groups, the 2 best groups kept, top-3,
#: normalised and scaled by 2.5; Mamba width 6 x 8 = 48 = 1.5 x hidden. ``latent``: one group,
#: not normalised, the experts in a latent width of 16; Mamba width 3 x 8 = 24 = 0.75 x hidden.
#: transformers needs an attention layer in the pattern (its causal mask asks the cache for one).
BASE = dict(vocab_size=16, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=48, mamba_head_dim=8, ssm_state_size=8, chunk_size=4, conv_kernel=4,
            n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
            moe_shared_expert_intermediate_size=24, layer_norm_epsilon=1e-5, attn_implementation="eager")
VARIANTS = {
    "grouped": dict(layers_block_type=["linear_attention", "moe", "full_attention", "moe"], mamba_num_heads=6,
                    n_groups=2, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5),
    "latent": dict(layers_block_type=["moe", "full_attention", "linear_attention"], mamba_num_heads=3, n_groups=1,
                   n_group=1, topk_group=1, norm_topk_prob=False, moe_latent_size=16),
}
KINDS = {"linear_attention": "recurrent", "full_attention": "attention", "mlp": "stateless", "moe": "stateless"}


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ours) - ref)) / np.max(np.abs(ref)))


def _hf_config(variant: str, **fields):
    from transformers import NemotronHConfig

    return NemotronHConfig(**{**BASE, **VARIANTS[variant], **fields})


@pytest.fixture(scope="module")
def references() -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHModel as HFModel
    from hf_reference_families import run_hf_layers

    out = {}
    for seed, variant in enumerate(VARIANTS):
        config = _hf_config(variant)
        out[variant] = run_hf_layers(HFModel, config, [KINDS[t] for t in config.layers_block_type], seq_len=8,
                                     n_decode=3, seed=11 + seed)
    return out


def _expected_state(config: NemotronHModel, kind: str, cache: dict) -> dict | None:
    if kind == "attention":
        return cache_from_hf(config.attention_config(), cache["key"], cache["value"])
    if kind == "mamba":
        return mamba2_states_from_hf(cache["conv"], cache["ssm"])
    return None  # an MLP or MoE layer carries none


@requires_hf
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("scan", ["chunked", "recurrent"])
def test_nemotron_h_moe_and_mamba_width_match_transformers(references: dict, variant: str, scan: str) -> None:
    """Every layer (the MoE layers, and the Mamba-2 layers whose width is not a multiple of the
    hidden size), from the config.json through our reader and the weights through our loader: a
    prefill of 8 tokens and 3 decode steps give transformers' output within 1e-5 of its largest
    value, and the carried conv + SSM states and KV cache equal transformers' cache."""
    ref = references[variant]
    config = nemotron_h_config_from_hf(ref["config"])
    assert "moe" in config.layer_types and config.mamba2().d_inner % config.d_model
    for k, kind in enumerate(config.layer_types):
        layer = ref["layers"][k]
        weights = load_nemotron_h_layer(ref["state_dict"], k, config)
        state = None
        for n, x in enumerate(layer["inputs"]):
            step = run_family_layer(config, k, x, weights, state=state, scan=scan if n == 0 else None)
            assert rel_err(step.output, layer["outputs"][n]) <= TOL, (variant, k, n, rel_err(step.output,
                                                                                          layer["outputs"][n]))
            expected = _expected_state(config, kind, layer["caches"][n]) if layer["caches"] else None
            if expected is None:
                assert step.state == {}
                continue
            assert set(step.state) == set(expected)
            for t in expected:
                assert rel_err(step.state[t], expected[t]) <= TOL, (variant, k, n, t)
            state = step.state


@requires_hf
def test_the_router_details_matter(references: dict) -> None:
    """The comparison can fail: the MoE layer without the correction bias, without the group
    limit, without the routed scaling factor, or with its weights normalised when the config
    says not, is far from transformers' output; and the group limit changes which experts some
    tokens pick (so the group Einsums are exercised)."""
    cases = (("grouped", 1, {"moe_topk_group": 4}), ("grouped", 1, {"moe_routed_scaling_factor": 1.0}),
             ("grouped", 3, {"bias": 0.0}), ("latent", 0, {"moe_norm_topk_prob": True}), ("latent", 0, {"bias": 0.0}))
    for variant, k, changes in cases:
        ref = references[variant]
        config = nemotron_h_config_from_hf(ref["config"])
        weights = load_nemotron_h_layer(ref["state_dict"], k, config)
        if "bias" in changes:
            weights = {**weights, "EB": np.zeros_like(weights["EB"])}
        else:
            config = config.model_copy(update=changes)
        x, expected = ref["layers"][k]["inputs"][0], ref["layers"][k]["outputs"][0]
        assert rel_err(run_family_layer(config, k, x, weights).output, expected) > 1e-3, (variant, k, changes)
    from mambalaya.execute import execute
    from mambalaya.workloads.families.base import family_inputs

    ref = references["grouped"]
    config = nemotron_h_config_from_hf(ref["config"])
    weights = load_nemotron_h_layer(ref["state_dict"], 1, config)
    x = ref["layers"][1]["inputs"][0]

    def selected(model: NemotronHModel) -> np.ndarray:
        cascade = model.layer("moe", batch=x.shape[0], seq_len=x.shape[1])
        return execute(cascade, {"X": x, **weights, **family_inputs(cascade, model)}, keep="all")["SEL"]

    limited, free = selected(config), selected(config.model_copy(update={"moe_topk_group": 4}))
    assert np.all(limited.sum(-1) == 3) and np.all(free.sum(-1) == 3)
    assert np.any(limited != free)


@requires_hf
def test_saved_moe_config_reads_back(tmp_path) -> None:
    """A MoE config saved by transformers' save_pretrained (the older pattern string, the alias
    num_local_experts, every MoE field) reads back with its values; parsed as a dict too."""
    from transformers import NemotronHConfig

    from mambalaya.workloads import load_model_config

    hf = NemotronHConfig(hidden_size=64, hybrid_override_pattern="ME*E-M", num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, intermediate_size=96, mamba_num_heads=6, mamba_head_dim=16, n_groups=2,
                         ssm_state_size=16, chunk_size=8, vocab_size=100, num_local_experts=12,
                         num_experts_per_tok=4, moe_intermediate_size=40, moe_shared_expert_intermediate_size=56,
                         moe_latent_size=24, n_group=3, topk_group=2, norm_topk_prob=False,
                         routed_scaling_factor=1.5, n_shared_experts=2)
    hf.save_pretrained(tmp_path)
    model = load_model_config(tmp_path / "config.json")
    assert model == nemotron_h_config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert model.layer_types == ("mamba", "moe", "attention", "moe", "mlp", "mamba")
    assert (model.moe_experts, model.moe_top_k, model.moe_d_ff, model.moe_shared_d_ff, model.moe_latent_size,
            model.moe_n_group, model.moe_topk_group, model.moe_norm_topk_prob, model.moe_routed_scaling_factor) \
        == (12, 4, 40, 56, 24, 3, 2, False, 1.5)
    assert model.d_ssm == 96 and model.expand == 1.5 and model.n_experts == 12
    both = {**hf.to_dict(), "model_type": "nemotron_h", "n_routed_experts": 5, "num_local_experts": 12}
    with pytest.raises(SpecError, match="num_local_experts = 12 and n_routed_experts = 5"):
        nemotron_h_config_from_hf(both)  # (transformers takes the alias's; a file saying two things is refused)
    assert nemotron_h_config_from_hf({**both, "n_routed_experts": 12}).moe_experts == 12


def _moe_base(**fields) -> dict:
    return {"model_type": "nemotron_h", "hidden_size": 64, "hybrid_override_pattern": "M*E", "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "mamba_num_heads": 8,
            "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "vocab_size": 100, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48, **fields}


@pytest.mark.parametrize("field,change", [
    ("n_group", {"n_group": 3}),  # 8 experts do not split into 3 groups
    ("n_group", {"n_routed_experts": 1, "num_experts_per_tok": 1}),  # a group needs two experts
    ("topk_group", {"n_group": 2, "topk_group": 3}),
    ("num_experts_per_tok", {"n_group": 4, "topk_group": 1, "num_experts_per_tok": 3}),
    ("num_experts_per_tok", {"num_experts_per_tok": 9}),
    ("norm_topk_prob", {"norm_topk_prob": 1}),
    ("routed_scaling_factor", {"routed_scaling_factor": True}),
    ("moe_latent_size", {"moe_latent_size": 0}),
    ("moe_intermediate_size", {"moe_intermediate_size": 2.5}),
    ("mlp_hidden_act", {"mlp_hidden_act": "silu"}),  # the experts' and the shared MLP's activation
    ("mlp_bias", {"mlp_bias": True}),  # the shared MLP's and the latent projections' bias
    ("flux_capacitor", {"flux_capacitor": 1}),
    ("n_groups", {"n_groups": 3}),
    ("mamba_head_dim", {"mamba_head_dim": 0}),
])
def test_moe_config_refusals_name_the_field(field: str, change: dict) -> None:
    with pytest.raises(SpecError) as err:
        nemotron_h_config_from_hf(_moe_base(**change))
    assert field in str(err.value), str(err.value)


def test_moe_fields_of_a_dense_config() -> None:
    """Without a MoE layer the MoE fields act nowhere: values transformers builds a dense model
    with (no experts, a group count that fits nothing) are taken, a value of the wrong type
    (which transformers' config class refuses) is refused by name, and nothing can be routed.
    The older layer names ``mamba``/``attention`` are renamed as transformers renames them."""
    dense = _moe_base(hybrid_override_pattern="M*-", n_routed_experts=0, n_group=3, topk_group=7)
    model = nemotron_h_config_from_hf(dense)
    assert model.layer_types == ("mamba", "attention", "mlp") and model.n_experts == 0
    assert model.active_parameters() == model.model_parameters()
    with pytest.raises(SpecError, match="n_group"):
        nemotron_h_config_from_hf({**dense, "n_group": "x"})
    legacy = nemotron_h_config_from_hf(_moe_base(layers_block_type=["mamba", "attention", "moe"]))
    assert legacy.layer_types == ("mamba", "attention", "moe")
    with pytest.raises(ValueError, match="topk_group"):  # the model class checks what the reader checks
        NemotronHModel(**{**legacy.model_dump(), "moe_topk_group": 3})


@requires_hf
def test_moe_parameters_match_transformers_modules() -> None:
    """The weight count of a MoE model (latent projections and group-limited router included)
    equals transformers' NemotronHModel on the meta device plus the untied LM head; the active
    count leaves out the experts a token does not use."""
    import torch
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHModel as HFModel

    for variant in VARIANTS:
        hf = _hf_config(variant)
        model = nemotron_h_config_from_hf({**hf.to_dict(), "model_type": "nemotron_h"})
        with torch.device("meta"):
            meta = sum(p.numel() for p in HFModel(hf).parameters())
        assert model.model_parameters() == meta + hf.vocab_size * hf.hidden_size, variant
        width = hf.moe_latent_size or hf.hidden_size
        unused = model.layer_types.count("moe") * (hf.n_routed_experts - hf.num_experts_per_tok) * 2 * width \
            * hf.moe_intermediate_size
        assert model.active_parameters() == model.model_parameters() - unused


def test_moe_layer_cascade_and_routing_cost() -> None:
    """A MoE layer's cascade for the cost model: the relu2 experts' region is routed (top_k of
    n_experts of its operations, the experts' weights read for the experts that get tokens),
    the router is not; in decode at batch 1 only top_k experts' weights are read."""
    from mambalaya.einsum.routing import einsum_scale, tensor_scale
    from mambalaya.workloads import build_layer

    model = nemotron_h_config_from_hf(_moe_base(n_group=4, topk_group=2, moe_latent_size=24))
    prefill = build_layer(model, phase="prefill", seq_len=64, batch=1, layer_type="moe")
    assert prefill.regions["experts"] == ("UP", "RU", "HM", "EO", "MO")
    assert einsum_scale(prefill, "UP") == einsum_scale(prefill, "MO") == Fraction(2, 8)
    assert einsum_scale(prefill, "SEL") == einsum_scale(prefill, "LO") == 1
    assert tensor_scale(prefill, "WU") == 1 and tensor_scale(prefill, "WL1") == 1
    assert prefill.tensors["WU"].ranks == ("X", "A", "F") and "GM" in prefill.tensors
    decode = build_layer(model, phase="decode", seq_len=64, batch=1, layer_type="moe")
    assert tensor_scale(decode, "WU") == tensor_scale(decode, "WDN") == Fraction(2, 8)
    assert tensor_scale(decode, "WSU") == 1


def test_mixer_width_of_its_own_builds_the_mamba2_cascade() -> None:
    """With a width of its own (d_ssm) that is a whole multiple of the hidden size, the mixer
    config builds exactly the cascade expand builds (the nemotron-h-8b preset's numbers are unchanged);
    with another width, the head ranks follow mamba_num_heads."""
    whole = Mamba2Config(d_model=64, d_ssm=128, expand=2, headdim=16, ngroups=2, d_state=16, chunk_size=8)
    plain = Mamba2Config(d_model=64, expand=2, headdim=16, ngroups=2, d_state=16, chunk_size=8)
    for phase, scan in (("prefill", "chunked"), ("prefill", "recurrent"), ("decode", "recurrent")):
        ours = mamba2_layer(whole, batch=2, seq_len=16, phase=phase, scan=scan, state_io=True)
        theirs = mamba2_layer(plain, batch=2, seq_len=16, phase=phase, scan=scan, state_io=True)
        assert (ours.params, ours.ranks, ours.tensors, ours.einsums) == (theirs.params, theirs.ranks, theirs.tensors,
                                                                         theirs.einsums)
    assert whole.layer_parameters() == plain.layer_parameters()
    model = nemotron_h_config_from_hf(_moe_base(mamba_num_heads=6))  # 6 x 16 = 96 = 1.5 x 64
    cascade = model.layer("mamba", batch=1, seq_len=16, scan="recurrent")  # (16 is no whole chunk: chunked refused)
    assert (cascade.ranks["G"].size, cascade.ranks["R"].size, cascade.ranks["P"].size) == (2, 3, 16)
    with pytest.raises(SpecError, match="n_groups"):
        nemotron_h_config_from_hf(_moe_base(mamba_num_heads=5))


#: NVIDIA Nemotron 3 Nano 30B-A3B's config.json (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16, the checkpoint
#: NemotronHConfig's docstring names; written by transformers 4.55.4, with NVIDIA's remote-code fields norm_eps,
#: rope_theta and partial_rotary_factor that NemotronHConfig 5.25 does not define): 23 Mamba-2 layers of
#: 64 x 64 = 4096 channels (not a multiple of the hidden 2688), 23 MoE layers of 128 experts, top-6, one
#: group, scaled 2.5, and 6 attention layers.
NANO_CONFIG = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 2, "expand": 2, "head_dim": 128, "hidden_dropout": 0.0,
    "hidden_size": 2688, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "initializer_range": 0.02, "intermediate_size": 1856, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64,
    "mamba_hidden_act": "silu", "mamba_num_heads": 64, "mamba_proj_bias": False, "mamba_ssm_cache_dtype": "float32",
    "max_position_embeddings": 262144, "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h",
    "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "n_groups": 8,
    "n_routed_experts": 128, "n_shared_experts": 1, "norm_eps": 1e-05, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts_per_tok": 6, "num_hidden_layers": 52, "num_key_value_heads": 2,
    "num_logits_to_keep": 1, "pad_token_id": 0, "partial_rotary_factor": 1.0, "rescale_prenorm_residual": True,
    "residual_in_fp32": False, "rope_theta": 10000, "routed_scaling_factor": 2.5, "sliding_window": None,
    "ssm_state_size": 128, "tie_word_embeddings": False, "time_step_floor": 0.0001, "time_step_max": 0.1,
    "time_step_min": 0.001, "topk_group": 1, "torch_dtype": "bfloat16", "transformers_version": "4.55.4",
    "use_bias": False, "use_cache": True, "use_conv_bias": True, "use_mamba_kernels": True, "vocab_size": 131072,
}


@requires_hf
def test_nemotron_3_nano_config_reads_and_counts_as_transformers() -> None:
    """Nemotron 3 Nano's published config.json is read (its MoE layers, its Mamba width of its
    own), and its weight count equals transformers' NemotronHForCausalLM built from the same
    file on the meta device: 31,577,937,344; 3,580,073,408 of them used per token."""
    import torch
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHForCausalLM

    model = nemotron_h_config_from_hf(NANO_CONFIG)
    assert model.layer_counts() == {"mamba": 23, "attention": 6, "moe": 23}
    assert (model.d_ssm, model.moe_experts, model.moe_top_k, model.moe_routed_scaling_factor) == (4096, 128, 6, 2.5)
    with torch.device("meta"):
        hf = NemotronHForCausalLM(NemotronHConfig.from_dict(NANO_CONFIG))
    assert model.model_parameters() == sum(p.numel() for p in hf.parameters()) == 31_577_937_344
    assert model.active_parameters() == 3_580_073_408


@requires_hf
def test_moe_fields_of_a_dense_config_take_the_values_transformers_takes() -> None:
    """Without a MoE layer, each MoE field (and the alias num_local_experts) is accepted by our
    reader for exactly the sample values transformers' NemotronHConfig accepts for it."""
    import logging
    import warnings

    from transformers import NemotronHConfig

    from mambalaya.workloads.families.nemotron_h import MOE_FIELDS

    samples = [True, False, 0, 1, -1, 1.5, 0.0, "x", None, [1], {}]
    dense = _moe_base(hybrid_override_pattern="M*-")
    disagreements = []
    for key in sorted(MOE_FIELDS | {"num_local_experts"}):
        for value in samples:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                logging.disable(logging.CRITICAL)
                try:
                    NemotronHConfig(layers_block_type=["linear_attention", "full_attention", "mlp"], **{key: value})
                    theirs = True
                except Exception:  # noqa: BLE001 - any refusal
                    theirs = False
                finally:
                    logging.disable(logging.NOTSET)
            try:
                nemotron_h_config_from_hf({**dense, key: value})
                ours = True
            except SpecError:
                ours = False
            if ours != theirs:
                disagreements.append((key, value, "mambalaya accepts" if ours else "mambalaya refuses"))
    assert not disagreements, disagreements


@requires_hf
def test_moe_weight_loader_refusals(references: dict) -> None:
    """A MoE layer's checkpoint with a latent projection the config does not set, a bias, or an
    expert tensor of another shape is one error naming the key."""
    from mambalaya.workloads.hf.loader import WeightLoadError

    ref = references["grouped"]
    config = nemotron_h_config_from_hf(ref["config"])
    sd = ref["state_dict"]
    assert set(load_nemotron_h_layer(sd, 1, config)) == {"WN", "WR", "EB", "WU", "WDN", "WSU", "WSD"}
    for key, value, words in (("layers.1.mixer.fc1_latent_proj.weight", np.zeros((16, 32)), "moe_latent_size"),
                              ("layers.1.mixer.shared_experts.up_proj.bias", np.zeros(24), "bias"),
                              ("layers.1.mixer.experts.up_proj", np.zeros((8, 16, 16)), "moe_intermediate_size")):
        with pytest.raises(WeightLoadError, match=words) as err:
            load_nemotron_h_layer({**sd, key: value}, 1, config)
        assert key.removeprefix("layers.1.") in str(err.value)
