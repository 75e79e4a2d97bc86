"""Multi-core chips: a layer's work split over cores that share the chip's off-chip memory.

A design with a ``cores`` section (:class:`~mambalaya.arch.system.CoresSpec`) is costed one core
at a time (:func:`~mambalaya.arch.core_design`): each core runs its part as one of several
devices would (tensor placement: its heads and channels of every layer,
:mod:`mambalaya.cost.tensor_parallel`, which is how Geens et al.'s multi-core mapping splits
the channels over the cores; sequence placement: its positions,
:mod:`mambalaya.cost.sequence_parallel`; pipeline placement: its layers,
:mod:`mambalaya.cost.pipeline`), at its share of the chip's off-chip bandwidth (:func:`streaming_cores`), the cores exchanging their all-reduces, halos and states over the
network on chip.

What differs from devices is the shared memory (:func:`core_dram_share`): a tensor that every
core holds whole (no split rank: the residual stream, a norm's weights, Mamba-1's ``B`` and
``C``, an all-reduced sum) is read from the chip's memory once and multicast to the cores over
the network, and written once, so one core carries ``1/cores`` of its off-chip bytes. A partial
sum goes to the other cores over the network (its all-reduce is costed there) and the reduced
sum is written to memory once: each core's write of its partial counts ``1/cores``, so the chip
writes the tensor once, as one array would. Every other tensor is the core's own. An assumption: the network multicasts (one read
reaches every core), as a broadcast-capable network on chip does, and what each core receives
so is the network's traffic (:func:`multicast_cost`); the work itself, whole
tensors' Einsums included, is as each core runs it (a norm over the residual stream on every
core, as tensor parallelism places it).
"""

from __future__ import annotations

from collections.abc import Iterable

from mambalaya.einsum.cascade import Cascade

#: The placements a multi-core design's cores take (``cores.placement``; ``best``: the fastest).
CORE_PLACEMENTS = ("tensor", "sequence", "pipeline", "best")


def streaming_cores(placement: str, cores: int, micro_batches: int | None) -> int:
    """How many cores stream from the shared memory at once under ``placement``: every core
    when each runs its part of every layer (tensor, sequence); in a pipeline of the layers, the
    stages a micro-batch keeps busy at once in GPipe's steady state, ``min(micro_batches,
    cores)`` (one batch: one core at a time, at the whole bandwidth). Each of them streams at
    that share of the memory's bandwidth: during a pipeline's fill and drain fewer run, each
    could stream faster than its share (on the safe side)."""
    return min(micro_batches or 1, cores) if placement == "pipeline" else cores


def core_dram_share(part: Cascade, split: Iterable[str], cores: int) -> dict[str, float]:
    """Per tensor of ``part`` (one core's part of a layer, its ``split`` ranks divided over
    ``cores``), the share of its off-chip bytes the core carries, where it is not all of them
    (see the module doc): ``1/cores`` for a tensor every core holds whole, a partial sum (whose
    all-reduce goes over the network and whose sum the chip writes once) among them."""
    ranks = set(split)
    return {name: 1.0 / cores for name, spec in part.tensors.items() if not ranks & set(spec.ranks)}


def multicast_cost(result, dram_share: dict[str, float], cores: int, network) -> tuple[float, float | None]:
    """(seconds, joules over the chip) the network on chip spends in one layer bringing each core
    the tensors every core reads whole: of each such tensor a core reads ``1/cores`` from memory
    (its share in ``result``, one core's :class:`~mambalaya.cost.latency.LayerLatency` costed
    with ``dram_share``) and receives the other ``(cores - 1)/cores`` from the others, at the
    network's per-core bandwidth (``network``: :meth:`~mambalaya.arch.system.CoresSpec.network`),
    not overlapped with the layer's work (on the safe side)."""
    shared = {t for t, share in dram_share.items() if share < 1}
    received = (cores - 1) * sum(b for g in result.groups for t, b in g.traffic.read_bytes.items() if t in shared)
    seconds = received / network.link_bandwidth_bytes_per_s if received else 0.0
    return seconds, network.transfer_j(cores * received)


__all__ = ["CORE_PLACEMENTS", "core_dram_share", "multicast_cost", "streaming_cores"]
