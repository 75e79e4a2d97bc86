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

Size: the unrolled cascade grows with the number of steps (a Mamba-1 prefill, about 240 bytes
of cascade file per position). Before anything is built, :func:`unrolled_size` gives its Einsum
count and estimates its cascade file's size (within a few percent) from one step per count of
digits in the step number, in milliseconds at any step count; :func:`unroll_recurrences`
refuses a cascade whose file would exceed :data:`MAX_UNROLLED_TEXT_BYTES`, the largest file
mambalaya reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.cascade_file import dump_cascade
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
    additive_terms,
    map_accesses,
    rank_variable,
)
from mambalaya.errors import SpecError
from mambalaya.specio import MAX_SPEC_BYTES

#: Preferred name of the size-1 rank that replaces the generational rank in step tensors.
STEP_RANK = "STEP"

#: The largest unrolled cascade :func:`unroll_recurrences` builds, as the estimated size in bytes
#: of its cascade file: a cascade beyond what mambalaya reads back (:data:`mambalaya.specio.MAX_SPEC_BYTES`,
#: 16 MiB, about 60,000 steps of a Mamba-1 prefill) cannot be checked, drawn or exported usefully,
#: and building it costs gigabytes (a Mamba-1 prefill at L = 10^6: over 5 GB). Nine tenths of the
#: read limit: the estimate is within 5% of the file (measured on five layers), so what is built
#: is always read back.
MAX_UNROLLED_TEXT_BYTES = MAX_SPEC_BYTES * 9 // 10

#: Bytes a cascade file (:func:`~mambalaya.einsum.cascade_file.dump_cascade`) spends on a tensor
#: line beyond its name, ranks, role, bits and description (the indent, keys, brackets, commas,
#: quotes and newline), and on an Einsum line beyond the Einsum's text (``  - `` and newline).
_TENSOR_LINE_OVERHEAD_BYTES = 49
_EINSUM_LINE_OVERHEAD_BYTES = 5


@dataclass(frozen=True)
class _Unrolled:
    """How one recurrent tensor was unrolled."""

    tensor: str
    dim: int  # position of the generational rank in the tensor's ranks
    steps: int

    def step(self, t: int) -> str:
        return f"{self.tensor}_{t}"


@dataclass(frozen=True)
class UnrollSize:
    """How big unrolling a cascade's recurrences would make it (:func:`unrolled_size`)."""

    #: the Einsums of the unrolled cascade (before dead steps are dropped, at most one per recurrence)
    einsums: int
    #: the estimated size of its cascade file (:func:`~mambalaya.einsum.cascade_file.dump_cascade`)
    text_bytes: int
    #: the size of the cascade file of the cascade as it is, not unrolled
    recurrent_text_bytes: int
    #: (recurrent Einsum, its generational rank, steps) of each recurrence unrolled
    recurrences: tuple[tuple[str, str, int], ...]

    @property
    def bytes_per_step(self) -> float:
        """What one more step of every recurrence adds to the file, on average."""
        steps = max((n for _, _, n in self.recurrences), default=1)
        return max(self.text_bytes - self.recurrent_text_bytes, 1) / steps


def unrolled_size(cascade: Cascade, einsums: Iterable[str] | None = None) -> UnrollSize:
    """The Einsum count and the estimated cascade-file size of ``unroll_recurrences(cascade,
    einsums)``, within a few percent: each recurrence's step line and each selecting read's
    term is measured once per count of digits in the step number, so the time grows with the
    logarithm of the step count, and no step is built."""
    plans = _plans(cascade, einsums)
    step_rank = _free_rank_name(cascade)
    sizes = {**cascade.variable_sizes, rank_variable(step_rank): 1}
    recurrent_text_bytes = len(dump_cascade(cascade).encode("utf-8"))
    text_bytes = recurrent_text_bytes
    for name, plan in plans.items():
        e, spec = cascade.einsum(name), cascade.tensors[name]
        for t, count in _digit_bands(0, plan.steps - 1):
            text_bytes += count * _step_text_bytes(cascade, e, _step_tensor(spec, plan, step_rank, t), plan, step_rank, t)
    for reader in cascade.einsums:  # a reader of H[..i..] reads the sum H_0[..] + H_1[..] + ...: a term per step
        for acc in reader.inputs:
            plan = plans.get(acc.tensor)
            if plan is None or acc.tensor == reader.name:
                continue
            lo, hi = acc.indices[plan.dim].bounds(sizes)
            for t, count in _digit_bands(max(lo, 0), min(hi, plan.steps - 1)):
                text_bytes += count * (len(str(_selecting_term(acc, plan, t))) + len(" + "))
    count = len(cascade.einsums) + sum(p.steps - 1 for p in plans.values())
    recurrences = tuple((n, cascade.recurrence(cascade.einsum(n))[0], p.steps) for n, p in plans.items())  # type: ignore[index]
    return UnrollSize(count, text_bytes, recurrent_text_bytes, recurrences)


def _digit_bands(first: int, last: int) -> list[tuple[int, int]]:
    """``[first, last]`` cut where the step number gains a digit: (first step of a band, steps in it)."""
    bands, start = [], first
    while start <= last:
        end = min(last, 10 ** len(str(start)) - 1)
        bands.append((start, end - start + 1))
        start = end + 1
    return bands


def _step_text_bytes(cascade: Cascade, e: Einsum, tensor: TensorSpec, plan: _Unrolled, step_rank: str, t: int) -> int:
    """Bytes of step ``t``'s Einsum line and tensor line in a cascade file."""
    einsum_text = str(_step_einsum(cascade, e, plan, step_rank, t))
    tensor_text = (len(tensor.name) + len(", ".join(tensor.ranks)) + len(tensor.role.value) + len(str(tensor.bits))
                   + len(tensor.description or ""))
    return len(einsum_text) + _EINSUM_LINE_OVERHEAD_BYTES + tensor_text + _TENSOR_LINE_OVERHEAD_BYTES


def check_unroll_size(cascade: Cascade, einsums: Iterable[str] | None = None, *,
                      max_text_bytes: int = MAX_UNROLLED_TEXT_BYTES) -> UnrollSize:
    """:func:`unrolled_size`, or a :class:`SpecError` naming the recurrences, their steps, the
    estimate and the bound when the unrolled cascade's file would exceed ``max_text_bytes``."""
    size = unrolled_size(cascade, einsums)
    if size.text_bytes <= max_text_bytes:
        return size
    over = ", ".join(f"{name} over {rank} = {steps:,} steps" for name, rank, steps in size.recurrences)
    fits = max(0, int((max_text_bytes - size.recurrent_text_bytes) / size.bytes_per_step))
    raise SpecError(
        f"cannot unroll cascade {cascade.name!r} ({over}): it would have {size.einsums:,} Einsums and a cascade "
        f"file of about {size.text_bytes:,} bytes, over the bound of {max_text_bytes:,} bytes "
        f"(MAX_UNROLLED_TEXT_BYTES, the largest spec file mambalaya reads back); at about "
        f"{size.bytes_per_step:,.0f} bytes per step, at most about {fits:,} steps fit (a shorter sequence)"
    )


def unroll_recurrences(cascade: Cascade, einsums: Iterable[str] | None = None, *,
                       max_text_bytes: int = MAX_UNROLLED_TEXT_BYTES) -> Cascade:
    """The cascade with the recurrences named in ``einsums`` (default: all) unrolled into one
    Einsum per step of their generational rank (see the module docstring). A cascade whose
    file would exceed ``max_text_bytes`` is refused before a step is built
    (:func:`check_unroll_size`)."""
    plans = _plans(cascade, einsums)
    if not plans:
        return cascade
    check_unroll_size(cascade, list(plans), max_text_bytes=max_text_bytes)
    chosen = list(plans)
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


def _plans(cascade: Cascade, einsums: Iterable[str] | None) -> dict[str, _Unrolled]:
    """How each recurrence named in ``einsums`` (default: all) unrolls, or a SpecError naming one
    that is not a recurrence of the cascade or cannot unroll."""
    recurrent = [e.name for e in cascade.einsums if cascade.recurrence(e)]
    chosen = list(recurrent if einsums is None else einsums)
    for name in chosen:
        if name not in recurrent:
            raise SpecError(
                f"cannot unroll {name!r}: it is not a recurrent Einsum of cascade {cascade.name!r} "
                f"(recurrences: {', '.join(recurrent) or 'none'})"
            )
    return {name: _plan(cascade, cascade.einsum(name)) for name in chosen}


def _plan(cascade: Cascade, e: Einsum) -> _Unrolled:
    rank, _ = cascade.recurrence(e)  # type: ignore[misc]
    if cascade.is_history_recurrence(e) or cascade.contracted_state_ranks(e):
        raise SpecError(f"cannot unroll {e.name!r}: it reads its state beyond v-c at the output's indices (a history "
                        "or contracting read); only plain recurrences unroll", einsum=e.name)
    dim = cascade.tensors[e.name].ranks.index(rank)
    plan = _Unrolled(e.name, dim, cascade.size(rank))
    prefix = f"{e.name}_"
    for name in cascade.tensors:  # a step's name taken already (checked per tensor, not per step)
        suffix = name[len(prefix):] if name.startswith(prefix) else ""
        if suffix.isdigit() and str(int(suffix)) == suffix and int(suffix) < plan.steps:
            raise SpecError(f"cannot unroll {e.name!r}: the cascade already has a tensor named {name}", einsum=e.name)
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
        out += [_step_tensor(spec, plan, step_rank, t) for t in range(plan.steps)]
    return out


def _step_tensor(spec: TensorSpec, plan: _Unrolled, step_rank: str, t: int) -> TensorSpec:
    """The tensor step ``t`` of ``plan`` writes."""
    ranks = spec.ranks[: plan.dim] + (step_rank,) + spec.ranks[plan.dim + 1 :]
    last = t == plan.steps - 1
    role = spec.role if (last or spec.role == Role.OUTPUT) else Role.INTERMEDIATE
    return TensorSpec(
        plan.step(t),
        ranks,
        role,
        spec.bits,
        updates=spec.updates if last else None,
        description=f"{spec.description or spec.name}, step {t} of {plan.steps}",
    )


def _substitute(idx: AffineIndex, var: str, value: int) -> AffineIndex:
    """``idx`` with ``var`` fixed to ``value``."""
    const = idx.const + sum(c * value for v, c in idx.terms if v == var)
    return AffineIndex(tuple((v, c) for v, c in idx.terms if v != var), const)


def _step_einsums(cascade: Cascade, e: Einsum, plan: _Unrolled, step_rank: str) -> list[Einsum]:
    return [_step_einsum(cascade, e, plan, step_rank, t) for t in range(plan.steps)]


def _step_einsum(cascade: Cascade, e: Einsum, plan: _Unrolled, step_rank: str, t: int) -> Einsum:
    """Step ``t`` of the recurrence ``e``: its generational variable fixed to ``t``, its self-read
    the step before (or the initial value, or zero)."""
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

    output = Access(plan.step(t), _with(e.output.indices, plan.dim, step_index))
    return Einsum(output, map_accesses(e.expr, lambda a: at_step(a, t)), e.reduce_op)


def _with(indices: tuple[AffineIndex, ...], dim: int, index: AffineIndex) -> tuple[AffineIndex, ...]:
    return indices[:dim] + (index,) + indices[dim + 1 :]


def _balanced_sum(terms: list[Expr]) -> Expr:
    """``a + b + ...`` as a balanced tree (its depth grows with log2 of the terms, so a long
    unrolled sum still parses back within the parser's nesting limit)."""
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return Binary("+", _balanced_sum(terms[:mid]), _balanced_sum(terms[mid:]))


def _selecting_term(acc: Access, plan: _Unrolled, t: int) -> Access:
    """The read of step ``t`` that stands for ``acc`` where its generational index ``x`` is
    ``t``: ``x - t`` is 0 exactly there, out of range (read as zero) elsewhere."""
    x = acc.indices[plan.dim]
    offset = AffineIndex(tuple((v, -c) for v, c in x.terms), t - x.const)
    return Access(plan.step(t), _with(acc.indices, plan.dim, offset))


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
        terms: list[Expr] = [_selecting_term(acc, plan, t) for t in range(max(lo, 0), min(hi, plan.steps - 1) + 1)]
        if not terms:
            return Const(0.0)
        if len(terms) > 1 and e.reduce_op != "sum" and id(acc) in top_level and e.reduced_variables:
            raise SpecError(
                f"cannot unroll {acc.tensor!r} in {e.name}: the top-level term {acc} of this {e.reduce_op}= "
                "Einsum would become a sum of step terms, each reduced on its own",
                einsum=e.name,
            )
        return _balanced_sum(terms)

    return Einsum(e.output, map_accesses(e.expr, selected), e.reduce_op)
