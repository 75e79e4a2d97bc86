"""The Mamba-2 (SSD) cascade: executor vs transformers' Mamba2Block, recurrent vs chunked scan,
state continuity, presets, parameter counts, text round-trip and the weight loader."""

from __future__ import annotations

import importlib.util
import json

import hf_reference_mamba2 as hf
import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.einsum import dump_cascade, loads_cascade
from mambalaya.execute import carry_states, execute
from mambalaya.workloads.hf.weights import WeightLoadError
from mambalaya.workloads.hf.weights_mamba2 import (
    WEIGHT_NAMES,
    load_mamba2_config,
    load_mamba2_layer,
    mamba2_states_from_hf,
    mamba2_states_to_hf,
)
from mambalaya.workloads.blocks.mamba2 import (
    PRESETS,
    PUBLISHED_PARAMETERS_M,
    WEIGHTS,
    Mamba2Config,
    chunked_output_to_positions,
    mamba2_constants,
    mamba2_layer,
)

STATE_NAMES = ("CSX0", "CSB0", "CSC0", "H0")


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def prefill(config: Mamba2Config, x: np.ndarray, weights: dict, states: dict | None, scan: str, dtype: str):
    """One prefill piece with state in/out; returns (output [B,L,D], outgoing states)."""
    batch, seq_len, _ = x.shape
    c = mamba2_layer(config, batch=batch, seq_len=seq_len, state_io=True, scan=scan)
    if states is None:
        states = {t: np.zeros(c.shape(t)) for t in STATE_NAMES}
    result = execute(c, {"X": x, **weights, **states, **mamba2_constants(c)}, dtype=dtype)
    xo = result["XO"] if scan == "recurrent" else chunked_output_to_positions(result["XO"], seq_len)
    return xo, carry_states(c, result)


def decode(config: Mamba2Config, xs: list, weights: dict, states: dict, dtype: str):
    c = mamba2_layer(config, batch=xs[0].shape[0], seq_len=1, phase="decode")
    outputs, all_states = [], []
    for x in xs:
        result = execute(c, {"X": x, **weights, **states}, dtype=dtype)
        states = carry_states(c, result)
        outputs.append(result["XO"])
        all_states.append(states)
    return outputs, all_states


# --------------------------------------------------------------------------------------------
# against transformers
# --------------------------------------------------------------------------------------------

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)


@requires_hf
@pytest.mark.parametrize("scan", ["recurrent", "chunked"])
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(dict(d_model=32, ngroups=1, batch=2, seq_len=10), id="G1-B2-L10-padded"),
        pytest.param(dict(d_model=32, ngroups=2, batch=2, seq_len=8), id="G2-B2-L8"),
        pytest.param(dict(d_model=24, ngroups=3, d_state=4, headdim=4, batch=1, seq_len=3), id="G3-B1-L3-short"),
    ],
)
def test_prefill_and_decode_match_transformers(case: dict, scan: str) -> None:
    case = dict(case)
    batch, seq_len = case.pop("batch"), case.pop("seq_len")
    ref = hf.run_hf_mamba2_block(**case, batch=batch, seq_len=seq_len, n_decode=4, dtype="float32", seed=7)
    config = Mamba2Config(**ref["config"])
    weights = ref["weights"]
    y, states = prefill(config, ref["x_prefill"], weights, None, scan, "float32")
    ys, dec_states = decode(config, ref["x_decode"], weights, states, "float32")

    assert y.dtype == np.float32
    errors = [rel_err(y, ref["y_prefill"])] + [rel_err(a, b) for a, b in zip(ys, ref["y_decode"])]
    assert len(errors) == 5 and max(errors) <= 1e-5, errors
    for ours, theirs in zip([states, *dec_states], [ref["states_prefill"], *ref["states_decode"]]):
        for t in STATE_NAMES:
            assert rel_err(ours[t], theirs[t]) <= 1e-5, t


@requires_hf
@pytest.mark.parametrize("first_scan, second_scan", [("chunked", "chunked"), ("recurrent", "chunked")])
def test_prefill_with_state_then_decode_continues_one_sequence(first_scan: str, second_scan: str) -> None:
    """transformers prefills 13 tokens at once; we prefill 6 + 7 (state carried), then decode."""
    ref = hf.run_hf_mamba2_block(d_model=32, ngroups=2, batch=2, seq_len=13, n_decode=4, seed=11)
    config = Mamba2Config(**ref["config"])
    x, w = ref["x_prefill"], ref["weights"]
    y1, s1 = prefill(config, x[:, :6], w, None, first_scan, "float32")
    y2, s2 = prefill(config, x[:, 6:], w, s1, second_scan, "float32")
    ys, dec_states = decode(config, ref["x_decode"], w, s2, "float32")
    assert rel_err(np.concatenate([y1, y2], axis=1), ref["y_prefill"]) <= 1e-5
    assert max(rel_err(a, b) for a, b in zip(ys, ref["y_decode"])) <= 1e-5
    for t in STATE_NAMES:
        assert rel_err(s2[t], ref["states_prefill"][t]) <= 1e-5
        assert rel_err(dec_states[-1][t], ref["states_decode"][-1][t]) <= 1e-5


@requires_hf
def test_transformers_piecewise_prefill_matches_ours() -> None:
    """transformers' own chunk path with an initial state (a second prefill piece) agrees too."""
    ref = hf.run_hf_mamba2_block(d_model=32, batch=1, seq_len=12, n_decode=1, prefill_pieces=[5, 7], seed=5)
    config = Mamba2Config(**ref["config"])
    y1, s1 = prefill(config, ref["x_prefill"][:, :5], ref["weights"], None, "chunked", "float32")
    y2, s2 = prefill(config, ref["x_prefill"][:, 5:], ref["weights"], s1, "chunked", "float32")
    assert rel_err(np.concatenate([y1, y2], axis=1), ref["y_prefill"]) <= 1e-5
    assert all(rel_err(s2[t], ref["states_prefill"][t]) <= 1e-5 for t in STATE_NAMES)


# --------------------------------------------------------------------------------------------
# the two scan forms
# --------------------------------------------------------------------------------------------


def _random_weights(config: Mamba2Config, seed: int) -> dict[str, np.ndarray]:
    sd = hf.random_mamba2_state_dict(
        d_model=config.d_model, d_state=config.d_state, headdim=config.headdim, ngroups=config.ngroups,
        expand=config.expand, d_conv=config.d_conv, seed=seed,
    )
    return load_mamba2_layer(sd, dtype="float64", ngroups=config.ngroups)


@pytest.mark.parametrize("seq_len", [12, 13, 2])
def test_recurrent_and_chunked_agree_in_float64(seq_len: int) -> None:
    config = Mamba2Config(d_model=32, d_state=8, headdim=8, ngroups=2, chunk_size=4)
    weights = _random_weights(config, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, seq_len, 32))
    c = mamba2_layer(config, batch=2, seq_len=seq_len, state_io=True)
    states = {t: 0.5 * rng.standard_normal(c.shape(t)) for t in STATE_NAMES}  # a non-zero incoming state
    y_rec, s_rec = prefill(config, x, weights, states, "recurrent", "float64")
    y_chk, s_chk = prefill(config, x, weights, states, "chunked", "float64")
    assert rel_err(y_chk, y_rec) <= 1e-10
    for t in STATE_NAMES:
        assert rel_err(s_chk[t], s_rec[t]) <= 1e-10


def test_chunked_padding_rows_are_zero_and_mask_is_causal() -> None:
    config = Mamba2Config(d_model=16, d_state=4, headdim=4, chunk_size=4)
    c = mamba2_layer(config, batch=1, seq_len=6, scan="chunked")
    assert c.shape("XO") == (1, 2, 4, 16) and c.size("C") == 2
    lm = mamba2_constants(c)["LM"]
    assert lm.shape == (4, 4) and np.all(np.tril(lm) == 0) and np.all(np.isneginf(lm[np.triu_indices(4, 1)]))
    assert mamba2_constants(mamba2_layer(config, batch=1, seq_len=6)) == {}
    weights = _random_weights(config, seed=4)
    x = np.random.default_rng(0).standard_normal((1, 6, 16))
    xo = execute(c, {"X": x, **weights, **mamba2_constants(c)})["XO"].reshape(1, 8, 16)
    assert np.all(xo[:, 6:] == 0) and np.all(np.isfinite(xo))


# --------------------------------------------------------------------------------------------
# presets, parameters, structure, text
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMETERS_M))
def test_whole_model_parameters_equal_published(name: str) -> None:
    config = PRESETS[name]
    layer = mamba2_layer(config, batch=1, seq_len=8)
    assert layer.parameters() == config.layer_parameters()
    assert config.model_parameters() / 1e6 == pytest.approx(PUBLISHED_PARAMETERS_M[name], rel=1e-3)


def test_layer_parameters_by_hand() -> None:
    c = PRESETS["mamba2-2.7b"]  # D 2560, E 5120, H 80, N 128, G 1, K 4
    assert (c.d_inner, c.nheads, c.heads_per_group) == (5120, 80, 80)
    in_proj = 2560 * (2 * 5120 + 2 * 128 + 80)
    conv = (5120 + 256) * 5
    assert c.layer_parameters() == 2560 + in_proj + conv + 3 * 80 + 5120 + 5120 * 2560
    assert c.model_parameters() == 50288 * 2560 + 64 * c.layer_parameters() + 2560


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_validate_at_L2048_batch64(name: str) -> None:
    config = PRESETS[name]
    rec = mamba2_layer(config, batch=64, seq_len=2048)
    chk = mamba2_layer(config, batch=64, seq_len=2048, scan="chunked", state_io=True)
    dec = mamba2_layer(config, batch=64, seq_len=2048, phase="decode")
    for c in (rec, chk, dec):
        assert c.parameters() == config.layer_parameters()
    assert rec.generational_ranks == ("I",) and set(chk.generational_ranks) == {"Q", "C"}
    assert (chk.size("C"), chk.size("Q")) == (8, 256)
    assert rec.shape("H") == (64, 2048, 1, config.nheads, 64, 128)
    assert chk.shape("HC") == (64, 8, 1, config.nheads, 64, 128)
    assert dec.size("I") == 1 and set(dec.output_tensors()) == {"XO", "H", "CSXN", "CSBN", "CSCN"}


def test_cascade_structure_and_kinds() -> None:
    config = Mamba2Config(d_model=64, ngroups=2, headdim=16, d_state=8, chunk_size=8)
    rec = mamba2_layer(config, batch=2, seq_len=16)
    names = [e.name for e in rec.einsums]
    assert len(names) == 27 and {"AD", "BX", "H", "YS"} <= set(names)  # the ssm-ri region
    kinds = {e.name: rec.kind(e) for e in rec.einsums}
    assert kinds["H"] == "recurrent" and kinds["XC"] == "window" and kinds["XI"] == "gemm"
    assert kinds["AD"] == "unary" and kinds["YS"] == "reduction" and kinds["O"] == "gemm"
    assert set(rec.external_tensors()) == {"X", *WEIGHTS} and set(WEIGHTS) == set(WEIGHT_NAMES)
    chk = mamba2_layer(config, batch=2, seq_len=16, scan="chunked")
    kinds = {e.name: chk.kind(e) for e in chk.einsums}
    assert len(kinds) == 34 and kinds["ACS"] == "recurrent" and kinds["HC"] == "recurrent"
    assert chk.recurrence(chk.einsum("HC")) == ("C", 1) and chk.recurrence(chk.einsum("ACS")) == ("Q", 1)
    assert set(chk.external_tensors()) == {"X", "LM", *WEIGHTS}
    assert not {"AD", "BX", "H", "YS"} & set(kinds)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(seq_len=9),
        dict(seq_len=9, state_io=True),
        dict(seq_len=9, scan="chunked"),
        dict(seq_len=9, scan="chunked", state_io=True),
        dict(seq_len=1, phase="decode"),
    ],
)
def test_cascade_text_round_trips(kwargs: dict) -> None:
    config = Mamba2Config(d_model=32, ngroups=2, headdim=8, d_state=8, chunk_size=4)
    c = mamba2_layer(config, batch=2, **kwargs)
    assert loads_cascade(dump_cascade(c)) == c


def test_bad_arguments_raise_spec_errors() -> None:
    config = Mamba2Config(d_model=32, headdim=8, d_state=8)
    with pytest.raises(SpecError, match="recurrent"):
        mamba2_layer(config, batch=1, seq_len=4, phase="decode", scan="chunked")
    with pytest.raises(SpecError, match="state_io"):
        mamba2_layer(config, batch=1, seq_len=4, phase="decode", state_io=False)
    with pytest.raises(SpecError, match="scan"):
        mamba2_layer(config, batch=1, seq_len=4, scan="parallel")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="headdim"):
        Mamba2Config(d_model=30, headdim=8)
    with pytest.raises(ValueError, match="ngroups"):
        Mamba2Config(d_model=32, headdim=8, ngroups=3)


# --------------------------------------------------------------------------------------------
# weight and config loading
# --------------------------------------------------------------------------------------------


def test_loader_prefixes_files_and_config_beside(tmp_path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    sd = hf.random_mamba2_state_dict(d_model=16, d_state=4, headdim=4, ngroups=2, expand=2, d_conv=4, seed=0)
    bare = load_mamba2_layer(sd, dtype="float64", ngroups=2)
    assert tuple(bare) == WEIGHT_NAMES
    assert bare["WB"].shape == (16, 2, 4) and bare["WO"].shape == (2, 4, 4, 16) and bare["A"].shape == (2, 4)
    assert np.allclose(bare["A"].ravel(), -np.exp(sd["mixer.A_log"]))
    assert load_mamba2_layer(sd, dtype="float64", d_state=4)["WCB"].shape == (2, 4, 4)
    model = {f"backbone.layers.{n}.{k}": v.astype(np.float32) for n in range(2) for k, v in sd.items()}
    model["backbone.embeddings.weight"] = np.zeros((8, 16), np.float32)
    safetensors_numpy.save_file(model, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"d_model": 16, "n_layer": 2, "vocab_size": 5, "pad_vocab_size_multiple": 8,
         "ssm_cfg": {"layer": "Mamba2", "d_state": 4, "headdim": 4, "ngroups": 2}}
    ))
    loaded = load_mamba2_layer(tmp_path, layer=1)  # ngroups from the config.json beside the weights
    assert all(np.allclose(loaded[k], bare[k], rtol=1e-6) and loaded[k].dtype == np.float32 for k in WEIGHT_NAMES)
    cfg = load_mamba2_config(tmp_path)
    assert cfg == dict(d_model=16, n_layers=2, d_state=4, headdim=4, ngroups=2, expand=2, d_conv=4,
                       chunk_size=256, vocab_size=8, norm_eps=1e-5, tie_embeddings=True)
    Mamba2Config(**cfg)
    unpadded = {"d_model": 16, "n_layer": 2, "vocab_size": 5, "ssm_cfg": {"layer": "Mamba2", "d_state": 4, "headdim": 4}}
    assert load_mamba2_config(unpadded)["vocab_size"] == 8  # mamba_ssm's default multiple of 8


def test_published_state_spaces_config_gives_the_preset() -> None:
    cfg = {"d_model": 768, "d_intermediate": 0, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {"layer": "Mamba2"},
           "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
           "fused_add_norm": True, "pad_vocab_size_multiple": 16, "tie_embeddings": True}
    assert Mamba2Config(**load_mamba2_config(cfg)) == PRESETS["mamba2-130m"]
    with pytest.raises(WeightLoadError, match="Mamba2"):
        load_mamba2_config({"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}})


def test_loader_rejects_what_is_not_modelled() -> None:
    sd = hf.random_mamba2_state_dict(d_model=16, d_state=4, headdim=4, ngroups=1, expand=2, d_conv=4, seed=0)
    with pytest.raises(WeightLoadError, match="use_bias"):
        load_mamba2_layer({**sd, "mixer.in_proj.bias": np.zeros(1)})
    with pytest.raises(WeightLoadError, match="conv1d.bias"):
        load_mamba2_layer({k: v for k, v in sd.items() if k != "mixer.conv1d.bias"})
    with pytest.raises(WeightLoadError, match="ngroups=3"):
        load_mamba2_layer(sd, ngroups=3)
    with pytest.raises(WeightLoadError, match="dtype"):
        load_mamba2_layer(sd, dtype="float16")


def test_states_round_trip_to_transformers_layout() -> None:
    rng = np.random.default_rng(0)
    conv = rng.standard_normal((2, 16 + 2 * 2 * 3, 4))  # E 16, G 2, N 3, K 4
    ssm = rng.standard_normal((2, 4, 4, 3))  # H 4, P 4, N 3
    s = mamba2_states_from_hf(conv, ssm, dtype="float64")
    assert s["CSX0"].shape == (2, 3, 2, 2, 4) and s["CSB0"].shape == (2, 3, 2, 3) and s["H0"].shape == (2, 2, 2, 4, 3)
    back_conv, back_ssm = mamba2_states_to_hf(s["CSX0"], s["CSB0"], s["CSC0"], s["H0"])
    assert np.array_equal(back_conv[:, :, 1:], conv[:, :, 1:]) and np.all(back_conv[:, :, 0] == 0)
    assert np.array_equal(back_ssm, ssm)


def test_loader_refuses_to_guess_how_b_and_c_split() -> None:
    """The weights fix ngroups * d_state, not each: with neither given and no config.json beside
    them, loading is an error rather than mamba_ssm's or transformers' default."""
    sd = hf.random_mamba2_state_dict(d_model=16, d_state=4, headdim=4, ngroups=2, expand=2, d_conv=4, seed=0)
    with pytest.raises(WeightLoadError, match="do not say how they split .* give ngroups= or d_state="):
        load_mamba2_layer(sd)


def test_every_command_runs_a_mamba2_prefill_in_its_faster_form_by_default() -> None:
    """compare ran the chunked form while sensitivity and reproduce ran the faster one, so one
    design pair printed 2.31x in one and 2.18x in the other; now compare (and evaluate) take the
    faster form too, equal to evaluate_best_scan, and evaluate names the form."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.experiments.evaluate import compare_rows, evaluate_best_scan
    from mambalaya.workloads import PRESETS

    config = PRESETS["mamba2-130m"]
    rows = compare_rows(["mambalaya", "geens-ideal"], "mamba2-130m", config, phase="prefill", seq_lens=[1024], batch=1,
                        baseline="geens-ideal")
    best = {a: evaluate_best_scan(a, "mamba2-130m", config, phase="prefill", seq_len=1024, batch=1).result.latency_s
            for a in ("mambalaya", "geens-ideal")}
    assert {r["arch"]: r["layer_latency_s"] for r in rows} == best
    out = CliRunner().invoke(app, ["evaluate", "-m", "mamba2-130m", "-L", "1024", "-B", "1"])
    assert out.exit_code == 0 and "scan, the faster form on this design)" in out.output.splitlines()[0]


@pytest.mark.parametrize("objective,key", [("energy", "model_energy_j"), ("edp", "edp_js")])
def test_an_energy_or_edp_search_runs_the_form_of_least_energy_or_edp(objective: str, key: str) -> None:
    """A Mamba-2 prefill without --scan runs the form its objective prefers: by latency alone,
    --objective energy on mamba2-1.3b printed the chunked form's energy, searched for energy,
    above the recurrent form's (51.0 against 48.2 mJ per layer); the evaluation names the form
    by what chose it."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.experiments.evaluate import evaluate, evaluate_best_scan
    from mambalaya.workloads import PRESETS

    config = PRESETS["mamba2-1.3b"]
    forms = {form: evaluate("mambalaya", "mamba2-1.3b", config, phase="prefill", seq_len=2048, batch=1, scan=form,
                            objective=objective).totals()[key] for form in ("chunked", "recurrent")}
    best = evaluate_best_scan("mambalaya", "mamba2-1.3b", config, phase="prefill", seq_len=2048, batch=1,
                              objective=objective)
    assert forms["recurrent"] < forms["chunked"]  # the case: the faster form (chunked) is not the least
    assert best.totals()[key] == min(forms.values())
    out = CliRunner().invoke(app, ["evaluate", "-m", "mamba2-1.3b", "-L", "2048", "-B", "1", "--objective", objective])
    name = "energy" if objective == "energy" else "EDP"
    assert out.exit_code == 0 and f"(recurrent scan, the form of least {name} on this design)" in out.output.splitlines()[0]
