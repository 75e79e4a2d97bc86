"""The numpy executor running the Mamba-1 cascade equals transformers' MambaBlock.

Random weights are copied from one transformers block (torch CPU path) into the cascade's
tensors through the real weight loader; prefill and then decode steps continue one sequence.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_reference import run_hf_mamba1_block  # noqa: E402

from mambalaya.execute import carry_states, execute  # noqa: E402
from mambalaya.workloads.hf.weights import load_mamba1_layer  # noqa: E402
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer  # noqa: E402


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def run_ours(ref: dict, config: Mamba1Config, dtype: str) -> tuple[list[np.ndarray], list[dict]]:
    """Prefill (with state out) then one decode step per decode input; outputs and states."""
    batch, seq_len, _ = ref["x_prefill"].shape
    weights = load_mamba1_layer(ref["state_dict"], layer=0, dtype=dtype)
    prefill = mamba1_layer(config, batch=batch, seq_len=seq_len, state_io=True)
    zero = {t: np.zeros(prefill.shape(t)) for t in ("H0", "CS0")}
    result = execute(prefill, {"X": ref["x_prefill"], **weights, **zero}, dtype=dtype)
    outputs, states = [result["XO"]], [carry_states(prefill, result)]
    decode = mamba1_layer(config, batch=batch, seq_len=1, phase="decode")
    for x in ref["x_decode"]:
        result = execute(decode, {"X": x, **weights, **states[-1]}, dtype=dtype)
        outputs.append(result["XO"])
        states.append(carry_states(decode, result))
    return outputs, states


CONFIGS = [
    pytest.param(dict(d_model=32, batch=2, seq_len=9), id="d32-B2-L9"),
    pytest.param(dict(d_model=48, batch=1, seq_len=3, dt_rank=5, d_state=8), id="d48-B1-L3-shortprefill"),
]


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 2e-6)])
@pytest.mark.parametrize("case", CONFIGS)
def test_prefill_and_decode_match_transformers(case: dict, dtype: str, tol: float) -> None:
    case = dict(case)
    batch, seq_len = case.pop("batch"), case.pop("seq_len")
    ref = run_hf_mamba1_block(**case, batch=batch, seq_len=seq_len, n_decode=4, dtype=dtype, seed=7)
    config = Mamba1Config(**case)
    outputs, states = run_ours(ref, config, dtype)

    assert outputs[0].dtype == np.dtype(dtype)
    errors = [rel_err(outputs[0], ref["y_prefill"])]
    errors += [rel_err(o, r) for o, r in zip(outputs[1:], ref["y_decode"])]
    assert len(errors) == 5
    assert max(errors) <= tol, errors

    for ours, theirs in zip(states, [ref["states_prefill"], *ref["states_decode"]]):
        assert rel_err(ours["H0"], theirs["H"]) <= tol
        assert rel_err(ours["CS0"], theirs["CS"]) <= tol


def test_float64_gap_is_transformers_float32_casts() -> None:
    """In float64 the residual gap is transformers' internal float32 rounding (~1e-7), far
    above float64 round-off: our float64 run is the exact one, so float32 and float64 runs of
    ours differ from each other by about as much as float64 differs from transformers."""
    ref = run_hf_mamba1_block(d_model=32, batch=2, seq_len=9, n_decode=1, dtype="float64", seed=3)
    ours64, _ = run_ours(ref, Mamba1Config(d_model=32), "float64")
    err = rel_err(ours64[0], ref["y_prefill"])
    assert 1e-12 < err < 2e-6
