"""Falcon-H1 configurations transformers 5.25 builds and runs beyond the ones
``tests/test_dense_families.py`` checks: the mixer's gated RMSNorm **before** the gate
(``mamba_rms_norm: true`` with FalconH1Config's default ``mamba_norm_before_gate: true``), a
Mamba width ``mamba_d_ssm`` that is not a multiple of the hidden size, and a null ``mamba_d_ssm``
(then ``mamba_expand * hidden_size``). Each is built in transformers (small random models,
float32, CPU, eager attention) and compared layer by layer: the config.json through our reader,
the weights through our loader (which finds the multipliers in the config), a prefill of 8 tokens
and 3 decode steps, both scan forms, the output and the carried conv, SSM and KV states after
every step within 1e-5. Companion tests show the comparison can fail, count the parameters
against transformers' modules, save each config with transformers and read it back, and
evaluate it from the command line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.execute.layers import run_family_layer
from mambalaya.workloads import load_model_config
from mambalaya.workloads.blocks.attention import cache_from_hf
from mambalaya.workloads.families.falcon_h1 import FalconH1Multipliers, falcon_h1_config_from_hf
from mambalaya.workloads.hf.loader import WeightLoadError
from mambalaya.workloads.hf.weights_families import load_falcon_h1_layer
from mambalaya.workloads.hf.weights_mamba2 import mamba2_states_from_hf

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)
TOL = 1e-5

#: Every multiplier other than 1, so that the loader must fold each from the config.
MULTIPLIERS = dict(attention_in_multiplier=0.7, attention_out_multiplier=1.3, key_multiplier=0.6,
                   ssm_in_multiplier=1.2, ssm_out_multiplier=0.8, mlp_multipliers=[0.9, 1.4],
                   ssm_multipliers=[1.1, 0.7, 1.5, 0.6, 1.3], embedding_multiplier=2.0, lm_head_multiplier=0.5)

#: The configurations, by id: hidden size 32 each.
CASES = {
    # the norm before the gate, over 2 groups of 24 channels of a width 1.5 x hidden
    "norm-before-gate-width-48": dict(mamba_d_ssm=48, mamba_n_heads=6, mamba_n_groups=2, mamba_rms_norm=True),
    # the norm after the gate, width 1.25 x hidden in 5 heads, one group
    "norm-after-gate-width-40": dict(mamba_d_ssm=40, mamba_n_heads=5, mamba_n_groups=1, mamba_rms_norm=True,
                                     mamba_norm_before_gate=False),
    # no norm; a null mamba_d_ssm: the width is mamba_expand * hidden_size = 96
    "width-null-expand-3": dict(mamba_d_ssm=None, mamba_expand=3, mamba_n_heads=12, mamba_n_groups=3),
}


def _hf_config(**fields):
    from transformers import FalconH1Config

    base = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, mamba_d_state=8, mamba_chunk_size=4, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, attn_implementation="eager",
                **MULTIPLIERS)
    return FalconH1Config(**{**base, **fields})


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ours) - ref)) / np.max(np.abs(ref)))


@pytest.fixture(scope="module", params=list(CASES))
def reference(request) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Model as HFModel
    from hf_reference_families import run_hf_layers

    ref = run_hf_layers(HFModel, _hf_config(**CASES[request.param]), ["both", "both"], seq_len=8, n_decode=3,
                        seed=29)
    return {**ref, "case": request.param}


def _run_steps(config, k: int, layer: dict, weights: dict, scan: str, softmax: str) -> tuple[float, float]:
    """Layer ``k`` run on each recorded input (a prefill, then decode steps carrying our state):
    the largest relative error of its output and of its carried states against transformers'."""
    state, worst_out, worst_state = None, 0.0, 0.0
    for n, x in enumerate(layer["inputs"]):
        step = run_family_layer(config, k, x, weights, state=state, scan=scan if n == 0 else None, softmax=softmax)
        worst_out = max(worst_out, rel_err(step.output, layer["outputs"][n]))
        cache = layer["caches"][n]
        expected = {**mamba2_states_from_hf(cache["conv"], cache["ssm"]),
                    **cache_from_hf(config.attention_config(), cache["key"], cache["value"])}
        assert set(step.state) == set(expected), (set(step.state), set(expected))
        worst_state = max([worst_state] + [rel_err(step.state[t], expected[t]) for t in expected])
        state = step.state
    return worst_out, worst_state


@requires_hf
@pytest.mark.parametrize("scan,softmax", [("chunked", "three-pass"), ("recurrent", "online")])
def test_layers_match_transformers(reference: dict, scan: str, softmax: str) -> None:
    """Each configuration's two layers, read and loaded by mambalaya, equal transformers' after a
    prefill and every decode step: outputs, conv and SSM states, KV cache (measured <= 1e-6)."""
    data = reference["config"]
    config = falcon_h1_config_from_hf(data)
    case = CASES[reference["case"]]
    assert config.mamba_d_ssm == (case["mamba_d_ssm"] or case["mamba_expand"] * 32)
    assert config.norm_before_gate == (case.get("mamba_rms_norm", False) and case.get("mamba_norm_before_gate", True))
    assert config.multipliers.key_multiplier == 0.6 and config.multipliers.ssm_multipliers == (1.1, 0.7, 1.5, 0.6, 1.3)
    for k in range(2):
        weights = load_falcon_h1_layer(reference["state_dict"], k, config)
        worst_out, worst_state = _run_steps(config, k, reference["layers"][k], weights, scan, softmax)
        assert worst_out <= TOL and worst_state <= TOL, (k, worst_out, worst_state)


@requires_hf
def test_the_gate_order_and_the_multipliers_matter(reference: dict) -> None:
    """The comparison can fail: the norm on the other side of the gate, or the multipliers of the
    config left out (FalconH1Config's defaults instead), is far from transformers' output."""
    config = falcon_h1_config_from_hf(reference["config"])
    layer = reference["layers"][0]
    wrong = [config.model_copy(update={"multipliers": FalconH1Multipliers()})]
    if config.mamba_rms_norm:
        wrong.append(config.model_copy(update={"mamba_norm_before_gate": not config.mamba_norm_before_gate}))
    for other in wrong:
        weights = load_falcon_h1_layer(reference["state_dict"], 0, other)
        step = run_family_layer(other, 0, layer["inputs"][0], weights, scan="recurrent")
        assert rel_err(step.output, layer["outputs"][0]) > 1e-3


def test_norm_before_gate_cascade() -> None:
    """With the norm before the gate the mixer squares the ungated YD (SG) and gates inside YN
    (no YG); its group is mamba_d_ssm / mamba_n_groups channels; the other orders keep YG."""
    base = {"model_type": "falcon_h1", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "mamba_d_ssm": 48,
            "mamba_n_heads": 6, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_chunk_size": 4, "vocab_size": 16}
    before = falcon_h1_config_from_hf({**base, "mamba_rms_norm": True})
    for phase, scan in (("prefill", "chunked"), ("prefill", "recurrent"), ("decode", None)):
        cascade = before.layer("parallel", batch=1, seq_len=8, phase=phase, scan=scan)
        einsums = {e.name: e for e in cascade.einsums}
        assert "YG" not in cascade.tensors and set(einsums["SG"].input_tensors) == {"YD"}
        assert set(einsums["YN"].input_tensors) == {"YD", "RG", "WGN", "GZ"}
        assert cascade.size("R") * cascade.size("P") == 48 // 2
        names = [e.name for e in cascade.einsums]
        assert names.index("SG") < names.index("RG") < names.index("YN") < names.index("O")
    for change in ({"mamba_rms_norm": True, "mamba_norm_before_gate": False}, {"mamba_rms_norm": False}):
        cascade = falcon_h1_config_from_hf({**base, **change}).layer("parallel", batch=1, seq_len=8)
        assert "YG" in cascade.tensors


@requires_hf
@pytest.mark.parametrize("case", list(CASES))
def test_parameters_equal_transformers_modules(case: str) -> None:
    """Our count = transformers' FalconH1Model on the meta device + the (untied) LM head."""
    import torch
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Model as HFModel

    hf = _hf_config(**CASES[case])
    with torch.device("meta"):
        hf_count = sum(p.numel() for p in HFModel(hf).parameters())
    assert falcon_h1_config_from_hf(hf.to_dict()).model_parameters() == hf_count + hf.vocab_size * hf.hidden_size


@requires_hf
@pytest.mark.parametrize("case", list(CASES))
def test_saved_config_reads_back_and_evaluates(tmp_path: Path, case: str) -> None:
    """Each configuration saved by transformers' save_pretrained reads back (load_model_config)
    with its width, gate order and multipliers, and `mambalaya evaluate` runs it in prefill and
    decode (the stitched mapping: the optimal search of a layer this small takes seconds)."""
    from typer.testing import CliRunner

    from mambalaya.cli import app

    hf = _hf_config(**CASES[case])
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    model = load_model_config(path)
    assert model == falcon_h1_config_from_hf(json.loads(path.read_text()))
    assert (model.mamba_d_ssm, model.mamba_heads, model.mamba_ngroups) == \
        (hf.mamba_d_ssm or hf.mamba_expand * 32, hf.mamba_n_heads, hf.mamba_n_groups)
    assert (model.mamba_rms_norm, model.mamba_norm_before_gate) == (hf.mamba_rms_norm, hf.mamba_norm_before_gate)
    assert model.multipliers == FalconH1Multipliers(**{k: v for k, v in MULTIPLIERS.items()})
    for phase in ("prefill", "decode"):
        out = CliRunner().invoke(app, ["evaluate", "--model", str(path), "--arch", "mambalaya", "--phase", phase,
                                       "-L", "16", "--batch", "1", "--mapping", "stitched"])
        assert out.exit_code == 0 and "model (2 layers)" in out.output, out.output[-800:]


BASE = {"model_type": "falcon_h1", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "mamba_d_ssm": 40, "mamba_n_heads": 5,
        "mamba_d_state": 8, "vocab_size": 16}


def test_width_is_read_as_transformers_reads_it() -> None:
    """mamba_d_ssm absent: FalconH1Config's 1024; null: mamba_expand * hidden_size; given: itself,
    whatever mamba_expand says (even null)."""
    no_width = {k: v for k, v in BASE.items() if k not in ("mamba_d_ssm", "mamba_n_heads")}
    assert falcon_h1_config_from_hf(no_width).mamba_d_ssm == 1024
    null = {**BASE, "mamba_d_ssm": None, "mamba_n_heads": 8}
    assert falcon_h1_config_from_hf({**null, "mamba_expand": 5}).mamba_d_ssm == 160
    assert falcon_h1_config_from_hf(null).mamba_d_ssm == 64  # mamba_expand's default 2
    assert falcon_h1_config_from_hf({**BASE, "mamba_expand": None}).mamba_d_ssm == 40
    assert falcon_h1_config_from_hf({**BASE, "mamba_d_head": 8}).mamba2().headdim == 8


@pytest.mark.parametrize("change,field", [
    ({"mamba_n_heads": 3}, "mamba_n_heads"),  # 40 is not 3 heads
    ({"mamba_d_head": 4}, "mamba_d_head"),  # 4 x 5 heads is not 40
    ({"mamba_d_ssm": None, "mamba_expand": None}, "mamba_expand"),  # transformers: None * hidden_size
    ({"mamba_d_ssm": None, "mamba_expand": "2"}, "mamba_expand"),
    ({"mamba_expand": 1.5}, "mamba_expand"),  # unread, but FalconH1Config types it
    ({"mamba_n_groups": 2}, "mamba_n_groups"),  # 5 heads in 2 groups
    ({"mamba_norm_before_gate": "yes"}, "mamba_norm_before_gate"),
])
def test_refusals_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(SpecError, match=field):
        falcon_h1_config_from_hf({**BASE, **change})


def test_loader_takes_the_multipliers_from_the_config() -> None:
    """The multipliers are the config's: a dict where the dtype goes is refused by name."""
    config = falcon_h1_config_from_hf(BASE)
    with pytest.raises(WeightLoadError, match="config.multipliers"):
        load_falcon_h1_layer({}, 0, config, {"key_multiplier": 2.0})  # type: ignore[arg-type]
