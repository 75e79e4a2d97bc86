"""Property tests of the cascade format and the Einsum parser.

(a) Random valid cascades print to text that loads back to the same cascade, and every Einsum
prints to text that parses back to the same Einsum. (b) Random malformed cascade text and
(c) random Einsum text either load/parse or raise :class:`SpecError` with a location, never
any other exception.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambalaya.errors import SpecError
from mambalaya.einsum import (
    Access,
    AffineIndex,
    Binary,
    Cascade,
    Const,
    Einsum,
    Param,
    Rank,
    Role,
    TensorSpec,
    Unary,
    build_cascade,
    dump_cascade,
    loads_cascade,
    parse_einsum,
)
from mambalaya.einsum.ir import BINARY_OPERATORS, UNARY_FUNCTIONS

# Names chosen to trip YAML 1.1 (NO, ON, Yes, Null, on, null) and the parser (exp, max as
# parameters; a rank E whose variable e is also an exponent letter).
RANK_POOL = ["B", "I", "E", "N", "K", "D2", "R_X", "NO", "ON"]
PARAM_POOL = ["eps", "alpha", "d_model", "on", "null", "exp", "max", "x1"]
EXTERNAL_POOL = ["X", "W", "Yes", "Null", "S0", "WB_2"]
OUTPUT_POOL = ["A", "H", "On", "T_1", "Out", "Z"]

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# descriptions: prose, YAML-significant text, anything (astral characters, controls, line breaks)
texts = st.one_of(st.sampled_from(["", "a cascade", "line one\nline \"two\"", "ünïcode: yes # no 😀"]), st.text())

numbers = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-5, 1.0e-05, 0.5, -2.0, 1e16, 123456789.125, -0.0]),
)


# ------------------------------------------------------------------------------------------
# (a) random valid cascades
# ------------------------------------------------------------------------------------------


@st.composite
def index_for(draw, rank: str, sizes: dict[str, int]) -> AffineIndex:
    """An index into a position of rank ``rank``: plain, shifted, constant or a window."""
    own = rank.lower()
    same_size = [r.lower() for r, s in sizes.items() if s == sizes[rank]]
    others = [r.lower() for r in sizes if r.lower() != own]
    kind = draw(st.sampled_from(["plain", "plain", "plain", "shift", "const", "window", "scaled"]))
    if kind == "plain":
        return AffineIndex.var(draw(st.sampled_from(same_size)))
    if kind == "shift":
        return AffineIndex.var(own, draw(st.sampled_from([-2, -1, 1, 2])))
    if kind == "const" or (kind == "window" and not others):
        return AffineIndex.constant(draw(st.integers(0, sizes[rank] - 1)))
    if kind == "window":
        other = draw(st.sampled_from(others))
        return AffineIndex(((own, 1), (other, 1)), -draw(st.integers(0, 4)))
    coeff = draw(st.sampled_from([-2, 2, 3, -1]))
    return AffineIndex(((own, coeff),), draw(st.integers(-3, 3)))


@st.composite
def access_to(draw, tensor: str, ranks: tuple[str, ...], sizes: dict[str, int]) -> Access:
    return Access(tensor, tuple(draw(index_for(r, sizes)) for r in ranks))


@st.composite
def expressions(draw, readable: dict[str, tuple[str, ...]], names: list[str], sizes: dict[str, int], depth: int):
    leaf_kinds = ["access"] * 4 + ["const"] + (["param"] if names else [])
    kinds = leaf_kinds + (["unary"] * 2 + ["binary"] * 6 if depth > 0 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "access":
        tensor = draw(st.sampled_from(sorted(readable)))
        return draw(access_to(tensor, readable[tensor], sizes))
    if kind == "const":
        return Const(draw(numbers))
    if kind == "param":
        return Param(draw(st.sampled_from(names)))
    if kind == "unary":
        return Unary(draw(st.sampled_from(UNARY_FUNCTIONS)), draw(expressions(readable, names, sizes, depth - 1)))
    op = draw(st.sampled_from(BINARY_OPERATORS))
    lhs = draw(expressions(readable, names, sizes, depth - 1))
    rhs = draw(expressions(readable, names, sizes, depth - 1))
    return Binary(op, lhs, rhs)


@st.composite
def size_expression(draw, size: int, params: dict[str, float], earlier: list[Rank]) -> str | None:
    forms = ["none", "none", "text", "ceil", "times"]
    int_params = [p for p, v in params.items() if isinstance(v, int)]
    if int_params:
        forms.append("param")
    if earlier:
        forms.append("rank")
    form = draw(st.sampled_from(forms))
    if form == "none":
        return None
    if form == "text":
        return str(size)
    if form == "ceil":
        return f"ceil({2 * size - 1}/2)"
    if form == "times":
        return f"{size}*1"
    if form == "param":
        return f"{draw(st.sampled_from(int_params))}*0 + {size}"
    prev = draw(st.sampled_from(earlier))
    diff = size - prev.size
    return f"{prev.name}+{diff}" if diff >= 0 else f"{prev.name}-{-diff}"


@st.composite
def valid_cascades(draw) -> Cascade:
    rank_names = draw(st.lists(st.sampled_from(RANK_POOL), min_size=1, max_size=4, unique=True))
    # (a parameter named as a rank or its variable is refused: a name means one thing)
    free = [p for p in PARAM_POOL if p not in rank_names and p not in {r.lower() for r in rank_names}]
    params = draw(st.dictionaries(st.sampled_from(free), numbers, max_size=3))
    ranks: list[Rank] = []
    for name in rank_names:
        size = draw(st.integers(1, 5))
        ranks.append(Rank(name, size, draw(size_expression(size, params, ranks))))
    sizes = {r.name: r.size for r in ranks}

    def rank_subset():
        return tuple(draw(st.lists(st.sampled_from(rank_names), max_size=len(rank_names), unique=True)))

    tensors: dict[str, TensorSpec] = {}
    for name in draw(st.lists(st.sampled_from(EXTERNAL_POOL), min_size=1, max_size=3, unique=True)):
        role = draw(st.sampled_from([Role.INPUT, Role.WEIGHT, Role.STATE]))
        tensors[name] = TensorSpec(name, rank_subset(), role, draw(st.integers(1, 64)), description=draw(texts))

    names = list(params) + rank_names
    einsums: list[Einsum] = []
    outputs = draw(st.lists(st.sampled_from(OUTPUT_POOL), min_size=1, max_size=4, unique=True))
    read: set[str] = set()
    for out in outputs:
        out_ranks = rank_subset()
        # (a tensor with an initial value is read back at most the history it holds: left to the recurrences)
        readable = {t: spec.ranks for t, spec in tensors.items() if spec.initial is None}
        expr = draw(expressions(readable, names, sizes, draw(st.sampled_from([0, 1, 2, 2, 3, 4]))))
        initial = None
        if out_ranks and draw(st.integers(0, 3)) == 0:  # a recurrence over one rank
            p = draw(st.integers(0, len(out_ranks) - 1))
            idx = [AffineIndex.var(r.lower()) for r in out_ranks]
            distance = draw(st.integers(1, 2))
            idx[p] = AffineIndex.var(out_ranks[p].lower(), -distance)
            expr = Binary(draw(st.sampled_from(BINARY_OPERATORS)), expr, Access(out, tuple(idx)))
            if distance == 1 and draw(st.booleans()):  # an initial value dropping the rank holds one step
                initial = out + "0"
                tensors[initial] = TensorSpec(initial, out_ranks[:p] + out_ranks[p + 1 :], Role.STATE)
        output = Access(out, tuple(AffineIndex.var(r.lower()) for r in out_ranks))
        einsums.append(Einsum(output, expr, draw(st.sampled_from(["sum", "max"]))))
        read |= {a.tensor for a in einsums[-1].inputs if a.tensor != out}
        if initial:
            read.add(initial)
        tensors[out] = TensorSpec(out, out_ranks, Role.OUTPUT, draw(st.sampled_from([8, 16, 32])), initial=initial)

    # roles of produced tensors, and an occasional state update
    states = [t for t, s in tensors.items() if s.role == Role.STATE and t not in outputs]
    for out in outputs:
        spec = tensors[out]
        roles = [Role.OUTPUT, Role.STATE] + ([Role.INTERMEDIATE] if out in read else [])
        role = draw(st.sampled_from(roles))
        updates = None
        fits = [
            s
            for s in states
            if set(tensors[s].ranks) <= set(spec.ranks)
            and all(sizes[r] == 1 for r in spec.ranks if r not in tensors[s].ranks)
        ]
        if fits and draw(st.booleans()):
            updates = draw(st.sampled_from(fits))
        tensors[out] = TensorSpec(out, spec.ranks, role, spec.bits, spec.initial, updates)

    for name, spec in list(tensors.items()):  # a weight nobody reads is refused (its elements would be parameters)
        if spec.role == Role.WEIGHT and name not in read:
            tensors[name] = TensorSpec(name, spec.ranks, Role.INPUT, spec.bits, description=spec.description)
    return build_cascade(
        name=draw(st.one_of(st.sampled_from(["t", "mamba1-prefill", "a b", "yes", "3", "x: y", "-dash"]), st.text())),
        params=params,
        ranks=ranks,
        tensors=list(tensors.values()),
        einsums=einsums,
        description=draw(texts),
    )


@settings(SETTINGS, max_examples=200)
@given(valid_cascades())
def test_random_cascades_round_trip(c: Cascade) -> None:
    text = dump_cascade(c)
    back = loads_cascade(text)
    assert back == c, text
    assert back.description == c.description  # descriptions are not compared by ==
    assert all(back.tensors[t].description == spec.description for t, spec in c.tensors.items())
    assert dump_cascade(back) == text
    sizes = {r: rk.size for r, rk in c.ranks.items()}
    for e in c.einsums:
        assert parse_einsum(str(e), sizes=sizes) == e, str(e)
        assert c.kind(e) in ("recurrent", "window", "gemm", "reduction", "unary", "broadcast", "elementwise", "copy")


# ------------------------------------------------------------------------------------------
# (b) malformed cascade text
# ------------------------------------------------------------------------------------------

SEED = """\
name: seed
params: {eps: 1.0e-05, d: 6}
ranks: {B: 2, I: 4, E: 'd/2', K: 2, R: ceil(d/4)}
tensors:
  X: {ranks: [B, I, E], role: input, bits: 16}
  W: {ranks: [E, R], role: weight}
  H0: {ranks: [B, E], role: state}
  H: {ranks: [B, I, E], role: intermediate, initial: H0}
  C: {ranks: [B, I, E], role: intermediate}
  M: {ranks: [B, I], role: intermediate}
  Y: {ranks: [B, I, E], role: output}
einsums:
  - H[b,i,e] = 0.5*H[b,i-1,e] + X[b,i,e]
  - C[b,i,e] = X[b,i+k-(K-1),e]*W[e,r] + (-1)
  - M[b,i] max= exp(C[b,i,e]) / (1e-5 + neg(H[b,i,e]))
  - "Y[b,i,e] = C[b,i,e]*M[b,i] - sqrt(eps)"
"""

TOKENS = [
    "[", "]", "(", ")", "{", "}", ",", ":", ": ", "-", "- ", "+", "*", "/", "//", "=", "max=", " ", "\n",
    "\n  ", "\t", "'", '"', "#", "&a", "*a", "!!int", "!!str", "!x", "|", ">", "%", "@", "`", "?", "...",
    "---", "i", "i-1", "K", "X", "Y", "e", "0", "1", "-1", "1e-5", "1e999", "9" * 30, ".", "exp(", "neg(",
    "ranks", "role", "bits", "tensors", "einsums", "params", "name", "input", "state", "initial", "updates",
    "~", "null", "true", "NO", "\x00", "\u00e9", "\ufeff", "\x85", "\u2028", "\\U00110000", "\\x41", "<<: ",
]

TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:e-?\d+)?|\S")


@st.composite
def mutated_text(draw, base: str | None = None) -> str:
    text = base if base is not None else draw(st.one_of(st.just(SEED), valid_cascades().map(dump_cascade)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "insert", "replace", "token", "lines", "truncate", "dup_line"]))
        n = len(text)
        if op == "delete" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + text[i + draw(st.integers(1, 5)) :]
        elif op == "insert":
            i = draw(st.integers(0, n))
            piece = draw(st.one_of(st.sampled_from(TOKENS), st.text(min_size=1, max_size=3)))
            text = text[:i] + piece + text[i:]
        elif op == "replace" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i + 1 :]
        elif op == "token":
            matches = list(TOKEN_RE.finditer(text))
            if matches:
                m = draw(st.sampled_from(matches))
                text = text[: m.start()] + draw(st.sampled_from(TOKENS + [""])) + text[m.end() :]
        elif op == "lines":
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif op == "dup_line":
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
            text = "\n".join(lines)
        elif op == "truncate":
            text = text[: draw(st.integers(0, n))]
    return text


YAML_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")  # what YAML counts as a line break


def check_load(text: str) -> None:
    try:
        c = loads_cascade(text, source="m.yaml")
    except SpecError as err:
        assert err.source == "m.yaml", repr(err)
        assert err.line is not None or err.einsum is not None, repr(err)
        if err.line is not None:
            assert 1 <= err.line <= len(YAML_BREAK.findall(text)) + 2, repr(err)
        if err.column is not None:
            assert err.column >= 1, repr(err)
        return
    assert isinstance(c, Cascade)
    # whatever loads must also print and load back to itself
    assert loads_cascade(dump_cascade(c)) == c, text


@settings(SETTINGS, max_examples=300)
@given(mutated_text())
def test_mutated_cascade_text_loads_or_raises_spec_error(text: str) -> None:
    check_load(text)


@settings(SETTINGS, max_examples=300)
@given(st.one_of(st.text(), st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)))
def test_arbitrary_text_loads_or_raises_spec_error(text: str) -> None:
    check_load(text)


# ------------------------------------------------------------------------------------------
# (c) random Einsum text
# ------------------------------------------------------------------------------------------

EINSUM_TOKENS = [
    "Y", "X", "H", "T_1", "[", "]", "[]", "(", ")", ",", "=", "max", "max=", "sum", "+", "-", "*", "/", "//",
    "%", " ", "b", "i", "k", "i-1", "K", "0", "2", "1e-5", "1e400", ".5", "3.", "9" * 25, "exp", "neg(",
    "silu", "eps", "_", "$", "\t", "\n", "é",
]
SIZES = {"K": 4, "I": 8}


def check_parse(text: str) -> None:
    try:
        e = parse_einsum(text, sizes=SIZES)
    except SpecError as err:
        assert err.source == "<string>" and err.line == 1, repr(err)
        assert err.column is not None and 1 <= err.column <= len(text) + 1, repr(err)
        return
    assert isinstance(e, Einsum)
    assert parse_einsum(str(e), sizes=SIZES) == e, (text, str(e))


@settings(SETTINGS, max_examples=300)
@given(st.one_of(st.text(), st.lists(st.sampled_from(EINSUM_TOKENS), max_size=30).map("".join)))
def test_arbitrary_einsum_text_parses_or_raises_spec_error(text: str) -> None:
    check_parse(text)


@settings(SETTINGS, max_examples=300)
@given(valid_cascades().flatmap(lambda c: st.sampled_from([str(e) for e in c.einsums])).flatmap(mutated_text))
def test_mutated_einsum_text_parses_or_raises_spec_error(text: str) -> None:
    check_parse(text)
