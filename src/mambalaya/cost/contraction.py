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
from mambalaya.einsum.ir import Binary, Einsum, Role, accesses, additive_terms, expr_variables, peel_scales, rank_of_variable


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
        if not (isinstance(term, Binary) and term.op == "*" and set(expr_variables(term)) & reduced):
            continue
        term, _ = peel_scales(term)
        if not (isinstance(term, Binary) and term.op == "*"):
            return ()  # a reduced product of one tensor with constants: not a contraction of two sides
        out.append(term)
    return tuple(out)


def contractions(cascade: Cascade, einsum: Einsum) -> tuple[Contraction, ...]:
    """One :class:`Contraction` per product the Einsum reduces (empty without MACs): its sides,
    rank roles (``K`` the reduced ranks of that product) and whether the 2D array can run it.
    The array runs a GEMM with a weight, and a reduction of two activations that is a matrix
    product (each side has an output rank the other lacks, so each operand is reused across the
    other's ranks): the SSD's CB, YDG, ST and YO, attention's scores and value product. It does
    not run a sliding window (its operand is a Toeplitz view), a recurrence, or a dot product or
    matrix-vector product of activations (RMSNorm's sum of squares, Mamba-1's readout over the
    state), which has no reuse for a second array dimension; those run on the lanes."""
    memo = cascade.structure_memo.setdefault("contractions", {})
    if einsum.name in memo:
        return memo[einsum.name]

    def is_weight(side: Any) -> bool:
        return any(cascade.tensors[a.tensor].role == Role.WEIGHT for a in accesses(side))

    def names(side: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.tensor for a in accesses(side)))

    kind = cascade.kind(einsum)
    out_ranks = [rank_of_variable(v) for v in einsum.output_variables]
    reduced_all = set(einsum.reduced_variables)
    found = []
    for term in _mac_terms(einsum):
        a_side, b_side = term.lhs, term.rhs
        if is_weight(a_side) and not is_weight(b_side):
            a_side, b_side = b_side, a_side
        has_weight = is_weight(b_side)
        a_ranks = {rank_of_variable(v) for v in expr_variables(a_side)}
        b_ranks = {rank_of_variable(v) for v in expr_variables(b_side)}
        reduced = {rank_of_variable(v) for v in set(expr_variables(term)) & reduced_all}
        roles = {
            "K": tuple(r for r in cascade.ranks if r in reduced),
            "N": tuple(r for r in out_ranks if r in b_ranks and r not in a_ranks),
            "M": tuple(r for r in out_ranks if r in a_ranks and r not in b_ranks)
            + tuple(r for r in out_ranks if r not in a_ranks and r not in b_ranks),
            "S": tuple(r for r in out_ranks if r in a_ranks and r in b_ranks),
        }
        matrix_product = bool(roles["K"] and roles["N"] and any(r in a_ranks for r in roles["M"]))
        on_array = kind == "gemm" or (kind == "reduction" and matrix_product)
        found.append(Contraction(roles, names(a_side), names(b_side), has_weight, on_array))
    memo[einsum.name] = tuple(found)
    return memo[einsum.name]


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
