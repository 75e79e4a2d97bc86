"""Composing cascades: one block's output feeding the next block's input, as one cascade.

A hybrid model's layer is a mixer block (Mamba or attention) followed by its MLP block; as one
cascade the fusion engine can also fuse across the boundary (the mixer's residual output into
the MLP's norm). :func:`chain_cascades` renames the second block's tensors with a prefix, reads
the first block's output where the second read its input, and checks that shared ranks agree.
"""

from __future__ import annotations

from dataclasses import replace

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Access, Binary, Einsum, Expr, Param, Role, Unary


def _rename(expr: Expr, tensors: dict[str, str], params: dict[str, str]) -> Expr:
    if isinstance(expr, Access):
        return Access(tensors.get(expr.tensor, expr.tensor), expr.indices)
    if isinstance(expr, Param):
        return Param(params.get(expr.name, expr.name))
    if isinstance(expr, Unary):
        return Unary(expr.fn, _rename(expr.arg, tensors, params))
    if isinstance(expr, Binary):
        return Binary(expr.op, _rename(expr.lhs, tensors, params), _rename(expr.rhs, tensors, params))
    return expr


def chain_cascades(first: Cascade, second: Cascade, *, prefix: str, link: tuple[str, str] = ("XO", "X"),
                   name: str | None = None, description: str | None = None) -> Cascade:
    """``second`` run on ``first``'s output, as one cascade.

    ``link = (out, inp)``: ``first``'s output tensor ``out`` becomes an intermediate that
    ``second`` reads wherever it read its input ``inp``. Every other tensor of ``second`` is
    renamed ``prefix + name``, and so is each of its parameters whose value differs from
    ``first``'s parameter of the same name. Ranks of the same name must have the same size.
    The output of the chain is ``second``'s output (renamed)."""
    out, inp = link
    if out not in first.tensors or first.tensors[out].role != Role.OUTPUT:
        raise SpecError(f"cannot chain {first.name!r} into {second.name!r}: {out!r} is not an output of {first.name!r}")
    if inp not in second.tensors or second.tensors[inp].role != Role.INPUT:
        raise SpecError(f"cannot chain {first.name!r} into {second.name!r}: {inp!r} is not an input of {second.name!r}")
    if first.tensors[out].ranks != second.tensors[inp].ranks:
        raise SpecError(f"cannot chain {first.name!r} into {second.name!r}: {out} [{', '.join(first.tensors[out].ranks)}] "
                        f"is not shaped like {inp} [{', '.join(second.tensors[inp].ranks)}]")
    for r, rank in second.ranks.items():
        if r in first.ranks and first.ranks[r].size != rank.size:
            raise SpecError(f"cannot chain {first.name!r} into {second.name!r}: rank {r} has size "
                            f"{first.ranks[r].size} in one and {rank.size} in the other")
    tensors = {t: (out if t == inp else prefix + t) for t in second.tensors}
    clash = [t for t in tensors.values() if t != out and t in first.tensors]
    if clash:
        raise SpecError(f"cannot chain {first.name!r} into {second.name!r} with prefix {prefix!r}: "
                        f"{', '.join(clash)} exist in both")
    params = {p: prefix + p for p, v in second.params.items() if p in first.params and first.params[p] != v}
    specs = dict(first.tensors)
    specs[out] = replace(specs[out], role=Role.INTERMEDIATE)
    for t, spec in second.tensors.items():
        if t == inp:
            continue
        specs[tensors[t]] = replace(spec, name=tensors[t], initial=spec.initial and tensors[spec.initial],
                                    updates=spec.updates and tensors[spec.updates])
    einsums = list(first.einsums) + [
        Einsum(Access(tensors[e.name], e.output.indices), _rename(e.expr, tensors, params), e.reduce_op)
        for e in second.einsums
    ]
    regions = dict(first.regions)
    regions.update({prefix + k: tuple(tensors[e] for e in v) for k, v in second.regions.items()})
    return build_cascade(
        name=name or f"{first.name}+{second.name}",
        params={**first.params, **{params.get(p, p): v for p, v in second.params.items()}},
        ranks=list(first.ranks.values()) + [r for k, r in second.ranks.items() if k not in first.ranks],
        tensors=list(specs.values()),
        einsums=einsums,
        description=description or f"{first.description}; then {second.description}",
        regions=regions,
    )


__all__ = ["chain_cascades"]
