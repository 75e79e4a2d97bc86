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
pipeline's bubble, which only a stream of batches (micro-batches) would fill: not modelled here.
One device is the model as without a system: no boundary, no transfer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
        raise SpecError(f"a pipeline of {devices} devices over {n_layers} layers would leave a device without a "
                        f"layer; use at most {n_layers} devices")
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
                sent.setdefault(name, math.prod(cascade.shape(name)) * spec.bits / 8)
    return float(sum(sent.values()))


@dataclass(frozen=True)
class PipelineCost:
    """A batch through a pipeline: each stage's layers' seconds, and each boundary's bytes,
    seconds and (where the links have an energy) joules."""

    stages: tuple[range, ...]
    stage_s: tuple[float, ...]
    boundary_bytes: tuple[float, ...]
    transfer_s: tuple[float, ...]
    transfer_j: tuple[float, ...] | None

    @property
    def devices(self) -> int:
        return len(self.stages)

    @property
    def layers_s(self) -> float:
        return sum(self.stage_s)

    @property
    def interconnect_s(self) -> float:
        return sum(self.transfer_s)

    @property
    def latency_s(self) -> float:
        """The batch's latency: every layer in turn, and every transfer between stages."""
        return self.layers_s + self.interconnect_s

    @property
    def interconnect_share(self) -> float:
        return self.interconnect_s / self.latency_s if self.latency_s else 0.0

    @property
    def interconnect_j(self) -> float | None:
        return None if self.transfer_j is None else sum(self.transfer_j)

    @property
    def busy_share(self) -> float:
        """The share of the devices' time they compute: each stage's seconds over the devices
        times the latency (the rest is the bubble and the transfers)."""
        return self.layers_s / (self.devices * self.latency_s) if self.latency_s else 0.0


def pipeline_cost(system, layer_s: Sequence[float], layers: Sequence[Cascade], devices: int) -> PipelineCost:
    """The :class:`PipelineCost` of a model whose layer ``i`` takes ``layer_s[i]`` seconds and
    reads as ``layers[i]`` does, split over ``devices`` stages; ``system`` is the design's
    :class:`~mambalaya.arch.system.SystemSpec`."""
    stages = stage_layers(len(layer_s), devices)
    if len(layers) != len(layer_s):
        raise ValueError(f"{len(layers)} layer cascades for {len(layer_s)} layers")
    stage_s = tuple(float(sum(layer_s[i] for i in stage)) for stage in stages)
    distinct = lambda cascades: {id(c): c for c in cascades}.values()  # noqa: E731
    sent = tuple(boundary_bytes(*distinct(layers[stage.start:])) for stage in stages[1:])
    seconds = tuple(system.transfer_s(b) for b in sent)
    joules = None if system.link_energy_pj_per_bit is None else tuple(system.transfer_j(b) for b in sent)
    return PipelineCost(stages, stage_s, sent, seconds, joules)


__all__ = ["MODEL_WIDTH_RANK", "PipelineCost", "boundary_bytes", "pipeline_cost", "stage_layers"]
