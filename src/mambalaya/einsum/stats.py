"""Operation counts, bytes moved and operational intensity of each Einsum, run unfused.

Counting rules (every number the tool prints comes from here):

* An operator node counts once per point of the iteration space of the variables under it:
  ``X[b,i,d]*RS[b,i]*WN[d]`` is two multiplies per ``(b,i,d)``.
* A reduced term that is a product counts its top multiply as a multiply-accumulate (MAC) per
  point of the term's iteration space: ``XN[b,i,d]*WX[d,e]`` is ``B*I*D*E`` MACs. Factors that
  do not depend on the reduced variables are pulled out of the sum: ``KB[n]*H[p,m]*KN[m]`` is
  ``P*M`` MACs and ``P*N`` multiplies, not ``P*N*M`` MACs. A scale by a
  constant or a parameter around the product (``QR*KR*scale``) multiplies the sum once per
  output point (``s * sum q k``), so it is one ``mul`` per output point and the MAC is the
  product under it. A reduced term that is not a product counts one ``add`` (sum) or ``max``
  per point.
* ``+``/``-`` between additive terms count over the output variables they combine, so a
  GEMM's bias is ``B*I*E`` adds, not ``B*I*E*R``.
* Unary functions are counted each under its own name (``exp``, ``silu``, ...). A copy counts
  nothing. ``ops_total`` = 2 per MAC + 1 per other operation.
* A mixture-of-experts block's routed Einsums count the operations and elements of the
  token-expert pairs and experts that exist, not of their dense form
  (:mod:`mambalaya.einsum.routing`). An Einsum a mask makes partly dead counts each operation
  over both of its frame's variables on the live cells only (a causal prefill's masked scores,
  the chunked scans' in-chunk products; :mod:`mambalaya.einsum.dead_work`), the others whole,
  and a masked tensor moves its live cells (read whole, or written).
* Unfused traffic is each tensor an Einsum reads read once (the bounding box of the elements
  its accesses reach, e.g. one position of ``H`` for ``HN[b,e,n] = H[b,I-1,e,n]``; the reached
  elements themselves on every shipped form, while a scattered read, a stride or a diagonal,
  counts its box here and may read less under a mapping that tiles it, each tile its own box),
  the rows of an initial value (incoming state) an index reaches below 0 are read, and the output is
  written once. A recurrence's read of its own output stays on chip.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from dataclasses import dataclass, field

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.dead_work import masked_variables
from mambalaya.einsum.products import chain_multiplies, factors as flat_factors, matrix_split
from mambalaya.einsum.routing import read_scale, scaled_ops, tensor_scale, work_text
from mambalaya.einsum.ir import (Access, Binary, Einsum, Expr, Role, Unary, additive_nodes, additive_terms,
                                 expr_variables, peel_scales, rank_of_variable)

OP_KINDS: tuple[str, ...] = ("mac", "add", "mul", "div", "max")


def _points(cascade: Cascade, variables, masked: "tuple[frozenset[str], Fraction] | None" = None) -> int | Fraction:
    """Points of the iteration space of ``variables``; over every variable of a mask frame
    (``masked``: its variables and live share), only its live share."""
    n = 1
    for v in set(variables):
        n *= cascade.variable_sizes[v]
    if masked is not None and masked[0] <= set(variables):
        return n * masked[1]
    return n


def _count(cascade: Cascade, node: Expr, ops: Counter, top_is_mac: bool = False, masked=None) -> None:
    if isinstance(node, Unary):
        ops[node.fn] += _points(cascade, expr_variables(node), masked)
        _count(cascade, node.arg, ops, masked=masked)
    elif isinstance(node, Binary):
        kind = {"+": "add", "-": "add", "*": "mul", "/": "div", "max": "max", "min": "max"}[node.op]
        if top_is_mac and node.op == "*":
            kind = "mac"
        ops[kind] += _points(cascade, expr_variables(node), masked)
        _count(cascade, node.lhs, ops, masked=masked)
        _count(cascade, node.rhs, ops, masked=masked)


def einsum_ops(cascade: Cascade, einsum: Einsum) -> dict[str, int]:
    """Operation counts of one Einsum by kind (see the module doc for the rules).

    Memoised on the (immutable) cascade: the latency model asks for them on every evaluation.
    """
    memo = cascade.__dict__.setdefault("_einsum_ops_memo", {})
    if einsum.name not in memo:
        memo[einsum.name] = scaled_ops(cascade, einsum.name, _einsum_ops(cascade, einsum))
    return dict(memo[einsum.name])


def _einsum_ops(cascade: Cascade, einsum: Einsum) -> dict[str, int]:
    ops: Counter = Counter()
    masked = masked_variables(cascade, einsum.name)
    reduced = set(einsum.reduced_variables)
    # the additive structure: count +/- over what they combine (reduced variables are gone by then)
    for n in additive_nodes(einsum.expr):
        ops["add"] += _points(cascade, set(expr_variables(n)) - reduced, masked)
    for _, term in additive_terms(einsum.expr):
        term_vars = set(expr_variables(term))
        if term_vars & reduced:
            is_product = isinstance(term, Binary) and term.op in ("*", "/")  # (a product scaled by division too)
            if einsum.reduce_op == "sum" and is_product:
                # a scale by a constant or a parameter multiplies the sum once per output point
                # (sum_k q k s = s sum_k q k): the MAC is the product under it
                product, scales = peel_scales(term)
                if isinstance(product, Binary) and product.op == "*":
                    for scale in scales:
                        ops["mul"] += _points(cascade, term_vars - reduced, masked)
                        _count(cascade, scale, ops, masked=masked)
                    _count_reduced_product(cascade, product, reduced, term_vars, ops, masked)
                    continue
            ops["add" if einsum.reduce_op == "sum" else "max"] += _points(cascade, term_vars, masked)
        _count(cascade, term, ops, masked=masked)
    return {k: int(round(v)) for k, v in ops.items() if v}


def _count_reduced_product(cascade: Cascade, product: Binary, reduced: set[str], term_vars: set[str],
                           ops: Counter, masked=None) -> None:
    """A reduced product: its factors that do not depend on the reduced variables multiply the
    sum once per output point (``sum_m a[n] h[m] k[m] = a[n] sum_m h[m] k[m]``, the delta rule's
    ``k beta (S^T k)``); the rest is the contraction, each of its two sides' factors multiplied
    in the fewest multiplies and one MAC per point of the product, whatever order it is written in
    (:func:`~mambalaya.einsum.products.matrix_split`)."""
    factors = flat_factors(product)
    inner = [f for f in factors if set(expr_variables(f)) & reduced]
    outer = [f for f in factors if not set(expr_variables(f)) & reduced]
    if not inner:
        _count(cascade, product, ops, top_is_mac=True, masked=masked)
        return
    for f in outer:
        ops["mul"] += _points(cascade, term_vars - reduced, masked)
        _count(cascade, f, ops, masked=masked)
    if len(inner) == 1:
        ops["add"] += _points(cascade, expr_variables(inner[0]), masked)
        _count(cascade, inner[0], ops, masked=masked)
        return
    # the contraction's two sides (einsum.products, the split the array runs): each side's own
    # factors joined in the fewest multiplies, then one MAC per point of the whole product; with
    # no split that makes a matrix product, every factor joined so, the last join the MAC
    node = _chain(inner)
    split = matrix_split(node, {rank_of_variable(v) for v in term_vars - reduced},
                         {rank_of_variable(v) for v in reduced & term_vars}, size=cascade.size)
    sides = split if split is not None else ([node],)
    whole = _points(cascade, expr_variables(node), masked)
    ops["mac"] += whole
    for side in sides:
        parts = [f for element in side for f in flat_factors(element)]
        for f in parts:  # (each factor's own operations, then the multiplies that join them)
            _count(cascade, f, ops, masked=masked)
        ops["mul"] += chain_multiplies([frozenset(expr_variables(f)) for f in parts],
                                       lambda variables: _points(cascade, variables, masked))
    if split is None:
        ops["mul"] -= whole  # (the last join is the MAC)


def _chain(factors: list[Expr]) -> Expr:
    """The product of ``factors`` in their order."""
    node = factors[0]
    for f in factors[1:]:
        node = Binary("*", node, f)
    return node


def _span(cascade: Cascade, accesses: list[Access], p: int, lowest: int) -> tuple[int, int]:
    """The positions ``accesses`` reach together along dimension ``p``: the span from the least to
    the most (their bounding box's side), within ``lowest .. extent - 1``."""
    bounds = [acc.indices[p].bounds(cascade.variable_sizes) for acc in accesses]
    extent = cascade.shape(accesses[0].tensor)[p]
    return max(min(lo for lo, _ in bounds), lowest), min(max(hi for _, hi in bounds), extent - 1)


def box_elements(cascade: Cascade, accesses: list[Access]) -> tuple[int, int]:
    """(elements of the tensor, rows below 0 along its initial axis) that ``accesses`` to one
    tensor read run once: the bounding box of all of them, per dimension the span they reach
    together, as the cost model reads a group's tensor (docs/fusion.md; ``cost.traffic``'s
    untiled sums): one rule for ``cascade check`` and the traffic model's untiled figure. Scattered
    reads (two rows far apart, a stride, a diagonal) count their box; a mapping that tiles them
    reads each tile's box, which may be less (``Y[i] = M[i,i]`` over 8: 64 elements here, 8 with
    tiles of one ``i``)."""
    found = cascade.initial_axis(accesses[0].tensor)
    own = rows = 1
    for p in range(len(accesses[0].indices)):
        depth = found[1] if found is not None and found[0] == p else 0
        lo, hi = _span(cascade, accesses, p, -depth)
        own *= max(0, hi - max(lo, 0) + 1)
        rows = max(0, min(hi, -1) - lo + 1) if depth else rows
    return own, (rows if found is not None else 0)


def einsum_reads(cascade: Cascade, einsum: Einsum) -> dict[str, int]:
    """Elements read from each tensor when the Einsum runs on its own (:func:`box_elements` over
    its accesses to it), and from an initial value the rows below 0 they reach."""
    accesses: dict[str, list[Access]] = {}
    for acc in einsum.inputs:
        if acc.tensor != einsum.name:
            accesses.setdefault(acc.tensor, []).append(acc)
    reads: dict[str, int] = {}
    for t, accs in accesses.items():
        reads[t], rows = box_elements(cascade, accs)
        init = cascade.tensors[t].initial
        if init is not None and rows:
            reads[init] = max(reads.get(init, 0), rows * cascade.elements(init) // cascade.initial_axis(t)[1])  # type: ignore[index]
    for acc in einsum.inputs:  # a recurrence's reads of its own initial value
        init = cascade.tensors[acc.tensor].initial
        if acc.tensor == einsum.name and init is not None:
            rows = box_elements(cascade, [acc])[1]
            if rows:
                reads[init] = max(reads.get(init, 0), rows * cascade.elements(init) // cascade.initial_axis(acc.tensor)[1])  # type: ignore[index]
    by_tensor = {t: [a for a in einsum.inputs if a.tensor == t] for t in reads}
    return {t: int(round(n * read_scale(cascade, t, by_tensor[t]))) for t, n in reads.items()}


@dataclass(frozen=True)
class EinsumStats:
    number: int
    name: str
    expression: str
    kind: str
    output_ranks: tuple[str, ...]
    iteration_ranks: tuple[str, ...]
    ops: dict[str, int]
    read_elements: dict[str, int]
    read_bytes_by_tensor: dict[str, float]
    write_elements: int
    write_bytes: float
    #: the share of its dense work that runs, and why (:func:`~mambalaya.einsum.routing.work_text`)
    runs: str = ""

    @property
    def macs(self) -> int:
        return self.ops.get("mac", 0)

    @property
    def ops_total(self) -> int:
        return sum(v * (2 if k == "mac" else 1) for k, v in self.ops.items())

    @property
    def read_bytes(self) -> float:
        return sum(self.read_bytes_by_tensor.values())

    @property
    def intensity(self) -> float:
        """Operations per byte moved when the Einsum runs unfused."""
        moved = self.read_bytes + self.write_bytes
        return self.ops_total / moved if moved else float("inf")


@dataclass(frozen=True)
class CascadeStats:
    cascade: Cascade
    einsums: tuple[EinsumStats, ...]
    n_layers: int = 1
    totals: dict[str, float] = field(default_factory=dict)


def einsum_stats(cascade: Cascade, einsum: Einsum) -> EinsumStats:
    reads = einsum_reads(cascade, einsum)
    width = {t: cascade.tensors[t].stored_bytes_per_element for t in reads}
    out_elems = int(round(cascade.elements(einsum.name) * tensor_scale(cascade, einsum.name)))
    return EinsumStats(
        number=cascade.position(einsum.name),
        name=einsum.name,
        expression=str(einsum),
        kind=cascade.kind(einsum),
        output_ranks=cascade.output_ranks(einsum),
        iteration_ranks=cascade.iteration_ranks(einsum),
        ops=einsum_ops(cascade, einsum),
        read_elements=reads,
        read_bytes_by_tensor={t: n * width[t] for t, n in reads.items()},
        write_elements=out_elems,
        write_bytes=out_elems * cascade.tensors[einsum.name].stored_bytes_per_element,
        runs=work_text(cascade, einsum.name),
    )


def cascade_stats(cascade: Cascade, *, n_layers: int = 1) -> CascadeStats:
    """Per-Einsum statistics, per-layer totals and whole-model totals (``n_layers`` x layer)."""
    rows = tuple(einsum_stats(cascade, e) for e in cascade.einsums)
    ops: Counter = Counter()
    for r in rows:
        ops.update(r.ops)
    read_bytes = sum(r.read_bytes for r in rows)
    write_bytes = sum(r.write_bytes for r in rows)
    ops_total = sum(r.ops_total for r in rows)
    totals: dict[str, float] = {
        "einsums": len(rows),
        "macs": ops.get("mac", 0),
        "ops_total": ops_total,
        "parameters": cascade.parameters(),
        "parameter_bytes": sum(cascade.nbytes(t) for t in cascade.tensors_with_role(Role.WEIGHT)),
        "read_bytes": read_bytes,
        "write_bytes": write_bytes,
        "intensity": ops_total / (read_bytes + write_bytes) if read_bytes + write_bytes else float("inf"),
        "n_layers": n_layers,
        "model_macs": n_layers * ops.get("mac", 0),
        "model_ops_total": n_layers * ops_total,
        "model_read_bytes": n_layers * read_bytes,
        "model_write_bytes": n_layers * write_bytes,
    }
    totals.update({f"ops_{k}": v for k, v in sorted(ops.items())})
    return CascadeStats(cascade, rows, n_layers, totals)
