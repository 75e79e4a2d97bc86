"""Sequence parallelism for long prefills: a layer's positions split across devices, each device
scanning its part and passing its state on.

**What splits** (:func:`sequence_ranks`): the position ranks, recognised by the size expression
the builders write for them (:data:`SEQUENCE_SIZE_EXPRESSIONS`: ``L``, and the chunked scan's
``ceil(L/chunk_size)``, split together so a device's chunks hold its positions). Device ``d`` of
``N`` holds positions ``d L/N`` to ``(d+1) L/N - 1`` of every sequence of the batch, and every
weight whole.

**What crosses, by the algebra** (:func:`check_sequence_split` refuses anything else, naming the
Einsum):

* a read of earlier positions at a fixed distance (a causal convolution's window, ``XI[b,i+k-3,e]``)
  needs the previous device's last positions: a *halo* (:func:`halos`), sent once per layer, the
  tensor's ``initial`` on the device (a conv state where the layer has one);
* a recurrence along a split rank, first order and linear with an elementwise coefficient
  (``H[t] = A[t] H[t-1] + B[t]``: Mamba-1's and Mamba-2's scans, the chunked scan's state passing
  ``HC``) crosses as its state (:func:`crossings`), the two-pass scheme of the Mamba-2 paper's
  context parallelism (Dao and Gu, arXiv 2405.21060, section 8.2): each device scans its part
  from a zero state, and also the product of its coefficients ``P[t] = A[t] P[t-1]`` (from ones);
  then the states pass along the devices, device ``d`` sending ``H_d[last] + P_d[last] h_in`` to
  the next (``N - 1`` sends of one state, one after the other); then each device corrects every
  reader of the state, which is linear in it, by the reader applied to ``P[t] h_in`` (the true
  state is ``H[t] + P[t] h_in``), and runs what follows. The correction (``<reader>_C``) and the
  corrected sum (``<reader>_T``) are Einsums of the device's cascade
  (:func:`sequence_device_cascade`), cut from the first pass at the tensors that wait for the
  incoming state (written off chip and read back, ``<name>_SP``), so no mapping fuses work that
  needs the incoming state with work that must finish before it is sent;
* a read of the last positions of the sequence (a final state ``HN``, a conv state ``CSN``) reads
  the device's own last positions: the last device's are the layer's.

Refused: a sum or maximum over a split rank (attention over keys: ring attention is not
modelled), a read at another fixed position, a recurrence along a split rank that is not of the
form above (Gated DeltaNet's state update contracts the state), a reader not linear in a crossing
state.

**The latency** (:class:`SequenceParallelCost`): per layer, the device's cascade (its part, the
products, the corrections) on one device of the design, plus the halo (one send per tensor) and
the ``N - 1`` state sends, each a link transfer, on the critical path (not overlapped: an
assumption on the safe side). Every device does the same work, the last waits longest.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mambalaya.cost.pipeline import LayerSplitCost
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import (Access, AffineIndex, Binary, Const, Einsum, Rank, Role, TensorSpec, accesses,
                                 additive_terms, expr_variables, map_accesses, product_factors, rank_of_variable,
                                 rank_variable)
from mambalaya.errors import SpecError

#: The size expressions (as the layer builders write them) of the position ranks sequence
#: parallelism splits, with what each rank is.
SEQUENCE_SIZE_EXPRESSIONS: Mapping[str, str] = {"L": "positions", "ceil(L/chunk_size)": "chunks of positions"}
#: Suffixes of a device cascade's own tensors: the incoming state, the coefficients' running
#: product and its start, a reader's correction and corrected value, a first-pass tensor read
#: after the state arrives, a halo.
INCOMING, PRODUCT, PRODUCT_START, CORRECTION, CORRECTED, CUT, HALO = "_IN", "_P", "_P0", "_C", "_T", "_SP", "_HALO"


def sequence_ranks(cascade: Cascade) -> tuple[str, ...]:
    """The position ranks of ``cascade`` (see the module doc), in the cascade's rank order."""
    return tuple(n for n, r in cascade.ranks.items() if r.size_expr in SEQUENCE_SIZE_EXPRESSIONS)


@dataclass(frozen=True)
class Crossing:
    """A recurrence along a split rank: Einsum ``einsum`` over ``rank``, ``coefficient`` the
    factors of its term in its previous value, ``incoming`` the tensor that holds the state a
    device starts from (the layer's own initial state on the first device)."""

    einsum: str
    rank: str
    coefficient: tuple
    incoming: str


@dataclass(frozen=True)
class Halo:
    """What a device receives from the one before it for a tensor read at earlier positions:
    ``positions`` of ``tensor`` along ``rank``, ``bytes`` in all."""

    tensor: str
    rank: str
    positions: int
    bytes: float


def _split_variables(split: frozenset[str]) -> set[str]:
    return {rank_variable(r) for r in split}


def _index_kind(index: AffineIndex, rank: str, cascade: Cascade, split: frozenset[str]) -> str | None:
    """How an index along split rank ``rank`` reads: ``own`` (the device's positions: its own
    variable, or a chunk's ``Q c + q``), ``earlier`` (its own and up to a fixed distance back:
    a shift or a causal window ``i + k - 3``), ``last`` (the sequence's last positions), ``other``
    (every position, or another split rank's: attention's keys) or None (anything else)."""
    size = cascade.size(rank)
    splits = [(v, c) for v, c in index.terms if rank_of_variable(v) in split]
    inner = [(w, k) for w, k in index.terms if rank_of_variable(w) not in split]
    span = sum(k * (cascade.size(rank_of_variable(w)) - 1) for w, k in inner)
    if not splits:  # the sequence's last positions, within the last device's part (of two devices at least)
        lo, hi = index.bounds({v: cascade.size(rank_of_variable(v)) for v in index.variables})
        if lo <= 0 and hi >= size - 1 and size > 1:
            return "other"
        return "last" if hi == size - 1 and lo >= size - size // 2 else None
    if len(splits) != 1 or any(k <= 0 for _, k in inner):
        return None
    v, c = splits[0]
    if rank_of_variable(v) != rank and c == 1:
        return "other"
    if rank_of_variable(v) == rank and c == 1:
        if index.const == 0 and not inner:
            return "own"
        return "earlier" if index.const < 0 and index.const + span <= 0 else None
    if index.const == 0 and c * cascade.size(rank_of_variable(v)) == size and span < c:
        return "own"
    return None


def check_sequence_split(cascade: Cascade, split: Iterable[str]) -> tuple[Crossing, ...]:
    """The crossing recurrences of ``cascade`` with its position ranks ``split`` across devices,
    or a :class:`~mambalaya.errors.SpecError` naming the Einsum that cannot be split (see the
    module doc)."""
    ranks = frozenset(split)
    variables = _split_variables(ranks)
    for e in cascade.einsums:
        summed = {rank_of_variable(v) for v in e.reduced_variables} & ranks
        if summed:
            raise SpecError(f"Einsum {e.name} {'maximises' if e.reduce_op == 'max' else 'sums'} over rank "
                            f"{', '.join(sorted(summed))} ({SEQUENCE_SIZE_EXPRESSIONS[cascade.ranks[min(summed)].size_expr]}), "
                            "which sequence parallelism splits: every device would need every other's positions "
                            "(attention across devices, ring attention, is not modelled)")
        for access in (e.output, *e.inputs):
            for rank, index in zip(cascade.tensors[access.tensor].ranks, access.indices):
                if rank in ranks:
                    kind = _index_kind(index, rank, cascade, ranks)
                    if kind == "other":
                        raise SpecError(f"Einsum {e.name} reads {access} at every position of rank {rank}, which "
                                        "sequence parallelism splits: each device would need every other's positions "
                                        "(attention across devices, ring attention, is not modelled)")
                    if kind is None or (access is e.output and kind != "own"):
                        raise SpecError(f"Einsum {e.name} reads {access} at {index} along rank {rank}, which sequence "
                                        "parallelism splits: only a device's own positions, positions a fixed "
                                        "distance back and the sequence's last ones can be read")
                elif set(index.variables) & variables:
                    raise SpecError(f"Einsum {e.name} indexes rank {rank} of {access.tensor} by a position: a device "
                                    "holds only its part of the positions")
    return tuple(_crossing(cascade, e, ranks) for e in cascade.einsums
                 if (rec := cascade.recurrence(e)) is not None and rec[0] in ranks)


def _crossing(cascade: Cascade, e: Einsum, split: frozenset[str]) -> Crossing:
    rank, distance = cascade.recurrence(e)
    own = [(s, t) for s, t in additive_terms(e.expr) if any(a.tensor == e.name for a in accesses(t))]
    refused = SpecError(f"Einsum {e.name} is a recurrence along rank {rank}, which sequence parallelism splits, "
                        "but not first order and linear with an elementwise coefficient (H[t] = A[t]*H[t-1] + B[t]): "
                        "its state cannot pass between devices as one tensor")
    if distance != 1 or len(own) != 1 or own[0][0] != 1 or cascade.is_history_recurrence(e):
        raise refused
    factors = product_factors(own[0][1])
    selves = [f for f in factors if isinstance(f, Access) and f.tensor == e.name]
    if (len(selves) != 1 or len(accesses(own[0][1])) != len(factors)
            or any(a.tensor == e.name for f in factors if f is not selves[0] for a in accesses(f))):
        raise refused
    expected = tuple(AffineIndex.var(v, -1 if rank_of_variable(v) == rank else 0) for v in e.output_variables)
    if selves[0].indices != expected:
        raise refused
    spec = cascade.tensors[e.name]
    return Crossing(e.name, rank, tuple(f for f in factors if f is not selves[0]), spec.initial or e.name + INCOMING)


def halos(cascade: Cascade, split: Iterable[str]) -> tuple[Halo, ...]:
    """What each device receives from the one before it for the tensors read at earlier positions
    along a split rank (recurrences excepted: their state crosses, :func:`crossings`)."""
    ranks = frozenset(split)
    deepest: dict[tuple[str, str], int] = {}
    for e in cascade.einsums:
        for access in e.inputs:
            producer = cascade.producer(access.tensor)
            recurrence = cascade.recurrence(producer) if producer is not None else None
            for rank, index in zip(cascade.tensors[access.tensor].ranks, access.indices):
                if recurrence is not None and recurrence[0] == rank:
                    continue  # a crossing state: it passes along the devices instead
                if rank in ranks and _index_kind(index, rank, cascade, ranks) == "earlier":
                    lo = index.bounds({v: cascade.size(rank_of_variable(v)) for v in index.variables})[0]
                    key = (access.tensor, rank)
                    deepest[key] = max(deepest.get(key, 0), -lo)
    out = []
    for (tensor, rank), depth in deepest.items():
        spec = cascade.tensors[tensor]
        row = math.prod(cascade.size(r) for r in spec.ranks if r != rank)
        out.append(Halo(tensor, rank, depth, depth * row * spec.stored_bytes_per_element))
    return tuple(out)


def crossings(cascade: Cascade) -> tuple[Crossing, ...]:
    """The recurrences whose state passes between the devices (checked, :func:`check_sequence_split`)."""
    return check_sequence_split(cascade, sequence_ranks(cascade))


def state_bytes(cascade: Cascade, crossing: Crossing) -> float:
    """Bytes of one crossing state: the recurrence's tensor at one position."""
    spec = cascade.tensors[crossing.einsum]
    return math.prod(cascade.size(r) for r in spec.ranks if r != crossing.rank) * spec.stored_bytes_per_element


def sequence_device_cascade(cascade: Cascade, devices: int) -> Cascade:
    """Each of ``devices`` devices' part of ``cascade`` (see the module doc): every position rank
    at its size over ``devices`` (which must divide it), halos as the tensors' initial values,
    each crossing recurrence started from zero with its coefficients' product beside it, every
    reader of a crossing state corrected, and the cascade cut where work waits for the incoming
    state. One device is ``cascade`` itself."""
    split = frozenset(sequence_ranks(cascade))
    found = check_sequence_split(cascade, split)
    if devices == 1 or not split:
        return cascade
    for name in split:
        if cascade.size(name) % devices:
            raise SpecError(f"sequence parallelism over {devices} devices splits rank {name} "
                            f"({SEQUENCE_SIZE_EXPRESSIONS[cascade.ranks[name].size_expr]}, {cascade.size(name)}) into "
                            f"equal parts, and {devices} does not divide {cascade.size(name)}")
    sizes = {name: cascade.size(name) // devices for name in split}
    received = halos(cascade, split)
    for halo in received:  # a halo comes from the one device before, so it must hold that many
        if halo.positions > sizes[halo.rank]:
            raise SpecError(f"sequence parallelism over {devices} devices gives each {sizes[halo.rank]} of rank "
                            f"{halo.rank}'s positions, fewer than the {halo.positions} earlier positions of {halo.tensor} "
                            "a device reads (its halo would span several devices); use fewer devices or a longer sequence")
    tensors = dict(cascade.tensors)
    ranks = dict(cascade.ranks)
    einsums = [dataclasses.replace(e, expr=_own_last(e.expr, cascade, split, sizes),
                                   output=_own_last(e.output, cascade, split, sizes)) for e in cascade.einsums]
    for halo in received:  # the previous device's last positions (a conv state where there is one)
        spec = tensors[halo.tensor]
        if spec.initial is None:
            history = _history_rank(ranks, halo.positions)
            name = halo.tensor + HALO
            tensors[name] = TensorSpec(name, tuple(history if r == halo.rank else r for r in spec.ranks), Role.INPUT,
                                       spec.bits, description=f"the previous device's last {halo.positions} positions "
                                       f"of {halo.tensor}")
            tensors[halo.tensor] = dataclasses.replace(spec, initial=name)
    for c in found:
        einsums = _corrected(einsums, tensors, cascade, c)
    return _cut(cascade, ranks, tensors, einsums, sizes, devices, frozenset(c.incoming for c in found))


def _own_last(node, cascade: Cascade, split: frozenset[str], sizes: Mapping[str, int]):
    """An access (or an expression's accesses) with every read of the sequence's last positions
    along a split rank moved to the device's own last positions."""
    def move(access: Access) -> Access:
        indices = []
        for rank, index in zip(cascade.tensors[access.tensor].ranks, access.indices):
            if rank in split and _index_kind(index, rank, cascade, split) == "last":
                lo = index.bounds({v: cascade.size(rank_of_variable(v)) for v in index.variables})[0]
                if cascade.size(rank) - lo > sizes[rank]:
                    raise SpecError(f"{access} reads the last {cascade.size(rank) - lo} positions of rank {rank}, more "
                                    f"than the last device's {sizes[rank]}; use fewer devices or a longer sequence")
                index = AffineIndex(index.terms, index.const - (cascade.size(rank) - sizes[rank]))
            indices.append(index)
        return dataclasses.replace(access, indices=tuple(indices))
    return move(node) if isinstance(node, Access) else map_accesses(node, move)


def _history_rank(ranks: dict[str, Rank], depth: int) -> str:
    """A rank of ``depth`` positions for a halo: the layer's conv-state rank ``J`` where it has that
    depth, else a new one."""
    for name, rank in ranks.items():
        if rank.size == depth and rank.size_expr == "d_conv-1":
            return name
    name = next(n for n in (f"H{k}" for k in range(1, 100)) if n not in ranks)
    ranks[name] = Rank(name, depth, str(depth))
    return name


def _corrected(einsums: list[Einsum], tensors: dict[str, TensorSpec], cascade: Cascade, c: Crossing) -> list[Einsum]:
    """``einsums`` with the crossing recurrence ``c`` started from zero, its coefficients' running
    product ``<X>_P`` (from ones, ``<X>_P0``) beside it, and every reader of ``X`` followed by its
    correction ``<R>_C`` (the reader on ``<X>_P * <X>_IN``) and the corrected ``<R>_T``, which
    the reader's readers read instead. The product has the ranks its coefficients have (and the
    crossing rank), not the state's: Mamba-2's decay ``CD[b,c,g,r]`` makes one value per chunk
    and head, where a product of the state's shape wrote and read 8.6 GB a layer per device."""
    x, spec = c.einsum, tensors[c.einsum]
    state = tuple(r for r in spec.ranks if r != c.rank)
    incoming = c.incoming
    if spec.initial is None:
        tensors[incoming] = TensorSpec(incoming, state, Role.INPUT, spec.bits,
                                       description=f"the state of {x} the previous device passes on")
    tensors[x] = dataclasses.replace(spec, initial=None)  # each device scans its part from zero
    product, start = x + PRODUCT, x + PRODUCT_START
    own = next(e for e in einsums if e.name == x)
    coefficient_ranks = {rank_of_variable(v) for f in c.coefficient for v in expr_variables(f)}
    kept = [d for d, r in enumerate(spec.ranks) if r == c.rank or r in coefficient_ranks]
    product_ranks = tuple(spec.ranks[d] for d in kept)
    tensors[start] = TensorSpec(start, tuple(r for r in product_ranks if r != c.rank), Role.INPUT, spec.bits,
                                description=f"ones: {product}'s start")
    tensors[product] = TensorSpec(product, product_ranks, Role.INTERMEDIATE, spec.bits, initial=start,
                                  description=f"the running product of {x}'s coefficients on this device")
    previous = Access(product, tuple(AffineIndex.var(own.output_variables[d], -1 if spec.ranks[d] == c.rank else 0)
                                     for d in kept))
    coefficient = previous
    for factor in c.coefficient:
        coefficient = Binary("*", coefficient, factor)
    out: list[Einsum] = []
    renamed: dict[str, str] = {}
    for e in einsums:
        e = dataclasses.replace(e, expr=map_accesses(e.expr, lambda a: dataclasses.replace(a, tensor=renamed[a.tensor])
                                                      if a.tensor in renamed else a))
        out.append(e)
        if e.name == x:
            out.append(Einsum(Access(product, tuple(own.output.indices[d] for d in kept)), coefficient))
            continue
        if x not in e.input_tensors:
            continue
        terms = [(s, t) for s, t in additive_terms(e.expr) if any(a.tensor == x for a in accesses(t))]
        for _, t in terms:
            if sum(1 for f in product_factors(t) if isinstance(f, Access) and f.tensor == x) != 1 or sum(
                    1 for a in accesses(t) if a.tensor == x) != 1:
                raise SpecError(f"Einsum {e.name} reads the state {x} other than linearly: the incoming state cannot "
                                "be added to it afterwards (sequence parallelism corrects a reader linear in the state)")
        if e.reduce_op != "sum" or cascade.recurrence(e) is not None:
            raise SpecError(f"Einsum {e.name} reads the state {x} in a {'recurrence' if cascade.recurrence(e) else e.reduce_op + '-reduction'}: "
                            "sequence parallelism corrects a sum linear in the state")
        correction = None
        for sign, t in terms:
            t = map_accesses(t, lambda a: Binary("*", Access(product, tuple(a.indices[d] for d in kept)),
                                                 _state_access(a, cascade, c)) if a.tensor == x else a)
            if correction is None:
                correction = t if sign > 0 else Binary("-", Const(0.0), t)
            else:
                correction = Binary("+" if sign > 0 else "-", correction, t)
        fixed, total = e.name + CORRECTION, e.name + CORRECTED
        base = tensors[e.name]
        tensors[fixed] = TensorSpec(fixed, base.ranks, Role.INTERMEDIATE, base.bits,
                                    description=f"{e.name}'s share of the incoming state of {x}")
        tensors[total] = dataclasses.replace(base, name=total, description=f"{e.name} with the incoming state of {x}")
        tensors[e.name] = dataclasses.replace(base, role=Role.INTERMEDIATE, updates=None,
                                              description=f"{e.name} from this device's part of {x}")
        same = Access(e.name, e.output.indices)
        out.append(Einsum(Access(fixed, e.output.indices), correction))
        out.append(Einsum(Access(total, e.output.indices), Binary("+", same, Access(fixed, e.output.indices))))
        renamed[e.name] = total
    return out


def _state_access(access: Access, cascade: Cascade, c: Crossing) -> Access:
    """The incoming state at ``access``'s indices but along the crossing rank."""
    ranks = cascade.tensors[access.tensor].ranks
    return Access(c.incoming, tuple(i for r, i in zip(ranks, access.indices) if r != c.rank))


def _cut(cascade: Cascade, ranks: dict[str, Rank], tensors: dict[str, TensorSpec], einsums: list[Einsum],
         sizes: Mapping[str, int], devices: int, incoming: frozenset[str]) -> Cascade:
    """The device cascade, cut where work waits for the incoming state: an Einsum that reads an
    incoming state (directly or through others) runs after it arrives; a tensor the first pass
    makes and such an Einsum reads is written off chip and read back (``<name>_SP``)."""
    late: set[str] = set()
    for e in einsums:
        if set(e.input_tensors) & (late | incoming):
            late.add(e.name)
    early = {e.name for e in einsums} - late
    cut = {t: t + CUT for t in sorted({t for e in einsums if e.name in late for t in e.input_tensors if t in early})}
    out_einsums = [dataclasses.replace(e, expr=map_accesses(e.expr, lambda a: dataclasses.replace(a, tensor=cut[a.tensor])
                                                            if a.tensor in cut else a)) if e.name in late else e
                   for e in einsums]
    out_tensors = []
    for name, spec in tensors.items():
        out_tensors.append(dataclasses.replace(spec, role=Role.OUTPUT) if name in cut else spec)
        if name in cut:
            out_tensors.append(dataclasses.replace(spec, name=cut[name], role=Role.INPUT, updates=None,
                                                   description=f"{name}, written before the incoming state arrives"))
    resized = [dataclasses.replace(r, size=sizes[n], size_expr=f"({r.size_expr})/{devices}") if n in sizes else r
               for n, r in ranks.items()]
    return build_cascade(name=cascade.name, params=cascade.params, ranks=resized, tensors=out_tensors,
                         einsums=out_einsums, description=f"{cascade.description}; sequence parallel: one of "
                         f"{devices} devices' positions", regions=cascade.regions)


@dataclass(frozen=True)
class SequenceParallelLayers:
    """One layer type of a sequence-parallel model: ``count`` layers, each ``layer_s`` seconds on
    a device (its positions, products and corrections) plus ``transfer_s`` seconds of halos and
    state sends (``halo_bytes`` and ``state_bytes`` a device receives) and their ``transfer_j``
    joules over all devices (None where the links have no energy)."""

    count: int
    layer_s: float
    halos: tuple[Halo, ...]
    crossings: tuple[Crossing, ...]
    halo_bytes: float
    state_bytes: float
    transfer_s: float
    transfer_j: float | None

    @property
    def interconnect_s(self) -> float:
        return self.transfer_s

    @property
    def interconnect_j(self) -> float | None:
        return self.transfer_j

    @property
    def moved_bytes(self) -> float:
        """Bytes a device (the last) receives in one layer: its halos and one state."""
        return self.halo_bytes + self.state_bytes


@dataclass(frozen=True)
class SequenceParallelCost(LayerSplitCost):
    """A model sequence parallel over ``devices``: every device runs every layer on its positions;
    each layer waits for its halos and for the states passed along the devices."""

    strategy = "sequence"


def sequence_parallel_layers(system, cascade: Cascade, devices: int, *, count: int, layer_s: float) -> SequenceParallelLayers:
    """A layer type's :class:`SequenceParallelLayers`: ``cascade`` is the whole layer, ``layer_s``
    its device cascade's seconds on one device. The halos go in parallel (one send per tensor, a
    device receiving its own); the states one after another, ``devices - 1`` sends of every
    crossing state."""
    split = sequence_ranks(cascade)
    found = check_sequence_split(cascade, split)
    sent = halos(cascade, split)
    halo_b = sum(h.bytes for h in sent)
    state_b = sum(state_bytes(cascade, c) for c in found)
    seconds = sum(system.transfer_s(h.bytes) for h in sent) + (devices - 1) * (
        system.transfer_s(state_b) if found else 0.0)
    moved = (devices - 1) * (halo_b + state_b)  # every device but the first receives them
    joules = system.transfer_j(moved) if system.link_energy_pj_per_bit is not None else None
    return SequenceParallelLayers(count, layer_s, sent, found, halo_b, state_b, seconds if devices > 1 else 0.0,
                                  joules if devices > 1 else (0.0 if joules is not None else None))


__all__ = ["CORRECTED", "CORRECTION", "CUT", "Crossing", "HALO", "Halo", "INCOMING", "PRODUCT", "PRODUCT_START",
           "SEQUENCE_SIZE_EXPRESSIONS", "SequenceParallelCost", "SequenceParallelLayers", "check_sequence_split",
           "crossings", "halos", "sequence_device_cascade", "sequence_parallel_layers", "sequence_ranks", "state_bytes"]
