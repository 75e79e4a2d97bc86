"""Tensor parallelism: a layer's heads and channels split across devices, an all-reduce wherever
an Einsum sums over a split rank.

**What splits** (:func:`tensor_parallel_ranks`): the ranks of a layer's heads and inner
channels, recognised by the size expression its builder wrote for them
(:data:`SPLIT_SIZE_EXPRESSIONS`: Mamba-1's inner channels, Mamba-2's heads, attention's
key/value heads with their query heads, Gated DeltaNet's heads, an MLP's or expert's
intermediate channels), the layout of Megatron-LM's tensor parallelism (Shoeybi et al., arXiv
1909.08053: column-parallel projections in, row-parallel projections out) and of
state-spaces/mamba's ``mamba_ssm/distributed`` layers for Mamba. Every other rank (batch,
positions, the model width ``D``, state size, head dimension, groups) is whole on every device:
an Einsum without a split rank runs on every device, whole (Mamba-2's ``B`` and ``C`` with one
group, the norms, the residual).

**Each device's layer** (:func:`device_cascade`) is the cascade with every split rank's size
divided by the device count: the same Einsums on a part of the heads and channels. Its cost on
one device of the design is the layer's cost per device.

**Collectives** (:func:`all_reduces`), by the algebra: an Einsum that reduces over a split rank
leaves on each device the sum over its part only (the out-projection's partial products, the
partial sum of squares of a norm over the whole inner width, Mamba-1's ``x_proj`` over the
channels); its output is summed over the devices (a max-reduction: maximised), an all-reduce,
before any Einsum reads it. Nothing else crosses devices.

**What a split forbids** (:func:`check_split`, each refusal naming the Einsum): an access that
reads a split rank at anything but a split rank's own plain variable (a shifted or constant
index would read another device's part); an Einsum that reduces over one split rank and keeps
another in its output (the partial sums of one device would miss the other devices' parts); a
recurrence along a split rank (each step would wait for another device).

**An all-reduce's time** (:func:`all_reduce_algorithm`): the fastest of the algorithms the
system offers, as NCCL's tuner picks one per size (NVIDIA/nccl ``src/graph/tuning.cc``): a
ring (``2 (N-1)`` steps, each device sending ``2 (N-1)/N`` times the bytes: the factor
nccl-tests' bus bandwidth is defined with, doc/PERFORMANCE.md), a one-shot exchange (one step,
each device sending its buffer to the ``N-1`` others: the small messages' algorithm) and, where
the switch reduces in flight (``system.in_network_reduction``: NVLink SHARP, NCCL's NVLS), an
in-network reduction (two steps, each device sending its bytes once). Each step pays the
link's latency, each call the collective's fixed cost (``system.collective_latency_s``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mambalaya.cost.pipeline import LayerSplitCost
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import (Access, Binary, Const, Einsum, Param, Role, TensorSpec, Unary, additive_terms,
                                product_factors, rank_of_variable, walk)
from mambalaya.errors import SpecError

#: The size expressions (as the layer builders write them) of the ranks tensor parallelism
#: splits, with what each rank is.
SPLIT_SIZE_EXPRESSIONS: Mapping[str, str] = {
    "expand*d_model": "Mamba-1's inner channels",
    "expand*d_model/headdim/ngroups": "Mamba-2's heads (per group)",
    "n_kv_heads": "attention's key/value heads (their query heads go with them)",
    "num_k_heads": "Gated DeltaNet's heads",
    "intermediate_size": "an MLP's or expert's intermediate channels",
    "shared_intermediate_size": "a shared expert's intermediate channels",
}


#: The size expressions of attention's key/value heads and of the query heads each one serves.
KV_HEADS, QUERIES_PER_KV_HEAD = "n_kv_heads", "n_heads/n_kv_heads"


def tensor_parallel_ranks(cascade: Cascade) -> tuple[str, ...]:
    """The ranks of ``cascade`` that tensor parallelism splits (see the module doc), in the
    cascade's rank order."""
    return tuple(name for name, rank in cascade.ranks.items() if rank.size_expr in SPLIT_SIZE_EXPRESSIONS)


def split_parts(cascade: Cascade, split: Iterable[str], devices: int) -> dict[str, int]:
    """Into how many parts each rank splits over ``devices``: every rank of ``split`` into
    ``devices``, except attention's key/value heads when there are fewer of them than devices
    and their count divides the devices: then each key/value head is replicated on
    ``devices / heads`` devices, which split the query heads it serves between them (the layout
    Megatron-LM and vLLM take when the tensor-parallel size exceeds the key/value heads). The
    sizes are checked by :func:`device_cascade`."""
    parts = {name: devices for name in split}
    queries = [n for n, r in cascade.ranks.items() if r.size_expr == QUERIES_PER_KV_HEAD]
    for name in split:
        heads = cascade.size(name)
        if (cascade.ranks[name].size_expr == KV_HEADS and heads < devices and devices % heads == 0
                and len(queries) == 1):
            parts[name] = heads
            parts[queries[0]] = devices // heads
            _check_replicated(cascade, name, queries[0])
    return parts


def _check_replicated(cascade: Cascade, heads: str, queries: str) -> None:
    """Refuse replicated key/value heads where an Einsum sums over them without the query heads
    (a norm over every key head's channels): the devices holding one head would each add its
    part, and the all-reduce would count it once per replica."""
    for e in cascade.einsums:
        variables = {rank_of_variable(v) for v in e.iteration_variables}
        if heads in {rank_of_variable(v) for v in e.reduced_variables} and queries not in variables:
            raise SpecError(f"Einsum {e.name} sums over the key/value heads ({heads}) without their query heads: with "
                            f"more devices than key/value heads each head is on several devices, and an all-reduce "
                            "would count it once per device; use a device count that divides the key/value heads")


def check_split(cascade: Cascade, split: Iterable[str]) -> None:
    """Raise :class:`~mambalaya.errors.SpecError`, naming the Einsum, if splitting the ranks
    ``split`` across devices is not a tensor-parallel layout of ``cascade`` (see the module doc)."""
    ranks = frozenset(split)
    unknown = ranks - set(cascade.ranks)
    if unknown:
        raise SpecError(f"cascade {cascade.name!r} has no rank {', '.join(sorted(unknown))} to split "
                        f"(its ranks: {', '.join(cascade.ranks)})")
    for e in cascade.einsums:
        for access in (e.output, *e.inputs):
            for rank, index in zip(cascade.tensors[access.tensor].ranks, access.indices):
                variable = index.plain_variable
                if rank in ranks and (variable is None or rank_of_variable(variable) not in ranks):
                    raise SpecError(
                        f"Einsum {e.name} reads {access} at {index} along rank {rank}, which tensor parallelism "
                        f"splits: a device would need another device's part (split ranks must be read at a split "
                        f"rank's own index)")
        reduced = {rank_of_variable(v) for v in e.reduced_variables} & ranks
        kept = set(cascade.tensors[e.name].ranks) & ranks
        if reduced and kept:
            raise SpecError(f"Einsum {e.name} sums over split rank {', '.join(sorted(reduced))} and keeps split rank "
                            f"{', '.join(sorted(kept))}: one device's partial sums would miss the other devices' parts")
        recurrence = cascade.recurrence(e)
        if recurrence is not None and recurrence[0] in ranks:
            raise SpecError(f"Einsum {e.name} is a recurrence along split rank {recurrence[0]}: each step would wait "
                            "for another device")


@dataclass(frozen=True)
class AllReduce:
    """One all-reduce of a tensor-parallel layer: the output of Einsum ``einsum`` (``op``: the
    Einsum's reduction, ``sum`` or ``max``), ``bytes`` on each device."""

    einsum: str
    op: str
    bytes: float


def all_reduces(cascade: Cascade, split: Iterable[str], devices: int | None = None) -> tuple[AllReduce, ...]:
    """The all-reduces of ``cascade`` with ``split`` ranks split (checked by :func:`check_split`;
    over ``devices``, the query heads too where key/value heads are replicated,
    :func:`split_parts`), one per tensor summed over the devices (see :func:`partial_tensors`
    for where)."""
    ranks = frozenset(split if devices is None else split_parts(cascade, split, devices))
    check_split(cascade, ranks)
    _, reduced = partial_tensors(cascade, ranks)
    return tuple(AllReduce(name, cascade.einsum(name).reduce_op,
                           math.prod(cascade.shape(name)) * cascade.tensors[name].stored_bytes_per_element)
                 for name in (e.name for e in cascade.einsums) if name in reduced)


def partial_tensors(cascade: Cascade, split: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(the tensors each device computes as a partial sum over its part of the split ranks, the
    ones of them all-reduced as soon as they are computed).

    An Einsum that reduces over a split rank computes a partial sum. An Einsum *linear in the
    partial sums* it reads (a sum-reduction each of whose additive terms has exactly one partial
    tensor as a plain factor, read nowhere else in the term, and no recurrence) computes one
    too: summing over the devices commutes with it, so its inputs' all-reduce may move to its
    output (an MoE layer's expert outputs, combined by the router's weights, are summed over
    the devices once combined, as a sum of routed and shared experts is). A partial tensor is
    all-reduced where it is computed unless every reader carries it on that way and their
    outputs are no larger; a layer's outputs and states are always all-reduced."""
    partial = {e.name for e in cascade.einsums if _reduces_split(e, split)}
    sources = frozenset(partial)
    for e in cascade.einsums:  # the most that linear readers could carry partial sums through
        if (e.name not in sources and set(e.input_tensors) & partial and _linear_in(cascade, e, partial)
                and not set(cascade.tensors[e.name].ranks) & split):
            partial.add(e.name)  # (an output over a split rank would hold other parts on other devices)
    reduced: set[str] = set()
    while True:
        visible = partial - reduced
        carriers = {e.name for e in cascade.einsums
                    if e.name in partial and e.name not in sources and _linear_in(cascade, e, visible)}
        partial = set(sources) | carriers  # a reader of a whole input among its sums carries none
        reduced &= partial
        visible = partial - reduced
        more = set()
        for name in visible:
            readers = cascade.consumers(name)
            carried = [r for r in readers if r.name in carriers and r.name != name]
            if (len(carried) < len(readers) or not readers or _leaves_layer(cascade, name)
                    or sum(_bytes(cascade, r.name) for r in carried) > _bytes(cascade, name)):
                more.add(name)
        if not more and carriers == partial - sources:
            return frozenset(partial), frozenset(reduced)
        reduced |= more


def _reduces_split(einsum, split: frozenset[str]) -> bool:
    return bool({rank_of_variable(v) for v in einsum.reduced_variables} & split)


def _bytes(cascade: Cascade, name: str) -> float:
    return math.prod(cascade.shape(name)) * cascade.tensors[name].stored_bytes_per_element


def _leaves_layer(cascade: Cascade, name: str) -> bool:
    spec = cascade.tensors[name]
    return spec.role == Role.OUTPUT or spec.updates is not None


def _linear_in(cascade: Cascade, einsum, partial: set[str] | frozenset[str]) -> bool:
    """Whether ``einsum``'s output is a partial sum when the tensors ``partial`` are: a sum whose
    every additive term holds exactly one of them, as a plain factor, and reads it nowhere else.
    A partial maximum (a max-reduction over a split rank) is carried by nothing."""
    if einsum.reduce_op != "sum" or cascade.recurrence(einsum) is not None:
        return False
    if any(cascade.einsum(t).reduce_op != "sum" for t in einsum.input_tensors if t in partial):
        return False
    for _sign, term in additive_terms(einsum.expr):
        direct = [a for a in product_factors(term) if isinstance(a, Access) and a.tensor in partial]
        anywhere = [a for a in walk(term) if isinstance(a, Access) and a.tensor in partial]
        if len(direct) != 1 or len(anywhere) != 1:
            return False
    return True


#: The suffix of an all-reduced tensor's whole value in a device's cascade (``O`` -> ``O_AR``).
ALL_REDUCED_SUFFIX = "_AR"


def device_cascade(cascade: Cascade, split: Iterable[str], devices: int) -> Cascade:
    """Each of ``devices`` devices' part of ``cascade``: every rank of ``split`` at its size over
    ``devices`` (which must divide it), everything else as it is, and the cascade cut at every
    all-reduce (:func:`all_reduces`): the tensor a device computes as a partial sum is written
    off chip (an output of its cascade), and its readers read the all-reduced sum back from
    memory (``<name>_AR``, an input), as NCCL reads and writes device memory. No mapping of a
    device's cascade can then keep a partial sum on chip for a reader that needs the whole."""
    if devices == 1 or not split:
        check_split(cascade, frozenset(split))
        return cascade
    parts = split_parts(cascade, split, devices)
    ranks = frozenset(parts)
    check_split(cascade, ranks)
    for name, n in parts.items():
        size = cascade.size(name)
        if size % n:
            what = SPLIT_SIZE_EXPRESSIONS.get(cascade.ranks[name].size_expr or "", "the query heads of each key/value head")
            raise SpecError(f"tensor parallelism over {devices} devices splits rank {name} ({what}, {size}) into "
                            f"{n} equal parts, and {n} does not divide {size}")
    whole = {name: cascade.size(name) for name in ranks}
    _, reduced = partial_tensors(cascade, ranks)
    cut = {name: f"{name}{ALL_REDUCED_SUFFIX}" for name in reduced if cascade.consumers(name)}
    clash = sorted(set(cut.values()) & set(cascade.tensors))
    if clash:
        raise SpecError(f"cascade {cascade.name!r} already has a tensor {clash[0]}, the name tensor parallelism gives "
                        f"the all-reduced {clash[0][:-len(ALL_REDUCED_SUFFIX)]}")
    einsums = [dataclasses.replace(e, expr=_renamed(_whole_sizes(e.expr, whole), cut)) for e in cascade.einsums]
    tensors = []
    for name, spec in cascade.tensors.items():
        if name in cut:
            tensors.append(dataclasses.replace(spec, role=Role.OUTPUT, description=f"{spec.description} (this "
                                               "device's partial sum, sent to the all-reduce)".strip()))
            tensors.append(dataclasses.replace(spec, name=cut[name], role=Role.INPUT, initial=None, updates=None,
                                               description=f"{name} all-reduced over the devices"))
        else:
            tensors.append(spec)
    return with_rank_sizes(cascade, {name: size // parts[name] for name, size in whole.items()},
                           {name: f"/{n}" for name, n in parts.items()}, einsums=einsums, tensors=tensors)


def _renamed(expr, names: Mapping[str, str]):
    """``expr`` reading ``names[t]`` wherever it read a tensor ``t`` of ``names``."""
    if isinstance(expr, Access) and expr.tensor in names:
        return dataclasses.replace(expr, tensor=names[expr.tensor])
    if isinstance(expr, Unary):
        return dataclasses.replace(expr, arg=_renamed(expr.arg, names))
    if isinstance(expr, Binary):
        return dataclasses.replace(expr, lhs=_renamed(expr.lhs, names), rhs=_renamed(expr.rhs, names))
    return expr


def _whole_sizes(expr, whole: Mapping[str, int]):
    """``expr`` with every split rank's size, read as a scalar (a norm's ``R*P``: the mean over
    all the heads' channels), at its whole size: a device divides by the whole layer's count."""
    if isinstance(expr, Param) and expr.name in whole:
        return Const(float(whole[expr.name]))
    if isinstance(expr, Unary):
        return dataclasses.replace(expr, arg=_whole_sizes(expr.arg, whole))
    if isinstance(expr, Binary):
        return dataclasses.replace(expr, lhs=_whole_sizes(expr.lhs, whole), rhs=_whole_sizes(expr.rhs, whole))
    return expr


def with_rank_sizes(cascade: Cascade, sizes: Mapping[str, int], note: str | Mapping[str, str] = "", *,
                    einsums: Iterable[Einsum] | None = None, tensors: Iterable[TensorSpec] | None = None) -> Cascade:
    """``cascade`` rebuilt (and so checked again) with the ranks of ``sizes`` at those sizes
    (and ``einsums`` and ``tensors``, when given, for its own); ``note`` is appended to each
    changed rank's size expression."""
    notes = note if isinstance(note, Mapping) else dict.fromkeys(sizes, note)
    ranks = [dataclasses.replace(rank, size=sizes[name], size_expr=f"({rank.size_expr}){notes[name]}"
                                 if notes.get(name) else rank.size_expr)
             if name in sizes else rank for name, rank in cascade.ranks.items()]
    return build_cascade(name=cascade.name, params=cascade.params, ranks=ranks,
                         tensors=cascade.tensors.values() if tensors is None else tensors,
                         einsums=cascade.einsums if einsums is None else einsums, description=cascade.description,
                         regions=cascade.regions)


#: The all-reduce algorithms (:func:`all_reduce_options`): per algorithm, its steps (each paying
#: the link latency) and the bytes each device sends over its link, per byte all-reduced.
ALL_REDUCE_ALGORITHMS = {
    # each device sends a share to the next, twice round the ring (reduce-scatter, all-gather)
    "ring": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    # each device sends its whole buffer to every other and sums what it receives: one step
    "one-shot": (lambda n: 1, lambda n: n - 1),
    # the switch sums in flight (NVLink SHARP): each device sends its buffer once, receives the sum
    "in-network": (lambda n: 2, lambda n: 1),
}


def all_reduce_options(n_bytes: float, devices: int, system) -> dict[str, float]:
    """Seconds of an all-reduce of ``n_bytes`` on each of ``devices`` devices by each algorithm
    the ``system`` (:class:`~mambalaya.arch.system.SystemSpec`) offers (the in-network one only
    where its switch reduces): the collective's fixed cost, the algorithm's steps at the link's
    latency, and its bytes per device over the link's bandwidth. Empty on one device."""
    if devices <= 1:
        return {}
    return {a: system.collective_latency_s + ALL_REDUCE_ALGORITHMS[a][0](devices) * system.link_latency_s
            + ALL_REDUCE_ALGORITHMS[a][1](devices) * n_bytes / system.link_bandwidth_bytes_per_s
            for a in _offered(system)}


def all_reduce_algorithm(n_bytes: float, devices: int, system) -> tuple[str, float]:
    """The fastest all-reduce algorithm for ``n_bytes`` (:func:`all_reduce_options`), as NCCL's
    tuner picks one per size, and its seconds; ``("none", 0.0)`` on one device."""
    options = all_reduce_options(n_bytes, devices, system)
    return min(options.items(), key=lambda item: item[1]) if options else ("none", 0.0)


def all_reduce_s(n_bytes: float, devices: int, system) -> float:
    """Seconds of the fastest all-reduce of ``n_bytes`` on each of ``devices`` devices."""
    return all_reduce_algorithm(n_bytes, devices, system)[1]


def all_reduce_sent_bytes(n_bytes: float, devices: int, algorithm: str) -> float:
    """Bytes one device sends over its link in an all-reduce of ``n_bytes`` by ``algorithm``."""
    return ALL_REDUCE_ALGORITHMS[algorithm][1](devices) * n_bytes if devices > 1 else 0.0


def all_reduce_bound_s(n_bytes: float, devices: int, system) -> float:
    """A lower bound on an all-reduce's seconds: the fewest bytes any algorithm sends per device
    over the link's bandwidth, no latency (a speed of light)."""
    if devices <= 1:
        return 0.0
    return min(ALL_REDUCE_ALGORITHMS[a][1](devices) for a in _offered(system)) * n_bytes / system.link_bandwidth_bytes_per_s


def _offered(system) -> tuple[str, ...]:
    """The all-reduce algorithms a system offers: the in-network one only where its switch reduces."""
    return tuple(a for a in ALL_REDUCE_ALGORITHMS if a != "in-network" or system.in_network_reduction)




@dataclass(frozen=True)
class TensorParallelLayers:
    """One layer type of a tensor-parallel model: ``count`` layers, each ``layer_s`` seconds on
    a device (its part of the heads and channels) plus its ``all_reduces``, ``all_reduce_s``
    seconds and (where the links have an energy) ``all_reduce_j`` joules over all devices."""

    count: int
    layer_s: float
    all_reduces: tuple[AllReduce, ...]
    all_reduce_s: float
    all_reduce_j: float | None
    #: the algorithm each all-reduce takes (:func:`all_reduce_algorithm`)
    algorithms: tuple[str, ...] = ()

    @property
    def interconnect_s(self) -> float:
        return self.all_reduce_s

    @property
    def interconnect_j(self) -> float | None:
        return self.all_reduce_j

    @property
    def moved_bytes(self) -> float:
        """Bytes each device all-reduces in one layer."""
        return sum(r.bytes for r in self.all_reduces)


@dataclass(frozen=True)
class TensorParallelCost(LayerSplitCost):
    """A model tensor parallel over ``devices``: every device runs every layer on its part, the
    devices wait for each other at every all-reduce (the collectives are not overlapped with
    compute: an assumption, Megatron-LM's all-reduces sit on the critical path)."""

    strategy = "tensor"


def tensor_parallel_layers(system, cascade: Cascade, devices: int, *, count: int, layer_s: float) -> TensorParallelLayers:
    """A layer type's :class:`TensorParallelLayers`: ``cascade`` is the whole layer, ``layer_s``
    its part's seconds on one device; ``system`` the design's
    :class:`~mambalaya.arch.system.SystemSpec`. Each all-reduce takes its fastest algorithm; the
    links' energy counts the bytes every device sends by it."""
    reduces = all_reduces(cascade, tensor_parallel_ranks(cascade), devices)
    chosen = [all_reduce_algorithm(r.bytes, devices, system) for r in reduces]
    seconds = sum(s for _, s in chosen)
    sent = devices * sum(all_reduce_sent_bytes(r.bytes, devices, a) for r, (a, _) in zip(reduces, chosen))
    joules = system.transfer_j(sent) if system.link_energy_pj_per_bit is not None else None
    return TensorParallelLayers(count, layer_s, reduces, seconds, joules, tuple(a for a, _ in chosen))


__all__ = ["ALL_REDUCED_SUFFIX", "ALL_REDUCE_ALGORITHMS", "AllReduce", "KV_HEADS", "QUERIES_PER_KV_HEAD", "SPLIT_SIZE_EXPRESSIONS", "TensorParallelCost", "TensorParallelLayers",
           "all_reduce_algorithm", "all_reduce_bound_s", "all_reduce_options", "all_reduce_s", "all_reduce_sent_bytes",
           "all_reduces", "check_split", "device_cascade", "partial_tensors", "tensor_parallel_layers",
           "split_parts", "tensor_parallel_ranks", "with_rank_sizes"]
