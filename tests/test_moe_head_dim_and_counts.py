"""Jamba and Granite 4 with a ``head_dim`` in config.json (attention heads not hidden/heads
wide), checked layer by layer against transformers 5.25 and read back from a config transformers
saved; the active parameters ``mambalaya models`` shows, counted on transformers' modules that one
token's forward pass runs; and the layer count ``models`` shows for olmo-hybrid, which agrees
with its (whole-model) parameter count."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mambalaya.errors import SpecError

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)

#: Jamba: hidden 32 with 6 heads (6 does not divide 32) of head_dim 12, 3 KV heads; layer 0
#: Mamba, layer 1 attention + MoE (4 experts, top-2).
JAMBA_HEAD_DIM = dict(vocab_size=16, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=3, head_dim=12, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                      expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8,
                      mamba_dt_rank=4, rms_norm_eps=1e-5)
#: Granite 4: hidden 32 with 4 heads of head_dim 6 (not 8), the rotary embedding over those 6
#: channels, attention and residual multipliers; 5 experts, top-3, a shared MLP.
GRANITE_HEAD_DIM = dict(vocab_size=16, hidden_size=32, intermediate_size=24, shared_intermediate_size=20,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                        position_embedding_type="rope", num_local_experts=5, num_experts_per_tok=3,
                        layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=4,
                        residual_multiplier=0.7, attention_multiplier=0.3, rms_norm_eps=1e-5)


def _rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _check_layers(ref: dict) -> None:
    """Every layer of the reference through our executor: outputs after the prefill and each
    decode step, and the carried KV cache of the attention layers, within 1e-5."""
    from mambalaya.execute.layers import run_moe_family_layer
    from mambalaya.workloads.blocks.attention import cache_from_hf
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf
    from mambalaya.workloads.hf.weights_moe import load_moe_family_layer

    config = moe_config_from_hf(dict(ref["config"]))
    hd = ref["config"]["head_dim"]
    assert config.head_dim == hd and config.attention().head_channels == hd != config.d_model // config.n_heads
    attention_layers = 0
    for k, layer in enumerate(ref["layers"]):
        weights = load_moe_family_layer(ref["state_dict"], k, config)
        state = None
        for n, (x, expected, cache) in enumerate(zip(layer["inputs"], layer["outputs"], layer["caches"])):
            step = run_moe_family_layer(config, k, x, weights, state=state)
            assert _rel_err(step.output, expected) <= 1e-5, (k, n, _rel_err(step.output, expected))
            state = step.state
            if "key" in cache:
                assert cache["key"].shape[-1] == hd
                want = cache_from_hf(config.attention(), cache["key"], cache["value"])
                assert set(state) == set(want) and all(_rel_err(state[t], want[t]) <= 1e-5 for t in want)
                attention_layers += n == 0
    assert attention_layers == 1


@requires_hf
@pytest.mark.parametrize("family, fields, seed", [("jamba", JAMBA_HEAD_DIM, 5),
                                                  ("granitemoehybrid", GRANITE_HEAD_DIM, 7)])
def test_head_dim_layers_match_transformers(family: str, fields: dict, seed: int) -> None:
    """A head_dim unlike hidden/heads (Jamba: 12 against 32/6, no position embedding, scores
    scaled by 12**-0.5; Granite: 6 against 8, rotary over the 6 channels, attention_multiplier):
    a prefill of 8 and 3 decode steps of every layer equal transformers within 1e-5, and so
    does the KV cache of head_dim-wide keys and values."""
    import hf_reference_moe as hf

    _check_layers(hf.run_hf_moe(family, seq_len=8, n_decode=3, seed=seed, **fields))


@requires_hf
def test_head_dim_sets_the_attention_shapes_and_parameters() -> None:
    """The attention's projections (q heads*head_dim, k/v kv_heads*head_dim) and so the layer's
    parameters follow head_dim: the model's count equals transformers' module (plus the LM head)."""
    import torch
    import hf_reference_moe as hf
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    for family, fields in (("jamba", JAMBA_HEAD_DIM), ("granitemoehybrid", GRANITE_HEAD_DIM)):
        with torch.device("meta"):
            config, model = hf.build_hf_model(family, **fields)
        ours = moe_config_from_hf(config.to_dict())
        head = 0 if ours.tie_embeddings else ours.vocab_size * ours.d_model
        assert sum(p.numel() for p in model.parameters()) + head == ours.model_parameters()
        without = moe_config_from_hf({k: v for k, v in config.to_dict().items() if k != "head_dim"}
                                     | {"num_attention_heads": 4, "num_key_value_heads": 2})
        assert without.head_dim is None and without.attention().head_channels == 8


@pytest.mark.parametrize("value, message", [
    (None, "field head_dim is null: transformers' attention .* leave it out"),
    (12.0, "field head_dim must be a positive integer, not 12.0"),
    ("12", "field head_dim must be a positive integer"),
    (0, "field head_dim must be a positive integer, not 0"),
])
def test_a_head_dim_transformers_cannot_build_or_run_is_refused(value, message: str) -> None:
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    for family, fields in (("jamba", JAMBA_HEAD_DIM), ("granitemoehybrid", GRANITE_HEAD_DIM)):
        with pytest.raises(SpecError, match=message):
            moe_config_from_hf({"model_type": family, **fields, "head_dim": value})


@requires_hf
def test_refused_head_dims_fail_in_transformers_too() -> None:
    """What the reader refuses transformers cannot build or run, and what it takes transformers
    runs: a null head_dim (the attention multiplies by it); an odd one above 4 in Granite, with or
    without the rotary embedding (GraniteMoeHybridConfig's rotary check); an odd one of at most 4
    under Granite's rotary embedding (it rotates pairs: the model fails); odd in Jamba (no
    rotary embedding) and in Granite without one, where both run."""
    import torch
    import hf_reference_moe as hf
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    def runs(family: str, fields: dict) -> bool:
        try:
            _, model = hf.build_hf_model(family, **fields)
            with torch.no_grad():
                model(inputs_embeds=torch.zeros(1, 3, 32))
        except Exception:  # noqa: BLE001 - any refusal
            return False
        return True

    def reads(family: str, fields: dict) -> bool:
        try:
            moe_config_from_hf({"model_type": family, **fields})
        except SpecError:
            return False
        return True

    granite_nope = {k: v for k, v in GRANITE_HEAD_DIM.items() if k != "position_embedding_type"}
    cases = [("jamba", {**JAMBA_HEAD_DIM, "head_dim": None}, False),
             ("jamba", {**JAMBA_HEAD_DIM, "head_dim": 5}, True),
             ("granitemoehybrid", {**GRANITE_HEAD_DIM, "head_dim": 5}, False),
             ("granitemoehybrid", {**granite_nope, "head_dim": 5}, False),
             ("granitemoehybrid", {**GRANITE_HEAD_DIM, "head_dim": 3}, False),
             ("granitemoehybrid", {**granite_nope, "head_dim": 3}, True)]
    for family, fields, expected in cases:
        assert runs(family, fields) == reads(family, fields) == expected, (family, fields["head_dim"], expected)
    with pytest.raises(SpecError, match="field head_dim = 5 is odd: transformers .* refuses an odd head_dim above 4"):
        moe_config_from_hf({"model_type": "granitemoehybrid", **granite_nope, "head_dim": 5})
    with pytest.raises(SpecError, match="rotary_dim .* is odd"):
        moe_config_from_hf({"model_type": "granitemoehybrid", **GRANITE_HEAD_DIM, "head_dim": 3})


def test_without_head_dim_the_heads_must_divide_hidden() -> None:
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    fields = {k: v for k, v in JAMBA_HEAD_DIM.items() if k != "head_dim"}
    with pytest.raises(SpecError, match="num_attention_heads = 6 does not divide hidden_size = 32 .and no head_dim"):
        moe_config_from_hf({"model_type": "jamba", **fields})


@requires_hf
@pytest.mark.parametrize("family", ["jamba", "granitemoehybrid"])
def test_head_dim_read_back_from_a_config_transformers_saved(tmp_path: Path, family: str) -> None:
    """The config class saves head_dim (a field it does not declare) and load_model_config
    reads it back, from the file and from the same file as a dict."""
    from transformers import GraniteMoeHybridConfig, JambaConfig

    from mambalaya.workloads import load_model_config
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    fields = JAMBA_HEAD_DIM if family == "jamba" else GRANITE_HEAD_DIM
    hf = (JambaConfig if family == "jamba" else GraniteMoeHybridConfig)(**fields)
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    assert json.loads(path.read_text())["head_dim"] == fields["head_dim"]
    m = load_model_config(path)
    assert m == moe_config_from_hf(json.loads(path.read_text()))
    assert (m.family, m.d_model, m.n_heads, m.n_kv_heads, m.head_dim) == (
        family, 32, fields["num_attention_heads"], fields["num_key_value_heads"], fields["head_dim"])
    assert m.rope == (family == "granitemoehybrid")


# --------------------------------------------------------------------------------------------
# active parameters

def _parameters_one_token_uses(model, input_ids) -> tuple[int, dict[str, set[int]]]:
    """Run ``input_ids`` through transformers' model and count the parameter elements its
    operations read: every parameter an operation takes whole, and of a 3-D expert weight
    (``[experts, ...]``) only the expert slices it indexes (``weight[expert]``: the eager experts
    loop). Returns that count and, per expert weight, the experts read."""
    import torch
    from torch.overrides import TorchFunctionMode

    names = {id(p): n for n, p in model.named_parameters()}  # a tied LM head is one parameter
    whole: set[str] = set()
    sliced: dict[str, set[int]] = {}

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") != "__get__":  # not .shape, .dtype: an operation
                for a in list(args) + list((kwargs or {}).values()):
                    name = names.get(id(a))
                    if name is None:
                        continue
                    if func is torch.Tensor.__getitem__ and a is args[0] and ".experts." in name:
                        sliced.setdefault(name, set()).add(int(args[1]))
                    else:
                        whole.add(name)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Reads():
        model(input_ids=input_ids)
    params = dict(model.named_parameters())
    assert not whole & set(sliced), "an expert weight read whole"
    total = sum(params[n].numel() for n in whole)
    total += sum(len(experts) * params[n][0].numel() for n, experts in sliced.items())
    return total, sliced


@requires_hf
@pytest.mark.parametrize("family, fields", [
    ("jamba", {**JAMBA_HEAD_DIM, "num_hidden_layers": 4}),  # 2 dense and 2 MoE layers, untied
    ("granitemoehybrid", {**GRANITE_HEAD_DIM, "tie_word_embeddings": True}),
])
def test_active_parameters_are_what_one_token_uses_in_transformers(family: str, fields: dict) -> None:
    """``active_parameters`` equals the parameters of transformers' ``ForCausalLM`` modules that
    one token's forward pass runs, with only the top-k experts each MoE layer picks counted;
    below the total, by the unpicked experts' weights exactly."""
    import torch
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, JambaConfig, JambaForCausalLM

    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    torch.manual_seed(0)
    kinds = {"jamba": (JambaConfig, JambaForCausalLM), "granitemoehybrid": (GraniteMoeHybridConfig,
                                                                            GraniteMoeHybridForCausalLM)}
    config_class, model_class = kinds[family]
    config = config_class(attn_implementation="eager", experts_implementation="eager", **fields)
    model = model_class(config).eval()
    ours = moe_config_from_hf(config.to_dict())
    used, sliced = _parameters_one_token_uses(model, torch.tensor([[3]]))
    moe_layers = sum(t.endswith("-moe") for t in ours.layer_types)
    assert len(sliced) == 2 * moe_layers > 0  # gate_up_proj and down_proj of every MoE layer
    assert all(len(experts) == ours.top_k for experts in sliced.values())
    assert ours.active_parameters() == used
    assert sum(p.numel() for p in model.parameters()) == ours.model_parameters()
    unpicked = moe_layers * (ours.n_experts - ours.top_k) * 3 * ours.d_model * ours.d_ff
    assert ours.model_parameters() - ours.active_parameters() == unpicked > 0
    # two tokens read more experts than one: the count is per token
    assert _parameters_one_token_uses(model, torch.tensor([[3, 5, 7, 9]]))[0] > used


def test_preset_active_parameters_round_to_the_published() -> None:
    from mambalaya.workloads.families.jamba_granite import MOE_PRESETS, MOE_PUBLISHED_PARAMETERS_B

    for name, cfg in MOE_PRESETS.items():
        assert round(cfg.active_parameters() / 1e9) == MOE_PUBLISHED_PARAMETERS_B[name][1]


def _models_rows() -> dict[str, dict]:
    from test_cli import invoke

    out = invoke("models", "-f", "json")
    assert out.exit_code == 0, out.output
    return {row["model"]: row for row in json.loads(out.stdout)}


def test_models_shows_active_parameters_beside_the_total() -> None:
    """MoE presets: the active count, below the total; every other preset: the total (each
    token uses every weight). The table and the CSV carry the column too."""
    from test_cli import invoke
    from mambalaya.workloads import PRESETS

    rows = _models_rows()
    for name, row in rows.items():
        cfg = PRESETS[name]
        if getattr(cfg, "n_experts", 0):
            assert row["active_parameters"] == cfg.active_parameters() < row["parameters"], name
        else:
            assert row["active_parameters"] == row["parameters"], name
    assert rows["jamba-v0.1"]["active_parameters"] == 12_110_311_296
    assert rows["granite-4.0-h-tiny"]["active_parameters"] == 1_465_470_528
    table = invoke("models")
    assert table.exit_code == 0 and "active_parameters" in table.stdout and "12,110,311,296" in table.stdout
    csv_out = invoke("models", "-f", "csv")
    assert csv_out.stdout.splitlines()[0].endswith("parameters,active_parameters")


def test_models_olmo_hybrid_layer_count_agrees_with_its_parameters() -> None:
    """The ``olmo-hybrid`` Gated DeltaNet preset counts the whole model's parameters (7.43B,
    the ``olmo-hybrid-7b`` whole model's); its layer count is the whole model's too: 32, as
    transformers' OlmoHybridConfig (num_hidden_layers), not the 24 Gated DeltaNet layers it builds."""
    from mambalaya.workloads import PRESETS

    rows = _models_rows()
    gdn, whole = rows["olmo-hybrid"], rows["olmo-hybrid-7b"]
    assert gdn["parameters"] == whole["parameters"] == 7_430_870_688
    assert gdn["n_layers"] == whole["n_layers"] == 32 == len(PRESETS["olmo-hybrid"].layer_types)
    assert PRESETS["olmo-hybrid"].n_layers == 24  # the layers it builds, what evaluate costs
    if importlib.util.find_spec("transformers") is not None:
        from transformers import OlmoHybridConfig

        assert OlmoHybridConfig().num_hidden_layers == 32
    for name, row in rows.items():  # every other preset: the layers it builds are all its layers
        if name != "olmo-hybrid":
            assert row["n_layers"] == PRESETS[name].n_layers, name
