"""The Mamba-1 cascade: shape, presets, parameter counts, statistics and prefill/decode continuity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.einsum import dump_cascade, loads_cascade
from mambalaya.einsum.stats import cascade_stats, einsum_ops
from mambalaya.execute import carry_states, execute
from mambalaya.workloads.blocks.mamba1 import (
    PRESETS,
    PUBLISHED_PARAMETERS_M,
    WEIGHTS,
    Mamba1Config,
    mamba1_layer,
)


@pytest.mark.parametrize("name", list(PRESETS))
def test_whole_model_parameters_equal_published(name: str) -> None:
    config = PRESETS[name]
    layer = mamba1_layer(config, batch=1, seq_len=8)
    assert layer.parameters() == config.layer_parameters()
    total_m = config.model_parameters(layer.parameters()) / 1e6
    assert total_m == pytest.approx(PUBLISHED_PARAMETERS_M[name], rel=1e-3)


def test_dt_rank_auto_and_custom() -> None:
    assert Mamba1Config(d_model=2560).dt_rank_value == 160
    assert Mamba1Config(d_model=100).dt_rank_value == math.ceil(100 / 16)
    c = mamba1_layer(Mamba1Config(d_model=64, dt_rank=3, d_state=4, expand=3, d_conv=2), batch=2, seq_len=5)
    assert c.shape("WDT") == (3, 192) and c.shape("A") == (192, 4) and c.shape("WC") == (192, 2)


def test_prefill_cascade_structure() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=16)
    assert [e.name for e in c.einsums][:3] == ["SS", "RS", "XN"]
    assert len(c.einsums) == 21
    assert c.generational_ranks == ("I",)
    kinds = {e.name: c.kind(e) for e in c.einsums}
    assert kinds["H"] == "recurrent" and kinds["XC"] == "window" and kinds["XI"] == "gemm"
    assert kinds["AD"] == "unary" and kinds["YS"] == "reduction" and kinds["XO"] == "elementwise"
    assert c.output_tensors() == ("XO",)
    assert set(c.external_tensors()) == {"X", *WEIGHTS}


def test_decode_cascade_reads_and_writes_state() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=999, phase="decode")
    assert c.size("I") == 1
    assert set(c.output_tensors()) == {"XO", "H", "CSN"}
    assert {"H0", "CS0"} <= set(c.external_tensors())
    assert c.consumers("H0")[0].name == "H" and c.consumers("CS0")[0].name == "XC"


def test_mac_counts_by_hand() -> None:
    cfg = PRESETS["mamba-130m"]
    B, L = 2, 16
    c = mamba1_layer(cfg, batch=B, seq_len=L)
    D, E, N, R, K = 768, 1536, 16, 48, 4
    ops = {e.name: einsum_ops(c, e) for e in c.einsums}
    assert ops["XI"] == {"mac": B * L * D * E}
    assert ops["XC"] == {"mac": B * L * E * K, "add": B * L * E}
    assert ops["DT"] == {"mac": B * L * R * E, "add": B * L * E}
    assert ops["BX"] == {"mul": B * L * E * N + B * L * E}
    assert ops["H"] == {"mul": B * L * E * N, "add": B * L * E * N}
    assert ops["RS"] == {"rsqrt": B * L, "div": B * L, "add": B * L}
    stats = cascade_stats(c, n_layers=cfg.n_layers)
    gemm_macs = B * L * (2 * D * E + E * (R + 2 * N) + R * E + E * D)
    other_macs = B * L * D + B * L * E * K + B * L * E * N  # SS, conv, C readout
    assert stats.totals["macs"] == gemm_macs + other_macs
    assert stats.totals["model_macs"] == cfg.n_layers * stats.totals["macs"]
    assert stats.totals["parameters"] == cfg.layer_parameters()


def test_unfused_bytes_by_hand() -> None:
    B, L = 1, 8
    c = mamba1_layer(PRESETS["mamba-130m"], batch=B, seq_len=L, bits=16)
    rows = {s.name: s for s in cascade_stats(c).einsums}
    E, N = 1536, 16
    assert rows["H"].read_elements == {"AD": B * L * E * N, "BX": B * L * E * N}
    assert rows["H"].write_bytes == B * L * E * N * 2
    assert rows["XC"].read_elements["XI"] == B * L * E  # the causal halo is zero padding
    d = mamba1_layer(PRESETS["mamba-130m"], batch=B, seq_len=1, phase="decode", bits=32)
    drow = {s.name: s for s in cascade_stats(d).einsums}
    assert drow["XC"].read_elements["CS0"] == B * 3 * E
    assert drow["H"].read_bytes_by_tensor["H0"] == B * E * N * 4
    assert drow["CSN"].ops == {}


def test_round_trip_text() -> None:
    for phase, L in (("prefill", 7), ("decode", 1)):
        c = mamba1_layer(Mamba1Config(d_model=32), batch=2, seq_len=L, phase=phase)
        assert loads_cascade(dump_cascade(c)) == c


def test_bad_builder_arguments() -> None:
    with pytest.raises(SpecError, match="batch"):
        mamba1_layer(PRESETS["mamba-130m"], batch=0, seq_len=4)
    with pytest.raises(SpecError, match="phase"):
        mamba1_layer(PRESETS["mamba-130m"], batch=1, seq_len=4, phase="train")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="state_io"):
        mamba1_layer(PRESETS["mamba-130m"], batch=1, seq_len=4, phase="decode", state_io=False)


def _random_weights(c, rng):
    w = {t: rng.standard_normal(c.shape(t)) * 0.2 for t in WEIGHTS}
    w["A"] = -rng.uniform(1, 16, c.shape("A"))
    return w


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_prefill_then_decode_continues_the_sequence(dtype: str) -> None:
    """Chunked prefill (state out) plus decode steps equals one prefill over the whole sequence."""
    cfg = Mamba1Config(d_model=16, d_state=4)
    rng = np.random.default_rng(1)
    full = mamba1_layer(cfg, batch=2, seq_len=9)
    w = _random_weights(full, rng)
    x = rng.standard_normal((2, 9, 16))
    expected = execute(full, {"X": x, **w}, dtype=dtype)["XO"]
    part = mamba1_layer(cfg, batch=2, seq_len=2, state_io=True)  # shorter than the conv window
    zero = {t: np.zeros(part.shape(t)) for t in ("H0", "CS0")}
    r = execute(part, {"X": x[:, :2], **w, **zero}, dtype=dtype)
    outs, state = [r["XO"]], carry_states(part, r)
    mid = mamba1_layer(cfg, batch=2, seq_len=3, state_io=True)
    r = execute(mid, {"X": x[:, 2:5], **w, **state}, dtype=dtype)
    outs.append(r["XO"])
    state = carry_states(mid, r)
    step = mamba1_layer(cfg, batch=2, seq_len=1, phase="decode")
    for t in range(5, 9):
        r = execute(step, {"X": x[:, t : t + 1], **w, **state}, dtype=dtype)
        outs.append(r["XO"])
        state = carry_states(step, r)
    got = np.concatenate(outs, axis=1)
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max())
