"""A reduced product's two sides: the split of its factors that makes it a matrix product, the
one rule that :mod:`mambalaya.cost.contraction` (which unit runs it) and
:mod:`mambalaya.einsum.stats` (how many multiplies it takes) share, whatever order the product is
written in (the operation count once took the written order: the chunked delta rule's
``W = TI*BETA*KN*DO`` counted 32x the multiplies of ``TI*(BETA*KN*DO)``)."""

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
    """The fewest multiplies that join factors over the index sets ``parts`` into one product
    (each multiply runs over the points of its operands' union): the least over every order of
    joining them, which does not depend on the order they are written in (``DO*BETA*TI`` joins
    the two per-key factors over the keys, then ``TI`` over (query, key), as ``TI*BETA*DO``
    does). Exact over the few factors a product has."""
    unions: dict[int, frozenset[str]] = {}
    least: dict[int, float] = {}
    n = len(parts)
    for mask in range(1, 1 << n):
        members = [parts[k] for k in range(n) if mask >> k & 1]
        unions[mask] = frozenset().union(*members)
        if len(members) == 1:
            least[mask] = 0.0
            continue
        best = math.inf
        sub = (mask - 1) & mask
        while sub:
            if sub < mask ^ sub:  # (each split once)
                best = min(best, least[sub] + least[mask ^ sub])
            sub = (sub - 1) & mask
        least[mask] = best + points(unions[mask])
    return least[(1 << n) - 1] if n else 0.0


def side_multiplies(side: list[Expr], size: Callable[[str], int]) -> float:
    """The multiplies that make one side of a product before its MACs (:func:`chain_multiplies`
    over its factors' ranks, ``size`` a rank's size)."""
    parts = [frozenset(ranks_of(f)) for element in side for f in factors(element)]
    return chain_multiplies(parts, lambda ranks: math.prod(size(r) for r in ranks))


def matrix_split(term: Binary, out_ranks: set[str], reduced: set[str], is_weight: Any = lambda factor: False,
                 size: Callable[[str], int] | None = None) -> tuple[list[Expr], list[Expr]] | None:
    """The two sides of a reduced product that make a matrix product, or None where no split of
    its factors does: of the splits that do (its top multiply's operands first, then the splits
    of its factors in their order), the one of fewest multiplies before the MACs
    (:func:`side_multiplies`, with ``size``; without it the first), ties going to the split
    whose sides' texts sort first, so that neither the unit nor the operation count depends on
    the order the product is written in. That is the cheapest way to run it, an assumption about
    a kernel: FLA's chunked delta rule computes ``W = TI*BETA*KN*DO`` as ``TI @ (BETA*KN*DO)``,
    where at a key head larger than the chunk ``KN`` times ``TI*BETA*DO`` takes fewer (the
    multiplies before the MACs are a few percent of them either way). Factors that hold no
    reduced rank multiply the sum once per output point (:mod:`mambalaya.einsum.stats` pulls them
    out), so they are not part of it."""
    found = []
    if is_matrix_product(ranks_of(term.lhs), ranks_of(term.rhs), out_ranks, reduced):
        found.append(([term.lhs], [term.rhs]))
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
        return None
    if size is None:
        return found[0]

    def key(sides: tuple[list[Expr], list[Expr]]) -> tuple:
        texts = tuple(sorted(str(f) for element in side for f in factors(element)) for side in sides)
        return (side_multiplies(sides[0], size) + side_multiplies(sides[1], size), texts)

    return min(found, key=key)


def product_sides(term: Binary, out_ranks: set[str], reduced: set[str], is_weight: Any = lambda factor: False,
                  size: Callable[[str], int] | None = None) -> tuple[list[Expr], list[Expr]]:
    """The two sides of a reduced product: :func:`matrix_split`'s, or its top multiply's operands
    where no split makes a matrix product."""
    split = matrix_split(term, out_ranks, reduced, is_weight, size)
    return split if split is not None else ([term.lhs], [term.rhs])


__all__ = ["chain_multiplies", "factors", "is_matrix_product", "matrix_split", "product_sides", "ranks_of",
           "side_multiplies"]
