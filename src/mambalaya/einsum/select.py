"""A part of a cascade as a cascade of its own: what one GPU kernel runs.

A measured kernel runs some of a layer's Einsums (the selective scan runs the discretisation,
the scan and the readout, not the projections). :func:`sub_cascade` keeps those Einsums and
the tensors they touch: a tensor they read and no kept Einsum writes becomes an input (a
weight stays a weight, a state stays a state), and a tensor a kept Einsum writes becomes an
output when an Einsum left out reads it, when it was an output or a state update, or when
``outputs`` names it (or, with ``only_outputs``, exactly when ``outputs`` names it). Everything else about the Einsums (ranks, parameters, widths) is the
cascade's own, so the part's costs are the same rules applied to less work.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Param, Role, walk
from mambalaya.errors import SpecError


def sub_cascade(cascade: Cascade, einsums: Iterable[str], *, outputs: Iterable[str] = (), only_outputs: bool = False,
                name: str | None = None) -> Cascade:
    """The cascade of the named Einsums of ``cascade`` (see the module doc). With
    ``only_outputs``, the tensors in ``outputs`` are the part's only outputs (a kernel that
    writes fewer than the part would: one whose readers outside it recompute the others); a
    kept Einsum whose tensor is then neither an output nor read in the part is refused (its
    work would go nowhere)."""
    kept = [cascade.einsum(n) for n in dict.fromkeys(einsums)]  # unknown names: SpecError naming it
    if not kept:
        raise SpecError(f"cascade {cascade.name!r}: a part needs at least one Einsum")
    names = {e.name for e in kept}
    wanted = set(outputs)
    unknown = wanted - names
    if unknown:
        raise SpecError(f"cascade {cascade.name!r}: outputs {', '.join(sorted(unknown))} are not written by the kept Einsums")
    touched: dict[str, None] = {}
    for e in kept:
        touched.setdefault(e.name)
        for t in (*e.input_tensors, *cascade.initial_reads(e)):
            touched.setdefault(t)
    tensors = []
    for t in touched:
        spec = cascade.tensors[t]
        if t in names:
            read_outside = any(c.name not in names for c in cascade.consumers(t))
            is_result = spec.role == Role.OUTPUT or spec.updates is not None or t in wanted
            read_inside = any(c.name in names for c in cascade.consumers(t))
            if only_outputs:
                if t not in wanted and not read_inside:
                    raise SpecError(f"cascade {cascade.name!r}: Einsum {t} is kept, but its tensor is neither one of "
                                    f"the outputs ({', '.join(sorted(wanted))}) nor read by a kept Einsum")
                role = Role.OUTPUT if t in wanted else Role.INTERMEDIATE
            else:
                role = Role.OUTPUT if (read_outside or is_result or not read_inside) else Role.INTERMEDIATE
        elif spec.role in (Role.WEIGHT, Role.STATE):
            role = spec.role
        else:
            role = Role.INPUT
        updates = spec.updates if spec.updates in touched else None
        initial = spec.initial if spec.initial in touched else None
        tensors.append(replace(spec, role=role, updates=updates, initial=initial))
    used_ranks = {r for t in tensors for r in t.ranks} | {
        v.upper() for e in kept for v in e.iteration_variables
    } | {n.name for e in kept for n in walk(e.expr) if isinstance(n, Param) and n.name in cascade.ranks}  # RS = .../D
    ranks = [r for n, r in cascade.ranks.items() if n in used_ranks]
    return build_cascade(
        name=name or f"{cascade.name}[{','.join(e.name for e in kept)}]",
        params=dict(cascade.params),
        ranks=ranks,
        tensors=tensors,
        einsums=kept,
        description=f"{len(kept)} Einsums of {cascade.name}",
    )


__all__ = ["sub_cascade"]
