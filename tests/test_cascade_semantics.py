"""A cascade file means one thing: what the executor computes, the cost model counts and the
checks allow, for every spelling of the same expression.

Found by an audit of user cascade files (2026-12-07), each a wrong number without a word: a
``max=`` over a subtracted term, ``-(a + b)`` against ``0 - (a + b)``, a bracketed sum's
additions, a product scaled by a division, a parameter named as a rank, a history read without
its mask, and a read further back than an initial value holds; beside them, two executor
crashes (a rank-0 read, a far stride) and a message that did not say what was wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.cost.latency import einsum_cycles
from mambalaya.einsum import loads_cascade
from mambalaya.einsum.dead_work import check_history_reads
from mambalaya.einsum.stats import cascade_stats
from mambalaya.errors import SpecError
from mambalaya.execute.numpy_exec import execute
from mambalaya.workloads.shipped import shipped_layers


def _run(text: str, seed: int = 0) -> dict[str, np.ndarray]:
    c = loads_cascade(text, source="t.yaml")
    rng = np.random.default_rng(seed)
    return execute(c, {t: rng.standard_normal(c.shape(t)) for t in c.external_tensors()}, keep="all")


def _ops(text: str) -> dict[str, dict[str, int]]:
    return {r.name: r.ops for r in cascade_stats(loads_cascade(text, source="t.yaml")).einsums}


_IK = "ranks: {I: 3, K: 4}\ntensors:\n  A: {ranks: [I, K], role: input}\n  C: {ranks: [I], role: input}\n"


def test_a_max_over_a_subtracted_term_takes_the_sign_inside() -> None:
    """``Y max= C - A`` is ``max_k(C - A) = C - min_k(A)``; it was ``C - max_k(A)``."""
    v = _run(_IK + "  Y: {ranks: [I], role: output}\n  W: {ranks: [I], role: output}\neinsums:\n"
             "  - Y[i] max= C[i] - A[i,k]\n  - W[i] max= C[i] + neg(A[i,k])\n")
    hand = (v["C"][:, None] - v["A"]).max(axis=1)
    assert np.allclose(v["Y"], hand) and np.allclose(v["W"], hand)


def test_a_unary_minus_over_a_sum_splits_it_as_a_binary_minus_does() -> None:
    """``-(A + C)`` and ``0 - (A + C)`` over a reduced ``k``: ``C`` lacks ``k`` and is added once
    in both (it was summed over ``k`` in the first), and both count the same operations."""
    text = (_IK + "  Y: {ranks: [I], role: output}\n  Z: {ranks: [I], role: output}\neinsums:\n"
            "  - Y[i] = -(A[i,k] + C[i])\n  - Z[i] = 0 - (A[i,k] + C[i])\n")
    v = _run(text)
    hand = -v["A"].sum(axis=1) - v["C"]
    assert np.allclose(v["Y"], hand) and np.allclose(v["Z"], hand)


def test_a_bracketed_sum_counts_every_addition() -> None:
    """``A + (B + C)`` is two additions per point, as ``A + B + C`` (the inner one was dropped)."""
    text = ("ranks: {I: 5}\ntensors:\n  A: {ranks: [I], role: input}\n  B: {ranks: [I], role: input}\n"
            "  C: {ranks: [I], role: input}\n  Y: {ranks: [I], role: output}\n  Z: {ranks: [I], role: output}\n"
            "einsums:\n  - Y[i] = A[i] + (B[i] + C[i])\n  - Z[i] = A[i] + B[i] + C[i]\n")
    ops = _ops(text)
    assert ops["Y"] == ops["Z"] == {"add": 10}


def test_a_product_scaled_by_a_division_is_a_contraction_on_the_array() -> None:
    """``A*W/8`` and ``A*W*0.125``: the same MACs on the same unit (the division made the first
    additions, multiplies and divisions on the 1D lanes, with no MAC)."""
    text = ("ranks: {I: 64, K: 128, J: 64}\ntensors:\n  A: {ranks: [I, K], role: input}\n"
            "  W: {ranks: [K, J], role: weight}\n  Y1: {ranks: [I, J], role: output}\n  Y2: {ranks: [I, J], role: output}\n"
            "einsums:\n  - Y1[i,j] = A[i,k]*W[k,j]/8\n  - Y2[i,j] = A[i,k]*W[k,j]*0.125\n")
    c = loads_cascade(text, source="t.yaml")
    ops = {r.name: r.ops for r in cascade_stats(c).einsums}
    assert ops["Y1"]["mac"] == ops["Y2"]["mac"] == 64 * 128 * 64
    spec = load_arch("mambalaya")
    units = [einsum_cycles(spec.compute, c, c.einsum(n))[0] for n in ("Y1", "Y2")]
    assert units[0].array_2d == units[1].array_2d > 0 and units[0].vector == units[1].vector == 0
    v = _run(text)
    assert np.allclose(v["Y1"], v["Y2"])


@pytest.mark.parametrize("params, rank_line, needle", [
    ("{D: 2}", "{I: 3, D: 8}", "parameter D has the name of rank D"),
    ("{d: 5}", "{I: 3, D: 8}", "parameter d has the name of the variable of rank D"),
])
def test_a_parameter_named_as_a_rank_is_refused(params, rank_line, needle) -> None:
    """``X[i,d]/D`` divided by the parameter while ``X[i,D-1]`` indexed with the rank."""
    text = (f"params: {params}\nranks: {rank_line}\ntensors:\n  X: {{ranks: [I, D], role: input}}\n"
            "  Y: {ranks: [I], role: output}\neinsums:\n  - Y[i] = X[i,d]\n")
    with pytest.raises(SpecError, match=needle):
        loads_cascade(text, source="t.yaml")


def test_a_history_read_without_its_mask_is_refused() -> None:
    """``H[i] = X[i] + A[i,t]*H[t]`` read rows not yet computed as zeros (solving nothing) while
    the cost counted every product; with ``A`` masked strictly below the diagonal it is the
    forward substitution it says."""
    head = "ranks: {I: 4, T: 4}\ntensors:\n  X: {ranks: [I], role: input}\n"
    body = "  H: {ranks: [I], role: output}\neinsums:\n  - H[i] = X[i] + A[i,t]*H[t]\n"
    with pytest.raises(SpecError, match="nothing makes its terms zero where t >= i"):
        loads_cascade(head + "  A: {ranks: [I, T], role: input}\n" + body, source="t.yaml")
    masked = ("  A: {ranks: [I, T], role: input, mask: {row: I, col: T, upper: -1, dead: 0}}\n")
    c = loads_cascade(head + masked + body, source="t.yaml")
    a = np.tril(np.random.default_rng(1).standard_normal((4, 4)), -1)
    x = np.random.default_rng(2).standard_normal(4)
    h = execute(c, {"X": x, "A": a}, keep="all")["H"]
    assert np.allclose(h, np.linalg.solve(np.eye(4) - a, x))


def test_every_shipped_history_read_has_its_mask() -> None:
    """The rule on every shipped layer form (the chunked delta rule's forward substitution)."""
    forms = list(shipped_layers(seq_len=128))
    assert forms
    for form in forms:
        check_history_reads(form.cascade)


def test_a_read_further_back_than_an_initial_value_holds_is_refused() -> None:
    """``Y[i] = XI[i-3]`` with a one-step initial value read zeros at its first two positions
    (the same reach in a recurrence was refused)."""
    text = ("ranks: {I: 6}\ntensors:\n  X: {ranks: [I], role: input}\n  X0: {ranks: [], role: input}\n"
            "  XI: {ranks: [I], role: intermediate, initial: X0}\n  Y: {ranks: [I], role: output}\n"
            "einsums:\n  - XI[i] = X[i]\n  - Y[i] = XI[i-3]\n")
    with pytest.raises(SpecError, match="holds 1 step"):
        loads_cascade(text, source="t.yaml")


def test_a_rank_0_read_and_a_far_stride_execute() -> None:
    """A rank-0 tensor's element and a read past the tensor's end by a huge stride (zeros): a
    transpose error and a 36 TiB allocation."""
    v = _run("ranks: {I: 6}\ntensors:\n  X: {ranks: [I], role: input}\n  Z: {ranks: [], role: input}\n"
             "  Y: {ranks: [I], role: output}\n  W: {ranks: [I], role: output}\n"
             "einsums:\n  - Y[i] = X[i] + Z[]\n  - W[i] = X[1000000000000*i]\n")
    assert np.allclose(v["Y"], v["X"] + v["Z"])
    assert v["W"][0] == v["X"][0] and not v["W"][1:].any()


def test_a_rank_variable_used_as_a_value_is_named_as_such() -> None:
    text = ("ranks: {I: 4, D: 3}\ntensors:\n  X: {ranks: [I, D], role: input}\n  Y: {ranks: [I], role: output}\n"
            "einsums:\n  - Y[i] = X[i,d]*d\n")
    with pytest.raises(SpecError, match="it is the variable of rank D, an index, not a value"):
        loads_cascade(text, source="t.yaml")


def test_every_shipped_sum_of_accesses_counts_each_addition() -> None:
    """Granite 4's MoE residual ``FF_XO = XO + (FF_MO + FF_SO)`` counted one of its two additions
    per point; every shipped Einsum that only adds and subtracts tensors counts one per term
    beyond the first."""
    from mambalaya.einsum.ir import Access, additive_terms

    checked = 0
    for form in shipped_layers(seq_len=64):
        c = form.cascade
        for row in cascade_stats(c).einsums:
            e = c.einsum(row.name)
            terms = additive_terms(e.expr)
            if e.reduced_variables or len(terms) < 2 or not all(isinstance(t, Access) for _, t in terms):
                continue
            points = 1
            for r in c.tensors[e.name].ranks:
                points *= c.size(r)
            assert row.ops.get("add", 0) == (len(terms) - 1) * points, (form.preset, e.name)
            checked += 1
    assert checked
