"""The numpy executor on small hand-checked cascades."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.errors import ExecutionError
from mambalaya.einsum import loads_cascade
from mambalaya.execute import carry_states, execute

BASE = """
name: t
params: {eps: 0.5}
ranks: {I: 6, D: 3, E: 4, K: 3, J: 2}
tensors:
  X: {ranks: [I, D], role: input}
  W: {ranks: [D, E], role: weight}
  S0: {ranks: [J, D], role: state}
  Y: {ranks: [I, E], role: output}
"""


def run(einsum_lines: str, extra_tensors: str = "", **arrays):
    text = BASE + extra_tensors + "einsums:\n" + einsum_lines
    c = loads_cascade(text)
    return c, execute(c, arrays, keep="all")


rng = np.random.default_rng(0)
X = rng.standard_normal((6, 3))
W = rng.standard_normal((3, 4))


def test_gemm_with_bias_adds_bias_once() -> None:
    _, r = run("  - Y[i,e] = X[i,d]*W[d,e] + eps\n", X=X, W=W, S0=np.zeros((2, 3)))
    np.testing.assert_allclose(r["Y"], X @ W + 0.5, rtol=1e-13)


def test_division_inside_a_reduced_product() -> None:
    _, r = run("  - Y[i,e] = X[i,d]/W[d,e]\n", X=X, W=W, S0=np.zeros((2, 3)))
    np.testing.assert_allclose(r["Y"], (X[:, :, None] / W[None]).sum(1), rtol=1e-12)


def test_max_reduction_and_unary() -> None:
    _, r = run("  - Y[i,e] max= exp(X[i,d]*W[d,e]) - 1\n", X=X, W=W, S0=np.zeros((2, 3)))
    np.testing.assert_allclose(r["Y"], np.exp(X[:, :, None] * W[None]).max(1) - 1, rtol=1e-13)


def test_causal_window_reads_initial_state() -> None:
    extra = "  XC: {ranks: [I, D], role: intermediate}\n  XS: {ranks: [I, D], role: input, initial: S0}\n  WK: {ranks: [K, D], role: weight}\n"
    lines = "  - XC[i,d] = XS[i+k-(K-1),d]*WK[k,d]\n  - Y[i,e] = XC[i,d]*W[d,e]\n"
    S0 = rng.standard_normal((2, 3))
    WK = rng.standard_normal((3, 3))
    _, r = run(lines, extra, XS=X, S0=S0, WK=WK, W=W, X=X)
    padded = np.concatenate([S0, X])
    expect = np.stack([sum(padded[i + k] * WK[k] for k in range(3)) for i in range(6)])
    np.testing.assert_allclose(r["XC"], expect, rtol=1e-13)


def test_recurrence_with_depth_two_and_initial() -> None:
    extra = "  H: {ranks: [I, D], role: intermediate, initial: S0}\n"
    lines = "  - H[i,d] = 0.5*H[i-1,d] - 0.25*H[i-2,d] + X[i,d]\n  - Y[i,e] = H[i,d]*W[d,e]\n"
    S0 = rng.standard_normal((2, 3))
    c, r = run(lines, extra, X=X, W=W, S0=S0)
    assert c.recurrence(c.einsum("H")) == ("I", 2)
    h = [S0[0], S0[1]]
    for i in range(6):
        h.append(0.5 * h[-1] - 0.25 * h[-2] + X[i])
    np.testing.assert_allclose(r["H"], np.array(h[2:]), rtol=1e-13)


def test_float32_results_are_float32() -> None:
    c = loads_cascade(BASE + "einsums:\n  - Y[i,e] = X[i,d]*W[d,e]\n")
    r = execute(c, {"X": X, "W": W, "S0": np.zeros((2, 3))}, dtype="float32")
    assert r["Y"].dtype == np.float32
    np.testing.assert_allclose(r["Y"], X @ W, rtol=1e-5)


def test_bad_arrays_are_reported() -> None:
    c = loads_cascade(BASE + "einsums:\n  - Y[i,e] = X[i,d]*W[d,e]\n")
    with pytest.raises(ExecutionError, match="W .weight, shape .3, 4"):
        execute(c, {"X": X, "S0": np.zeros((2, 3))})
    with pytest.raises(ExecutionError, match=r"array X has shape \(3, 6\)"):
        execute(c, {"X": X.T, "W": W, "S0": np.zeros((2, 3))})
    with pytest.raises(ExecutionError, match="not tensors"):
        execute(c, {"X": X, "W": W, "S0": np.zeros((2, 3)), "Q": X})
    with pytest.raises(ExecutionError, match="computed by the cascade"):
        execute(c, {"X": X, "W": W, "S0": np.zeros((2, 3)), "Y": X})
    with pytest.raises(ExecutionError, match="dtype"):
        execute(c, {"X": X, "W": W, "S0": np.zeros((2, 3))}, dtype="int32")


def test_outputs_only_frees_intermediates() -> None:
    text = BASE + "  T: {ranks: [I, E], role: intermediate}\neinsums:\n  - T[i,e] = X[i,d]*W[d,e]\n  - Y[i,e] = silu(T[i,e])\n"
    c = loads_cascade(text)
    r = execute(c, {"X": X, "W": W, "S0": np.zeros((2, 3))})
    assert set(r) == {"Y"}
    t = X @ W
    np.testing.assert_allclose(r["Y"], t / (1 + np.exp(-t)), rtol=1e-13)


def test_carry_states_drops_unit_ranks() -> None:
    text = """
ranks: {B: 2, I: 1, E: 3}
tensors:
  X: {ranks: [B, I, E], role: input}
  H0: {ranks: [B, E], role: state}
  H: {ranks: [B, I, E], role: state, initial: H0, updates: H0}
einsums:
  - H[b,i,e] = 0.5*H[b,i-1,e] + X[b,i,e]
"""
    c = loads_cascade(text)
    x = rng.standard_normal((2, 1, 3))
    h0 = rng.standard_normal((2, 3))
    r = execute(c, {"X": x, "H0": h0})
    nxt = carry_states(c, r)
    np.testing.assert_allclose(nxt["H0"], 0.5 * h0 + x[:, 0], rtol=1e-13)
