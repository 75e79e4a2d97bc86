"""The Einsum parser and the YAML cascade format: what parses, and where each error points."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.errors import MambalayaError, SpecError
from mambalaya.einsum import (
    Access,
    AffineIndex,
    Binary,
    Const,
    Einsum,
    Param,
    Unary,
    dump_cascade,
    evaluate_size,
    load_cascade,
    loads_cascade,
    parse_einsum,
)

HEAD = """\
name: t
params: {eps: 1.0e-05, d: 6}
ranks: {B: 2, I: 4, E: 3, K: 2, F: 3}
tensors:
  X: {ranks: [B, I, E], role: input}
  W: {ranks: [E, F], role: input}
  Y: {ranks: [B, I, E], role: output}
"""


def cascade_text(*einsums: str, tensors: str = "", head: str = HEAD) -> str:
    return head + tensors + "einsums:\n" + "".join(f"  - {e}\n" for e in einsums)


def locate(text: str, needle: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based line and column of the ``occurrence``-th ``needle`` in ``text``."""
    pos = -1
    for _ in range(occurrence):
        pos = text.index(needle, pos + 1)
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, column


def load_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        loads_cascade(text, source="t.yaml")
    err = info.value
    assert isinstance(err, MambalayaError)
    assert err.source == "t.yaml"
    return err


def assert_at(err: SpecError, text: str, needle: str, occurrence: int = 1) -> None:
    assert (err.line, err.column) == locate(text, needle, occurrence), str(err)
    assert f"line {err.line}" in str(err) and f"column {err.column}" in str(err)


# ------------------------------------------------------------------------------------------
# validation errors: named Einsum, tensor or rank, and the Einsum's line
# ------------------------------------------------------------------------------------------


def test_undefined_tensor() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]*Q[b,i,e]")
    err = load_error(text)
    assert err.einsum == "Y"
    assert "Q" in err.message and "not declared" in err.message
    assert err.line == locate(text, "Y[b,i,e] =")[0]


def test_rank_used_with_two_sizes() -> None:
    # variable e iterates E (size 3) but indexes rank I (size 4) of X
    text = cascade_text("Y[b,i,e] = X[b,e,e]")
    err = load_error(text)
    assert err.einsum == "Y"
    assert "two sizes" in err.message
    assert "rank I" in err.message and "E (size 3)" in err.message
    assert err.line == locate(text, "Y[b,i,e] =")[0]


def test_a_fixed_position_past_the_end_is_refused() -> None:
    """A position past its rank's end reads no element: the Einsum would run on zeros without a
    word (a final state read at the length instead of the last position). Below 0 is a
    recurrence's starting state or padding, and an offset beside a variable reads part of the
    rank at some size: both stay."""
    text = cascade_text("Y[b,i,e] = X[b,4,e]")
    err = load_error(text)
    assert err.einsum == "Y" and "position 4 of X[b,4,e] is past the end of rank I (0..3)" in err.message
    assert err.line == locate(text, "Y[b,i,e] =")[0]
    loads_cascade(cascade_text("Y[b,i,e] = X[b,3,e] + X[b,-1,e] + X[b,i+4,e]"))


def test_a_recurrence_reads_within_its_initial_values_history() -> None:
    """A recurrence with an initial value reads back at most the history that value holds: H[i-100]
    with H0 (one step) never read H0 and ran on zeros without a word. Without an initial value,
    reads before the start are the zero state (a recurrence over one position, a one-block softmax)."""
    base = """ranks: {B: 1, I: 16, E: 8}
tensors:
  AD: {ranks: [B, I, E], role: input}
  H0: {ranks: [B, E], role: state}
  H: {ranks: [B, I, E], role: output, initial: H0}
einsums:
  - H[b,i,e] = AD[b,i,e]*H[b,i-D,e] + AD[b,i,e]
"""
    for distance in (2, 100):
        err = load_error(base.replace("i-D", f"i-{distance}"))
        assert err.einsum == "H" and f"reads itself {distance} steps back along I" in err.message
        assert "H0 holds 1 step(s) of history" in err.message
    loads_cascade(base.replace("i-D", "i-1"))
    loads_cascade(base.replace("i-D", "i-100").replace(", initial: H0", "").replace("  H0: {ranks: [B, E], role: state}\n", ""))


def test_a_softmax_mask_leaves_every_query_a_key() -> None:
    """A mask of -inf (a softmax's) that hides every key of a query makes its softmax 0/0, which the
    cost model counted as no work and no bytes, output included; a mask of 0s may hide a whole row."""
    text = """ranks: {Q: 16, S: 16, D: 8}
tensors:
  QQ: {ranks: [Q, D], role: input}
  K: {ranks: [S, D], role: input}
  LM: {ranks: [Q, S], role: input, mask: {row: Q, col: S, lower: LO, upper: UP, dead: DEAD}}
  SC: {ranks: [Q, S], role: intermediate}
  P: {ranks: [Q, S], role: output}
einsums:
  - SC[q,s] = QQ[q,d]*K[s,d]
  - P[q,s] = exp(SC[q,s] + LM[q,s])
"""
    for lo, up, query in ((100, 200, 15), (-200, -100, 0), (-3, -1, 0)):
        err = load_error(text.replace("LO", str(lo)).replace("UP", str(up)).replace("DEAD", "-inf"))
        assert f"leaves query {query} no key of the 16" in err.message and "LM" in err.message
    loads_cascade(text.replace("LO", "-3").replace("UP", "0").replace("DEAD", "-inf"))  # a window of 4 keys
    loads_cascade(text.replace("LO", "-3").replace("UP", "-1").replace("DEAD", "0"))  # strictly lower, of 0s


def test_access_with_wrong_number_of_indices() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i]")
    err = load_error(text)
    assert err.einsum == "Y"
    assert "X[b,i]" in err.message and "2 indices" in err.message and "3 ranks" in err.message
    assert err.line == locate(text, "Y[b,i,e] =")[0]


def test_output_access_with_wrong_number_of_indices() -> None:
    err = load_error(cascade_text("Y[b,i] = X[b,i,e]"))
    assert err.einsum == "Y" and "Y[b,i]" in err.message


def test_output_defined_twice() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]", "Y[b,i,e] = X[b,i,e]*2")
    err = load_error(text)
    assert err.einsum == "Y"
    assert "defined twice" in err.message and "Y" in err.message
    assert_at(err, text, "Y[b,i,e]", 2)  # the second definition


def test_output_defined_twice_built_directly() -> None:
    from mambalaya.einsum import Rank, Role, TensorSpec, build_cascade

    e = parse_einsum("Y[i] = X[i]")
    with pytest.raises(SpecError) as info:
        build_cascade(
            name="t",
            params={},
            ranks=[Rank("I", 2)],
            tensors=[TensorSpec("X", ("I",), Role.INPUT), TensorSpec("Y", ("I",), Role.OUTPUT)],
            einsums=[e, e],
        )
    assert info.value.einsum == "Y" and "defined twice" in info.value.message


def test_cycle_between_two_einsums() -> None:
    tensors = "  A: {ranks: [B, I, E], role: intermediate}\n  C: {ranks: [B, I, E], role: intermediate}\n"
    text = cascade_text("A[b,i,e] = C[b,i,e] + X[b,i,e]", "C[b,i,e] = A[b,i,e]", "Y[b,i,e] = A[b,i,e]",
                        tensors=tensors)
    err = load_error(text)
    assert err.einsum in ("A", "C")
    assert "cycle" in err.message and "A" in err.message and "C" in err.message
    assert err.line == locate(text, f"{err.einsum}[b,i,e] =")[0]


@pytest.mark.parametrize(
    "line",
    [
        "Y[b,i,e] = Y[b,i+1,e] + X[b,i,e]",  # a later index
        "Y[b,i,e] = Y[b,i,e]",  # the same element
        "Y[b,i,e] = X[b,i,e]*Y[b,i,e]",
        "Y[b,i,e] = Y[b,i-1,e-1]",  # earlier at two ranks
        "Y[b,i,e] = Y[b,2*i-1,e]",  # not v-c
        "Y[b,i,e] = Y[b,i-1,f-1]*X[b,i,e]",  # a shifted other variable (a plain reduced one contracts the state)
    ],
)
def test_self_read_that_is_not_a_recurrence(line: str) -> None:
    text = cascade_text(line)
    err = load_error(text)
    assert err.einsum == "Y"
    assert "cycle" in err.message and "reads itself" in err.message
    assert err.line == locate(text, "Y[b,i,e] =")[0]


def test_recurrence_is_legal() -> None:
    c = loads_cascade(cascade_text("Y[b,i,e] = 0.5*Y[b,i-1,e] + X[b,i,e]"))
    y = c.einsum("Y")
    assert c.recurrence(y) == ("I", 1) and c.kind(y) == "recurrent"
    c2 = loads_cascade(cascade_text("Y[b,i,e] = Y[b,i-2,e] + Y[b,i-1,e]"))
    assert c2.recurrence(c2.einsum("Y")) == ("I", 2)


@pytest.mark.parametrize(
    ("index", "needle", "what"),
    [
        ("i*i", "i", "product of two rank variables"),  # the product that is not affine
        ("2*i*k", "2", "product of two rank variables"),
        ("exp(i)", "exp", "exp("),
        ("i/2", "/", "'/'"),
        ("i//2", "//", "'//'"),
        ("i%2", "%", "'%'"),
        ("i+0.5", "0.5", "not an integer"),
        ("X[i]", "X[i]", "X["),
    ],
)
def test_non_affine_index(index: str, needle: str, what: str) -> None:
    line = f"Y[b,i,e] = X[b,{index},e]"
    text = cascade_text(line)
    err = load_error(text)
    assert "non-affine" in err.message and what in err.message
    offset = line.index(index) + index.index(needle)
    assert (err.line, err.column) == (locate(text, line)[0], locate(text, line)[1] + offset)


def test_non_affine_index_direct_columns() -> None:
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[b,i] = X[b,i*i]")
    assert (info.value.source, info.value.line, info.value.column) == ("<string>", 1, 14)
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[b,i] = X[b,exp(i)]")
    assert info.value.column == 14
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[b,i] = X[b,i/2]")
    assert info.value.column == 15


def test_quoted_einsum_columns_count_the_quote() -> None:
    text = HEAD + "einsums: ['Y[b,i,e] = X[b,i*i,e]']\n"
    err = load_error(text)
    assert_at(err, text, "i*i,e]")
    text = HEAD + 'einsums:\n  - "Y[b,i,e] = X[b,i,e] $ 2"\n'
    err = load_error(text)
    assert_at(err, text, "$")
    assert "unexpected character '$'" in err.message


def test_output_index_must_be_a_plain_variable() -> None:
    err = load_error(cascade_text("Y[b,i-1,e] = X[b,i,e]"))
    assert err.einsum == "Y" and "single rank variable" in err.message


def test_undeclared_rank_variable_and_name() -> None:
    err = load_error(cascade_text("Y[b,i,e] = X[b,i,z+e]"))
    assert err.einsum == "Y" and "'z'" in err.message
    err = load_error(cascade_text("Y[b,i,e] = X[b,i,e]*alpha"))
    assert err.einsum == "Y" and "'alpha'" in err.message
    text = cascade_text("Y[b,i,e] = X[b,i+Q,e]")
    err = load_error(text)
    assert_at(err, text, "Q,e]")
    assert "'Q'" in err.message


def test_unknown_function_and_reduce_operator() -> None:
    text = cascade_text("Y[b,i,e] = cosh(X[b,i,e])")
    err = load_error(text)
    assert_at(err, text, "cosh")
    assert "cosh" in err.message
    text = cascade_text("Y[b,i,e] min= X[b,i,e]")
    err = load_error(text)
    assert_at(err, text, "min=")
    assert "min" in err.message


@pytest.mark.parametrize(
    ("line", "offset"),
    [
        ("Y[b,i,e] = X[b,i,e] +", 21),  # just past the end of the line
        ("Y[b,i,e] = (X[b,i,e]", 20),
        ("Y[b,i,e] = X[b,i,e])", 19),
        ("Y[b,i,e] X[b,i,e]", 9),
        ("Y[b,i,e] = X[b,i,,e]", 17),
        ("y[b,i,e] = X[b,i,e]", 0),
        ("Y[b,i,e] = X[b,i,e] X[b,i,e]", 20),
        ("Y[b,i,e] = X[b,i,e] ^ 2", 20),
        ("Y[b,i,e] = X[b,i,e]*", 20),
    ],
)
def test_syntax_errors_point_at_the_character(line: str, offset: int) -> None:
    text = cascade_text(line)
    err = load_error(text)
    ln, col = locate(text, line)
    assert (err.line, err.column) == (ln, col + offset), str(err)
    with pytest.raises(SpecError) as info:
        parse_einsum(line)
    assert (info.value.line, info.value.column) == (1, offset + 1)


def test_error_in_a_file_names_the_file(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(cascade_text("Y[b,i,e] = X[b,i*i,e]"))
    with pytest.raises(SpecError) as info:
        load_cascade(path)
    assert info.value.source == str(path) and str(path) in str(info.value)
    assert info.value.line == 9
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SpecError) as info:
        load_cascade(missing)
    assert info.value.source == str(missing)


# ------------------------------------------------------------------------------------------
# what parses
# ------------------------------------------------------------------------------------------


def test_max_reduction() -> None:
    head = HEAD.replace("  Y: {ranks: [B, I, E], role: output}\n", "  M: {ranks: [B, I], role: output}\n")
    c = loads_cascade(cascade_text("M[b,i] max= X[b,i,e]", head=head))
    e = c.einsum("M")
    assert e.reduce_op == "max" and e.reduced_variables == ("e",)
    assert c.kind(e) == "reduction"
    assert str(e) == "M[b,i] max= X[b,i,e]"
    assert parse_einsum("M[b,i] max = X[b,i,e]").reduce_op == "max"


def test_binary_max_and_min_functions() -> None:
    """``max(a, b)`` is an element-wise function of two values (an online softmax's running
    max), distinct from the ``max=`` reduction: it parses, prints back, counts as max ops and
    runs element-wise."""
    from mambalaya.einsum.stats import einsum_ops
    from mambalaya.execute import execute

    e = parse_einsum("M[b,t] = max(M[b,t-1], S[b,t]*2) - min(S[b,t], 0)")
    s = Access("S", (AffineIndex.var("b"), AffineIndex.var("t")))
    assert e.expr.lhs == Binary("max", Access("M", (AffineIndex.var("b"), AffineIndex.var("t", -1))),
                                Binary("*", s, Const(2.0)))
    assert e.expr.rhs == Binary("min", s, Const(0.0)) and e.reduce_op == "sum"
    assert str(e) == "M[b,t] = max(M[b,t-1], S[b,t]*2) - min(S[b,t], 0)" and parse_einsum(str(e)) == e
    head = (HEAD.replace("  Y: {ranks: [B, I, E], role: output}\n", "  M: {ranks: [B, I, E], role: output}\n"))
    c = loads_cascade(cascade_text("M[b,i,e] = max(M[b,i-1,e], X[b,i,e])", head=head))
    assert einsum_ops(c, c.einsum("M")) == {"max": c.size("B") * c.size("I") * c.size("E")}
    x = np.random.default_rng(0).standard_normal(c.shape("X"))
    assert np.array_equal(execute(c, {"X": x, "W": np.zeros(c.shape("W"))})["M"], np.maximum(np.maximum.accumulate(x, axis=1), 0.0))
    with pytest.raises(SpecError, match="expected ',' between the two arguments of max"):
        parse_einsum("M[b] = max(X[b])")
    with pytest.raises(SpecError, match="known: .*relu, gelu, max, min"):
        parse_einsum("M[b] = maxi(X[b], 1)")


def test_constants_negative_numbers_parentheses_and_neg() -> None:
    e = parse_einsum("Y[b] = (X[b] + 1e-5)*-2 - neg(X[b]) / (2.5 - -3) + .5e+1")
    x = Access("X", (AffineIndex.var("b"),))
    assert e.expr == Binary(
        "+",
        Binary(
            "-",
            Binary("*", Binary("+", x, Const(1e-5)), Const(-2.0)),
            Binary("/", Unary("neg", x), Binary("-", Const(2.5), Const(-3.0))),
        ),
        Const(5.0),
    )
    assert parse_einsum(str(e)) == e
    assert parse_einsum("Y[b] = -X[b]").expr == Unary("neg", x)
    assert parse_einsum("Y[b] = -(2)").expr == Unary("neg", Const(2.0))
    assert parse_einsum("Y[b] = ((((X[b]))))").expr == x
    assert parse_einsum("Y[b] = 1.0E-05").expr == Const(1e-5)


def test_precedence_and_associativity() -> None:
    e = parse_einsum("Y[] = A[] - B[] - C[] / D[] / F[]")
    a, b, c, d, f = (Access(n, ()) for n in "ABCDF")
    assert e.expr == Binary("-", Binary("-", a, b), Binary("/", Binary("/", c, d), f))
    g = parse_einsum("Y[] = A[] - (B[] - C[]) / (D[] * F[])")
    assert g.expr == Binary("-", a, Binary("/", Binary("-", b, c), Binary("*", d, f)))
    assert str(g) == "Y[] = A[] - (B[] - C[])/(D[]*F[])"
    assert parse_einsum(str(e)) == e and parse_einsum(str(g)) == g


def test_scalar_tensors() -> None:
    head = HEAD + "  S: {ranks: [], role: intermediate}\n  Z: {ranks: [], role: output}\n"
    c = loads_cascade(cascade_text("S[] = X[b,i,e]*X[b,i,e]", "Y[b,i,e] = X[b,i,e]*S[]", "Z[] = S[] + eps",
                                   head=head))
    assert c.einsum("S").output == Access("S", ()) and c.shape("S") == ()
    assert c.einsum("S").reduced_variables == ("b", "i", "e")
    assert loads_cascade(dump_cascade(c)) == c


def test_upper_case_rank_names_in_indices() -> None:
    head = HEAD + "  C: {ranks: [B, I, E], role: output}\n  L: {ranks: [B, E], role: output}\n"
    c = loads_cascade(cascade_text("C[b,i,e] = X[b,i+k-(K-1),e]*W[e,e]", "L[b,e] = X[b,I-1,e]",
                                   "Y[b,i,e] = X[b,i,e]", head=head))
    conv = c.einsum("C")
    assert conv.inputs[0].indices[1] == AffineIndex((("i", 1), ("k", 1)), -1)
    assert c.kind(conv) == "window"
    assert c.einsum("L").inputs[0].indices[1] == AffineIndex.constant(3)
    assert str(conv) == "C[b,i,e] = X[b,i+k-1,e]*W[e,e]"
    assert loads_cascade(dump_cascade(c)) == c


def test_affine_index_forms() -> None:
    sizes = {"K": 4}
    e = parse_einsum("Y[i] = X[256*c+q, 2*(i-1)+K, -i+3, i-i, (0)]", sizes=sizes)
    assert e.output == Access("Y", (AffineIndex.var("i"),))
    idx = e.inputs[0].indices
    assert idx[0] == AffineIndex((("c", 256), ("q", 1)), 0)
    assert idx[1] == AffineIndex((("i", 2),), 2)
    assert idx[2] == AffineIndex((("i", -1),), 3)
    assert idx[3] == AffineIndex.constant(0) and idx[4] == AffineIndex.constant(0)
    assert parse_einsum(str(e)) == e


def test_einsums_print_and_parse_back() -> None:
    from mambalaya.workloads.blocks.mamba1 import PRESETS, mamba1_layer

    for phase in ("prefill", "decode"):
        c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=5, phase=phase)
        sizes = {r: rk.size for r, rk in c.ranks.items()}
        for e in c.einsums:
            assert parse_einsum(str(e), sizes=sizes) == e
        assert loads_cascade(dump_cascade(c)) == c


def test_printing_constants() -> None:
    for value in (0.0, 1.0, -1.0, 1e-5, -2.5e-7, 1e15, 1e16, 123456789.125, 1 / 3, -1e300, 5e-324):
        e = Einsum(Access("Y", ()), Binary("-", Const(value), Binary("*", Const(value), Param("eps"))))
        assert parse_einsum(str(e)) == e, str(e)
    assert str(Einsum(Access("Y", ()), Const(-2.0))) == "Y[] = (-2)"


# ------------------------------------------------------------------------------------------
# the YAML format: fields, roles, bits, sizes, tensor ranks
# ------------------------------------------------------------------------------------------


def test_unknown_top_level_field() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]") + "colour: blue\n"
    err = load_error(text)
    assert "colour" in err.message
    assert_at(err, text, "colour")


def test_unknown_tensor_field() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("role: output}", "role: output, dtype: fp16}")
    err = load_error(text)
    assert "dtype" in err.message and "tensors.Y" in err.message
    assert_at(err, text, "dtype")


def test_missing_fields() -> None:
    err = load_error("name: t\nranks: {B: 1}\ntensors: {}\n")
    assert "einsums" in err.message and err.line == 1
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("Y: {ranks: [B, I, E], role: output}", "Y: {ranks: [B]}")
    err = load_error(text)
    assert "role" in err.message
    assert_at(err, text, "{ranks: [B]}")


def test_wrong_role() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("role: output", "role: result")
    err = load_error(text)
    assert "result" in err.message and "output" in err.message
    assert_at(err, text, "result")


def test_role_inconsistent_with_the_cascade() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("role: input", "role: intermediate")
    err = load_error(text)
    assert "X" in err.message and "intermediate" in err.message
    assert err.line == locate(text, "  X:")[0]
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("role: output", "role: weight")
    err = load_error(text)
    assert err.einsum == "Y" and "weight" in err.message
    head = HEAD + "  T: {ranks: [B, I, E], role: intermediate}\n"
    text = cascade_text("T[b,i,e] = X[b,i,e]", "Y[b,i,e] = X[b,i,e]", head=head)
    err = load_error(text)
    assert err.einsum == "T" and "never read" in err.message
    # a weight nobody reads: its elements would count among the parameters (8,388,608 for 4,194,304)
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("F], role: input}", "F], role: weight}")
    err = load_error(text)
    assert "weight W is never read" in err.message and "9 elements" in err.message


@pytest.mark.parametrize("bits", ["0", "-8", "x", "2.5", "true", "[8]"])
def test_bad_bits(bits: str) -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("F], role: input}", f"F], role: input, bits: {bits}}}")
    err = load_error(text)
    assert "bits" in err.message and "tensors.W" in err.message
    assert_at(err, text, f"{bits}}}")


def test_rank_size_expressions() -> None:
    c = loads_cascade(cascade_text("Y[b,i,e] = X[b,i,e]").replace("K: 2", "K: ceil(d/4), R: 'd//4 + K'"))
    assert c.size("K") == 2 and c.ranks["K"].size_expr == "ceil(d/4)" and c.size("R") == 3
    assert loads_cascade(dump_cascade(c)) == c


@pytest.mark.parametrize(
    ("size", "what"),
    [
        ("d/4", "not a positive integer"),
        ("0", "positive integer"),
        ("-2", "positive integer"),
        ("d-6", "not a positive integer"),
        ("1.5", "not a positive integer"),
        ("d/(d-6)", "division by zero"),
        ("q*2", "unknown name 'q'"),
        ("sqrt(d)", "unknown function"),
        ("true", "positive integer"),
        ("[2]", "single value"),
        ("ceil(1e308*10)", "above 2^53"),  # sizes are exact: 1e309 is a (refused) number, not infinity
        ("d*(", "expected a number"),
    ],
)
def test_bad_rank_size(size: str, what: str) -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("K: 2", f"K: {size}")
    err = load_error(text)
    assert what in err.message
    assert err.line == 3 and err.column is not None
    start = locate(text, f"K: {size}")[1] + 3
    assert start <= err.column <= start + len(size)


def test_evaluate_size_directly() -> None:
    assert evaluate_size("ceil(d/3)", {"d": 7}) == 3
    assert evaluate_size("max(2, min(d, 4))*2", {"d": 7}) == 8
    with pytest.raises(SpecError) as info:
        evaluate_size("d/3", {"d": 7})
    assert (info.value.line, info.value.column) == (1, 1) and "d/3" in info.value.message
    with pytest.raises(SpecError) as info:
        evaluate_size("0", {})
    assert "not a positive integer" in info.value.message


def test_tensor_using_an_undeclared_rank() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("W: {ranks: [E, F]", "W: {ranks: [E, Q]")
    err = load_error(text)
    assert "W" in err.message and "'Q'" in err.message and "not declared" in err.message
    assert err.line == locate(text, "  W:")[0]


def test_names_are_checked_with_a_location() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("K: 2", "k: 2")
    err = load_error(text)
    assert "'k'" in err.message and err.line == 3
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("  W:", "  w:")
    err = load_error(text)
    assert "'w'" in err.message and err.line == locate(text, "  w:")[0]
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("d: 6", "2d: 6")
    err = load_error(text)
    assert "'2d'" in err.message and err.line == 2


def test_yaml_boolean_words_are_names_in_rank_lists() -> None:
    head = HEAD.replace("K: 2", "NO: 2") + "  T: {ranks: [B, NO], role: input}\n"
    c = loads_cascade(cascade_text("Y[b,i,e] = X[b,i,e]*T[b,no]", head=head))
    assert c.tensors["T"].ranks == ("B", "NO")
    assert loads_cascade(dump_cascade(c)) == c


def test_param_must_be_a_number() -> None:
    for bad in ("abc", ".nan", "[1]", "true", "!!int x"):
        text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("d: 6", f"d: {bad}")
        err = load_error(text)
        assert "params.d" in err.message and err.line == 2 and err.column is not None


def test_huge_numbers_in_params() -> None:
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("d: 6", "d: 1" + "0" * 400).replace("K: 2", "K: d")
    err = load_error(text)
    assert "above 2^53" in err.message and err.line == 3  # exact arithmetic: the size itself is refused
    text = cascade_text("Y[b,i,e] = X[b,i,e]").replace("d: 6", "d: 1" + "0" * 5000)
    err = load_error(text)
    assert "params.d" in err.message and err.line == 2


def test_malformed_yaml() -> None:
    for text, line in [
        ("name: [unclosed\nranks: {}\n", 2),
        ("a: 1\n b: 2\n", 2),
        ("\t- x", 1),
        ("a: 1\n---\nb: 2\n", 2),
        ("a: *nope\n", 1),
        ("a: !custom 3\nranks: {}\ntensors: {}\neinsums: []\n", 1),
        ("ranks: {B: 1}\ntensors: {}\neinsums: []\nname: \x07\n", 4),
        ("", 1),
        ("[" * 5000, 1),
        ("just text", 1),
        ('name: t\ndescription: "\\U00110000"\n', 2),  # PyYAML raises ValueError from chr()
        ('name: "00\\Ue0010000"\n', 1),  # ... and OverflowError beyond a C int (found by hypothesis)
        ("a: 1\x85b: [\n", 3),  # YAML counts NEL as a line break
    ]:
        err = load_error(text)
        assert err.line == line, (text[:40], str(err))


def test_deeply_nested_expressions_are_rejected_with_a_location() -> None:
    for body in ("(" * 500 + "X[]" + ")" * 500, "-" * 2000 + "1", "neg(" * 300 + "1" + ")" * 300,
                 "+".join(["X[]"] * 3000)):
        with pytest.raises(SpecError) as info:
            parse_einsum("Y[] = " + body)
        assert info.value.line == 1 and info.value.column is not None and "nested" in info.value.message
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[i] = X[" + "(" * 500 + "i" + ")" * 500 + "]")
    assert info.value.column is not None
    with pytest.raises(SpecError) as info:
        evaluate_size("(" * 5000 + "1" + ")" * 5000, {})
    assert info.value.column is not None
    # moderate nesting is fine
    assert parse_einsum("Y[] = " + "(" * 40 + "X[]" + ")" * 40).expr == Access("X", ())


def test_huge_numbers_are_rejected_with_a_location() -> None:
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[i] = X[i+" + "9" * 5000 + "]")
    assert info.value.column == 12
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[i] = X[" + "*".join(["999999999"] * 40) + "*i]")
    assert info.value.column == 10
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[] = 1" + "0" * 400)
    assert info.value.column == 7 and "finite" in info.value.message


def test_non_ascii_text_is_rejected() -> None:
    with pytest.raises(SpecError) as info:
        parse_einsum("Y[i] = X[i] * \u0663")  # an Arabic-Indic digit
    assert info.value.column == 15


def test_every_spec_reader_names_an_escape_beyond_unicode() -> None:
    """PyYAML's scanner calls chr() on an eight-digit escape unchecked: ValueError above U+10FFFF,
    OverflowError beyond a C int. Specs read through specio (architectures, policies, mappings,
    sweeps) give one SpecError with the location too."""
    from mambalaya.specio import parse_yaml_text
    from mambalaya.workloads.precision import loads_policy

    for text, column in (('a: "\\U00110000"\n', 5), ('a: "x\\Ue0010000"\n', 6)):
        with pytest.raises(SpecError, match="an escape names no Unicode character") as info:
            parse_yaml_text(text, source="s.yaml")
        assert (info.value.source, info.value.line, info.value.column) == ("s.yaml", 1, column)
    with pytest.raises(SpecError, match="an escape names no Unicode character"):
        loads_policy('name: "\\Ue0010000"\n')


def test_a_line_parsed_again_takes_the_sizes_its_indices_name_and_a_bad_one_names_its_place() -> None:
    """parse_einsum is memoised per text: a line whose index names a rank size gives that size's
    offset at every size asked (never the first parse's), a line naming none is one object, and
    a line that fails is parsed again so its error names the file and line asked about."""
    from mambalaya.einsum.parse import Where

    text = "HN[b,e] = H[b,I-1,e]"
    at = {n: parse_einsum(text, sizes={"I": n, "E": 3}) for n in (4, 8, 4)}
    assert [str(at[n].expr) for n in (4, 8)] == ["H[b,3,e]", "H[b,7,e]"]
    assert parse_einsum(text, sizes={"I": 4}) is at[4]  # the sizes it names, not the others
    with pytest.raises(SpecError, match="rank name"):
        parse_einsum(text)  # no sizes: I is unknown, the memo is not asked to guess
    plain = "Y[b,i] = X[b,i]*2"
    assert parse_einsum(plain) is parse_einsum(plain, sizes={"I": 9})
    for line in (3, 7):
        with pytest.raises(SpecError, match=f"layer.yaml.*{line}"):
            parse_einsum("Y[b,i] = X[b,i", where=Where("layer.yaml", line))
