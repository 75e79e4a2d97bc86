"""The exact GELU unary function: the executor against torch, and every shipped spec still loads
(and costs it: an MFU cycle count, a PE-operation count without MFUs, an MFU energy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mambalaya.arch import load_arch
from mambalaya.cli import app
from mambalaya.einsum.cascade import build_cascade
from mambalaya.einsum.ir import UNARY_FUNCTIONS, Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.execute.numpy_exec import UNARY_NUMPY, execute

SPECS = sorted((Path(__file__).parent.parent / "src" / "mambalaya" / "arch" / "specs").glob("*.yaml"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gelu_equals_torch(dtype: str) -> None:
    x = np.concatenate([np.linspace(-12, 12, 2001), np.random.default_rng(0).normal(0, 3, 2000)]).astype(dtype)
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    got = UNARY_NUMPY["gelu"](x)
    assert got.dtype == x.dtype
    assert np.max(np.abs(got - want)) <= 1e-6
    # the tanh approximation differs from the exact form by more than the tolerance: the check can fail
    approx = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.max(np.abs(approx - want)) > 1e-5


def test_gelu_in_a_cascade() -> None:
    assert "gelu" in UNARY_FUNCTIONS
    ranks = [Rank("I", 7, "L")]
    cascade = build_cascade(name="g", params={}, ranks=ranks,
                            tensors=[TensorSpec("X", ("I",), Role.INPUT, 32), TensorSpec("Y", ("I",), Role.OUTPUT, 32)],
                            einsums=[parse_einsum("Y[i] = gelu(X[i])", sizes={"I": 7})])
    x = np.linspace(-3, 3, 7)
    got = execute(cascade, {"X": x}, dtype="float64")["Y"]
    np.testing.assert_allclose(got, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_every_shipped_spec_costs_gelu(spec: Path) -> None:
    arch = load_arch(spec)
    c = arch.compute
    assert c.unary_cost_cycles["gelu"] > 0
    if c.mfu_units == 0:
        assert c.unary_cost_pe_ops["gelu"] > 0
    if arch.energy is not None:
        assert arch.energy.mfu_pj["gelu"] > 0
    run = CliRunner().invoke(app, ["arch", "show", str(spec)])
    assert run.exit_code == 0, run.output
    assert "gelu" in run.stdout
