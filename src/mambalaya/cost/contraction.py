"""An Einsum's multiply-accumulates as contractions of two sides, and the dataflows an array
can run each in (the part of :mod:`mambalaya.cost.spatial` that depends on the Einsum's
structure alone).

Side B is the weight of a GEMM with a weight and the right operand of the product otherwise;
side A is the other. Roles: ``K`` the reduced ranks, ``N`` ranks of the output and side B only,
``M`` ranks of the output and side A only (and ranks of the output neither side has: they
stream), ``S`` ranks of the output and both sides (a batch of independent products).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.products import is_matrix_product, product_sides, ranks_of
from mambalaya.einsum.ir import (Binary, Einsum, Expr, Role, accesses, additive_terms, expr_variables, peel_scales,
                                 rank_of_variable)


@dataclass(frozen=True)
class Contraction:
    """An Einsum's multiply-accumulates as the product of two sides, by the role of each rank.

    Side B is the weight of a GEMM with a weight and the right operand of the product otherwise;
    side A is the other. Roles: ``K`` the reduced ranks, ``N`` ranks of the output and side B
    only, ``M`` ranks of the output and side A only (and ranks of the output neither side has:
    they stream), ``S`` ranks of the output and both sides (a batch of independent products)."""

    roles: dict[str, tuple[str, ...]]
    side_a: tuple[str, ...]  # tensors read by side A
    side_b: tuple[str, ...]
    has_weight: bool
    on_array: bool  # a product the 2D array can run (a GEMM, or a matrix product of activations)


def _mac_terms(einsum: Einsum) -> tuple[Binary, ...]:
    """The reduced products whose top multiplies are counted as MACs (:mod:`mambalaya.einsum.stats`),
    each below any scale by a constant or a parameter (``QK^T * scale``: the product under it
    is the contraction). Attention with partially rotated heads has two: the rotated and the
    pass-through channels."""
    reduced = set(einsum.reduced_variables)
    if einsum.reduce_op != "sum" or not reduced:
        return ()
    out = []
    for _, term in additive_terms(einsum.expr):
        if not (isinstance(term, Binary) and term.op in ("*", "/") and set(expr_variables(term)) & reduced):
            continue
        quotient = term.op == "/"
        term, _ = peel_scales(term)
        if not (isinstance(term, Binary) and term.op == "*"):
            if quotient:  # a quotient by a tensor: not a product
                continue
            return ()  # a reduced product of one tensor with constants: not a contraction of two sides
        out.append(term)
    return tuple(out)


def contractions(cascade: Cascade, einsum: Einsum) -> tuple[Contraction, ...]:
    """One :class:`Contraction` per product the Einsum reduces (empty without MACs): its sides,
    rank roles (``K`` the reduced ranks of that product) and whether the 2D array can run it.

    The unit is decided by the algebra, wherever the product sits in the expression (the
    Einsum's whole expression, an additive term beside others, a term of a recurrence): the
    array runs a GEMM with a weight, and a reduced product of activations that is a matrix
    product (:func:`~mambalaya.einsum.products.product_sides`: each side has an output rank the other lacks, and both hold
    the reduced ranks, so each operand is reused across the other's ranks): the SSD's CB, YDG,
    ST and YO, attention's scores and value product, Gated DeltaNet's W, U and chunk-state
    products. In a recurrence it does so when each step is a whole matrix product, the
    generational rank on both sides (Gated DeltaNet's chunk-state update ``HC[c] = ... -
    KW[c,n,m]*HC[c-1,p,m]``). It does not run a sliding window (its operand is a Toeplitz
    view), a dot product or a matrix-vector product (RMSNorm's sum of squares, Mamba-1's
    readout over the state, a delta rule's per-position state read), which has no reuse for a
    second array dimension, or a recurrence that makes one row of the product per step (a
    forward substitution, whose generational rank is an output rank of one side only, each row
    waiting for the rows before it); those run on the lanes (``tests/test_units.py`` walks every
    shipped cascade). Ranks of size 1 are not dimensions of the product: a decode step's
    attention without grouped query heads (one query position, one query head per key head) is
    a vector times a matrix per head, on the lanes as the readouts are (it was on the array,
    its rank names alone deciding)."""
    # a rank of size 1 is no dimension: a decode step's one query position, a head's one query
    # head per key head (a product over them is a vector times a matrix, as Mamba-1's readout)
    ones = frozenset(r for r in (*map(rank_of_variable, einsum.output_variables),
                                 *map(rank_of_variable, einsum.reduced_variables)) if cascade.size(r) == 1)
    memo = cascade.structure_memo.setdefault("contractions", {})
    key = (einsum.name, ones)
    if key in memo:
        return memo[key]

    def is_weight(side: Any) -> bool:
        return any(cascade.tensors[a.tensor].role == Role.WEIGHT for a in accesses(side))

    def names(sides: list[Expr]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.tensor for side in sides for a in accesses(side)))

    kind = cascade.kind(einsum)
    out_ranks = [rank_of_variable(v) for v in einsum.output_variables]
    reduced_all = set(einsum.reduced_variables)
    generational = cascade.generational_rank(einsum)
    found = []
    for term in _mac_terms(einsum):
        reduced = {rank_of_variable(v) for v in set(expr_variables(term)) & reduced_all}
        a_sides, b_sides = product_sides(term, set(out_ranks), reduced, is_weight, cascade.size)
        if any(is_weight(f) for f in a_sides) and not any(is_weight(f) for f in b_sides):
            a_sides, b_sides = b_sides, a_sides
        has_weight = any(is_weight(f) for f in b_sides)
        a_ranks = set().union(*(ranks_of(f) for f in a_sides))
        b_ranks = set().union(*(ranks_of(f) for f in b_sides))
        roles = {
            "K": tuple(r for r in cascade.ranks if r in reduced),
            "N": tuple(r for r in out_ranks if r in b_ranks and r not in a_ranks),
            "M": tuple(r for r in out_ranks if r in a_ranks and r not in b_ranks)
            + tuple(r for r in out_ranks if r not in a_ranks and r not in b_ranks),
            "S": tuple(r for r in out_ranks if r in a_ranks and r in b_ranks),
        }
        matrix_product = is_matrix_product(a_ranks - ones, b_ranks - ones, set(out_ranks) - ones, reduced - ones)
        whole_steps = generational is None or generational in roles["S"]
        on_array = kind == "gemm" or (kind in ("reduction", "recurrent") and matrix_product and whole_steps)
        found.append(Contraction(roles, names(a_sides), names(b_sides), has_weight, on_array))
    memo[key] = tuple(found)
    return memo[key]


def contraction(cascade: Cascade, einsum: Einsum) -> Contraction | None:
    """The Einsum's first contraction (:func:`contractions`), or None without MACs."""
    found = contractions(cascade, einsum)
    return found[0] if found else None


#: The stationary operand -> (role on one array dimension, role on the other, roles of the
#: stationary operand, streamed roles). "B": side B (the weight), "A": side A, "out": the output.
STATIONARY_ROLES = {
    "B": ("K", "N", ("K", "N", "S"), ("M",)),
    "out": ("M", "N", ("M", "N", "S"), ("K",)),
    "A": ("K", "M", ("K", "M", "S"), ("N",)),
}


def stationary_options(compute: Any, found: Contraction) -> list[tuple[str, str]]:
    """(dataflow, stationary operand) pairs the array may run a contraction in, in the order of
    ``compute.dataflows``. With a weight, weight-stationary holds side B (the weight) and
    input-stationary side A; a product of two activations may hold either side in either (the
    stationary port of an array takes any operand: TPUs load K as the 'weights' of QK^T)."""
    out: list[tuple[str, str]] = []
    for df in compute.dataflows:
        if df == "output-stationary":
            sides = ("out",)
        elif found.has_weight:
            sides = ("B",) if df == "weight-stationary" else ("A",)
        else:
            sides = ("A", "B")
        out += [(df, s) for s in sides if s not in {side for _, side in out}]
    return out


__all__ = ["STATIONARY_ROLES", "Contraction", "contraction", "contractions", "stationary_options"]
