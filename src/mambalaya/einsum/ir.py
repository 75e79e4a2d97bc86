"""The extended-Einsum intermediate representation.

An :class:`Einsum` assigns an expression over tensor accesses to one output access. Index
expressions are affine in rank variables (``i-1``, ``i+k-3``, ``256*c+q``). Rank variables are
the lower-case names of ranks (rank ``E`` has variable ``e``). Rank variables on the right that
are absent on the left are reduced: each top-level additive term of the expression is reduced
over the variables it has and the output lacks, with the Einsum's reduce operator (``sum``
unless ``max=`` is written), so ``DT[b,i,e] = DL[b,i,r]*WDT[r,e] + BDT[e]`` adds the bias
once, as a reader of Einstein notation expects.

These are plain immutable values; :mod:`mambalaya.einsum.cascade` checks how they fit together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from enum import Enum
from typing import Union

UNARY_FUNCTIONS: tuple[str, ...] = (
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "silu",
    "softplus",
    "neg",
    "square",
    "sigmoid",
    "tanh",
    "abs",
    "step",
    "relu",
    "gelu",
)
#: ``step(x)`` is the Heaviside step, 1 where ``x > 0`` and 0 elsewhere: the comparison a
#: mixture-of-experts router needs to pick its top-k experts (``workloads/blocks/moe.py``), counted as
#: one elementwise operation like ``relu``. ``gelu(x)`` is the exact GELU, ``0.5*x*(1 + erf(x/sqrt(2)))``
#: (transformers' ``ACT2FN['gelu']``, ``torch.nn.functional.gelu`` without the tanh approximation),
#: the activation of Zamba2's shared MLPs.
BINARY_OPERATORS: tuple[str, ...] = ("+", "-", "*", "/")
#: Element-wise functions of two values, written ``max(a, b)``: the running maximum of an
#: online softmax (``M[b,i,t] = max(M[b,i,t-1], S[b,i,t])``). A :class:`Binary` node with
#: these as ``op``; distinct from the ``max=`` reduction.
BINARY_FUNCTIONS: tuple[str, ...] = ("max", "min")
REDUCE_OPERATORS: tuple[str, ...] = ("sum", "max")


def rank_variable(rank: str) -> str:
    """The variable that iterates ``rank`` (``E`` -> ``e``)."""
    return rank.lower()


def rank_of_variable(variable: str) -> str:
    """The rank a variable iterates (``e`` -> ``E``)."""
    return variable.upper()


@dataclass(frozen=True)
class AffineIndex:
    """``sum(coeff * var) + const``; ``terms`` keeps the order the index was written in."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str, offset: int = 0) -> "AffineIndex":
        return AffineIndex(((name, 1),), offset)

    @staticmethod
    def constant(value: int) -> "AffineIndex":
        return AffineIndex((), value)

    @cached_property
    def variables(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    @property
    def plain_variable(self) -> str | None:
        """The variable if the index is exactly one variable (``e``), else ``None``."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def shifted_variable(self) -> tuple[str, int] | None:
        """``(var, offset)`` if the index is ``var + offset``, else ``None``."""
        if len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0], self.const
        return None

    def bounds(self, sizes: dict[str, int]) -> tuple[int, int]:
        """Smallest and largest value over ``0 <= var < sizes[var]``."""
        lo = hi = self.const
        for v, c in self.terms:
            top = c * (sizes[v] - 1)
            lo += min(0, top)
            hi += max(0, top)
        return lo, hi

    def __str__(self) -> str:
        out = ""
        for v, c in self.terms:
            mag = abs(c)
            piece = v if mag == 1 else f"{mag}*{v}"
            if not out:
                out = piece if c > 0 else f"-{piece}"
            else:
                out += f"+{piece}" if c > 0 else f"-{piece}"
        if self.const or not out:
            if not out:
                out = str(self.const)
            else:
                out += f"+{self.const}" if self.const > 0 else f"-{-self.const}"
        return out


@dataclass(frozen=True)
class Access:
    tensor: str
    indices: tuple[AffineIndex, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(str(i) for i in self.indices)}]"

    @cached_property
    def variables(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for idx in self.indices:
            for v in idx.variables:
                seen.setdefault(v)
        return tuple(seen)


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Param:
    """A named scalar: a cascade parameter (``eps``) or a rank's size (``D``)."""

    name: str


@dataclass(frozen=True)
class Unary:
    fn: str
    arg: "Expr"


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: "Expr"
    rhs: "Expr"


Expr = Union[Access, Const, Param, Unary, Binary]


def walk(expr: Expr):
    """Every node of ``expr``, parents before children."""
    yield expr
    if isinstance(expr, Unary):
        yield from walk(expr.arg)
    elif isinstance(expr, Binary):
        yield from walk(expr.lhs)
        yield from walk(expr.rhs)


def accesses(expr: Expr) -> tuple[Access, ...]:
    return tuple(n for n in walk(expr) if isinstance(n, Access))


def expr_variables(expr: Expr) -> tuple[str, ...]:
    """Rank variables of ``expr`` in order of first appearance."""
    seen: dict[str, None] = {}
    for acc in accesses(expr):
        for v in acc.variables:
            seen.setdefault(v)
    return tuple(seen)


def peel_scales(term: Expr) -> tuple[Expr, tuple[Expr, ...]]:
    """A product with its factors that read no tensor (constants, parameters) peeled off:
    ``(the product under them, the factors)``. ``QR*KR*scale`` is ``(QR*KR, (scale,))``: a
    reduction over it is ``scale * sum QR*KR``, a contraction of two tensors scaled once per
    output point (:mod:`mambalaya.einsum.stats`, :mod:`mambalaya.cost.contraction`).
    A division by such a factor is a scale too, by its reciprocal (``A*W/8`` is
    ``(A*W, (1/8,))``): once it left the product unrecognised, counted as additions, multiplies
    and divisions on the vector units, while ``A*W*0.125`` ran on the array."""
    scales = []
    while isinstance(term, Binary):
        if term.op == "*" and not (accesses(term.lhs) and accesses(term.rhs)):
            scale, term = (term.rhs, term.lhs) if accesses(term.lhs) else (term.lhs, term.rhs)
        elif term.op == "/" and accesses(term.lhs) and not accesses(term.rhs):
            scale, term = Binary("/", Const(1.0), term.rhs), term.lhs
        else:
            break
        scales.append(scale)
    return term, tuple(scales)


def _negated_sum(expr: Expr) -> bool:
    """A unary minus over a sum, ``-(a + b)``: as ``0 - (a + b)``, its terms are ``-a`` and ``-b``."""
    return (isinstance(expr, Unary) and expr.fn == "neg" and isinstance(expr.arg, Binary)
            and expr.arg.op in ("+", "-"))


def additive_terms(expr: Expr) -> tuple[tuple[int, Expr], ...]:
    """Top-level terms of a sum with their signs: ``a - b + c`` -> ``((1,a), (-1,b), (1,c))``.
    Brackets and a unary minus over a sum are transparent (``-(a + b)`` is ``-a - b``, as
    ``0 - (a + b)`` is: once its terms were one, so a term lacking the reduced variable was summed
    over it in one spelling and added once in the other); any other operator (a product, a
    function) makes its whole argument one term."""
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        left = additive_terms(expr.lhs)
        right = additive_terms(expr.rhs)
        if expr.op == "-":
            right = tuple((-s, t) for s, t in right)
        return left + right
    if _negated_sum(expr):
        return tuple((-s, t) for s, t in additive_terms(expr.arg))  # type: ignore[union-attr]
    return ((1, expr),)


def additive_nodes(expr: Expr) -> tuple["Binary", ...]:
    """The ``+`` and ``-`` nodes that join :func:`additive_terms`' terms (each one addition per
    point it combines): every one, not the left spine's alone (``a + (b + c)`` has two)."""
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        return (expr, *additive_nodes(expr.lhs), *additive_nodes(expr.rhs))
    if _negated_sum(expr):
        return additive_nodes(expr.arg)  # type: ignore[union-attr]
    return ()


def product_factors(term: Expr) -> tuple[Expr, ...]:
    """The multiplicative factors of a product (a quotient's numerator's, not its divisor's)."""
    if isinstance(term, Binary) and term.op == "*":
        return product_factors(term.lhs) + product_factors(term.rhs)
    if isinstance(term, Binary) and term.op == "/":
        return product_factors(term.lhs)
    return (term,)


def map_accesses(expr: Expr, fn) -> Expr:
    """``expr`` with every access ``a`` replaced by ``fn(a)`` (an expression)."""
    if isinstance(expr, Access):
        return fn(expr)
    if isinstance(expr, Unary):
        return Unary(expr.fn, map_accesses(expr.arg, fn))
    if isinstance(expr, Binary):
        return Binary(expr.op, map_accesses(expr.lhs, fn), map_accesses(expr.rhs, fn))
    return expr


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _format_const(value: float) -> str:
    text = str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
    return f"(-{text.lstrip('-')})" if value < 0 else text


def format_expr(expr: Expr) -> str:
    """Text that parses back to exactly ``expr`` (same tree), with minimal parentheses."""
    if isinstance(expr, Access):
        return str(expr)
    if isinstance(expr, Const):
        return _format_const(expr.value)
    if isinstance(expr, Param):
        return expr.name
    if isinstance(expr, Unary):
        return f"{expr.fn}({format_expr(expr.arg)})"
    if expr.op in BINARY_FUNCTIONS:
        return f"{expr.op}({format_expr(expr.lhs)}, {format_expr(expr.rhs)})"
    level = _PRECEDENCE[expr.op]
    lhs = format_expr(expr.lhs)
    rhs = format_expr(expr.rhs)
    if isinstance(expr.lhs, Binary) and _PRECEDENCE.get(expr.lhs.op, 3) < level:
        lhs = f"({lhs})"
    if isinstance(expr.rhs, Binary) and _PRECEDENCE.get(expr.rhs.op, 3) <= level:
        rhs = f"({rhs})"
    sep = f" {expr.op} " if level == 1 else expr.op
    return f"{lhs}{sep}{rhs}"


@dataclass(frozen=True)
class Einsum:
    """``output = expr``, reduced over the variables ``output`` lacks with ``reduce_op``.

    The Einsum is named after the tensor it writes: a cascade defines each tensor once.
    """

    output: Access
    expr: Expr
    reduce_op: str = "sum"

    @property
    def name(self) -> str:
        return self.output.tensor

    @cached_property
    def output_variables(self) -> tuple[str, ...]:
        return tuple(i.plain_variable or "" for i in self.output.indices)

    @cached_property
    def reduced_variables(self) -> tuple[str, ...]:
        out = set(self.output_variables)
        return tuple(v for v in expr_variables(self.expr) if v not in out)

    @cached_property
    def iteration_variables(self) -> tuple[str, ...]:
        return self.output_variables + self.reduced_variables

    @cached_property
    def inputs(self) -> tuple[Access, ...]:
        return accesses(self.expr)

    @cached_property
    def input_tensors(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for acc in self.inputs:
            seen.setdefault(acc.tensor)
        return tuple(seen)

    def __str__(self) -> str:
        assign = "=" if self.reduce_op == "sum" else f"{self.reduce_op}="
        return f"{self.output} {assign} {format_expr(self.expr)}"


class Role(str, Enum):
    INPUT = "input"
    WEIGHT = "weight"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"
    STATE = "state"


@dataclass(frozen=True)
class Rank:
    name: str
    size: int
    size_expr: str | None = None  # how the size was written, e.g. "expand*d_model"


#: What a mask holds where it hides a key: 0 (a mask that multiplies) or -inf (a mask in log
#: space, added before an ``exp`` or a ``max``).
MASK_DEAD_VALUES: tuple[float, ...] = (0.0, float("-inf"))


@dataclass(frozen=True)
class Mask:
    """Which elements of a constant mask input hide a key: the band of keys each query sees.

    The mask's ranks are ``row`` (the queries; absent when every query sees the same keys),
    ``col`` (the keys) and, when keys come in blocks, ``block`` (the keys of one ``col`` index:
    key ``col * size(block) + block``); along any other rank of the tensor it holds the same. Query ``q = row + offset`` (``offset``: the position of
    row 0, a decode step's cache length) sees key ``k`` iff ``lower <= k - q <= upper``
    (``None``: unbounded); without ``row``, iff ``lower <= k <= upper``. The mask holds ``dead``
    (:data:`MASK_DEAD_VALUES`) at every key its query does not see, and something else at every
    key it sees. Work is skipped by whole cells of ``col``: a cell (a block of keys, or one key)
    that holds no seen key. Causal: ``upper = 0``; strictly lower: ``upper = -1``; the diagonal:
    ``lower = upper = 0``; a sliding window of ``w`` keys: ``lower = 1 - w, upper = 0``.
    ``row_tile`` and ``col_tile`` coarsen the skipping to a kernel's tiles: ``row_tile`` queries
    by ``col_tile`` cells, aligned at 0, computed whole if any key of the tile is seen (1 and 1,
    the least work, unless a kernel is modelled).
    """

    col: str
    row: str | None = None
    block: str | None = None
    lower: int | None = None
    upper: int | None = None
    offset: int = 0
    dead: float = float("-inf")
    row_tile: int = 1
    col_tile: int = 1

    @property
    def ranks(self) -> tuple[str, ...]:
        """The mask tensor's ranks: ``row``, ``col``, ``block`` (those it has)."""
        return tuple(r for r in (self.row, self.col, self.block) if r is not None)

    def __str__(self) -> str:
        seen = "k" if self.row is None else ("q" if not self.offset else f"q+{self.offset}" if self.offset > 0
                                            else f"q{self.offset}")
        bounds = []
        if self.lower is not None:
            bounds.append(f"k >= {seen}{self.lower:+d}" if self.row is not None else f"k >= {self.lower}")
        if self.upper is not None:
            bounds.append(f"k <= {seen}{self.upper:+d}" if self.row is not None else f"k <= {self.upper}")
        key = f"{self.col}*{self.block}+{self.block.lower()}" if self.block else self.col
        rows = f"q = {self.row}" + (f"+{self.offset}" if self.offset else "") + ", " if self.row else ""
        tiles = f", skipped by tiles of {self.row_tile} x {self.col_tile}" if (self.row_tile, self.col_tile) != (1, 1) else ""
        return (f"mask ({rows}k = {key}): sees {' and '.join(bounds) or 'every key'}, "
                f"holds {'-inf' if self.dead < 0 else '0'} elsewhere{tiles}")


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor: its ranks (in storage order), role and element width.

    ``initial`` names the tensor whose values an out-of-range read below index 0 of an ordered
    rank returns (the SSM state ``H0`` for ``H[b,i-1,e,n]`` at ``i=0``, the conv state for the
    causal window); without it such reads return zero. Its ranks are this tensor's with that
    rank removed (history depth 1) or replaced in place by a history rank (depth = its size).
    ``updates`` names the state tensor whose next value this tensor holds (the new SSM state
    replaces ``H0`` in the next step). ``mask`` says which elements of a constant mask input hide
    a key (:class:`Mask`): the work they make dead is skipped (:mod:`mambalaya.einsum.dead_work`).
    """

    name: str
    ranks: tuple[str, ...]
    role: Role
    bits: int = 16
    initial: str | None = None
    updates: str | None = None
    description: str = field(default="", compare=False)
    mask: "Mask | None" = None

    @property
    def stored_bytes_per_element(self) -> float:
        """Bytes an element takes wherever it is stored or moved: ``bits / 8``, and 0 for a
        declared mask. A mask is a band of the indices (:class:`Mask`), which every kernel makes
        where it is used (FlashAttention's causal flag; mamba_ssm's chunk scan and FLA's chunked
        kernels compare the positions, ``tl.where``): no kernel reads one from memory, holds it in
        a buffer or counts it against the device's capacity. Its width (``bits``) stays the
        values' (the executors and the arithmetic's width read it)."""
        return 0.0 if self.mask is not None else self.bits / 8
