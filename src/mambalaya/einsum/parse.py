"""A hand-written recursive-descent parser for Einsum lines and rank-size expressions.

Grammar of one Einsum (DESIGN.md §3 notation)::

    einsum  := access ('=' | 'max=') expr
    access  := TENSOR '[' [index (',' index)*] ']'
    index   := affine combination of rank variables and integers; upper-case rank names
               stand for their sizes (``i+k-(K-1)``)
    expr    := term (('+'|'-') term)*
    term    := factor (('*'|'/') factor)*
    factor  := '-' factor | NUMBER | access | FUNC '(' expr ')' | FUNC2 '(' expr ',' expr ')'
               | NAME | '(' expr ')'

``FUNC`` is a unary function (``exp``, ``silu``, ...), ``FUNC2`` an element-wise function of
two values (``max``, ``min``).

Nothing is ever ``eval``-ed. Every error is a :class:`~mambalaya.errors.SpecError` that
carries the source, line and column of the offending character.
"""

from __future__ import annotations

import math
from fractions import Fraction
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from mambalaya.errors import SpecError
from mambalaya.einsum.ir import (
    REDUCE_OPERATORS,
    BINARY_FUNCTIONS,
    UNARY_FUNCTIONS,
    Access,
    AffineIndex,
    Binary,
    Const,
    Einsum,
    Expr,
    Param,
    Unary,
)

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t]+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>//|[-+*/()\[\],=%])
    """,
    re.VERBOSE | re.ASCII,
)

#: How deeply parentheses, functions and unary minus may nest, and how deep an expression tree
#: may grow; deeper text is rejected with a located error instead of exhausting the stack.
MAX_DEPTH = 100
#: Digits an integer in an index may have.
_MAX_INDEX_DIGITS = 18


@dataclass(frozen=True)
class Token:
    kind: str  # number | name | op | end
    text: str
    column: int  # 0-based within the text


@dataclass(frozen=True)
class Where:
    """Where a piece of text came from, to turn text offsets into file locations."""

    source: str = "<string>"
    line: int = 1
    column: int = 1  # column of the text's first character


def tokenize(text: str, where: Where = Where()) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise SpecError(
                f"unexpected character {text[pos]!r}",
                source=where.source,
                line=where.line,
                column=where.column + pos,
            )
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str, where: Where, sizes: Mapping[str, int] | None) -> None:
        self.text = text
        self.where = where
        self.sizes = sizes
        self.sizes_read: dict[str, int] = {}  # the rank sizes an index named (parse_einsum's memo key)
        self.tokens = tokenize(text, where)
        self.pos = 0
        self.nesting = 0
        self._depths: dict[int, int] = {}  # id(node) -> height of the tree under node

    def enter(self) -> None:
        """Count one level of nesting (call :meth:`leave` on the way out)."""
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"expression nested more than {MAX_DEPTH} levels deep")

    def leave(self) -> None:
        self.nesting -= 1

    def node(self, node: Expr, token: Token) -> Expr:
        """Record the height of a new Unary/Binary node; reject trees deeper than MAX_DEPTH."""
        children = (node.arg,) if isinstance(node, Unary) else (node.lhs, node.rhs)  # type: ignore[union-attr]
        height = 1 + max(self._depths.get(id(c), 0) for c in children)
        if height > MAX_DEPTH:
            raise self.error(f"expression nested more than {MAX_DEPTH} levels deep", token)
        self._depths[id(node)] = height
        return node

    # -- token helpers -------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def error(self, message: str, token: Token | None = None) -> SpecError:
        token = token or self.tok
        return SpecError(
            message,
            source=self.where.source,
            line=self.where.line,
            column=self.where.column + token.column,
        )

    def describe(self, token: Token) -> str:
        return "end of line" if token.kind == "end" else repr(token.text)

    def accept(self, text: str) -> Token | None:
        if self.tok.kind in ("op", "name") and self.tok.text == text:
            tok = self.tok
            self.pos += 1
            return tok
        return None

    def expect(self, text: str, context: str) -> Token:
        tok = self.accept(text)
        if tok is None:
            raise self.error(f"expected {text!r} {context}, found {self.describe(self.tok)}")
        return tok

    def expect_end(self) -> None:
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.describe(self.tok)} after the end of the expression")

    # -- Einsum --------------------------------------------------------------------------
    def einsum(self) -> Einsum:
        out = self.access(output=True)
        reduce_op = "sum"
        if self.tok.kind == "name" and self.tok.text in REDUCE_OPERATORS:
            reduce_op = self.tok.text
            self.pos += 1
        elif self.tok.kind == "name":
            raise self.error(
                f"unknown reduce operator {self.tok.text!r}; known: {', '.join(REDUCE_OPERATORS)}"
            )
        self.expect("=", "after the output access")
        expr = self.expr()
        self.expect_end()
        return Einsum(out, expr, reduce_op)

    def access(self, output: bool = False) -> Access:
        tok = self.tok
        if tok.kind != "name" or not tok.text[0].isupper():
            what = "the output tensor" if output else "a tensor"
            raise self.error(f"expected {what} (a name starting with an upper-case letter), found {self.describe(tok)}")
        self.pos += 1
        self.expect("[", f"after tensor {tok.text}")
        indices: list[AffineIndex] = []
        if not self.accept("]"):
            while True:
                indices.append(self.index())
                if self.accept("]"):
                    break
                self.expect(",", f"or ']' in the indices of {tok.text}")
        return Access(tok.text, tuple(indices))

    # -- affine index expressions --------------------------------------------------------
    def index(self) -> AffineIndex:
        first = self.tok
        terms, const = self.affine_sum()
        merged: dict[str, int] = {}
        for v, c in terms:
            merged[v] = merged.get(v, 0) + c
        if any(abs(x) >= 2**63 for x in (const, *merged.values())):
            raise self.error("an integer in this index is too large", first)
        return AffineIndex(tuple((v, c) for v, c in merged.items() if c != 0), const)

    def affine_sum(self) -> tuple[list[tuple[str, int]], int]:
        terms, const = self.affine_product()
        while self.tok.text in ("+", "-") and self.tok.kind == "op":
            sign = 1 if self.tok.text == "+" else -1
            self.pos += 1
            t2, c2 = self.affine_product()
            terms += [(v, sign * c) for v, c in t2]
            const += sign * c2
        return terms, const

    def affine_product(self) -> tuple[list[tuple[str, int]], int]:
        first = self.tok
        terms, const = self.affine_atom()
        while self.tok.kind == "op" and self.tok.text in ("*", "/", "//", "%"):
            op_tok = self.tok
            if op_tok.text != "*":
                raise self.error(f"non-affine index: {op_tok.text!r} is not allowed in an index", op_tok)
            self.pos += 1
            t2, c2 = self.affine_atom()
            if terms and t2:
                raise self.error(
                    "non-affine index: a product of two rank variables is not affine", first
                )
            if terms:
                terms, const = [(v, c * c2) for v, c in terms], const * c2
            else:
                terms, const = [(v, c * const) for v, c in t2], const * c2
        return terms, const

    def affine_atom(self) -> tuple[list[tuple[str, int]], int]:
        self.enter()
        try:
            return self._affine_atom()
        finally:
            self.leave()

    def _affine_atom(self) -> tuple[list[tuple[str, int]], int]:
        tok = self.tok
        if tok.kind == "op" and tok.text == "-":
            self.pos += 1
            terms, const = self.affine_atom()
            return [(v, -c) for v, c in terms], -const
        if tok.kind == "op" and tok.text == "(":
            self.pos += 1
            result = self.affine_sum()
            self.expect(")", "to close '(' in the index")
            return result
        if tok.kind == "number":
            if not re.fullmatch(r"[0-9]+", tok.text):
                raise self.error(f"non-affine index: {tok.text} is not an integer", tok)
            if len(tok.text.lstrip("0")) > _MAX_INDEX_DIGITS:
                raise self.error(f"an integer in an index has more than {_MAX_INDEX_DIGITS} digits", tok)
            self.pos += 1
            return [], int(tok.text)
        if tok.kind == "name":
            self.pos += 1
            if self.tok.kind == "op" and self.tok.text in ("(", "["):
                raise self.error(f"non-affine index: {tok.text}{self.tok.text}...) is not allowed in an index", tok)
            if tok.text.islower() or tok.text[0].islower():
                return [(tok.text, 1)], 0
            if self.sizes is None or tok.text not in self.sizes:
                raise self.error(
                    f"{tok.text!r} in an index must be a rank variable (lower case) or a rank name "
                    "(upper case, standing for its size) of a declared rank",
                    tok,
                )
            self.sizes_read[tok.text] = int(self.sizes[tok.text])
            return [], self.sizes_read[tok.text]
        raise self.error(f"expected an index expression, found {self.describe(tok)}")

    # -- value expressions ---------------------------------------------------------------
    def expr(self) -> Expr:
        node = self.term()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op_tok = self.tok
            op = op_tok.text
            self.pos += 1
            node = self.node(Binary(op, node, self.term()), op_tok)
        return node

    def term(self) -> Expr:
        node = self.factor()
        while self.tok.kind == "op" and self.tok.text in ("*", "/"):
            op_tok = self.tok
            op = op_tok.text
            self.pos += 1
            node = self.node(Binary(op, node, self.factor()), op_tok)
        return node

    def factor(self) -> Expr:
        self.enter()
        try:
            return self._factor()
        finally:
            self.leave()

    def _factor(self) -> Expr:
        tok = self.tok
        if tok.kind == "op" and tok.text == "-":
            self.pos += 1
            if self.tok.kind == "number":
                value = self.number()
                return Const(-value)
            return self.node(Unary("neg", self.factor()), tok)
        if tok.kind == "number":
            return Const(self.number())
        if tok.kind == "op" and tok.text == "(":
            self.pos += 1
            node = self.expr()
            self.expect(")", "to close '('")
            return node
        if tok.kind == "name":
            nxt = self.tokens[self.pos + 1]
            if nxt.kind == "op" and nxt.text == "[":
                return self.access()
            if nxt.kind == "op" and nxt.text == "(":
                if tok.text in BINARY_FUNCTIONS:
                    self.pos += 2
                    lhs = self.expr()
                    self.expect(",", f"between the two arguments of {tok.text}(")
                    rhs = self.expr()
                    self.expect(")", f"to close {tok.text}(")
                    return self.node(Binary(tok.text, lhs, rhs), tok)
                if tok.text not in UNARY_FUNCTIONS:
                    known = ", ".join(UNARY_FUNCTIONS + BINARY_FUNCTIONS)
                    raise self.error(f"unknown function {tok.text!r}; known: {known}", tok)
                self.pos += 2
                arg = self.expr()
                self.expect(")", f"to close {tok.text}(")
                return self.node(Unary(tok.text, arg), tok)
            self.pos += 1
            return Param(tok.text)
        raise self.error(f"expected a value (number, tensor access, function or name), found {self.describe(tok)}")

    def number(self) -> float:
        tok = self.tok
        self.pos += 1
        value = float(tok.text)
        if not math.isfinite(value):
            raise self.error(f"number {tok.text} is not finite", tok)
        return value


#: Einsum lines parsed so far: per text, ``(the rank sizes its indices named, the Einsum)``. A
#: layer's lines recur in every build of it (each length, batch, phase and design of a sweep); an
#: Einsum is immutable, so one parse serves every build whose named sizes are the same. Speed only.
_PARSED: dict[str, list[tuple[tuple[tuple[str, int], ...], Einsum]]] = {}
_PARSED_TEXTS = 20_000
_PARSED_PER_TEXT = 32


def parse_einsum(
    text: str, *, sizes: Mapping[str, int] | None = None, where: Where = Where()
) -> Einsum:
    """Parse one Einsum line. ``sizes`` maps rank names to sizes for upper-case names in indices.
    Memoised per text and the sizes its indices name (a line that fails is parsed again, so its
    error names ``where``)."""
    seen = _PARSED.get(text)
    for named, einsum in seen or ():
        if all(sizes is not None and n in sizes and int(sizes[n]) == v for n, v in named):
            return einsum
    parser = _Parser(text, where, sizes)
    einsum = parser.einsum()
    if seen is None:
        if len(_PARSED) >= _PARSED_TEXTS:
            _PARSED.clear()
        seen = _PARSED[text] = []
    if len(seen) >= _PARSED_PER_TEXT:
        seen.pop(0)
    seen.append((tuple(parser.sizes_read.items()), einsum))
    return einsum


# -- rank-size expressions -------------------------------------------------------------------
_SIZE_FUNCTIONS: dict[str, Callable[..., float]] = {
    "ceil": math.ceil,
    "floor": math.floor,
    "min": min,
    "max": max,
}


class _SizeParser(_Parser):
    """Integer arithmetic over parameters: ``expand*d_model``, ``ceil(d_model/16)``. Exact: numbers
    and parameters are integers or fractions (a float parameter is its exact binary value), so a
    size past 2^53 is not rounded on the way to the check that refuses it."""

    def __init__(self, text: str, where: Where, env: Mapping[str, float]) -> None:
        super().__init__(text, where, None)
        self.env = env

    def number(self) -> Fraction:  # type: ignore[override]
        tok = self.tok
        value = super().number()
        try:
            return Fraction(tok.text)
        except ValueError:  # a spelling Fraction does not read: the float's exact value
            return Fraction(value)

    def value(self) -> float:
        result = self.sum()
        self.expect_end()
        return result

    def sum(self) -> float:
        value = self.product()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.tok.text
            self.pos += 1
            rhs = self.product()
            value = value + rhs if op == "+" else value - rhs
        return value

    def product(self) -> float:
        value = self.atom()
        while self.tok.kind == "op" and self.tok.text in ("*", "/", "//", "%"):
            op_tok = self.tok
            self.pos += 1
            rhs = self.atom()
            if op_tok.text != "*" and rhs == 0:
                raise self.error("division by zero", op_tok)
            if op_tok.text == "*":
                value *= rhs
            elif op_tok.text == "/":
                value = Fraction(value) / Fraction(rhs)
            elif op_tok.text == "//":
                value //= rhs
            else:
                value %= rhs
        return value

    def atom(self) -> float:
        self.enter()
        try:
            return self._atom()
        finally:
            self.leave()

    def _atom(self) -> float:
        tok = self.tok
        if tok.kind == "op" and tok.text == "-":
            self.pos += 1
            return -self.atom()
        if tok.kind == "op" and tok.text == "(":
            self.pos += 1
            value = self.sum()
            self.expect(")", "to close '('")
            return value
        if tok.kind == "number":
            return self.number()
        if tok.kind == "name":
            self.pos += 1
            if self.accept("("):
                fn = _SIZE_FUNCTIONS.get(tok.text)
                if fn is None:
                    raise self.error(
                        f"unknown function {tok.text!r} in a size; known: {', '.join(_SIZE_FUNCTIONS)}", tok
                    )
                args = [self.sum()]
                while self.accept(","):
                    args.append(self.sum())
                self.expect(")", f"to close {tok.text}(")
                try:
                    return Fraction(fn(*args))
                except TypeError:
                    raise self.error(f"wrong number of arguments to {tok.text}()", tok) from None
                except (ValueError, OverflowError):
                    raise self.error(f"{tok.text}() of a value that is not finite", tok) from None
            if tok.text not in self.env:
                known = ", ".join(sorted(self.env)) or "none"
                raise self.error(f"unknown name {tok.text!r} in a size (known parameters and ranks: {known})", tok)
            try:
                return Fraction(self.env[tok.text])
            except (OverflowError, ValueError, TypeError):
                raise self.error(f"{tok.text} = {self.env[tok.text]!r} is not a finite number for a size", tok) from None
        raise self.error(f"expected a number, name or '(' in a size, found {self.describe(tok)}")


#: The largest size a size expression may give: trip counts and tile grids are float64 in the
#: search, exact up to 2^53 (the cascade's ``MAX_RANK_SIZE`` is this bound).
MAX_SIZE = 2**53


def exact_text(value: Fraction) -> str:
    """A rational value as text that shows it is not whole where it is not: to 20 significant
    digits (``30*d`` with ``d: 0.1`` is 3.0000000000000001665, as 0.1 is not exact in binary;
    printed as a float it was a misleading 3), any magnitude (a float overflows past 1e308)."""
    import decimal

    with decimal.localcontext() as ctx:
        ctx.prec = 20
        return f"{decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator):g}"


def evaluate_size(text: str, env: Mapping[str, float], *, where: Where = Where()) -> int:
    """Evaluate a rank-size expression to a positive integer."""
    value = Fraction(_SizeParser(text, where, env).value())
    if value.denominator == 1 and value > MAX_SIZE:
        digits = len(str(value.numerator))
        shown = f"{value.numerator:,}" if digits <= 40 else f"an integer of {digits:,} digits"
        raise SpecError(f"size {text!r} evaluates to {shown}, above "
                        f"2^53 = {MAX_SIZE:,}, the largest size counted exactly", source=where.source,
                        line=where.line, column=where.column)
    if value.denominator != 1 or value < 1:
        raise SpecError(
            f"size {text!r} evaluates to {exact_text(value)}, not a positive integer",
            source=where.source,
            line=where.line,
            column=where.column,
        )
    return int(value)
