"""Cascades: a DAG of Einsums through named tensors, validated on construction.

:func:`build_cascade` is the one way to make a :class:`Cascade`; it checks every rule of the
IR and raises :class:`~mambalaya.errors.SpecError` naming the Einsum and the tensor or rank
at fault. A recurrence (an Einsum reading its own output at ``v-c`` of one rank, ``c >= 1``) is
legal and makes that rank *generational*; every other cycle is an error.

Two wider self-reads keep a recurrence causal (the gated delta rule needs both): a
**contracting** read, at ``v-c`` of the generational rank and elsewhere at reduced variables of
same-size ranks (``H[b,i-1,g,r,p,m]``: each element contracts the whole previous state along
those ranks, which therefore cannot be tiled, :meth:`Cascade.contracted_state_ranks`); and a
**history** read, the generational dimension at a reduced variable of a same-size rank and
every other at the output's index (forward substitution ``TI[b,c,q,s] = EYE[q,s] -
AS[b,c,q,t]*TI[b,c,t,s]``): step ``q`` reads every row computed so far, later rows read as
zero, and the Einsum's values must give them no weight (a strictly-lower mask). Its distance
is the rank's size: a tile carries every earlier row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping

from mambalaya.errors import SpecError
from mambalaya.einsum.parse import MAX_SIZE
from mambalaya.einsum.ir import (
    Access,
    AffineIndex,
    Einsum,
    MASK_DEAD_VALUES,
    Mask,
    Param,
    Rank,
    Role,
    TensorSpec,
    Unary,
    map_accesses,
    rank_of_variable,
    rank_variable,
    walk,
)

RANK_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
TENSOR_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")
PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Einsum kinds, in the order they are tested (first match wins).
EINSUM_KINDS: tuple[str, ...] = (
    "recurrent",  # reads its own output at an earlier index of a generational rank
    "window",  # an index combines an output variable with a reduced one (causal conv)
    "gemm",  # a reduction with a weight operand
    "reduction",  # a reduction over activations only
    "unary",  # applies a nonlinear function
    "broadcast",  # a map where some operand lacks some of the output's ranks
    "elementwise",  # a map over identical ranks
    "copy",  # a single access, possibly re-indexed
)


#: The largest rank size the cost model represents exactly (the size expressions' bound, 2^53).
MAX_RANK_SIZE = MAX_SIZE


#: How many cascade structures keep their shared memos (:attr:`Cascade.structure_memo`): a
#: sweep meets a few model families; memory, not a model constant.
STRUCTURE_MEMOS = 16

_STRUCTURE_MEMOS: dict[tuple, dict] = {}


@dataclass(frozen=True)
class Cascade:
    """A validated cascade. Build with :func:`build_cascade`; Einsums are in topological order."""

    name: str
    params: Mapping[str, float]
    ranks: Mapping[str, Rank]
    tensors: Mapping[str, TensorSpec]
    einsums: tuple[Einsum, ...]
    description: str = field(default="", compare=False)
    #: Named sets of Einsums (e.g. ``ssm``: the region a fine-grained-fusion baseline fuses).
    regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    # -- lookups ---------------------------------------------------------------------------
    @cached_property
    def _by_name(self) -> dict[str, Einsum]:
        return {e.name: e for e in self.einsums}

    def einsum(self, name: str) -> Einsum:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpecError(f"cascade {self.name!r} has no Einsum {name!r}") from None

    def position(self, name: str) -> int:
        """1-based number of an Einsum in topological order."""
        return self.einsums.index(self.einsum(name)) + 1

    def producer(self, tensor: str) -> Einsum | None:
        return self._by_name.get(tensor)

    @cached_property
    def _consumers(self) -> dict[str, tuple[Einsum, ...]]:
        table: dict[str, list[Einsum]] = {t: [] for t in self.tensors}
        for e in self.einsums:
            for t in e.input_tensors:
                if t != e.name:
                    table[t].append(e)
            for t in self.initial_reads(e):
                table[t].append(e)
        return {t: tuple(v) for t, v in table.items()}

    def consumers(self, tensor: str) -> tuple[Einsum, ...]:
        """Einsums that read ``tensor`` (directly, or as the initial value of what they read)."""
        return self._consumers[tensor]

    def initial_reads(self, einsum: Einsum) -> tuple[str, ...]:
        """Initial-value tensors an Einsum may read (``H0`` for the scan, the conv state)."""
        out = []
        for t in einsum.input_tensors:
            init = self.tensors[t].initial
            if init is not None and init not in out:
                out.append(init)
        return tuple(out)

    def initial_axis(self, tensor: str) -> tuple[int, int] | None:
        """``(dimension, history depth)`` of the tensor's initial value, or ``None``: the
        dimension whose reads below 0 return the initial value, and how many positions of
        history it holds (1 when the initial value drops that rank, else the size of the
        history rank that replaces it)."""
        return self._initial_axes.get(tensor)

    @cached_property
    def _initial_axes(self) -> dict[str, tuple[int, int]]:
        out = {}
        for name, spec in self.tensors.items():
            if spec.initial is None:
                continue
            init = self.tensors[spec.initial]
            if len(init.ranks) == len(spec.ranks) - 1:
                for p in range(len(spec.ranks)):
                    if spec.ranks[:p] + spec.ranks[p + 1 :] == init.ranks:
                        out[name] = (p, 1)
                        break
            else:
                for p, (a, b) in enumerate(zip(spec.ranks, init.ranks)):
                    if a != b:
                        out[name] = (p, self.size(b))
                        break
        return out

    def size(self, rank: str) -> int:
        return self.ranks[rank].size

    @cached_property
    def variable_sizes(self) -> dict[str, int]:
        return {r.lower(): rk.size for r, rk in self.ranks.items()}

    def shape(self, tensor: str) -> tuple[int, ...]:
        return tuple(self.size(r) for r in self.tensors[tensor].ranks)

    def elements(self, tensor: str) -> int:
        n = 1
        for s in self.shape(tensor):
            n *= s
        return n

    def nbytes(self, tensor: str) -> float:
        return self.elements(tensor) * self.tensors[tensor].stored_bytes_per_element

    def param_value(self, name: str) -> float:
        if name in self.params:
            return float(self.params[name])
        return float(self.ranks[name].size)

    # -- derived facts ---------------------------------------------------------------------
    def iteration_ranks(self, einsum: Einsum) -> tuple[str, ...]:
        return tuple(rank_of_variable(v) for v in einsum.iteration_variables)

    def output_ranks(self, einsum: Einsum) -> tuple[str, ...]:
        return self.tensors[einsum.name].ranks

    def recurrence(self, einsum: Einsum) -> tuple[str, int] | None:
        """``(generational rank, distance)`` if the Einsum reads its own output, else ``None``."""
        return self._recurrences.get(einsum.name)

    def generational_rank(self, einsum: Einsum) -> str | None:
        rec = self.recurrence(einsum)
        return rec[0] if rec else None

    @cached_property
    def _recurrences(self) -> dict[str, tuple[str, int]]:
        out = {}
        for e in self.einsums:
            rec = _recurrence_of(e, self.tensors[e.name])
            if rec:
                out[e.name] = (rec[0], rec[1] or self.size(rec[0]))  # 0: a history read
        return out

    def is_history_recurrence(self, einsum: Einsum) -> bool:
        """Whether the Einsum recurs by reading every earlier row (forward substitution)."""
        rec = _recurrence_of(einsum, self.tensors[einsum.name]) if self.recurrence(einsum) else None
        return rec is not None and rec[1] == 0

    def contracted_state_ranks(self, einsum: Einsum) -> tuple[str, ...]:
        """Ranks of a recurrence's own state that it reads whole at every step (a contracting
        read, ``H[b,i-1,g,r,p,m]``): a group holding it cannot tile them."""
        if self.recurrence(einsum) is None or self.is_history_recurrence(einsum):
            return ()
        ranks = self.tensors[einsum.name].ranks
        found: dict[str, None] = {}
        for acc in einsum.inputs:
            if acc.tensor == einsum.name:
                for p, (a, b) in enumerate(zip(acc.indices, einsum.output.indices)):
                    if a != b and a.plain_variable is not None:
                        found.setdefault(ranks[p])
        return tuple(found)

    @cached_property
    def generational_ranks(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for rank, _ in self._recurrences.values():
            seen.setdefault(rank)
        return tuple(seen)

    def kind(self, einsum: Einsum) -> str:
        return self._kinds[einsum.name]

    @cached_property
    def _kinds(self) -> dict[str, str]:
        return {e.name: _kind_of(self, e) for e in self.einsums}

    def external_tensors(self) -> tuple[str, ...]:
        """Tensors no Einsum produces: inputs, weights and incoming state."""
        return tuple(t for t in self.tensors if self.producer(t) is None)

    def tensors_with_role(self, role: Role) -> tuple[str, ...]:
        return tuple(t for t, spec in self.tensors.items() if spec.role == role)

    @cached_property
    def structure_key(self) -> tuple:
        """Everything about the cascade but its rank sizes and parameter values: the Einsums (with
        their accesses and expressions), the tensors, the rank names in order and the regions.
        Layers of one model family at other lengths, batches or widths share it."""
        return (self.einsums, tuple(self.tensors.items()), tuple(self.ranks), tuple(self.regions.items()))

    @cached_property
    def index_constants(self) -> Mapping[str, tuple[int, ...]]:
        """Per Einsum whose output or reads of other tensors index at a constant (a fixed
        position, the constant alone: the final state ``HN = H[b,2047,e,n]``) or with an offset
        (a constant beside variables: the conv state ``XI[b,j+2045,e]``, a decode step's cached
        keys ``K[b,t-2048,g,e]``): each such constant in the order its accesses are written
        (which of them are fixed positions, :attr:`position_free_key` keeps); the others are absent (a recurrence's reads of
        itself are its distance, not looked at here). A layer at another length has other
        constants there and nowhere else: :attr:`position_free_key` leaves them out."""
        out = {}
        for e in self.einsums:
            found = tuple(idx.const for a in (e.output, *e.inputs)
                          if a is e.output or a.tensor != e.name for idx in a.indices
                          if idx.const or not idx.terms)
            if found:
                out[e.name] = found
        return out

    def index_constants_of(self, einsums: Iterable[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """:attr:`index_constants` of the Einsums ``einsums`` that have any: with
        :attr:`position_free_key`, their accesses exactly (the key part of a per-group entry of
        :attr:`structure_memo` that holds accesses)."""
        constants = self.index_constants
        if not constants or constants.keys().isdisjoint(einsums):
            return ()
        return tuple((n, constants[n]) for n in einsums if n in constants)

    @cached_property
    def position_free_key(self) -> tuple:
        """:attr:`structure_key` with the index constants of :attr:`index_constants` left out:
        an offset beside variables by its sign, a fixed position (the constant alone) by which
        of the Einsum's fixed positions it equals (0, 1, ... in order of first appearance;
        -1 below 0). The layers of one family at other lengths, whose final-state, conv-state
        and cached-key reads name other positions, share it (their other Einsums are the same).
        A fact about a group that holds positions refers to where they are read, not to their
        values (:class:`~mambalaya.fusion.group_analysis.GroupAnalysis`), and one that holds
        the group's accesses is keyed by their constants too (:meth:`index_constants_of`);
        every other looks at constants only through their sign and which fixed positions of
        one Einsum are equal (a plain variable, an initial-value read, a selecting sink, a
        select-runner's position), which the replacement keeps."""
        def masked(e: Einsum):
            labels: dict[int, int] = {}

            def index(i: AffineIndex) -> AffineIndex:
                if i.terms:
                    return AffineIndex(i.terms, (i.const > 0) - (i.const < 0))
                return AffineIndex((), labels.setdefault(i.const, len(labels)) if i.const >= 0 else -1)

            def one(a: Access) -> Access:  # a recurrence's own reads stay as they are (its distance)
                if a.tensor == e.name and a is not e.output:
                    return a
                return Access(a.tensor, tuple(index(i) for i in a.indices))
            return Einsum(one(e.output), map_accesses(e.expr, one), e.reduce_op)

        einsums = tuple(masked(e) if e.name in self.index_constants else e for e in self.einsums)
        return (einsums, tuple(self.tensors.items()), tuple(self.ranks), tuple(self.regions.items()))

    @cached_property
    def structure_memo(self) -> dict:
        """A dict shared by every cascade of this :attr:`position_free_key`, for facts derived
        from the Einsums' accesses and the tensors alone, never from a rank size, a parameter
        value or the value of an index constant (what a candidate group reads and writes, the
        ranks its reads mention, its loop orders; a position is referred to by where it is
        read): a sweep's layers at other lengths, batches or widths reuse them. A fact that holds
        a group's accesses is keyed by their constants too (:meth:`index_constants_of`). The
        memos of the :data:`STRUCTURE_MEMOS` structures used last are kept."""
        key = self.position_free_key
        memo = _STRUCTURE_MEMOS.pop(key, None)
        if memo is None:
            memo = {}
            while len(_STRUCTURE_MEMOS) >= STRUCTURE_MEMOS:
                del _STRUCTURE_MEMOS[next(iter(_STRUCTURE_MEMOS))]
        _STRUCTURE_MEMOS[key] = memo  # the most recently used last
        return memo

    def output_tensors(self) -> tuple[str, ...]:
        """Tensors the cascade hands back: outputs and outgoing state."""
        return tuple(
            t
            for t, spec in self.tensors.items()
            if spec.role == Role.OUTPUT or (spec.role == Role.STATE and self.producer(t) is not None)
        )

    def parameters(self) -> int:
        """Weight elements."""
        return sum(self.elements(t) for t in self.tensors_with_role(Role.WEIGHT))


# ----------------------------------------------------------------------------------------------
# construction and validation
# ----------------------------------------------------------------------------------------------


def build_cascade(
    *,
    name: str,
    params: Mapping[str, float],
    ranks: Iterable[Rank],
    tensors: Iterable[TensorSpec],
    einsums: Iterable[Einsum],
    description: str = "",
    regions: Mapping[str, Iterable[str]] | None = None,
    source: str | None = None,
    einsum_lines: Mapping[str, int] | None = None,
    tensor_lines: Mapping[str, int] | None = None,
    rank_lines: Mapping[str, int] | None = None,
    param_lines: Mapping[str, int] | None = None,
) -> Cascade:
    """Check every rule of the IR and return the cascade with its Einsums in topological order.

    ``source`` and the ``*_lines`` maps (Einsum, tensor, rank or parameter name -> line) only
    make error messages point at the file being loaded.
    """
    lines = dict(einsum_lines or {})
    where = {"tensor": dict(tensor_lines or {}), "rank": dict(rank_lines or {}), "param": dict(param_lines or {})}

    def fail(
        message: str,
        einsum: str | None = None,
        *,
        tensor: str | None = None,
        rank: str | None = None,
        param: str | None = None,
    ) -> SpecError:
        line = lines.get(einsum) if einsum else None
        for kind, name in (("tensor", tensor), ("rank", rank), ("param", param)):
            if line is None and name is not None:
                line = where[kind].get(name)
        return SpecError(message, source=source, line=line, einsum=einsum)

    rank_table: dict[str, Rank] = {}
    for r in ranks:
        if not RANK_NAME.fullmatch(r.name):
            raise fail(
                f"rank name {r.name!r} must be upper case letters, digits or '_', starting with a letter",
                rank=r.name,
            )
        if r.name in rank_table:
            raise fail(f"rank {r.name} is declared twice", rank=r.name)
        if not isinstance(r.size, int) or isinstance(r.size, bool) or r.size < 1:
            raise fail(f"rank {r.name} has size {r.size!r}; a size is a positive integer", rank=r.name)
        if r.size > MAX_RANK_SIZE:
            raise fail(
                f"rank {r.name} has size {r.size:,}, above 2^53 = {MAX_RANK_SIZE:,}: the cost model counts trips and "
                "index ranges exactly only up to that size (element and byte counts stay exact Python integers)",
                rank=r.name)
        rank_table[r.name] = r

    for p, v in params.items():
        if not PARAM_NAME.fullmatch(p):
            raise fail(f"parameter name {p!r} is not an identifier", param=p)
        clash = next((r for r in rank_table if p in (r, rank_variable(r))), None)
        if clash is not None:  # (it meant the parameter in a value, the rank in an index, either in a size)
            raise fail(f"parameter {p} has the name of {'rank ' + clash if p == clash else 'the variable of rank ' + clash}; "
                       "a name means one thing: rename the parameter", param=p)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise fail(f"parameter {p} = {v!r} is not a number", param=p)

    tensor_table: dict[str, TensorSpec] = {}
    for t in tensors:
        _check_tensor(t, rank_table, tensor_table, fail)
        tensor_table[t.name] = t

    einsum_list = list(einsums)
    defined: dict[str, Einsum] = {}
    for e in einsum_list:
        if e.name in defined:
            raise fail(f"output tensor {e.name} is defined twice (by '{defined[e.name]}' and '{e}')", e.name)
        defined[e.name] = e
        _check_einsum(e, rank_table, tensor_table, params, fail)

    for t in tensor_table.values():
        _check_initial_and_updates(t, tensor_table, rank_table, fail)

    ordered = _topological_order(einsum_list, fail)
    region_table: dict[str, tuple[str, ...]] = {}
    for region, members in (regions or {}).items():
        members = tuple(members)
        if not PARAM_NAME.fullmatch(str(region)):
            raise fail(f"region name {region!r} is not an identifier")
        unknown = [m for m in members if m not in defined]
        if unknown or not members:
            raise fail(f"region {region} names {', '.join(map(repr, unknown)) or 'no Einsum'}, which is not an Einsum of the cascade")
        region_table[str(region)] = members
    cascade = Cascade(
        name=name,
        params=dict(params),
        ranks=rank_table,
        tensors=tensor_table,
        einsums=tuple(ordered),
        description=description,
        regions=region_table,
    )
    _check_roles(cascade, fail)
    _check_reach(cascade, fail)
    return cascade


def _check_tensor(t: TensorSpec, ranks: dict[str, Rank], seen: dict[str, TensorSpec], fail) -> None:
    if not TENSOR_NAME.fullmatch(t.name):
        raise fail(
            f"tensor name {t.name!r} must be letters, digits or '_', starting with an upper-case letter",
            tensor=t.name,
        )
    if t.name in seen:
        raise fail(f"tensor {t.name} is declared twice", tensor=t.name)
    for r in t.ranks:
        if r not in ranks:
            raise fail(
                f"tensor {t.name} uses rank {r!r}, which is not declared (ranks: {', '.join(ranks) or 'none'})",
                tensor=t.name,
            )
    if len(set(t.ranks)) != len(t.ranks):
        raise fail(f"tensor {t.name} lists a rank twice: {list(t.ranks)}", tensor=t.name)
    if not isinstance(t.bits, int) or isinstance(t.bits, bool) or t.bits < 1:
        raise fail(f"tensor {t.name} has bits={t.bits!r}; bits per element is a positive integer", tensor=t.name)
    if not isinstance(t.role, Role):
        raise fail(f"tensor {t.name} has role {t.role!r}; roles: {', '.join(r.value for r in Role)}", tensor=t.name)
    if t.mask is not None:
        _check_mask(t, fail)
        _check_rows_see_a_key(t, ranks, fail)


def _check_rows_see_a_key(t: TensorSpec, ranks: dict[str, Rank], fail) -> None:
    """A softmax's mask (``dead: -inf``) leaves every query at least one key: a row that sees
    none has a softmax of 0/0, which the cost model would count as no work and no bytes. (A mask
    of 0s may hide a whole row: its products are zeros, as a strictly-lower mask's at a chunk of 1.)"""
    m = t.mask
    if float(m.dead) != float("-inf"):
        return
    keys = ranks[m.col].size * (ranks[m.block].size if m.block is not None else 1)
    first, last = (m.offset, m.offset + ranks[m.row].size - 1) if m.row is not None else (0, 0)
    if m.row is None:  # the band lower <= k <= upper, the same for every query
        blind = (m.upper is not None and m.upper < 0) or (m.lower is not None and m.lower > keys - 1)
        where = "every query"
    else:  # query q sees max(0, q+lower) .. min(keys-1, q+upper)
        blind = (m.upper is not None and first + m.upper < 0) or (m.lower is not None and last + m.lower > keys - 1)
        q = first if m.upper is not None and first + m.upper < 0 else last
        where = f"query {q}"
    if blind:
        raise fail(f"tensor {t.name}'s mask ({m}) leaves {where} no key of the {keys:,} (dead -inf: its softmax would "
                   "be 0/0); check the bounds and offset against the ranks' sizes", tensor=t.name)


def _check_mask(t: TensorSpec, fail) -> None:
    """A mask is a constant input (role input, no Einsum writes it: :func:`_check_roles`) whose
    row, col and block are distinct ranks of it, with integer bounds, one of the dead values."""
    m = t.mask
    what = f"tensor {t.name}'s mask"
    if not isinstance(m, Mask):
        raise fail(f"{what} is a {type(m).__name__}, not a Mask", tensor=t.name)
    if t.role != Role.INPUT:
        raise fail(f"{what}: only a constant input (role input) is a mask; {t.name} is {t.role.value}", tensor=t.name)
    if not set(m.ranks) <= set(t.ranks) or len(set(m.ranks)) != len(m.ranks):
        raise fail(f"{what} names ranks {list(m.ranks)} (row, col, block); the tensor's are {list(t.ranks)}: "
                   "a mask's row, col and block are three of its ranks (it holds the same values along any other)",
                   tensor=t.name)
    for field_name in ("lower", "upper", "offset"):
        value = getattr(m, field_name)
        if (value is not None or field_name == "offset") and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(f"{what}: {field_name} is {value!r}, not an integer", tensor=t.name)
    if m.lower is None and m.upper is None:
        raise fail(f"{what} bounds no key (lower and upper both absent): it hides nothing; drop it", tensor=t.name)
    if m.lower is not None and m.upper is not None and m.lower > m.upper:
        raise fail(f"{what} has lower {m.lower} above upper {m.upper}: it hides every key", tensor=t.name)
    for field_name in ("row_tile", "col_tile"):
        value = getattr(m, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(f"{what}: {field_name} is {value!r}, not a positive integer", tensor=t.name)
    if m.row is None and m.offset:
        raise fail(f"{what} has an offset ({m.offset}) but no row rank: offset is the position of row 0", tensor=t.name)
    if isinstance(m.dead, bool) or not isinstance(m.dead, (int, float)) or float(m.dead) not in MASK_DEAD_VALUES:
        raise fail(f"{what}: dead is {m.dead!r}; a mask holds 0 or -inf where it hides a key", tensor=t.name)


def _check_access(acc: Access, e: Einsum, ranks, tensors, fail) -> None:
    if acc.tensor not in tensors:
        raise fail(f"tensor {acc.tensor} is not declared (in '{e}')", e.name)
    spec = tensors[acc.tensor]
    if len(acc.indices) != len(spec.ranks):
        raise fail(
            f"access {acc} has {len(acc.indices)} indices but tensor {acc.tensor} has "
            f"{len(spec.ranks)} ranks [{', '.join(spec.ranks)}]",
            e.name,
        )
    for idx, rank in zip(acc.indices, spec.ranks):
        for v in idx.variables:
            if rank_of_variable(v) not in ranks:
                raise fail(f"rank variable {v!r} in {acc} has no rank {rank_of_variable(v)} declared", e.name)
        if not idx.terms and idx.const >= ranks[rank].size:  # below 0 is a starting state or padding
            raise fail(f"position {idx.const} of {acc} is past the end of rank {rank} (0..{ranks[rank].size - 1}): "
                       "the access reads nothing, and the Einsum would run on zeros", e.name)
        plain = idx.plain_variable
        if plain is not None:
            own = ranks[rank_of_variable(plain)]
            if own.size != ranks[rank].size:
                raise fail(
                    f"rank used with two sizes: variable {plain} iterates {own.name} (size {own.size}) "
                    f"but indexes rank {rank} (size {ranks[rank].size}) of {acc.tensor} in {acc}",
                    e.name,
                )


def _check_einsum(e: Einsum, ranks, tensors, params, fail) -> None:
    if e.name not in tensors:
        raise fail(f"output tensor {e.name} is not declared", e.name)
    _check_access(e.output, e, ranks, tensors, fail)
    out_vars = []
    for idx in e.output.indices:
        v = idx.plain_variable
        if v is None:
            raise fail(f"output index {idx} of {e.output} must be a single rank variable", e.name)
        if v in out_vars:
            raise fail(f"output {e.output} uses variable {v} twice", e.name)
        out_vars.append(v)
    for node in walk(e.expr):
        if isinstance(node, Access):
            _check_access(node, e, ranks, tensors, fail)
        elif isinstance(node, Param) and node.name not in params and node.name not in ranks:
            variable = rank_of_variable(node.name) in ranks and node.name == rank_variable(rank_of_variable(node.name))
            raise fail(
                f"name {node.name!r} is neither a parameter ({', '.join(params) or 'none'}) nor a rank"
                + (f"; it is the variable of rank {rank_of_variable(node.name)}, an index, not a value (a value is a "
                   f"tensor's element, a constant, a parameter or a rank's size, {rank_of_variable(node.name)})"
                   if variable else ""),
                e.name,
            )
    if _has_self_access(e):
        _recurrence_of(e, tensors[e.name], fail)


def _check_reach(c: Cascade, fail) -> None:
    """A recurrence with an initial value reads back at most the history that value holds
    (:meth:`Cascade.initial_axis`: one step when it drops the rank, a history rank's size when one
    replaces it). Past it, its first steps read nothing and it ran on zeros without a word
    (``H[i-100]`` with ``H0``: the initial value was never read). Without an initial value, reads
    before the start are the zero state, as a recurrence over one position (a one-block softmax)
    reads it. Every other read of a tensor with an initial value is held to the same history
    (``Y[i] = XI[i-3]`` with a one-step initial value read zeros at its first two positions)."""
    sizes = c.variable_sizes
    for e in c.einsums:
        rec, initial = c.recurrence(e), c.tensors[e.name].initial
        if rec is not None and initial is not None and not c.is_history_recurrence(e):
            rank, distance = rec
            axis = c.initial_axis(e.name)
            depth = axis[1] if axis is not None else 1
            if distance > depth:
                raise fail(f"{e.name} reads itself {distance} steps back along {rank}, but its initial value {initial} "
                           f"holds {depth} step(s) of history: its first {distance - depth} step(s) would read nothing; "
                           f"give {initial} a history rank of {distance}", e.name)
        for acc in e.inputs:
            held, axis = c.tensors[acc.tensor].initial, c.initial_axis(acc.tensor)
            if acc.tensor == e.name or held is None or axis is None:
                continue
            dim, depth = axis
            first = acc.indices[dim].bounds(sizes)[0]
            if first < -depth:
                rank = c.tensors[acc.tensor].ranks[dim]
                raise fail(f"{e.name} reads {acc} back to position {first} of {rank}, but {acc.tensor}'s initial value "
                           f"{held} holds {depth} step(s) of history: positions before {-depth} would read nothing; "
                           f"give {held} a history rank of {-first}", e.name)


def _has_self_access(e: Einsum) -> bool:
    return any(a.tensor == e.name for a in e.inputs)


def _recurrence_of(e: Einsum, spec: TensorSpec, fail=None) -> tuple[str, int] | None:
    """The generational rank and distance of a recurrence (distance 0: a history read, see the
    module docstring); ``None`` if ``e`` is not one."""
    found: tuple[str, int] | None = None
    outs = set(e.output_variables)
    for acc in e.inputs:
        if acc.tensor != e.name:
            continue
        shifted: list[tuple[int, int]] = []
        other: list[int] = []
        ok = True
        for p, (a, b) in enumerate(zip(acc.indices, e.output.indices)):
            if a == b:
                continue
            sv = a.shifted_variable()
            if sv is not None and sv[0] == b.plain_variable and sv[1] <= -1:
                shifted.append((p, -sv[1]))
            elif a.plain_variable is not None and a.plain_variable not in outs:
                other.append(p)
            else:
                ok = False
        candidate: tuple[str, int] | None = None
        if ok and len(shifted) == 1:  # v-c, possibly contracting other dimensions
            candidate = (spec.ranks[shifted[0][0]], shifted[0][1])
        elif ok and not shifted and len(other) == 1:  # a history read
            candidate = (spec.ranks[other[0]], 0)
        if candidate is None:
            if fail is None:
                return None
            raise fail(
                f"{e.name} reads itself at {acc}: a recurrence must read its own output at an earlier "
                f"index (v-1, v-2, ...) of exactly one rank and elsewhere at the output's indices or at "
                "reduced variables (a contraction of the previous state), or read one rank at a reduced "
                "variable and every other at the output's indices (a history read); any other "
                "self-reference is a cycle",
                e.name,
            )
        if found is not None and (found[0] != candidate[0] or (found[1] == 0) != (candidate[1] == 0)):
            if fail is None:
                return None
            raise fail(f"{e.name} recurs over two ranks or in two ways ({found[0]} and {candidate[0]}); one is allowed",
                       e.name)
        found = candidate if found is None else (found[0], max(found[1], candidate[1]))
    return found


def _check_initial_and_updates(t: TensorSpec, tensors, ranks, fail) -> None:
    if t.initial is not None:
        init = tensors.get(t.initial)
        if init is None:
            raise fail(f"tensor {t.name} has initial value {t.initial!r}, which is not declared", tensor=t.name)
        dropped = len(t.ranks) - len(init.ranks)
        same_len_diff = [p for p, (a, b) in enumerate(zip(t.ranks, init.ranks)) if a != b]
        ok = (dropped == 1 and any(t.ranks[:p] + t.ranks[p + 1 :] == init.ranks for p in range(len(t.ranks)))) or (
            dropped == 0 and len(same_len_diff) == 1
        )
        if not ok:
            raise fail(
                f"initial value {t.initial} [{', '.join(init.ranks)}] of {t.name} [{', '.join(t.ranks)}] must have "
                f"{t.name}'s ranks with one rank removed or replaced by a history rank",
                tensor=t.name,
            )
    if t.updates is not None:
        target = tensors.get(t.updates)
        if target is None:
            raise fail(f"tensor {t.name} updates {t.updates!r}, which is not declared", tensor=t.name)
        if target.role != Role.STATE:
            raise fail(
                f"tensor {t.name} updates {t.updates}, whose role is {target.role.value}, not state", tensor=t.name
            )
        extra = [r for r in t.ranks if r not in target.ranks]
        missing = [r for r in target.ranks if r not in t.ranks]
        if missing or any(ranks[r].size != 1 for r in extra):
            raise fail(
                f"tensor {t.name} [{', '.join(t.ranks)}] cannot update state {t.updates} [{', '.join(target.ranks)}]: "
                "it must have the state's ranks plus only ranks of size 1",
                tensor=t.name,
            )


def stable_topological_order(names: list[str], deps: Mapping[str, set[str]]) -> tuple[list[str], list[str]]:
    """Kahn's algorithm, always taking the first ready name in the given order: the names in a
    dependency-respecting order, and the names left over when a cycle blocks the rest."""
    done: list[str] = []
    placed: set[str] = set()
    pending = list(names)
    while pending:
        ready = next((n for n in pending if deps[n] <= placed), None)
        if ready is None:
            break
        done.append(ready)
        placed.add(ready)
        pending.remove(ready)
    return done, pending


def _topological_order(einsums: list[Einsum], fail) -> list[Einsum]:
    produced = {e.name for e in einsums}
    deps = {e.name: {t for t in e.input_tensors if t in produced and t != e.name} for e in einsums}
    order, stuck = stable_topological_order([e.name for e in einsums], deps)
    if stuck:
        raise fail(
            f"the Einsums {', '.join(stuck)} form a cycle that is not a recurrence (only an Einsum reading its own "
            "output at an earlier index may close a loop)",
            stuck[0],
        )
    by_name = {e.name: e for e in einsums}
    return [by_name[n] for n in order]


def _check_roles(c: Cascade, fail) -> None:
    for t, spec in c.tensors.items():
        produced = c.producer(t) is not None
        if spec.role in (Role.INPUT, Role.WEIGHT) and produced:
            raise fail(f"tensor {t} has role {spec.role.value} but Einsum {t} writes it", t)
        if spec.role in (Role.INTERMEDIATE, Role.OUTPUT) and not produced:
            raise fail(f"tensor {t} has role {spec.role.value} but no Einsum writes it", tensor=t)
        if spec.role == Role.INTERMEDIATE and not c.consumers(t):
            raise fail(f"intermediate tensor {t} is never read; declare it an output", t)
        if spec.role == Role.WEIGHT and not c.consumers(t):  # it would count among the parameters
            raise fail(f"weight {t} is never read: the layer's parameters would count its "
                       f"{c.elements(t):,} elements; read it or drop it", tensor=t)


# ----------------------------------------------------------------------------------------------
# kinds
# ----------------------------------------------------------------------------------------------


def _kind_of(c: Cascade, e: Einsum) -> str:
    if c.recurrence(e):
        return "recurrent"
    reduced = set(e.reduced_variables)
    out_vars = set(e.output_variables)
    for acc in e.inputs:
        for idx, rank in zip(acc.indices, c.tensors[acc.tensor].ranks):
            vs = set(idx.variables)
            # a window slides along the dimension's own rank (i+k-3); c*Q+s only re-indexes it
            if len(vs) > 1 and rank.lower() in vs and vs & reduced and vs & out_vars:
                return "window"
    if reduced:
        if any(c.tensors[a.tensor].role == Role.WEIGHT for a in e.inputs):
            return "gemm"
        return "reduction"
    if any(isinstance(n, Unary) and n.fn != "neg" for n in walk(e.expr)):
        return "unary"
    if len(e.inputs) == 1 and e.expr == e.inputs[0]:
        return "copy"
    if any(set(a.variables) != out_vars for a in e.inputs):
        return "broadcast"
    return "elementwise"
