"""Pipeline parallelism: a model's layers split in order across devices joined by links.

Device ``d`` holds a contiguous run of the model's layers (:func:`stage_layers`: as equal in
count as the layers allow, the first stages taking one more where they do not divide); a batch
passes through the stages in turn, and at each boundary the activations the layers from there
on read from before (their input tensors over the model width ``D``: the residual stream ``X``,
and Zamba2's original embedding ``EMB`` while a hybrid layer is still to come;
:func:`boundary_bytes`) go over a link
(:meth:`~mambalaya.arch.system.SystemSpec.transfer_s`). A layer costs what it costs on one
device (the same cascade, mapping and design), so the batch's latency is the sum of every
layer's plus the transfers (:class:`PipelineCost`); the other devices wait meanwhile, the
pipeline's bubble. Split into ``m`` micro-batches (GPipe's schedule, Huang et al., arXiv
1811.06965, forward only), each layer costed at the micro-batch's size, the first micro-batch
passes every stage and boundary and the others follow one per bottleneck interval: the slowest
stage with its outgoing transfer (a stage is taken not to compute while it sends: an assumption
on the safe side), so the latency is the first micro-batch's path plus ``m - 1`` bottleneck
intervals. One device is the model as without a system: no boundary, no transfer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError

#: The rank of a model's width: a boundary carries the input activations that have it.
MODEL_WIDTH_RANK = "D"


def stage_layers(n_layers: int, devices: int) -> tuple[range, ...]:
    """The layer indices each of ``devices`` stages holds: contiguous runs whose lengths differ
    by at most one, the longer ones first."""
    if devices < 1:
        raise SpecError(f"a pipeline needs at least one device, not {devices}")
    if devices > n_layers:
        raise SpecError(f"a pipeline of {devices} stages over {n_layers} layers would leave a stage without a "
                        f"layer; use at most {n_layers} devices (on a multi-core chip, whose cores are its stages, "
                        f"at most {n_layers} cores: --set cores.count)")
    base, extra = divmod(n_layers, devices)
    stages, start = [], 0
    for d in range(devices):
        length = base + (1 if d < extra else 0)
        stages.append(range(start, start + length))
        start += length
    return tuple(stages)


def boundary_bytes(*downstream: Cascade) -> float:
    """Bytes a stage receives from the one before: the input tensors over the model width that
    the layers from it on read (``downstream``: their cascades; the residual stream ``X``, and
    Zamba2's original embedding ``EMB`` while a hybrid layer is still to come), each once, its
    elements times its width. Constants a device makes itself (masks, rotary tables) have no
    ``D`` rank and are not sent."""
    sent: dict[str, float] = {}
    for cascade in downstream:
        for name, spec in cascade.tensors.items():
            if spec.role == Role.INPUT and MODEL_WIDTH_RANK in spec.ranks:
                sent.setdefault(name, math.prod(cascade.shape(name)) * spec.stored_bytes_per_element)
    return float(sum(sent.values()))


class SplitCost:
    """A model over several devices: its ``layers_s`` and ``interconnect_s`` on the critical path
    (given by the class that takes this one in), their sum and the interconnect's share."""

    @property
    def layers_s(self) -> float:
        raise NotImplementedError

    @property
    def interconnect_s(self) -> float:
        raise NotImplementedError

    @property
    def latency_s(self) -> float:
        return self.layers_s + self.interconnect_s

    @property
    def interconnect_share(self) -> float:
        return self.interconnect_s / self.latency_s if self.latency_s else 0.0


@dataclass(frozen=True)
class LayerSplitCost(SplitCost):
    """A model whose every device runs every layer on its part (tensor, expert, sequence
    parallelism): ``layers`` per layer type, each with its ``count`` of layers, ``layer_s`` (one
    device's part), ``interconnect_s`` and ``interconnect_j`` (its collectives or transfers, the
    joules over all devices, None where the links have no energy) and ``moved_bytes`` (what one
    device moves in them); the devices wait for each other at every collective (not overlapped
    with compute). On the cores of one chip, ``multicast`` adds per layer type the seconds and
    joules the network spends bringing each core the tensors every core reads whole
    (:func:`~mambalaya.cost.cores.multicast_cost`). The class that takes this one in names its
    ``strategy``."""

    devices: int
    layers: Mapping[str | None, Any]
    multicast: Mapping[str | None, tuple[float, float | None]] = field(default_factory=dict)

    @property
    def layers_s(self) -> float:
        return sum(t.count * t.layer_s for t in self.layers.values())

    @property
    def multicast_s(self) -> float:
        """Seconds the network on chip spends in the model's multicasts (0 off a chip)."""
        return sum(self.layers[k].count * seconds for k, (seconds, _) in self.multicast.items())

    @property
    def interconnect_s(self) -> float:
        return sum(t.count * t.interconnect_s for t in self.layers.values()) + self.multicast_s

    @property
    def interconnect_j(self) -> float | None:
        joules = [t.interconnect_j for t in self.layers.values()] + [j for _, j in self.multicast.values()]
        if any(j is None for j in joules):
            return None
        return sum(t.count * (t.interconnect_j + (self.multicast.get(k, (0.0, 0.0))[1] or 0.0))
                   for k, t in self.layers.items())

    @property
    def collective_bytes(self) -> float:
        """Bytes one device moves in the model's collectives (see each strategy's ``moved_bytes``)."""
        return sum(t.count * t.moved_bytes for t in self.layers.values())


@dataclass(frozen=True)
class PipelineCost(SplitCost):
    """A batch through a pipeline: each stage's layers' seconds, and each boundary's bytes,
    seconds and (where the links have an energy) joules."""

    stages: tuple[range, ...]
    stage_s: tuple[float, ...]  # one micro-batch's (the batch's, with one)
    boundary_bytes: tuple[float, ...]  # per micro-batch
    transfer_s: tuple[float, ...]  # per micro-batch
    transfer_j: tuple[float, ...] | None  # per micro-batch
    micro_batches: int = 1

    @property
    def devices(self) -> int:
        return len(self.stages)

    @property
    def bottleneck(self) -> int:
        """The stage whose compute and outgoing transfer take longest: one micro-batch leaves the
        pipeline per its interval once the pipeline is full."""
        return max(range(self.devices), key=self.interval_s)

    def interval_s(self, stage: int) -> float:
        """A stage's compute for one micro-batch and its outgoing transfer."""
        return self.stage_s[stage] + (self.transfer_s[stage] if stage < len(self.transfer_s) else 0.0)

    @property
    def layers_s(self) -> float:
        """Compute on the critical path: the first micro-batch's stages, and the bottleneck
        stage's for each other micro-batch."""
        return sum(self.stage_s) + (self.micro_batches - 1) * self.stage_s[self.bottleneck]

    @property
    def interconnect_s(self) -> float:
        """Transfers on the critical path: the first micro-batch's, and the bottleneck stage's
        outgoing one for each other micro-batch."""
        b = self.bottleneck
        after = self.transfer_s[b] if b < len(self.transfer_s) else 0.0
        return sum(self.transfer_s) + (self.micro_batches - 1) * after

    # latency_s (SplitCost): the first micro-batch through every stage and transfer, then one
    # micro-batch per bottleneck interval (with one micro-batch: every layer and transfer in turn)

    @property
    def interconnect_j(self) -> float | None:
        return None if self.transfer_j is None else self.micro_batches * sum(self.transfer_j)

    @property
    def busy_share(self) -> float:
        """The share of the devices' time they compute: every micro-batch's seconds on every stage
        over the devices times the latency (the rest is the bubble and the transfers)."""
        busy = self.micro_batches * sum(self.stage_s)
        return busy / (self.devices * self.latency_s) if self.latency_s else 0.0


def pipeline_cost(system, layer_s: Sequence[float], layers: Sequence[Cascade], devices: int,
                  micro_batches: int = 1) -> PipelineCost:
    """The :class:`PipelineCost` of a model whose layer ``i`` takes ``layer_s[i]`` seconds and
    reads as ``layers[i]`` does (both for one micro-batch), split over ``devices`` stages and run
    as ``micro_batches`` micro-batches; ``system`` is the design's
    :class:`~mambalaya.arch.system.SystemSpec`."""
    stages = stage_layers(len(layer_s), devices)
    if len(layers) != len(layer_s):
        raise ValueError(f"{len(layers)} layer cascades for {len(layer_s)} layers")
    stage_s = tuple(float(sum(layer_s[i] for i in stage)) for stage in stages)
    distinct = lambda cascades: {id(c): c for c in cascades}.values()  # noqa: E731
    sent = tuple(boundary_bytes(*distinct(layers[stage.start:])) for stage in stages[1:])
    seconds = tuple(system.transfer_s(b) for b in sent)
    joules = None if system.link_energy_pj_per_bit is None else tuple(system.transfer_j(b) for b in sent)
    return PipelineCost(stages, stage_s, sent, seconds, joules, micro_batches)


__all__ = ["LayerSplitCost", "MODEL_WIDTH_RANK", "PipelineCost", "SplitCost", "boundary_bytes", "pipeline_cost", "stage_layers"]
