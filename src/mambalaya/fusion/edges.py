"""Fusion classes and dependency kinds of every producer -> consumer edge (DESIGN.md §4).

For an edge U -> V through tensor T, with S = ranks(T):

* ``P_U`` = ranks the producer iterates beyond S (it reduces them);
* ``P_V`` = ranks the consumer iterates, in the additive terms that read T, that none of its
  indices into T mention (it sweeps them while T's element stays fixed). A window variable
  (``k`` in ``i+k-3``) indexes T and so is not in ``P_V``: the window is a dependency along
  ``I``, not an extra rank. Each additive term is reduced over the variables it has: a term
  lacking a reduced variable reads T once per output point, so a rank only another term sweeps
  is not T's (the chunked delta rule's ``HC = CD*HC[c-1] + ST - KW*HC[c-1,..,m]`` reads ``ST``
  without sweeping ``M``; it once printed RD with ``M`` in ``P_V``).

=====  ====================  ===========================================================
class  condition             fusion needs
=====  ====================  ===========================================================
RI     P_U = P_V = {}        stream T tile by tile
RSb    P_U != {}, P_V = {}   the producer completes its reduction over P_U inside a tile
RSp    P_U = {}, P_V != {}   hold T's tile while the consumer sweeps P_V, or recompute it
RD     both non-empty        both; a pass boundary on ranks in both (reduced, then reused)
=====  ====================  ===========================================================

Dependency kinds, per dimension of T: ``aligned`` (``i`` <-> ``i``), ``recurrent`` (an Einsum
reading its own output at ``i-c``; ``recurrent(N, contracted)`` where it reads its previous
state whole along a rank, ``recurrent(Q, history)`` where it reads every earlier row, see
:mod:`mambalaya.einsum.cascade`), ``window`` (``i+k-3``: a halo of 3 rows), ``shifted``
(``i-1`` into another Einsum: a halo of 1), ``reflect`` (``-u+1``: the rotary embedding's other
half, each position reading its mirror, a halo of the whole rank), ``select`` (a constant or
another rank's variable indexes the dimension), ``reshape`` (mixed-radix digits re-index it, such as positions split
into chunks ``4*c+q``), and ``reduce-then-reuse``: V reads T again after another reader of T
fully reduced one of T's ranks on V's path (``X`` around RMSNorm, ``U`` around x_proj).
An edge forces a **pass boundary** on a rank that is reduced and then reused along it: the
ranks in both ``P_U`` and ``P_V``, and the reduce-then-reuse ranks.

Edges from layer inputs and incoming state (``producer = None``) are listed too, since the
reduce-then-reuse of the input ``X`` happens there, a state read as an initial value among them
(``initial(I)``: ``H`` below position 0 reads ``H0``, the conv's window reads the conv state, a
decode step's scores read the KV cache; :func:`initial_edges`); weights are not.
"""

from __future__ import annotations

from dataclasses import dataclass

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Access, Einsum, Role, accesses, additive_terms, expr_variables, rank_of_variable

FUSION_CLASSES = ("RI", "RSb", "RSp", "RD")
_PRIORITY = ("recurrent", "window", "shifted", "reflect", "reduce-then-reuse", "select", "reshape", "initial",
             "aligned")


@dataclass(frozen=True)
class Edge:
    producer: str | None  # None: a layer input or incoming state
    consumer: str
    tensor: str
    fusion_class: str
    producer_only: tuple[str, ...]  # P_U
    consumer_only: tuple[str, ...]  # P_V
    dependencies: tuple[str, ...]  # e.g. ("aligned", "window(I, halo 3)")
    pass_boundary: tuple[str, ...]  # ranks reduced then reused along this edge

    @property
    def dependency(self) -> str:
        """The most constraining dependency kind (without its details)."""
        kinds = {d.split("(")[0] for d in self.dependencies}
        return next(k for k in _PRIORITY if k in kinds)

    @property
    def key(self) -> tuple[str | None, str, str]:
        return (self.producer, self.consumer, self.tensor)


def fusion_class(producer_only: set[str], consumer_only: set[str]) -> str:
    if producer_only and consumer_only:
        return "RD"
    if producer_only:
        return "RSb"
    if consumer_only:
        return "RSp"
    return "RI"


def _dimension_dependency(cascade: Cascade, acc: Access, dim: int, consumer: Einsum) -> str:
    rank = cascade.tensors[acc.tensor].ranks[dim]
    idx = acc.indices[dim]
    own = rank.lower()
    coeffs = dict(idx.terms)
    if acc.tensor == consumer.name and idx.plain_variable not in (None, own):  # a wider self-read
        rec = cascade.recurrence(consumer)
        return f"recurrent({rank}, {'history' if rec and rec[0] == rank else 'contracted'})"
    if coeffs == {own: -1}:  # the rotary's other half, QA[.., -u+1, w]: every other position of the rank
        return f"reflect({rank})"
    if coeffs.get(own) != 1:
        split = _reshape_ranks(cascade, idx)
        if split:
            return f"reshape({rank} as {','.join(split)})"
        return f"select({rank})"
    if idx.plain_variable == own:
        return "aligned"
    sizes = {v: (cascade.variable_sizes[v] if v != own else 1) for v in idx.variables}
    lo, hi = idx.bounds(sizes)
    if acc.tensor == consumer.name:
        return f"recurrent({rank}, distance {-lo})"
    if len(coeffs) > 1:
        return f"window({rank}, halo {max(0, -lo)}{', reach +' + str(hi) if hi > 0 else ''})"
    return f"shifted({rank}, {idx.const:+d})"


def _reshape_ranks(cascade: Cascade, idx) -> list[str] | None:
    """Ranks (outer first) whose variables index a dimension as mixed-radix digits, such as
    ``4*c+q`` with ``|Q| = 4`` (positions split into chunks): a bijective re-indexing."""
    terms = sorted(idx.terms, key=lambda t: t[1])
    if len(terms) < 2 or idx.const != 0 or terms[0][1] != 1:
        return None
    stride = 1
    for v, c in terms:
        if c != stride:
            return None
        stride *= cascade.variable_sizes[v]
    return [rank_of_variable(v) for v, _ in reversed(terms)]


def einsum_ancestors(cascade: Cascade) -> dict[str, set[str]]:
    """Each Einsum's ancestors: the Einsums it depends on, directly or through others (its own
    earlier steps left out). Memoised per cascade structure."""
    memo = cascade.structure_memo.setdefault("einsum_ancestors", {})
    if "anc" not in memo:
        anc: dict[str, set[str]] = {}
        for e in cascade.einsums:
            s: set[str] = set()
            for t in e.input_tensors:
                if t != e.name and cascade.producer(t) is not None:
                    s |= {t} | anc[t]
            anc[e.name] = s
        memo["anc"] = anc
    return memo["anc"]


def reduce_then_reuse(cascade: Cascade, tensor: str, consumer: Einsum,
                      anc: dict[str, set[str]] | None = None) -> list[tuple[str, str]]:
    """(rank, reducer) pairs: another reader of ``tensor`` upstream of ``consumer`` reduces that
    rank, so ``consumer`` reads ``tensor`` only once that reduction is over (the softmax's
    scores, read by the row max and then by the exponential)."""
    anc = anc if anc is not None else einsum_ancestors(cascade)
    found = []
    for other in cascade.consumers(tensor):
        if other.name == consumer.name or other.name not in anc[consumer.name]:
            continue
        reduced = set(other.reduced_variables)
        for acc in other.inputs:
            if acc.tensor != tensor:
                continue
            for dim, idx in enumerate(acc.indices):
                v = idx.plain_variable
                if v is not None and v in reduced:
                    pair = (cascade.tensors[tensor].ranks[dim], other.name)
                    if pair not in found:
                        found.append(pair)
    return found


def swept_variables(consumer: Einsum, tensor: str) -> set[str]:
    """The variables ``consumer`` iterates where it reads ``tensor``: its output variables and
    those of the additive terms that read it (each term is reduced over the variables it has)."""
    swept = set(consumer.output_variables)
    for _, term in additive_terms(consumer.expr):
        if any(a.tensor == tensor for a in accesses(term)):
            swept |= set(expr_variables(term))
    return swept


def classify_edge(cascade: Cascade, tensor: str, consumer: Einsum, anc: dict[str, set[str]] | None = None) -> Edge:
    anc = anc if anc is not None else einsum_ancestors(cascade)
    producer = cascade.producer(tensor)
    accs = [a for a in consumer.inputs if a.tensor == tensor]
    p_u = {rank_of_variable(v) for v in producer.reduced_variables} if producer is not None else set()
    mentioned = {v for a in accs for idx in a.indices for v in idx.variables}
    p_v = {rank_of_variable(v) for v in swept_variables(consumer, tensor) if v not in mentioned}
    deps: list[str] = []
    for a in accs:
        for dim in range(len(a.indices)):
            d = _dimension_dependency(cascade, a, dim, consumer)
            if d not in deps and not (d == "aligned" and "aligned" in deps):
                deps.append(d)
    rtr = reduce_then_reuse(cascade, tensor, consumer, anc)
    deps += [f"reduce-then-reuse({rank} reduced by {who})" for rank, who in rtr]
    if len(deps) > 1 and "aligned" in deps:
        deps.remove("aligned")
    boundary = sorted((p_u & p_v) | {rank for rank, _ in rtr})
    rank_order = list(cascade.ranks)
    return Edge(
        producer=producer.name if producer is not None else None,
        consumer=consumer.name,
        tensor=tensor,
        fusion_class=fusion_class(p_u, p_v),
        producer_only=tuple(sorted(p_u, key=rank_order.index)),
        consumer_only=tuple(sorted(p_v, key=rank_order.index)),
        dependencies=tuple(deps),
        pass_boundary=tuple(boundary),
    )


def initial_edges(cascade: Cascade, consumer: Einsum, anc: dict[str, set[str]] | None = None) -> list[Edge]:
    """The edges from the states ``consumer`` reads as initial values (``H0``, read as ``H``
    below position 0 by the scan; the conv state, by the conv's window; a decode step's KV
    caches, by its scores): each as the edge of the tensor it starts, from no producer, its
    dependency ``initial(RANK)``. Only reads that reach below 0 along the initial rank (the
    readout ``H[b,i,..]`` never reads ``H0``)."""
    out = []
    for t in dict.fromkeys(a.tensor for a in consumer.inputs):
        state, axis = cascade.tensors[t].initial, cascade.initial_axis(t)
        if state is None or axis is None:
            continue
        sizes = cascade.variable_sizes
        if not any(a.indices[axis[0]].bounds(sizes)[0] < 0 for a in consumer.inputs if a.tensor == t):
            continue
        edge = classify_edge(cascade, t, consumer, anc)
        rank = cascade.tensors[t].ranks[axis[0]]
        out.append(Edge(producer=None, consumer=consumer.name, tensor=state,
                        fusion_class=fusion_class(set(), set(edge.consumer_only)), producer_only=(),
                        consumer_only=edge.consumer_only, dependencies=(f"initial({rank})",), pass_boundary=()))
    return out


def classify_edges(cascade: Cascade, *, include_inputs: bool = True) -> list[Edge]:
    """Every edge of the cascade, in consumer order (recurrences as self-edges; with
    ``include_inputs``, the layer's inputs and incoming states too, a state read as an initial
    value among them, :func:`initial_edges`)."""
    anc = einsum_ancestors(cascade)
    edges = []
    for e in cascade.einsums:
        for t in e.input_tensors:
            spec = cascade.tensors[t]
            if cascade.producer(t) is None and (not include_inputs or spec.role == Role.WEIGHT):
                continue
            edges.append(classify_edge(cascade, t, e, anc))
        if include_inputs:
            edges += initial_edges(cascade, e, anc)
    return edges


def edge_rows(edges: list[Edge]) -> list[dict]:
    return [
        {
            "producer": e.producer or "-",
            "consumer": e.consumer,
            "tensor": e.tensor,
            "fusion_class": e.fusion_class,
            "dependency": e.dependency,
            "details": "; ".join(e.dependencies),
            "producer_only": ",".join(e.producer_only),
            "consumer_only": ",".join(e.consumer_only),
            "pass_boundary": ",".join(e.pass_boundary),
        }
        for e in edges
    ]


def edges_json(edges: list[Edge]) -> list[dict]:
    return [
        {
            "producer": e.producer,
            "consumer": e.consumer,
            "tensor": e.tensor,
            "fusion_class": e.fusion_class,
            "dependency": e.dependency,
            "dependencies": list(e.dependencies),
            "producer_only_ranks": list(e.producer_only),
            "consumer_only_ranks": list(e.consumer_only),
            "pass_boundary": list(e.pass_boundary),
            "forces_pass_boundary": bool(e.pass_boundary),
        }
        for e in edges
    ]
