"""Unroll a recurrence into one Einsum per step: the same computation as a graph without cycles.

A recurrence such as the selective scan ``H[b,i,e,n] = AD[b,i,e,n]*H[b,i-1,e,n] + BX[b,i,e,n]``
over a generational rank ``I`` of size ``T`` becomes ``T`` step Einsums

    H_t[b,step,e,n] = AD[b,t,e,n]*H_{t-1}[b,step,e,n] + BX[b,t,e,n]      (t = 0 .. T-1)

where ``STEP`` is a new rank of size 1 standing where ``I`` stood (so a step tensor keeps the
original's rank order), ``H_{-1}`` is the initial value (``H0``) or zero, and every other read
of the generational rank is fixed to ``t``. A reader of ``H[..., x, ...]`` (``x`` any affine
index along the generational rank) reads the step tensors instead, each selected by an
out-of-range read that returns zero unless ``x = t``:

    YS[b,i,e] = (H_0[b,-i,e,n] + H_1[b,1-i,e,n] + ... + H_{T-1}[b,T-1-i,e,n]) * CM[b,i,n]

Steps that ``x`` can never reach are left out (``HN[b,e,n] = H[b,T-1,e,n]`` becomes
``H_{T-1}[b,0,e,n]``). The unrolled cascade computes the same values as the recurrent one (the
executor tests check it) and is what a tool without recurrences, such as AccelForge, costs: its
unfused mapping writes every ``H_t`` off chip and reads it back in step ``t+1``, while the
recurrent Einsum keeps the carried state on chip.

Dead code goes: a step nothing reads any more (the last chunk's state in a chunked prefill
without state out), and then what only fed it, is dropped and named in the description.
Operation counts are those of the graph as written: the selecting sum adds ``T-1`` additions
per point of the reader.

Limits, each refused with an error naming the Einsum: a reader that reaches a step tensor's
initial value through the generational rank (``HC[b,c-1,...]`` with an ``HC0``); a ``max=``
Einsum whose top-level term is a read of an unrolled tensor over reduced variables (splitting
it into a sum of terms would change what ``max`` reduces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import (
    Access,
    AffineIndex,
    Binary,
    Const,
    Einsum,
    Expr,
    Rank,
    Role,
    TensorSpec,
    Unary,
    additive_terms,
    rank_variable,
)
from mambalaya.errors import SpecError

#: Preferred name of the size-1 rank that replaces the generational rank in step tensors.
STEP_RANK = "STEP"


@dataclass(frozen=True)
class _Unrolled:
    """How one recurrent tensor was unrolled."""

    tensor: str
    dim: int  # position of the generational rank in the tensor's ranks
    steps: int

    def step(self, t: int) -> str:
        return f"{self.tensor}_{t}"


def unroll_recurrences(cascade: Cascade, einsums: Iterable[str] | None = None) -> Cascade:
    """The cascade with the recurrences named in ``einsums`` (default: all) unrolled into one
    Einsum per step of their generational rank (see the module docstring)."""
    recurrent = [e.name for e in cascade.einsums if cascade.recurrence(e)]
    chosen = list(recurrent if einsums is None else einsums)
    for name in chosen:
        if name not in recurrent:
            raise SpecError(
                f"cannot unroll {name!r}: it is not a recurrent Einsum of cascade {cascade.name!r} "
                f"(recurrences: {', '.join(recurrent) or 'none'})"
            )
    if not chosen:
        return cascade
    plans = {name: _plan(cascade, cascade.einsum(name)) for name in chosen}
    step_rank = _free_rank_name(cascade)
    tensors = _step_tensors(cascade, plans, step_rank)
    new_einsums: list[Einsum] = []
    for e in cascade.einsums:
        pieces = _step_einsums(cascade, e, plans[e.name], step_rank) if e.name in plans else [e]
        new_einsums += [_rewrite_reads(cascade, p, plans, step_rank) for p in pieces]
    new_einsums, dropped = _without_dead_code(new_einsums, tensors)
    tensors = [t for t in tensors if t.name not in dropped]
    regions = {
        region: tuple(n for m in members for n in ([plans[m].step(t) for t in range(plans[m].steps)] if m in plans else [m]))
        for region, members in cascade.regions.items()
    }
    regions = {r: kept for r, members in regions.items() if (kept := tuple(m for m in members if m not in dropped))}
    unrolled = ", ".join(f"{n} ({plans[n].steps} step{'s' if plans[n].steps != 1 else ''})" for n in chosen)
    if dropped:
        unrolled += f"; never read, so not computed: {', '.join(sorted(dropped))}"
    return build_cascade(
        name=f"{cascade.name}-unrolled",
        params=cascade.params,
        ranks=[*cascade.ranks.values(), Rank(step_rank, 1)],
        tensors=tensors,
        einsums=new_einsums,
        description=f"{cascade.description} [recurrences unrolled: {unrolled}]".strip(),
        regions=regions,
    )


def _plan(cascade: Cascade, e: Einsum) -> _Unrolled:
    rank, _ = cascade.recurrence(e)  # type: ignore[misc]
    if cascade.is_history_recurrence(e) or cascade.contracted_state_ranks(e):
        raise SpecError(f"cannot unroll {e.name!r}: it reads its state beyond v-c at the output's indices (a history "
                        "or contracting read); only plain recurrences unroll", einsum=e.name)
    dim = cascade.tensors[e.name].ranks.index(rank)
    plan = _Unrolled(e.name, dim, cascade.size(rank))
    for t in range(plan.steps):
        if plan.step(t) in cascade.tensors:
            raise SpecError(f"cannot unroll {e.name!r}: the cascade already has a tensor named {plan.step(t)}", einsum=e.name)
    return plan


def _without_dead_code(einsums: list[Einsum], tensors: list[TensorSpec]) -> tuple[list[Einsum], set[str]]:
    """Drop Einsums whose intermediate result nothing reads any more, repeatedly: the last chunk's
    state when only the next chunk reads it, and then what only fed it (the recurrent form
    computes these and throws them away; unrolled, the selecting read of a step that cannot
    exist becomes a constant zero)."""
    roles = {t.name: t.role for t in tensors}
    dropped: set[str] = set()
    while True:
        read = {t for e in einsums for t in e.input_tensors if t != e.name}
        dead = {e.name for e in einsums if roles[e.name] == Role.INTERMEDIATE and e.name not in read}
        if not dead:
            return einsums, dropped
        dropped |= dead
        einsums = [e for e in einsums if e.name not in dead]


def _free_rank_name(cascade: Cascade) -> str:
    taken = set(cascade.ranks) | {r.upper() for r in cascade.params}
    name, n = STEP_RANK, 1
    while name in taken:
        n += 1
        name = f"{STEP_RANK}{n}"
    return name


def _step_tensors(cascade: Cascade, plans: dict[str, _Unrolled], step_rank: str) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for name, spec in cascade.tensors.items():
        plan = plans.get(name)
        if plan is None:
            out.append(spec)
            continue
        ranks = spec.ranks[: plan.dim] + (step_rank,) + spec.ranks[plan.dim + 1 :]
        for t in range(plan.steps):
            last = t == plan.steps - 1
            role = spec.role if (last or spec.role == Role.OUTPUT) else Role.INTERMEDIATE
            out.append(
                TensorSpec(
                    plan.step(t),
                    ranks,
                    role,
                    spec.bits,
                    updates=spec.updates if last else None,
                    description=f"{spec.description or name}, step {t} of {plan.steps}",
                )
            )
    return out


def _substitute(idx: AffineIndex, var: str, value: int) -> AffineIndex:
    """``idx`` with ``var`` fixed to ``value``."""
    const = idx.const + sum(c * value for v, c in idx.terms if v == var)
    return AffineIndex(tuple((v, c) for v, c in idx.terms if v != var), const)


def _map_accesses(expr: Expr, fn) -> Expr:
    if isinstance(expr, Access):
        return fn(expr)
    if isinstance(expr, Unary):
        return Unary(expr.fn, _map_accesses(expr.arg, fn))
    if isinstance(expr, Binary):
        return Binary(expr.op, _map_accesses(expr.lhs, fn), _map_accesses(expr.rhs, fn))
    return expr


def _step_einsums(cascade: Cascade, e: Einsum, plan: _Unrolled, step_rank: str) -> list[Einsum]:
    gvar = e.output.indices[plan.dim].plain_variable
    assert gvar is not None
    step_index = AffineIndex.var(rank_variable(step_rank))
    spec = cascade.tensors[e.name]

    def at_step(acc: Access, t: int) -> Expr:
        if acc.tensor != e.name:
            return Access(acc.tensor, tuple(_substitute(i, gvar, t) for i in acc.indices))
        source = t + acc.indices[plan.dim].const  # the self-read is gvar - d
        if source >= 0:
            return Access(plan.step(source), _with(acc.indices, plan.dim, step_index))
        if spec.initial is None:
            return Const(0.0)
        axis, depth = cascade.initial_axis(e.name)  # type: ignore[misc]
        history = depth + source
        if history < 0:
            return Const(0.0)
        init = cascade.tensors[spec.initial]
        if len(init.ranks) < len(spec.ranks):  # the initial value drops the generational rank
            return Access(spec.initial, acc.indices[:axis] + acc.indices[axis + 1 :])
        return Access(spec.initial, _with(acc.indices, axis, AffineIndex.constant(history)))

    steps = []
    for t in range(plan.steps):
        output = Access(plan.step(t), _with(e.output.indices, plan.dim, step_index))
        steps.append(Einsum(output, _map_accesses(e.expr, lambda a, t=t: at_step(a, t)), e.reduce_op))
    return steps


def _with(indices: tuple[AffineIndex, ...], dim: int, index: AffineIndex) -> tuple[AffineIndex, ...]:
    return indices[:dim] + (index,) + indices[dim + 1 :]


def _balanced_sum(terms: list[Expr]) -> Expr:
    """``a + b + ...`` as a balanced tree (its depth grows with log2 of the terms, so a long
    unrolled sum still parses back within the parser's nesting limit)."""
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return Binary("+", _balanced_sum(terms[:mid]), _balanced_sum(terms[mid:]))


def _rewrite_reads(cascade: Cascade, e: Einsum, plans: dict[str, _Unrolled], step_rank: str) -> Einsum:
    sizes = {**cascade.variable_sizes, rank_variable(step_rank): 1}
    top_level = {id(term) for _, term in additive_terms(e.expr)}

    def selected(acc: Access) -> Expr:
        plan = plans.get(acc.tensor)
        if plan is None:  # not unrolled, or already a step tensor (H_{t-1} in step t)
            return acc
        x = acc.indices[plan.dim]
        lo, hi = x.bounds(sizes)
        if lo < 0 and cascade.tensors[acc.tensor].initial is not None:
            raise SpecError(
                f"cannot unroll {acc.tensor!r}: {e.name} reads {acc}, which reaches below 0 along the "
                f"recurrence's rank into the initial value {cascade.tensors[acc.tensor].initial}; an unrolled "
                "reader cannot select it",
                einsum=e.name,
            )
        terms: list[Expr] = []
        for t in range(max(lo, 0), min(hi, plan.steps - 1) + 1):
            offset = AffineIndex(tuple((v, -c) for v, c in x.terms), t - x.const)  # 0 exactly when x = t
            terms.append(Access(plan.step(t), _with(acc.indices, plan.dim, offset)))
        if not terms:
            return Const(0.0)
        if len(terms) > 1 and e.reduce_op != "sum" and id(acc) in top_level and e.reduced_variables:
            raise SpecError(
                f"cannot unroll {acc.tensor!r} in {e.name}: the top-level term {acc} of this {e.reduce_op}= "
                "Einsum would become a sum of step terms, each reduced on its own",
                einsum=e.name,
            )
        return _balanced_sum(terms)

    return Einsum(e.output, _map_accesses(e.expr, selected), e.reduce_op)
