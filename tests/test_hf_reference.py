"""Checks of the transformers reference harness and of the real-weights loader.

The harness (tests/hf_reference.py) is verified against an independent float64 numpy Mamba-1
block written from the equations, fed the weights through ``load_mamba1_layer`` (so the
layouts of the loader are checked at the same time).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mambalaya.errors import MambalayaError  # noqa: E402
from mambalaya.workloads.hf.weights import (  # noqa: E402
    WEIGHT_NAMES,
    WeightLoadError,
    load_mamba1_config,
    load_mamba1_layer,
    mamba1_states_from_hf,
    mamba1_states_to_hf,
)

try:  # tests/ has no __init__.py: pytest puts tests/ itself on sys.path
    from hf_reference import random_mamba1_state_dict, run_hf_mamba1_block
except ImportError:  # pragma: no cover - if tests/ becomes a package
    from tests.hf_reference import random_mamba1_state_dict, run_hf_mamba1_block

EPS = 1e-5


# ------------------------------------------------------------------------------------------
# Independent float64 numpy Mamba-1 block (mambalaya layouts)
# ------------------------------------------------------------------------------------------


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, v)


def numpy_mamba1_block(w, X, H0, CS0, eps=EPS):
    """Y[B,L,D], H[B,E,N], CS[B,J,E] of one Mamba-1 block from states H0, CS0 (float64)."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    X = np.asarray(X, dtype=np.float64)
    B, L, _ = X.shape
    J = w["WC"].shape[1] - 1
    xn = X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps) * w["WN"]
    x = xn @ w["WX"]  # [B,L,E]
    z = xn @ w["WZ"]
    xc = np.concatenate([np.asarray(CS0, dtype=np.float64), x], axis=1)  # [B,J+L,E]
    conv = np.stack(
        [np.einsum("bke,ek->be", xc[:, t : t + J + 1], w["WC"]) for t in range(L)], axis=1
    )
    u = _silu(conv + w["BC"])
    dt = _softplus((u @ w["WDL"]) @ w["WDT"] + w["BDT"])  # [B,L,E]
    Bm = u @ w["WB"]  # [B,L,N]
    Cm = u @ w["WCM"]
    h = np.asarray(H0, dtype=np.float64).copy()
    ys = []
    for t in range(L):
        h = np.exp(dt[:, t, :, None] * w["A"]) * h + (dt[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append(np.einsum("ben,bn->be", h, Cm[:, t]) + w["DS"] * u[:, t])
    y = np.stack(ys, axis=1) * _silu(z)
    return y @ w["WO"] + X, h, xc[:, -J:]


def _rel(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.fixture(scope="module")
def run32():
    return run_hf_mamba1_block(d_model=32, batch=2, seq_len=7, n_decode=4, dtype="float32", seed=0)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-6)])
def test_harness_matches_numpy_reference(dtype, tol, run32):
    r = run32 if dtype == "float32" else run_hf_mamba1_block(
        d_model=32, batch=2, seq_len=7, n_decode=4, dtype=dtype, seed=0
    )
    d = r["dims"]
    assert r["y_prefill"].dtype == np.dtype(dtype)
    assert r["x_prefill"].shape == (2, 7, 32) and len(r["x_decode"]) == 4
    assert r["states_prefill"]["H"].shape == (d["B"], d["E"], d["N"])
    assert r["states_prefill"]["CS"].shape == (d["B"], d["J"], d["E"])
    w = load_mamba1_layer(r["state_dict"], dtype="float64")

    H = np.zeros((d["B"], d["E"], d["N"]))
    CS = np.zeros((d["B"], d["J"], d["E"]))
    y, H, CS = numpy_mamba1_block(w, r["x_prefill"], H, CS)
    assert _rel(r["y_prefill"], y) <= tol
    assert _rel(r["states_prefill"]["H"], H) <= tol
    assert _rel(r["states_prefill"]["CS"], CS) <= tol
    for step in range(4):
        y, H, CS = numpy_mamba1_block(w, r["x_decode"][step], H, CS)
        assert _rel(r["y_decode"][step], y) <= tol, step
        assert _rel(r["states_decode"][step]["H"], H) <= tol, step
        assert _rel(r["states_decode"][step]["CS"], CS) <= tol, step
    # The states are not trivially zero and the decode changed them.
    assert np.abs(r["states_decode"][-1]["H"]).max() > 1e-3
    assert not np.allclose(r["states_decode"][-1]["H"], r["states_prefill"]["H"])


def test_harness_weights_are_random_and_seeded(run32):
    sd = run32["state_dict"]
    assert np.ptp(sd["mixer.A_log"]) > 0.5 and np.ptp(sd["mixer.D"]) > 0.1
    assert np.ptp(sd["norm.weight"]) > 0.1 and np.ptp(sd["mixer.dt_proj.bias"]) > 0.1
    A = run32["weights"]["A"]
    assert (A <= -1.0).all() and (A >= -16.0).all()
    again = run_hf_mamba1_block(d_model=32, batch=2, seq_len=7, n_decode=1, seed=0)
    np.testing.assert_array_equal(again["y_prefill"], run32["y_prefill"])


def test_short_prefill_pads_conv_state():
    # seq_len < K-1: transformers left-pads the conv state with zeros.
    r = run_hf_mamba1_block(d_model=16, d_state=4, batch=1, seq_len=2, n_decode=2, seed=3)
    w = load_mamba1_layer(r["state_dict"], dtype="float64")
    d = r["dims"]
    y, H, CS = numpy_mamba1_block(
        w, r["x_prefill"], np.zeros((1, d["E"], d["N"])), np.zeros((1, d["J"], d["E"]))
    )
    assert _rel(r["y_prefill"], y) <= 1e-5
    np.testing.assert_array_equal(r["states_prefill"]["CS"][:, 0], 0.0)
    for step in range(2):
        y, H, CS = numpy_mamba1_block(w, r["x_decode"][step], H, CS)
        assert _rel(r["y_decode"][step], y) <= 1e-5


# ------------------------------------------------------------------------------------------
# Loader
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def block_sd():
    sd = random_mamba1_state_dict(d_model=8, d_state=4, d_inner=16, dt_rank=2, d_conv=4, seed=7)
    return {k: v.astype(np.float32) for k, v in sd.items()}


def _check_layout(w, sd, dtype=np.float32):
    E, D = 16, 8
    assert tuple(w) == WEIGHT_NAMES
    for name, arr in w.items():
        assert arr.dtype == dtype and arr.flags.c_contiguous, name
    np.testing.assert_array_equal(w["WX"], sd["mixer.in_proj.weight"][:E].T.astype(dtype))
    np.testing.assert_array_equal(w["WZ"], sd["mixer.in_proj.weight"][E:].T.astype(dtype))
    np.testing.assert_array_equal(w["WC"], sd["mixer.conv1d.weight"][:, 0].astype(dtype))
    np.testing.assert_array_equal(w["WDL"], sd["mixer.x_proj.weight"][:2].T.astype(dtype))
    np.testing.assert_array_equal(w["WB"], sd["mixer.x_proj.weight"][2:6].T.astype(dtype))
    np.testing.assert_array_equal(w["WCM"], sd["mixer.x_proj.weight"][6:].T.astype(dtype))
    np.testing.assert_array_equal(w["WDT"], sd["mixer.dt_proj.weight"].T.astype(dtype))
    np.testing.assert_array_equal(w["WO"], sd["mixer.out_proj.weight"].T.astype(dtype))
    expected_A = (-np.exp(sd["mixer.A_log"].astype(np.float64))).astype(dtype)
    np.testing.assert_array_equal(w["A"], expected_A)
    assert w["WO"].shape == (E, D) and w["WX"].shape == (D, E)


def _prefixed(sd, prefix):
    return {prefix + k: v for k, v in sd.items()}


def test_loader_roundtrip_safetensors_bin_memory(tmp_path, block_sd):
    import torch
    from safetensors.numpy import save_file

    full = _prefixed(block_sd, "backbone.layers.0.")
    full["backbone.embeddings.weight"] = np.zeros((10, 8), np.float32)
    full["backbone.norm_f.weight"] = np.ones(8, np.float32)
    save_file(full, str(tmp_path / "m.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in full.items()}, tmp_path / "m.bin")

    from_st = load_mamba1_layer(tmp_path / "m.safetensors")
    from_bin = load_mamba1_layer(str(tmp_path / "m.bin"))
    from_mem = load_mamba1_layer(full)
    from_torch_mem = load_mamba1_layer({k: torch.from_numpy(v) for k, v in full.items()})
    from_bare = load_mamba1_layer(block_sd, layer=0)
    from_model = load_mamba1_layer(_prefixed(block_sd, "layers.0."))
    _check_layout(from_st, block_sd)
    for other in (from_bin, from_mem, from_torch_mem, from_bare, from_model):
        assert tuple(other) == WEIGHT_NAMES
        for name in WEIGHT_NAMES:
            np.testing.assert_array_equal(other[name], from_st[name])
    w64 = load_mamba1_layer(tmp_path / "m.safetensors", dtype="float64")
    _check_layout(w64, block_sd, np.float64)


def test_loader_directories_shards_and_bf16(tmp_path, block_sd):
    import torch
    from safetensors.numpy import save_file
    from safetensors.torch import save_file as save_torch

    two = {**_prefixed(block_sd, "backbone.layers.0."), **_prefixed(block_sd, "backbone.layers.1.")}
    (tmp_path / "single").mkdir()
    save_file(two, str(tmp_path / "single" / "model.safetensors"))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = sorted(two)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in halves.items():
        save_file({k: two[k] for k in keys}, str(sharded / fname))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "bin").mkdir()
    torch.save({k: torch.from_numpy(v) for k, v in two.items()}, tmp_path / "bin" / "pytorch_model.bin")

    ref = load_mamba1_layer(block_sd)
    for d in ("single", "sharded", "bin"):
        got = load_mamba1_layer(tmp_path / d, layer=1)
        for name in WEIGHT_NAMES:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{d}:{name}")

    # bfloat16 safetensors are read without torch (widened exactly to float32).
    bf = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in _prefixed(block_sd, "layers.0.").items()}
    save_torch(bf, str(tmp_path / "bf16.safetensors"))
    got = load_mamba1_layer(tmp_path / "bf16.safetensors")
    ref_bf = load_mamba1_layer({k: v.float() for k, v in bf.items()})
    for name in WEIGHT_NAMES:
        np.testing.assert_array_equal(got[name], ref_bf[name], err_msg=name)


def test_loader_errors(tmp_path, block_sd):
    assert issubclass(WeightLoadError, MambalayaError)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(WeightLoadError, match="bad.safetensors"):
        load_mamba1_layer(bad)
    garbage_bin = tmp_path / "bad.bin"
    garbage_bin.write_bytes(b"\x00garbage")
    with pytest.raises(WeightLoadError, match="bad.bin"):
        load_mamba1_layer(garbage_bin)
    with pytest.raises(WeightLoadError, match="does not exist"):
        load_mamba1_layer(tmp_path / "nope.safetensors")

    full = _prefixed(block_sd, "backbone.layers.0.")
    missing = {k: v for k, v in full.items() if k != "backbone.layers.0.mixer.A_log"}
    with pytest.raises(WeightLoadError, match=r"backbone\.layers\.0\.mixer\.A_log"):
        load_mamba1_layer(missing)
    from safetensors.numpy import save_file

    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(WeightLoadError, match=r"missing\.safetensors.*|mixer\.A_log") as info:
        load_mamba1_layer(tmp_path / "missing.safetensors")
    assert "mixer.A_log" in str(info.value) and "missing.safetensors" in str(info.value)

    with pytest.raises(WeightLoadError, match=r"Layer 3 .*layers present are 0\b"):
        load_mamba1_layer(full, layer=3)

    biased = dict(full, **{"backbone.layers.0.mixer.in_proj.bias": np.zeros(32, np.float32)})
    with pytest.raises(WeightLoadError, match=r"mixer\.in_proj\.bias.*use_bias"):
        load_mamba1_layer(biased)
    no_conv_bias = {k: v for k, v in full.items() if not k.endswith("conv1d.bias")}
    with pytest.raises(WeightLoadError, match=r"conv1d\.bias"):
        load_mamba1_layer(no_conv_bias)

    wrong = dict(full, **{"backbone.layers.0.mixer.out_proj.weight": np.zeros((8, 15), np.float32)})
    with pytest.raises(WeightLoadError, match=r"out_proj\.weight.*\[8, 15\].*\[8, 16\]"):
        load_mamba1_layer(wrong)
    with pytest.raises(WeightLoadError, match="float16"):
        load_mamba1_layer(full, dtype="float16")
    with pytest.raises(WeightLoadError, match="Mamba checkpoint"):
        load_mamba1_layer({"foo.weight": np.zeros(3)})


def test_states_roundtrip(run32):
    s = run32["states_decode"][-1]
    conv, ssm = mamba1_states_to_hf(s["CS"], s["H"])
    B, J, E = s["CS"].shape
    assert conv.shape == (B, E, J + 1) and ssm.shape == s["H"].shape
    back = mamba1_states_from_hf(conv, ssm, dtype="float32")
    np.testing.assert_array_equal(back["CS0"], s["CS"])
    np.testing.assert_array_equal(back["H0"], s["H"])
    assert back["CS0"].flags.c_contiguous and back["H0"].flags.c_contiguous


def test_config_loader(tmp_path):
    hf = {
        "model_type": "mamba", "hidden_size": 768, "state_size": 16, "expand": 2,
        "conv_kernel": 4, "time_step_rank": 48, "num_hidden_layers": 24, "vocab_size": 50280,
        "layer_norm_epsilon": 1e-5, "intermediate_size": 1536, "use_bias": False,
        "use_conv_bias": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    want = {"d_model": 768, "d_state": 16, "expand": 2, "d_conv": 4, "dt_rank": 48,
            "n_layers": 24, "vocab_size": 50280, "norm_eps": 1e-5, "tie_embeddings": True}
    assert load_mamba1_config(tmp_path / "config.json") == want
    assert load_mamba1_config(tmp_path) == want
    ss = {"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": True,
          "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8}
    assert load_mamba1_config(ss) == want
    # without the field, mamba_ssm's MambaConfig default of 8 pads it (once left at 50277)
    assert load_mamba1_config({k: v for k, v in ss.items() if k != "pad_vocab_size_multiple"}) == want
    assert load_mamba1_config({**hf, "time_step_rank": "auto"})["dt_rank"] == math.ceil(768 / 16)
    with pytest.raises(WeightLoadError, match="Mamba2"):
        load_mamba1_config({**ss, "ssm_cfg": {"layer": "Mamba2"}})
    with pytest.raises(WeightLoadError, match="use_bias"):
        load_mamba1_config({**hf, "use_bias": True})
    with pytest.raises(WeightLoadError, match="d_model"):
        load_mamba1_config({"n_layer": 2, "vocab_size": 5})
