"""Expert parallelism: a MoE model's experts split across devices, the tokens sent to the
devices holding their experts and back (two all-to-alls per MoE block).

**The layout** (DeepSpeed-MoE's and Megatron-LM's expert parallelism for inference, with the
layers outside the experts data parallel as vLLM's expert-parallel deployment runs them): each
of ``N`` devices runs every layer on ``1/N`` of the batch's sequences, with every weight outside
the experts whole (the mixers, attention, norms, router, shared MLP), and holds ``n_experts/N``
of each MoE block's experts, contiguous (device ``d`` the experts ``d n/N`` to ``(d+1) n/N - 1``,
as Megatron-LM numbers its local experts). Nothing crosses devices but the routed tokens.

**What crosses, by the algebra** (:func:`all_to_alls`). The *expert side* of a MoE block is the
Einsums of its experts region (:func:`~mambalaya.einsum.routing.routed_einsums`) whose output
has the expert rank ``X`` (gate, up, the activation, each expert's output ``EO``); the rest of
the region (the combine ``MO = sum_x EO RW``) runs where the token is. A tensor the expert side
reads from outside it, over the token's ranks without ``X`` and not a weight (``XN``, or ``XL``
in a latent width), is *dispatched*: one row per token-expert pair whose expert is on another
device (Megatron-LM's all-to-all token dispatcher sends a token once per expert it chose); a
tensor the expert side writes and the rest reads (``EO``) is *combined*: the same pairs' rows
sent back. A pair's row is the tensor's elements per token and expert times its width.

**How many pairs** (:func:`expert_loads`): a device's tokens choose ``top_k`` experts each;
``f_d`` is the share of all the token-expert pairs that go to device ``d``'s experts (the
model's routing assumption: ``1/N`` under ``uniform``, the sum of its experts' fractions under a
routing histogram, the same on every device's tokens). Device ``d`` then sends ``(1 - f_d)`` of
its ``T/N * top_k`` pairs and receives ``(N-1) f_d`` times as many from the others, and its
experts compute ``N f_d`` times its own tokens' pairs. The devices wait for each other at every
all-to-all, so the model is as slow as its most loaded device (:func:`expert_device_cascade`
costs that one; load imbalance between experts of one device is not modelled, as on one).

**An all-to-all's time** (:func:`all_to_all_s`): every device sends to every other at once
through the switch (NCCL's all-to-all is a send and a receive per peer, in one step), so it
takes the collective's fixed cost (``system.collective_latency_s``, taken to be an all-reduce's:
an assumption), one step at the link's latency, and the larger of what the busiest device sends
and receives over the link's bandwidth (the links are full duplex). Its speed of light
(:func:`all_to_all_bound_s`) is the bytes alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mambalaya.cost.pipeline import LayerSplitCost
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Role
from mambalaya.einsum.routing import LOAD_PARAM, expert_rank, experts_reached, routed_einsums
from mambalaya.errors import SpecError

#: The directions of a MoE block's all-to-alls: tokens to their experts, results back.
DISPATCH, COMBINE = "dispatch", "combine"


def expert_side(cascade: Cascade) -> tuple[str, ...]:
    """The Einsums of the experts region whose output has the expert rank (they run on the
    device that holds the expert), in cascade order."""
    routed, experts = routed_einsums(cascade), expert_rank(cascade)
    return tuple(e.name for e in cascade.einsums
                 if e.name in routed and experts is not None and experts in cascade.tensors[e.name].ranks)


def is_moe(cascade: Cascade) -> bool:
    """Whether ``cascade`` has a MoE block: an experts region with an expert rank."""
    return bool(expert_side(cascade))


def expert_weights(cascade: Cascade) -> tuple[str, ...]:
    """The weights the expert side reads that have the expert rank (each expert's own), the
    ones a device holds ``1/N`` of; the router's weight, read outside it, is not among them."""
    side, experts = expert_side(cascade), expert_rank(cascade)
    return tuple(dict.fromkeys(t for name in side for t in cascade.einsum(name).input_tensors
                               if cascade.tensors[t].role == Role.WEIGHT and experts in cascade.tensors[t].ranks))


def token_ranks(cascade: Cascade) -> tuple[str, ...]:
    """The ranks that index a token (batch and positions): those every expert-side output has,
    but the expert rank and the ranks of the experts' weights."""
    side = expert_side(cascade)
    common = set.intersection(*(set(cascade.tensors[n].ranks) for n in side))
    weight_ranks, experts = {r for t in expert_weights(cascade) for r in cascade.tensors[t].ranks}, expert_rank(cascade)
    return tuple(r for r in cascade.ranks if r in common and r not in weight_ranks and r != experts)


@dataclass(frozen=True)
class AllToAll:
    """One all-to-all of a MoE block: ``tensor``'s rows sent between the devices, ``direction``
    :data:`DISPATCH` (to the experts) or :data:`COMBINE` (back), ``row_bytes`` per token-expert
    pair."""

    tensor: str
    direction: str
    row_bytes: float


def all_to_alls(cascade: Cascade) -> tuple[AllToAll, ...]:
    """The all-to-alls of ``cascade``'s MoE block (see the module doc); none without one."""
    side = expert_side(cascade)
    if not side:
        return ()
    inside, tokens, experts = set(side), set(token_ranks(cascade)), expert_rank(cascade)

    def row(name: str) -> float:
        spec = cascade.tensors[name]
        return math.prod(cascade.size(r) for r in spec.ranks if r not in tokens and r != experts) * spec.stored_bytes_per_element

    sent: dict[str, AllToAll] = {}
    for name in side:
        for t in cascade.einsum(name).input_tensors:
            spec = cascade.tensors[t]
            if (t not in inside and spec.role != Role.WEIGHT and experts not in spec.ranks
                    and tokens <= set(spec.ranks)):
                sent.setdefault(t, AllToAll(t, DISPATCH, row(t)))
    for e in cascade.einsums:
        if e.name not in inside:
            for t in e.input_tensors:
                if t in inside:
                    sent.setdefault(t, AllToAll(t, COMBINE, row(t)))
    return tuple(sent.values())


def expert_loads(n_experts: int, devices: int, routing: str | Sequence[float]) -> tuple[float, ...]:
    """Per device, the share ``f_d`` of the token-expert pairs its experts receive under the
    model's ``routing`` (``uniform`` or a per-expert histogram), the experts placed contiguously."""
    check_expert_devices(n_experts, devices)
    per = n_experts // devices
    if routing == "uniform":
        return (1 / devices,) * devices
    fractions = list(routing)
    return tuple(math.fsum(fractions[d * per:(d + 1) * per]) for d in range(devices))


def check_expert_devices(n_experts: int, devices: int) -> None:
    """Refuse a device count that does not split the experts into equal parts."""
    if n_experts % devices:
        raise SpecError(f"expert parallelism over {devices} devices gives each device an equal part of the "
                        f"{n_experts} experts, and {devices} does not divide {n_experts}")


def expert_device_cascade(part: Cascade, devices: int, routing: str | Sequence[float], *, total_tokens: int) -> Cascade:
    """The most loaded device's part of a MoE layer: ``part`` is the layer built for one
    device's share of the batch (``total_tokens`` are the whole batch's tokens); its experts
    compute ``N f_max`` times its own tokens' pairs and read the weights of the experts of its
    that receive a token, at most its pairs (as one device reads ``min(experts, pairs)``)."""
    params = part.params
    n, k = int(params["moe_experts"]), int(params["moe_top_k"])
    loads = expert_loads(n, devices, routing)
    heaviest = max(range(devices), key=lambda d: loads[d])
    per = n // devices
    pairs = math.ceil(total_tokens * k * loads[heaviest] - 1e-9)
    if routing == "uniform":
        read = min(per, pairs)
    else:  # the device's experts that one of the pass's choices reaches
        read = min(pairs, experts_reached(list(routing)[heaviest * per:(heaviest + 1) * per], total_tokens, k))
    new = {**params, LOAD_PARAM: devices * loads[heaviest], "moe_experts_read": read}
    return build_cascade(name=part.name, params=new, ranks=part.ranks.values(), tensors=part.tensors.values(),
                         einsums=part.einsums, description=f"{part.description}; expert parallel over {devices} devices "
                         f"(the most loaded device's part: {loads[heaviest]:.4g} of the token-expert pairs)",
                         regions=part.regions)


def all_to_all_bytes(cascade: Cascade, loads: Sequence[float], top_k: int, direction: str) -> float:
    """The most any device moves one way (sent or received, the links being full duplex) in the
    block's all-to-all in ``direction``: ``cascade`` is a device's part (its tokens), ``loads``
    the :func:`expert_loads`. A device sends its tokens' pairs bound elsewhere and receives the
    other devices' pairs bound to its experts; the combine sends them back."""
    tokens = math.prod(cascade.size(r) for r in token_ranks(cascade))
    n = len(loads)
    row = sum(a.row_bytes for a in all_to_alls(cascade) if a.direction == direction)
    away = max(tokens * top_k * (1 - f) for f in loads) * row  # a device's own tokens' pairs, to others
    home = max((n - 1) * tokens * top_k * f for f in loads) * row  # the others' pairs, to its experts
    return max(away, home)


def all_to_all_s(n_bytes: float, system) -> float:
    """Seconds of an all-to-all whose busiest device moves ``n_bytes`` one way (see the module doc)."""
    return system.collective_latency_s + system.link_latency_s + n_bytes / system.link_bandwidth_bytes_per_s


def all_to_all_bound_s(n_bytes: float, system) -> float:
    """An all-to-all's speed of light: the busiest device's bytes over the link's bandwidth."""
    return n_bytes / system.link_bandwidth_bytes_per_s


@dataclass(frozen=True)
class ExpertParallelLayers:
    """One layer type of an expert-parallel model: ``count`` layers, each ``layer_s`` seconds on
    the most loaded device (its share of the batch), plus its ``all_to_alls`` (none outside a
    MoE block), ``all_to_all_s`` seconds and (where the links have an energy) ``all_to_all_j``
    joules over all devices; ``moved_bytes``: what the busiest device moves in them."""

    count: int
    layer_s: float
    all_to_alls: tuple[AllToAll, ...]
    all_to_all_s: float
    all_to_all_j: float | None
    moved_bytes: float = 0.0

    @property
    def interconnect_s(self) -> float:
        return self.all_to_all_s

    @property
    def interconnect_j(self) -> float | None:
        return self.all_to_all_j


@dataclass(frozen=True)
class ExpertParallelCost(LayerSplitCost):
    """A model expert parallel over ``devices``: every device runs every layer on its share of
    the batch and its experts; the devices wait for each other at every all-to-all (not
    overlapped with compute: an assumption on the safe side, as for the all-reduces)."""

    strategy = "expert"


def expert_parallel_layers(system, part: Cascade, devices: int, routing: str | Sequence[float], *, count: int,
                           layer_s: float) -> ExpertParallelLayers:
    """A layer type's :class:`ExpertParallelLayers`: ``part`` is one device's part of the layer
    (:func:`expert_device_cascade`, or a layer without experts at its share of the batch),
    ``layer_s`` its seconds; ``system`` the design's :class:`~mambalaya.arch.system.SystemSpec`.
    The links' energy counts the bytes every device sends."""
    moves = all_to_alls(part)
    if not moves:
        return ExpertParallelLayers(count, layer_s, (), 0.0, 0.0 if system.link_energy_pj_per_bit is not None else None)
    n, k = int(part.params["moe_experts"]), int(part.params["moe_top_k"])
    loads = expert_loads(n, devices, routing)
    busiest = {d: all_to_all_bytes(part, loads, k, d) for d in (DISPATCH, COMBINE)}
    seconds = sum(all_to_all_s(b, system) for b in busiest.values())
    tokens = math.prod(part.size(r) for r in token_ranks(part))
    rows = sum(a.row_bytes for a in moves)  # a pair's row each way
    every_device_sent = sum(tokens * k * (1 - f) for f in loads) * rows
    joules = system.transfer_j(every_device_sent) if system.link_energy_pj_per_bit is not None else None
    return ExpertParallelLayers(count, layer_s, moves, seconds, joules, sum(busiest.values()))


__all__ = ["AllToAll", "COMBINE", "DISPATCH", "ExpertParallelCost", "ExpertParallelLayers", "all_to_all_bound_s",
           "all_to_all_bytes", "all_to_all_s", "all_to_alls", "check_expert_devices", "expert_device_cascade",
           "expert_loads", "expert_parallel_layers", "expert_side", "expert_weights", "is_moe", "token_ranks"]
