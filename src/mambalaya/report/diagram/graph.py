"""What the cascade diagram shows: a box per tensor that is not a weight (its category, header,
name, ranks and shape), an edge per read, and the weights each Einsum reads."""

from __future__ import annotations

from dataclasses import dataclass

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.report.style import KIND_CATEGORY


EdgeKey = tuple[str, str, str]  # (producer Einsum, consumer Einsum, tensor)


def tensor_category(cascade: Cascade, tensor: str) -> str:
    """The colour category of a tensor's box (a key of :data:`CATEGORY_STYLE`).

    Weights are ``weight``; tensors no Einsum writes (inputs, incoming state) are ``input``;
    a tensor an Einsum writes takes the category of that Einsum's kind.
    """
    spec = cascade.tensors[tensor]
    if spec.role == Role.WEIGHT:
        return "weight"
    producer = cascade.producer(tensor)
    if producer is None:
        return "input"
    return KIND_CATEGORY[cascade.kind(producer)]


@dataclass(frozen=True)
class Edge:
    """``consumer`` (an Einsum) reads ``tensor``; ``initial`` if it reads it as an initial value."""

    tensor: str
    consumer: str
    initial: bool = False


def _is_weight(cascade: Cascade, tensor: str) -> bool:
    return cascade.tensors[tensor].role == Role.WEIGHT


def graph_nodes(cascade: Cascade) -> tuple[str, ...]:
    """The boxes of the graph: tensors no Einsum writes first, then the Einsums in order."""
    externals = tuple(t for t in cascade.external_tensors() if not _is_weight(cascade, t))
    return externals + tuple(e.name for e in cascade.einsums)


def graph_edges(cascade: Cascade) -> tuple[Edge, ...]:
    """Reads of non-weight tensors, plain then initial-value, in Einsum order."""
    out: list[Edge] = []
    for e in cascade.einsums:
        plain = [t for t in e.input_tensors if t != e.name and not _is_weight(cascade, t)]
        out += [Edge(t, e.name) for t in plain]
        out += [
            Edge(t, e.name, initial=True)
            for t in cascade.initial_reads(e)
            if t not in plain and not _is_weight(cascade, t)
        ]
    return tuple(out)


def weight_reads(cascade: Cascade) -> dict[str, tuple[str, ...]]:
    """Einsum name -> the weights it reads, in the order they appear."""
    return {
        e.name: tuple(t for t in e.input_tensors if _is_weight(cascade, t))
        for e in cascade.einsums
        if any(_is_weight(cascade, t) for t in e.input_tensors)
    }


def box_lines(cascade: Cascade, tensor: str) -> tuple[str, str, str, str]:
    """(header, name, ranks, shape) of a tensor's box."""
    spec = cascade.tensors[tensor]
    producer = cascade.producer(tensor)
    if producer is not None:
        header = f"{cascade.position(tensor)} · {cascade.kind(producer)}"
    else:
        header = "state in" if spec.role == Role.STATE else spec.role.value
    return header, tensor, _ranks_text(spec.ranks), _shape_text(cascade.shape(tensor))


def _ranks_text(ranks: tuple[str, ...]) -> str:
    return "[" + ",".join(ranks) + "]"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "×".join(str(s) for s in shape) if shape else "scalar"


def is_output(cascade: Cascade, tensor: str) -> bool:
    return tensor in cascade.output_tensors()


def weight_lines(cascade: Cascade, weight: str) -> tuple[str, str]:
    return f"{weight} {_ranks_text(cascade.tensors[weight].ranks)}", _shape_text(cascade.shape(weight))
