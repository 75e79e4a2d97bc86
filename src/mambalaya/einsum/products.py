"""A reduced product's two sides: the split of its factors that makes it a matrix product, the
one rule that :mod:`mambalaya.cost.contraction` (which unit runs it) and
:mod:`mambalaya.einsum.stats` (how many multiplies it takes) share: ``W = TI*BETA*KN*DO`` is
``TI`` times ``BETA*KN*DO`` for both (the operation count once took the written order, 32x the
multiplies of the split the array runs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mambalaya.einsum.ir import Binary, Expr, expr_variables, rank_of_variable


def factors(term: Expr) -> list[Expr]:
    """The multiplicands of a product, its tree flattened (``(a*b)*c`` -> ``[a, b, c]``); a
    unary function, a quotient or a sum is one factor."""
    if isinstance(term, Binary) and term.op == "*":
        return factors(term.lhs) + factors(term.rhs)
    return [term]


def ranks_of(side: Any) -> set[str]:
    """The ranks of an expression's variables."""
    return {rank_of_variable(v) for v in expr_variables(side)}


def is_matrix_product(a_ranks: set[str], b_ranks: set[str], out_ranks: set[str], reduced: set[str]) -> bool:
    """Each side has an output rank the other lacks, and both sides hold every reduced rank
    (each operand is reused across the other's ranks)."""
    return bool(reduced and (a_ranks - b_ranks) & out_ranks and (b_ranks - a_ranks) & out_ranks
                and reduced <= a_ranks & b_ranks)


def chain_multiplies(parts: list[frozenset[str]], points: Callable[[frozenset[str]], float]) -> float:
    """The multiplies of a product of factors over the index sets ``parts``, in the order of
    fewest: the two whose union has the fewest ``points`` first, again and again (each multiply
    runs over the points of its operands' union). Does not depend on the order the factors are
    written in (``DO*BETA*TI`` multiplies the two per-key factors over the keys, then ``TI`` over
    (query, key), as ``TI*BETA*DO`` does)."""
    parts, total = list(parts), 0.0
    while len(parts) > 1:
        i, j = min(((i, j) for i in range(len(parts)) for j in range(i + 1, len(parts))),
                   key=lambda pair: (points(parts[pair[0]] | parts[pair[1]]), pair))
        merged = parts[i] | parts[j]
        total += points(merged)
        parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [merged]
    return total


def side_multiplies(side: list[Expr], size: Callable[[str], int]) -> float:
    """The multiplies that make one side of a product before its MACs (:func:`chain_multiplies`
    over its factors' ranks, ``size`` a rank's size)."""
    parts = [frozenset(ranks_of(f)) for element in side for f in factors(element)]
    return chain_multiplies(parts, lambda ranks: math.prod(size(r) for r in ranks))


def product_sides(term: Binary, out_ranks: set[str], reduced: set[str], is_weight: Any = lambda factor: False,
                  size: Callable[[str], int] | None = None) -> tuple[list[Expr], list[Expr]]:
    """The two sides of a reduced product: of the splits of its factors that make a matrix
    product (its top multiply's operands first, then the splits of its factors in their order),
    the one of fewest multiplies before the MACs (:func:`side_multiplies`, with ``size``; without
    it the first), so that neither the unit nor the operation count depends on the order the
    product is written in (``TI*BETA*V`` and ``V*BETA*TI``); its top multiply's operands when no
    split makes one. Factors that hold no reduced rank multiply the sum once per output point
    (:mod:`mambalaya.einsum.stats` pulls them out), so they are not part of it: ``W =
    TI[q,s]*BETA[s]*KN[s,n]*DO[s]`` is ``TI`` times ``BETA*KN*DO``, a matrix product whose tree
    split (``TI*BETA*KN`` times ``DO``) is not."""
    tree = ([term.lhs], [term.rhs])
    found = []
    if is_matrix_product(ranks_of(term.lhs), ranks_of(term.rhs), out_ranks, reduced):
        found.append(tree)
    held = [f for f in factors(term) if ranks_of(f) & reduced]
    for split in range(1, 2 ** (len(held) - 1) if len(held) > 1 else 1):
        a = [f for k, f in enumerate(held) if split >> k & 1]
        b = [f for k, f in enumerate(held) if not split >> k & 1]
        a_ranks = set().union(*(ranks_of(f) for f in a))
        b_ranks = set().union(*(ranks_of(f) for f in b))
        if is_matrix_product(a_ranks, b_ranks, out_ranks, reduced):
            found.append((a, b) if not any(is_weight(f) for f in a) else (b, a))
            if size is None:
                break
    if not found:
        return tree
    if size is None:
        return found[0]
    return min(found, key=lambda sides: side_multiplies(sides[0], size) + side_multiplies(sides[1], size))


__all__ = ["chain_multiplies", "factors", "is_matrix_product", "product_sides", "ranks_of", "side_multiplies"]
