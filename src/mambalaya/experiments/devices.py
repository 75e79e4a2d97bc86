"""A model on several devices of one design: pipeline parallel (:mod:`mambalaya.cost.pipeline`), or tensor parallel.

``devices`` comes from ``--devices`` (default 1: the device count is the evaluation's choice, not
the design's); more than one needs the design's ``system`` section (its links). Each device
holds a contiguous run of the model's layers in their order (:func:`layer_order`), so what it
must hold
(:func:`stage_needs`) is those layers' weights (per layer type, :func:`layer_weight_parameters`),
recurrent states and KV caches, any weights its layers share with others (Zamba2's shared blocks,
on every device that runs a hybrid layer), and on the first device the weights outside the layers
(the embedding, the LM head, the final norm): an assumption, as the stage that embeds the tokens
is taken to hold the head too. Each device's need is checked against the design's capacity
(:func:`require_fits_on`); a model that does not fit is refused naming the fewest devices whose
pipeline would hold it (:func:`fewest_pipeline_devices`). The latency adds the transfers at the
stage boundaries to the layers' (:func:`pipeline_of`); a layer's own cost is unchanged, so one
device is exactly the single-device evaluation.

With ``parallel="tensor"`` every layer's heads and channels split instead
(:mod:`mambalaya.cost.tensor_parallel`): each device holds its share of every layer
(:func:`tensor_parallel_need`, :func:`require_fits_tensor_parallel`); ``parallel="best"`` keeps
the faster strategy (:func:`fastest_strategy`); ``micro_batches`` splits a pipeline's batch
(:func:`resolve_micro_batches`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from mambalaya.arch import ArchSpec
from mambalaya.arch.system import MAX_DEVICES
from mambalaya.cost.capacity import (CapacityError, DramUse, MemoryNeed, byte_size, memory_need,
                                     other_width_weight_bits, state_bytes)
from mambalaya.cost.pipeline import PipelineCost, pipeline_cost, stage_layers
from mambalaya.cost.expert_parallel import check_expert_devices, expert_weights
from mambalaya.cost.tensor_parallel import device_cascade, tensor_parallel_ranks
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.workloads import build_layer
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig
from mambalaya.workloads.families.base import is_hybrid
from mambalaya.workloads.precision import PrecisionPolicy

#: Gated DeltaNet models' layer types (the olmo-hybrid preset): the built delta-rule layers and
#: the attention layers the evaluation does not build (their KV cache is held all the same).
GDN_LINEAR, GDN_FULL = "linear_attention", "full_attention"


def resolve_devices(spec: ArchSpec, devices: int | None) -> int:
    """The device count of an evaluation: ``devices`` (None: 1); more than one needs the
    design's ``system`` section (its links)."""
    n = 1 if devices is None else devices
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_DEVICES:
        raise SpecError(f"--devices is a whole number of devices from 1 to {MAX_DEVICES:,} (got {n!r})")
    if n > 1 and spec.system is None:
        raise SpecError(f"{spec.name} has no system section (how its devices are joined: system.link_bandwidth_"
                        "bytes_per_s, system.link_latency_s), so it runs on one device only; use a design with one "
                        "(gpu-h100) or add it to your spec")
    most = spec.system.max_devices if spec.system is not None else None
    if most is not None and n > most:  # (once costed as if one switch joined them all)
        raise SpecError(f"{spec.name}'s system joins at most {most} devices (system.max_devices: one switch domain); "
                        f"{n} would be joined by another network, which is not modelled")
    return n


def on_cores(spec: ArchSpec, devices: int | None, parallel: str | None) -> str:
    """The placement of an evaluation on a multi-core design (``spec.cores``): its cores run as
    devices joined by the network on chip, placed by ``cores.placement`` (or ``parallel``, which
    overrides it); several such chips are not modelled."""
    if devices not in (None, 1):
        raise SpecError(f"{spec.name} is a multi-core design ({spec.cores.count} cores joined on chip): several such "
                        "chips (--devices) are not modelled; it runs on one chip, its cores placed by cores.placement "
                        "or --parallel")
    from mambalaya.cost.cores import CORE_PLACEMENTS

    chosen = parallel or spec.cores.placement
    if chosen not in CORE_PLACEMENTS:
        raise SpecError(f"{spec.name}'s cores are placed by {', '.join(CORE_PLACEMENTS[:-1])} or best, not {chosen!r}: "
                        "experts over the cores of one chip are not modelled")
    return chosen


def run_on_cores(spec: ArchSpec, devices: int | None, parallel: str | None, micro_batches: int | None,
                 run: Callable[..., Any], what: str, chip_dram: Callable[[], DramUse]) -> Any:
    """An evaluation on a multi-core design (``spec.cores``): its cores as devices joined by the
    network on chip (:func:`on_cores`), each a design of its own at its share of the chip's
    bandwidth (:func:`~mambalaya.arch.core_design`,
    :func:`~mambalaya.cost.cores.streaming_cores`), ``best`` weighing every placement. ``run``
    evaluates a design (``run(arch, devices=, parallel=, micro_batches=)``: ``evaluate`` or
    ``evaluate_hybrid`` of ``what``); the result carries the chip's memory use, ``chip_dram()``
    (the one copy of the model every core reads)."""
    from mambalaya.arch import core_design
    from mambalaya.cost.cores import streaming_cores

    placement = on_cores(spec, devices, parallel)
    if micro_batches not in (None, 1) and placement not in ("pipeline", "best"):  # (it pointed to --devices, refused here)
        raise SpecError(f"--micro-batches {micro_batches} splits a batch between the stages of a pipeline: on "
                        f"{spec.name}, a multi-core design, use it with --parallel pipeline (its {spec.cores.count} "
                        "cores as the stages)")
    if placement == "best":  # each placement on the chip again, itself
        return fastest_strategy(lambda strategy: run(spec, parallel=strategy,
                                                     micro_batches=micro_batches if strategy == "pipeline" else None),
                                f"{what} on the {spec.cores.count} cores of {spec.name}", strategies_on(spec))
    chip = chip_dram()
    core = core_design(spec, streaming_cores(placement, spec.cores.count, micro_batches))
    _check_chip_budget(spec, core)
    ev = run(core, devices=spec.cores.count, parallel=placement, micro_batches=micro_batches)
    return dataclasses.replace(ev, dram=chip, stage_dram=())


def _check_chip_budget(spec: ArchSpec, core: ArchSpec) -> None:
    """A chip's power budget, shared by its cores (each holds 1/count of it), must exceed their
    leakage together: the core's own refusal named the core's share as the threshold, and
    following it was refused again."""
    from mambalaya.cost.area import leakage_w
    from mambalaya.cost.energy import check_budget_above_leakage

    if core.energy is not None:
        check_budget_above_leakage(spec.name, spec.power_budget_w, leakage_w(core), cores=spec.cores.count)  # type: ignore[union-attr]


def layer_order(config: Any) -> tuple[str | None, ...]:
    """The model's layers in order, by layer type (None for a model of one layer type)."""
    if is_hybrid(config) or isinstance(config, GatedDeltaNetConfig):
        return tuple(config.layer_types)
    return (None,) * config.n_layers


def costed_layer_type(config: Any) -> str | None:
    """The layer type a model of one costed layer type evaluates (None: its only type; a Gated
    DeltaNet model's delta-rule layers, its attention layers not being built)."""
    return GDN_LINEAR if isinstance(config, GatedDeltaNetConfig) else None


def layer_weight_parameters(config: Any, layer_type: str | None) -> int:
    """Weight elements of one layer of ``layer_type`` (its norms, mixer and MLP)."""
    if isinstance(config, GatedDeltaNetConfig):
        mixer = config.layer_parameters() if layer_type == GDN_LINEAR else config.attention_parameters()
        return mixer + config.mlp_parameters()
    return config.layer_parameters() if layer_type is None else config.layer_parameters(layer_type)


#: How a model runs over several devices (``--parallel``): its layers split in order
#: (:mod:`mambalaya.cost.pipeline`), every layer's heads and channels split
#: (:mod:`mambalaya.cost.tensor_parallel`), a MoE model's experts split and its batch's
#: sequences between the devices everywhere else (:mod:`mambalaya.cost.expert_parallel`), or
#: a prefill's positions split, the scans' states passed along the devices
#: (:mod:`mambalaya.cost.sequence_parallel`).
PARALLEL_STRATEGIES = ("pipeline", "tensor", "expert", "sequence")


def resolve_parallel(parallel: str | None, devices: int) -> str:
    """The parallel strategy of an evaluation over ``devices`` (None: pipeline); ``best``: each
    strategy is evaluated and the faster kept (:func:`fastest_strategy`)."""
    chosen = "pipeline" if parallel is None else parallel
    if chosen not in (*PARALLEL_STRATEGIES, "best"):
        raise SpecError(f"--parallel is {', '.join(PARALLEL_STRATEGIES)} or best, not {parallel!r}")
    return chosen


def strategies_on(spec: ArchSpec) -> tuple[str, ...]:
    """The strategies ``--parallel best`` weighs on ``spec``'s devices, or on its cores (those
    whose cores all run at once, :data:`~mambalaya.cost.cores.CORE_PLACEMENTS`)."""
    from mambalaya.cost.cores import CORE_PLACEMENTS

    if spec.cores is not None or (spec.system is not None and spec.system.unit == "core"):
        return tuple(s for s in CORE_PLACEMENTS if s != "best")
    return PARALLEL_STRATEGIES


def fastest_strategy(evaluate_with: Callable[[str], Any], what: str,
                     strategies: tuple[str, ...] = PARALLEL_STRATEGIES) -> Any:
    """The evaluation (``evaluate_with(strategy)``) of least model latency over the
    :data:`PARALLEL_STRATEGIES`, carrying every strategy's latency in ``strategies_s``; a strategy
    the model cannot take (a device count that does not divide its heads) is left out, and if
    none can, one error names each one's reason."""
    found, refused = {}, []
    for strategy in strategies:
        try:
            found[strategy] = evaluate_with(strategy)
        except MambalayaError as err:
            refused.append(f"{strategy}: {err}")
    if not found:
        raise MambalayaError(f"{what} runs in no parallel strategy: " + "; ".join(refused))
    best = min(found.values(), key=lambda ev: ev.model_latency_s)
    return dataclasses.replace(best, strategies_s=tuple((s, ev.model_latency_s) for s, ev in found.items()))


def model_experts(config: Any) -> int:
    """The experts of each of the model's MoE blocks (0: a model without any)."""
    return int(getattr(config, "n_experts", 0) or 0)


def check_expert_parallel(config: Any, model_name: str, devices: int, *, batch: int) -> None:
    """Refuse expert parallelism where it cannot split the model (see
    :mod:`mambalaya.cost.expert_parallel`): a model without MoE layers, experts or a batch of
    sequences that ``devices`` does not divide into equal parts."""
    experts = model_experts(config)
    if not experts:
        raise SpecError(f"{model_name} has no mixture-of-experts layers: expert parallelism splits a MoE block's "
                        "experts between the devices; use --parallel pipeline or tensor")
    check_expert_devices(experts, devices)
    if batch % devices:
        raise SpecError(f"expert parallelism over {devices} devices gives each device an equal share of the batch's "
                        f"sequences outside the experts, and {devices} does not divide the batch ({batch}); use a "
                        "batch it divides")


def check_sequence_parallel(phase: str) -> None:
    """Refuse sequence parallelism where there are no positions to split: a decode step."""
    if phase != "prefill":
        raise SpecError("sequence parallelism splits a prefill's positions between the devices; a decode step has "
                        "one position: use --parallel pipeline, tensor or expert")


def sequence_parallel_need(config: Any, devices: int, *, batch: int, seq_len: int, bits: int,
                           policy: PrecisionPolicy) -> MemoryNeed:
    """What each of ``devices`` devices holds with a prefill's positions split
    (:mod:`mambalaya.cost.sequence_parallel`): every weight, and the states the prefill hands on
    (a state is one per sequence, not per position; the last device's are the layer's): as one
    device."""
    return _every_layer_need(_ModelHoldings(config, batch=batch, seq_len=seq_len, bits=bits, policy=policy))


def tensor_parallel_need(config: Any, devices: int, *, batch: int, seq_len: int, bits: int,
                         policy: PrecisionPolicy) -> MemoryNeed:
    """What each of ``devices`` devices holds with every layer's heads and channels split
    (:mod:`mambalaya.cost.tensor_parallel`): per layer type, the layer's weights in the share its
    split decode step keeps (norms and ungrouped projections whole on every device) and the
    states and KV caches of that split step; the weights outside the layers (embedding, head,
    final norm) and Zamba2's shared blocks whole on every device (an assumption on the safe
    side: Megatron-LM also splits the vocabulary). A Gated DeltaNet model's unbuilt attention
    layers keep ``1/devices`` of their weights and KV cache (their heads split)."""
    held = _ModelHoldings(config, batch=batch, seq_len=seq_len, bits=bits, policy=policy, tensor_devices=devices)
    return _every_layer_need(held)


def expert_parallel_need(config: Any, devices: int, *, batch: int, seq_len: int, bits: int,
                         policy: PrecisionPolicy) -> MemoryNeed:
    """What each of ``devices`` devices holds with a MoE model's experts split
    (:mod:`mambalaya.cost.expert_parallel`): every layer's weights but the experts' whole, the
    ``1/devices`` of each MoE block's experts it runs, the states and KV caches of its
    ``batch/devices`` sequences, and the weights outside the layers whole (each device embeds its
    own sequences)."""
    held = _ModelHoldings(config, batch=batch // devices, seq_len=seq_len, bits=bits, policy=policy,
                          expert_devices=devices)
    return _every_layer_need(held)


def _every_layer_need(held: "_ModelHoldings") -> MemoryNeed:
    """A device's need when it runs its part of every layer."""
    counts = {t: held.order.count(t) for t in dict.fromkeys(held.order)}
    own = sum(held.params[t] * n for t, n in counts.items()) + held.shared(set(held.order))
    return memory_need(own + held.outside, held.weight_bits, [(n, held.states[t]) for t, n in counts.items()],
                       batch=held.batch, seq_len=held.seq_len,
                       other_width=[(n, held.other_width[t]) for t, n in counts.items()])


#: Each strategy that splits every layer between the devices, with its need per device.
LAYER_SPLIT_NEEDS = {"tensor": tensor_parallel_need, "expert": expert_parallel_need,
                     "sequence": sequence_parallel_need}


def require_fits_layer_split(spec: ArchSpec, model_name: str, config: Any, devices: int, *, strategy: str,
                             batch: int, seq_len: int, policy: PrecisionPolicy) -> DramUse:
    """Each device's use of its off-chip memory under tensor or expert parallelism
    (``strategy``), or a :class:`~mambalaya.cost.capacity.CapacityError` saying what one device
    holds."""
    need = LAYER_SPLIT_NEEDS[strategy](config, devices, batch=batch, seq_len=seq_len, bits=spec.bits_per_element,
                                       policy=policy)
    capacity = spec.memory.offchip_capacity_bytes
    if capacity is not None and need.total_bytes > capacity:
        raise CapacityError(
            f"{model_name} does not fit on {devices} devices of {spec.name} {strategy} parallel: each holds "
            f"{byte_size(need.total_bytes)} ({need.parts_text()}), over memory.offchip_capacity_bytes = "
            f"{byte_size(capacity)}; use more devices, another strategy (--parallel), or a smaller batch or "
            "sequence length")
    return DramUse(need, capacity)


def _layer_states(config: Any, layer_type: str | None, *, batch: int, seq_len: int, bits: int,
                  policy: PrecisionPolicy, tensor_devices: int = 1,
                  expert_devices: int = 1) -> tuple[float, float, float, tuple[float, tuple[str, ...]]]:
    """(recurrent and conv state bytes, KV cache bytes, the share of its weights held, the
    weights held at another width than the policy's weights' and their extra bits,
    :func:`~mambalaya.cost.capacity.other_width_weight_bits`) of one layer of ``layer_type`` on
    one of ``tensor_devices`` tensor-parallel devices, or of ``expert_devices`` expert-parallel
    ones (``batch`` then being one device's sequences; one: the whole layer): the incoming states
    of its (split) decode step. A Gated DeltaNet model (the ``olmo-hybrid`` preset) builds
    its delta-rule layers only, yet runs its ``full_attention`` layers too: each holds a key and a
    value cache of ``n_kv_heads x head_dim`` per position, at the width the policy gives a hybrid
    attention layer's value cache."""
    if isinstance(config, GatedDeltaNetConfig) and layer_type == GDN_FULL:  # not built: its KV cache alone
        if config.n_kv_heads % tensor_devices:
            raise SpecError(f"tensor parallelism over {tensor_devices} devices splits the attention layers' "
                            f"{config.n_kv_heads} key/value heads into equal parts, and {tensor_devices} does not "
                            f"divide {config.n_kv_heads}")
        head_dim = config.head_dim or config.d_model // config.n_heads
        width = policy.bits("bamba", "VC0", Role.STATE, bits)
        return (0.0, 2 * config.n_kv_heads * head_dim * batch * seq_len * width / 8 / tensor_devices, 1 / tensor_devices,
                (0.0, ()))
    chosen = {"layer_type": layer_type} if is_hybrid(config) else {}
    step = build_layer(config, phase="decode", seq_len=max(seq_len, 1), batch=batch, bits=bits, precision=policy,
                       **chosen)
    weight_bits = policy.bits("", "", Role.WEIGHT, bits)
    if expert_devices > 1:  # its own sequences' states, all weights but the other devices' experts
        experts = set(expert_weights(step))
        kept = 1 - sum(math.prod(step.shape(t)) for t in experts) * (expert_devices - 1) / expert_devices \
            / _weight_elements(step)
        extra, names = other_width_weight_bits(step, weight_bits)
        expert_extra, _ = other_width_weight_bits(step, weight_bits, experts)
        return (*state_bytes(step), kept, (extra - expert_extra * (expert_devices - 1) / expert_devices, names))
    if tensor_devices == 1:
        return (*state_bytes(step), 1.0, other_width_weight_bits(step, weight_bits))
    part = device_cascade(step, tensor_parallel_ranks(step), tensor_devices)
    return (*state_bytes(part), _weight_elements(part) / _weight_elements(step), other_width_weight_bits(part, weight_bits))


def _weight_elements(cascade: Cascade) -> int:
    """The weight elements of a layer's cascade (the share of them a device holds applies to the
    layer's parameter count, whatever each weight's width)."""
    return sum(math.prod(cascade.shape(t)) for t, spec in cascade.tensors.items() if spec.role == Role.WEIGHT)


def stage_needs(config: Any, devices: int, *, batch: int, seq_len: int, bits: int,
                policy: PrecisionPolicy) -> tuple[MemoryNeed, ...]:
    """What each of ``devices`` pipeline stages must hold (see the module doc)."""
    return _split_needs(_ModelHoldings(config, batch=batch, seq_len=seq_len, bits=bits, policy=policy), devices)


class _ModelHoldings:
    """What a model's layers hold, per layer type (weights, states, KV caches), and what it
    holds outside them: built once, split over any device count."""

    def __init__(self, config: Any, *, batch: int, seq_len: int, bits: int, policy: PrecisionPolicy,
                 tensor_devices: int = 1, expert_devices: int = 1) -> None:
        self.order = layer_order(config)
        self.batch, self.seq_len = batch, seq_len
        self.weight_bits = policy.bits("", "", Role.WEIGHT, bits)
        kinds = dict.fromkeys(self.order)
        whole = {t: layer_weight_parameters(config, t) for t in kinds}
        held = {t: _layer_states(config, t, batch=batch, seq_len=seq_len, bits=bits, policy=policy,
                                 tensor_devices=tensor_devices, expert_devices=expert_devices) for t in kinds}
        self.states = {t: (recurrent, kv) for t, (recurrent, kv, _share, _other) in held.items()}
        self.params = {t: round(whole[t] * held[t][2]) for t in kinds}  # the share of the weights a device keeps
        self.other_width = {t: held[t][3] for t in kinds}
        self.shared = getattr(config, "shared_parameters", lambda types: 0)
        self.outside = config.model_parameters() - sum(whole[t] for t in self.order) - self.shared(set(self.order))


def _split_needs(held: _ModelHoldings, devices: int) -> tuple[MemoryNeed, ...]:
    needs = []
    for d, stage in enumerate(stage_layers(len(held.order), devices)):
        types = [held.order[i] for i in stage]
        counts = {t: types.count(t) for t in dict.fromkeys(types)}
        own = sum(held.params[t] * n for t, n in counts.items()) + held.shared(set(types))
        needs.append(memory_need(own + (held.outside if d == 0 else 0), held.weight_bits,
                                 [(n, held.states[t]) for t, n in counts.items()], batch=held.batch,
                                 seq_len=held.seq_len, other_width=[(n, held.other_width[t]) for t, n in counts.items()]))
    return tuple(needs)


def fewest_pipeline_devices(config: Any, capacity_bytes: int, *, batch: int, seq_len: int, bits: int,
                            policy: PrecisionPolicy, start: int = 1) -> int | None:
    """The fewest devices (from ``start``) whose pipeline stages each fit ``capacity_bytes``
    (None: not even one layer per device fits)."""
    held = _ModelHoldings(config, batch=batch, seq_len=seq_len, bits=bits, policy=policy)
    for n in range(max(start, 1), len(held.order) + 1):
        if all(need.total_bytes <= capacity_bytes for need in _split_needs(held, n)):
            return n
    return None


def require_fits_on(spec: ArchSpec, model_name: str, config: Any, devices: int, *, batch: int, seq_len: int,
                    policy: PrecisionPolicy) -> tuple[DramUse, ...]:
    """Each pipeline stage's use of its device's off-chip memory, or a
    :class:`~mambalaya.cost.capacity.CapacityError` naming the stage over the capacity and the
    fewest devices that would hold the model."""
    capacity = spec.memory.offchip_capacity_bytes
    needs = stage_needs(config, devices, batch=batch, seq_len=seq_len, bits=spec.bits_per_element, policy=policy)
    uses = tuple(DramUse(need, capacity) for need in needs)
    if capacity is None:
        return uses
    over = [d for d, need in enumerate(needs) if need.total_bytes > capacity]
    if over:
        d = over[0]
        fewest = fewest_pipeline_devices(config, capacity, batch=batch, seq_len=seq_len, bits=spec.bits_per_element,
                                         policy=policy, start=devices + 1)
        remedy = (f"--devices {fewest} holds it" if fewest is not None
                  else "no pipeline holds it (one layer per device is over the capacity)")
        raise CapacityError(
            f"{model_name} does not fit on {devices} devices of {spec.name} in a pipeline: device {d} holds "
            f"{byte_size(needs[d].total_bytes)} ({needs[d].parts_text()}), over memory.offchip_capacity_bytes = "
            f"{byte_size(capacity)}; {remedy}, or use a smaller batch or sequence length")
    return uses


def resolve_micro_batches(micro_batches: int | None, *, batch: int, devices: int, parallel: str) -> int:
    """The micro-batches of an evaluation (None: 1): more than one needs a pipeline over several
    devices and a batch they divide."""
    m = 1 if micro_batches is None else micro_batches
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise SpecError(f"--micro-batches is a whole number from 1 (got {micro_batches!r})")
    if m > 1 and (devices == 1 or parallel != "pipeline"):
        raise SpecError(f"--micro-batches {m} splits a batch between the stages of a pipeline: use it with "
                        "--devices N (N > 1) and --parallel pipeline")
    if batch % m:
        raise SpecError(f"--micro-batches {m} must divide the batch ({batch}) into equal micro-batches")
    return m


def pipeline_of(spec: ArchSpec, config: Any, devices: int, layer_s: dict[str | None, float],
                layer_cascades: dict[str | None, Cascade], micro_batches: int = 1) -> PipelineCost:
    """The pipeline of ``devices`` stages over the model's layers: each layer takes
    ``layer_s[type]`` seconds (0 for a type the evaluation does not cost, a Gated DeltaNet model's
    attention layers) and reads as ``layer_cascades[type]`` does (an uncosted type as a costed
    one: the residual stream is the same), both for one of ``micro_batches`` micro-batches."""
    order = layer_order(config)
    fallback = next(iter(layer_cascades.values()))
    return pipeline_cost(spec.system, [layer_s.get(t, 0.0) for t in order],
                         [layer_cascades.get(t, fallback) for t in order], devices, micro_batches)


def throttled_model_latency_s(spec: ArchSpec, config: Any, energies: dict[str | None, Any],
                              cascades: dict[str | None, Cascade], *, layer_split: Any = None,
                              pipeline: PipelineCost | None = None) -> float:
    """The model held to the power budget, each layer type (``energies[type]``, a
    :class:`~mambalaya.cost.energy.LayerEnergy` over its layers) throttled on its own: on several
    devices with the collectives' and transfers' time as it is (they were left out once, so the
    throttled model could be faster than the unthrottled one), a pipeline's schedule run again at
    the throttled layer times. One rule for a Mamba model and a hybrid one (a Mamba model's
    comparison once printed its layer's throttled time beside the model's latency)."""
    from mambalaya.cost.energy import ModelEnergy

    model = ModelEnergy(tuple(energies.values()))
    if layer_split is not None:
        return layer_split.latency_s + model.throttled_model_latency_s - model.model_latency_s
    if pipeline is not None:
        throttled = {t: e.throttled_latency_s for t, e in energies.items()}
        return pipeline_of(spec, config, pipeline.devices, throttled, cascades,
                           micro_batches=pipeline.micro_batches).latency_s
    return model.throttled_model_latency_s


def stage_energies_j(config: Any, pipeline: PipelineCost, layer_j: dict[str | None, float]) -> tuple[float, ...]:
    """Each stage's energy for one micro-batch: its layers', each ``layer_j[type]`` (0 for a type
    the evaluation does not cost, as :func:`pipeline_of` takes its seconds)."""
    order = layer_order(config)
    return tuple(float(sum(layer_j.get(order[i], 0.0) for i in stage)) for stage in pipeline.stages)


__all__ = ["on_cores", "run_on_cores", "strategies_on", "LAYER_SPLIT_NEEDS", "PARALLEL_STRATEGIES", "check_expert_parallel", "check_sequence_parallel",
           "sequence_parallel_need", "expert_parallel_need", "model_experts", "costed_layer_type", "fastest_strategy", "fewest_pipeline_devices", "layer_order", "layer_weight_parameters",
           "pipeline_of", "throttled_model_latency_s", "require_fits_on", "require_fits_layer_split", "resolve_devices", "resolve_micro_batches",
           "resolve_parallel",
           "stage_energies_j", "stage_needs", "tensor_parallel_need"]
