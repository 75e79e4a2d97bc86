"""Evaluate one model layer on one architecture, and compare designs across sequence lengths.

Every evaluation first checks that the model fits in the design's off-chip memory
(:func:`require_fits`, :mod:`mambalaya.cost.capacity`): its weights, states and KV cache at the
batch and context length; a model that does not fit is refused before anything is costed. Every
figure it reports is finite (:func:`mambalaya.cost.latency.require_finite`, checked where the
latency and energy results are made)."""

from __future__ import annotations

import math
import re

from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import Any

from mambalaya.arch import ArchSpec, load_arch
from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.mapping import Mapping
from mambalaya.cost.capacity import DramUse, MemoryNeed, activation_peak, check_fits
from mambalaya.cost.expert_parallel import ExpertParallelCost
from mambalaya.cost.pipeline import PipelineCost
from mambalaya.cost.sequence_parallel import SequenceParallelCost, sequence_device_cascade, sequence_parallel_layers
from mambalaya.cost.tensor_parallel import (TensorParallelCost, device_cascade, tensor_parallel_layers,
                                            tensor_parallel_ranks)
from mambalaya.experiments.devices import (check_expert_parallel, check_sequence_parallel, costed_layer_type,
                                           fastest_strategy, fewest_pipeline_devices, pipeline_of, throttled_model_latency_s,
                                           require_fits_layer_split, require_fits_on, resolve_devices,
                                           resolve_micro_batches, resolve_parallel, run_on_cores,
                                           stage_energies_j, stage_needs, strategies_on)
from mambalaya.cost.latency import LayerLatency, layer_latency
from mambalaya.cost.energy import LayerEnergy, layer_energy
from mambalaya.fusion.mapping_file import check_mapping_file
from mambalaya.search.mappings import NAMED_MAPPINGS, SearchStats, load_mapping_file, named_mapping
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.workloads import ModelConfig, build_layer, has_scan_forms
from mambalaya.workloads.precision import PrecisionPolicy, load_policy


@dataclass(frozen=True)
class Evaluation:
    arch: ArchSpec
    model: str
    config: ModelConfig
    phase: str
    seq_len: int
    batch: int
    cascade: Cascade
    mapping: Mapping
    result: LayerLatency
    search: SearchStats
    precision: PrecisionPolicy
    objective: str = "latency"
    #: The model's use of the design's off-chip memory (None where the caller did not check it).
    dram: DramUse | None = None
    #: On several devices (pipeline parallel): the pipeline and each device's use of its memory.
    pipeline: PipelineCost | None = None
    stage_dram: tuple[DramUse, ...] = ()
    #: Tensor, expert or sequence parallel over several devices (or a multi-core chip's cores):
    #: each layer's part on a device and its collectives (``cascade`` and ``result`` are then one
    #: device's part of the layer).
    layer_split: TensorParallelCost | ExpertParallelCost | SequenceParallelCost | None = None
    #: With ``parallel="best"``: each strategy's model latency, the fastest kept.
    strategies_s: tuple[tuple[str, float], ...] = ()
    #: Where ``result`` is a part of the model's pass (one device's of a layer split over devices:
    #: fewer sequences or positions; one micro-batch's of a pipeline): the tokens of the whole
    #: pass, every device's and micro-batch's together. None: the costed layer's own (a hybrid
    #: layer type's micro-batch, whose figures are that micro-batch's).
    whole_tokens: int | None = None
    #: A prefill with two scan forms (Mamba-2, the delta rule) run in its faster form (:func:`evaluate_best_scan`): why the other form did
    #: not run, where it did not ("" where both ran, or the form was asked for).
    other_scan_refused: str = ""

    @property
    def tokens(self) -> int:
        """The tokens the costed layer's time covers (what tokens per second and energy per token
        divide by): every device's of a split layer, else the costed layer's batch x positions."""
        return self.whole_tokens if self.whole_tokens is not None else self.result.batch * self.result.positions

    @property
    def model_latency_s(self) -> float:
        """The whole model's latency: every layer's, and on several devices the transfers."""
        if self.layer_split is not None:
            return self.layer_split.latency_s
        return self.pipeline.latency_s if self.pipeline is not None else self.result.model_latency_s

    @property
    def cores(self) -> int:
        """The cores of the chip this evaluation ran on (a multi-core design's, each costed as
        one of the devices of ``layer_split`` or ``pipeline``); 1 otherwise."""
        return chip_cores(self.arch, self.layer_split or self.pipeline)

    @property
    def layer_parts(self) -> int:
        """How many cores' parts make up one layer of a multi-core chip (its cores each running a
        part of every layer; one where a core runs whole layers, in a pipeline, or off a chip)."""
        return chip_cores(self.arch, self.layer_split)

    @property
    def energy(self) -> LayerEnergy | None:
        """The energy of this evaluation's actions (None when the arch has no energy section)."""
        if self.arch.energy is None:
            return None
        return layer_energy(self.arch, self.cascade, self.result)

    def throttled_model_latency_s(self, energy: LayerEnergy) -> float:
        """The model held to the power budget
        (:func:`~mambalaya.experiments.devices.throttled_model_latency_s`, with this layer's
        ``energy``)."""
        kind = costed_layer_type(self.config)
        return throttled_model_latency_s(self.arch, self.config, {kind: energy}, {kind: self.cascade},
                                         layer_split=self.layer_split, pipeline=self.pipeline)

    def totals(self) -> dict[str, Any]:
        r = self.result
        energy = self.energy
        extra = {} if energy is None else {
            "layer_energy_j": energy.layer_j, "model_energy_j": energy.model_j,
            "energy_per_token_j": energy.per_token_j, "edp_js": energy.edp_js,
            "average_power_w": energy.average_power_w, "power_budget_w": self.arch.power_budget_w,
            # the budget holds at every moment: a layer's power while it runs (on several devices the
            # average below counts the waits too, so it may be within a budget the layer is over)
            "layer_power_w": energy.average_power_w,
            "over_power_budget": over_budget(energy.average_power_w, self.arch.power_budget_w),
            "leakage_w": energy.leakage_w, "throttled_latency_s": energy.throttled_latency_s,
            "throttled_model_latency_s": self.throttled_model_latency_s(energy),
        }
        if self.arch.area is not None:
            from mambalaya.cost.area import total_area_mm2

            extra["area_mm2"] = total_area_mm2(self.arch) * self.cores  # a multi-core chip: every core's
        if self.dram is not None:
            extra.update(dram_totals(self.dram))
        model_s = self.model_latency_s
        tokens = self.tokens
        tokens_per_s = tokens / model_s if model_s else 0.0
        if self.pipeline is not None:
            extra.update(pipeline_totals(self.pipeline, self.stage_dram))
            if energy is not None:
                stage_j = stage_energies_j(self.config, self.pipeline, {costed_layer_type(self.config): energy.layer_j})
                extra.update(pipeline_energy(self.pipeline, stage_j, tokens, energy.leakage_w))
        if self.strategies_s:
            extra["parallel_strategies_s"] = dict(self.strategies_s)
        if self.layer_split is not None:
            extra.update(layer_split_totals(self.layer_split, energy and energy.model_j, tokens,
                                            energy.leakage_w if energy is not None else 0.0))
        return {
            "latency_s": r.latency_s,
            "model_latency_s": model_s,
            "offchip_bytes": r.offchip_bytes,
            "compute_util": r.compute_util,
            "mem_util": r.mem_util,
            "comp_s": r.comp_s,
            "groups": len(r.groups),
            "n_layers": r.n_layers,
            # a model whose built layers are part of it (the gated_deltanet family's mixers): what
            # its "model" figures leave out
            **({"model_leaves_out": self.config.not_built()} if hasattr(self.config, "not_built") else {}),
            "tokens_per_s": tokens_per_s,
            "onchip_s": r.onchip_s,
            "buffer_read_write_bytes": r.buffer_read_write_bytes,
            "spatial_util": r.spatial_util,
            "bound": r.bound,
            **extra,
        }


def core_share(spec: ArchSpec, whole: Cascade, part: Cascade, strategy: str, devices: int) -> dict[str, float] | None:
    """On one core of a multi-core chip (``spec``'s system joins cores), each tensor's share of
    the off-chip bytes the core carries (:func:`~mambalaya.cost.cores.core_dram_share`; ``part``
    is its part of ``whole`` under ``strategy``); None on a device of its own."""
    if spec.system is None or spec.system.unit != "core" or devices == 1 or strategy not in ("tensor", "sequence"):
        return None  # (a pipeline's cores each stream their own layers)
    from mambalaya.cost.cores import core_dram_share
    from mambalaya.cost.sequence_parallel import sequence_ranks
    from mambalaya.cost.tensor_parallel import split_parts

    if strategy == "tensor":
        return core_dram_share(part, split_parts(whole, tensor_parallel_ranks(whole), devices), devices)
    share = core_dram_share(part, sequence_ranks(whole), devices)
    # what the split adds (the state a core receives, its halos, its product's start) is the core's
    # own, not a tensor every core holds (it was read at a 1/cores share and multicast)
    return {t: v for t, v in share.items() if t in whole.tensors}


def multicast_of(spec: ArchSpec, result: LayerLatency, dram_share: dict[str, float] | None, kind: str | None,
                 cores: int) -> dict[str | None, tuple[float, float | None]]:
    """On one of ``cores`` cores of a multi-core chip, the network's multicast in a layer of
    ``kind`` costed as ``result`` (:func:`~mambalaya.cost.cores.multicast_cost`); nothing on a
    device of its own."""
    if dram_share is None:
        return {}
    from mambalaya.cost.cores import multicast_cost

    return {kind: multicast_cost(result, dram_share, cores, spec.system)}


def chip_cores(arch: ArchSpec, split: Any) -> int:
    """The cores of a multi-core chip an evaluation's ``arch`` is one core of (its system joins
    cores, :func:`~mambalaya.arch.core_design`), from its split; 1 for any other design."""
    return split.devices if split is not None and arch.system is not None and arch.system.unit == "core" else 1


def layer_split_totals(split: TensorParallelCost | ExpertParallelCost | SequenceParallelCost, device_model_j: float | None, tokens: int,
                       leakage_w: float = 0.0) -> dict[str, Any]:
    """Tensor, expert or sequence parallelism's own figures in an evaluation's totals (every device runs
    every layer on its part), and its energy: the devices' together (the most loaded device's
    model energy times the devices, an upper bound where the experts' load is uneven, each
    device's leakage while the collectives run, ``leakage_w`` over ``interconnect_s``, which its
    layers' energy leaves out, plus the links' where they have an energy), per token and times
    the latency; the average power is one device's (its energy over the model's latency,
    collectives included). ``all_reduce_bytes`` (tensor), ``all_to_all_bytes`` (expert) or
    ``passed_bytes`` (sequence): what one device moves in the collectives (the busiest, for the
    all-to-alls; the halos and states the last device receives, for sequence parallelism). Whether
    the budget holds is the layers' own rule (a layer's power while it runs), not this average."""
    moved = {"tensor": "all_reduce_bytes", "expert": "all_to_all_bytes", "sequence": "passed_bytes"}[split.strategy]
    out: dict[str, Any] = {"devices": split.devices, "parallel": split.strategy, "layers_latency_s": split.layers_s,
                           "interconnect_s": split.interconnect_s, "interconnect_share": split.interconnect_share,
                           moved: split.collective_bytes, "interconnect_energy_j": split.interconnect_j}
    if device_model_j is not None:
        waiting_j = leakage_w * split.interconnect_s  # (once left out: a device leaks while it waits too)
        device_j = device_model_j + waiting_j
        total_j = split.devices * device_j + (split.interconnect_j or 0.0)
        out.update(model_energy_j=total_j, energy_per_token_j=total_j / tokens if tokens else 0.0,
                   edp_js=total_j * split.latency_s, waiting_leakage_j=split.devices * waiting_j,
                   average_power_w=device_j / split.latency_s if split.latency_s else 0.0)
    return out


def devices_columns(cost: PipelineCost | TensorParallelCost | ExpertParallelCost | SequenceParallelCost | None) -> dict[str, Any]:
    """A comparison row's columns for a model over several devices (none on one)."""
    if cost is None:
        return {}
    return {"devices": cost.devices, "parallel": getattr(cost, "strategy", "pipeline"),
            "interconnect_s": cost.interconnect_s, "interconnect_share": cost.interconnect_share}


def pipeline_energy(pipeline: PipelineCost, stage_j: tuple[float, ...], tokens: int,
                    leakage_w: float = 0.0) -> dict[str, Any]:
    """A pipeline's energy: every micro-batch's on every stage (``stage_j``: each stage's for one
    micro-batch, :func:`~mambalaya.experiments.devices.stage_energies_j`), each device's leakage
    while it waits (``leakage_w`` over the latency less its stage's busy time, which its layers'
    energy leaves out) and the links' transfers, per token (the batch's ``tokens``) and times the
    model's latency, transfers included; the average power is the busiest device's (its energy
    over that latency, as tensor parallelism's is one device's). Whether the budget holds is the
    layers' own rule (a layer's power while it runs), not this average."""
    m, latency_s = pipeline.micro_batches, pipeline.latency_s
    device_j = [m * j + leakage_w * max(0.0, latency_s - m * s) for j, s in zip(stage_j, pipeline.stage_s)]
    waiting_j = sum(device_j) - m * sum(stage_j)
    total_j = sum(device_j) + (pipeline.interconnect_j or 0.0)
    return {"model_energy_j": total_j, "energy_per_token_j": total_j / tokens if tokens else 0.0,
            "edp_js": total_j * latency_s, "waiting_leakage_j": waiting_j,
            "average_power_w": max(device_j) / latency_s if latency_s else 0.0}


def pipeline_totals(pipeline: PipelineCost, stage_dram: tuple[DramUse, ...]) -> dict[str, Any]:
    """A pipeline's own figures in an evaluation's totals: the devices, the time and (where the
    links have one) energy of the transfers between them, and the fullest device's memory."""
    out: dict[str, Any] = {"devices": pipeline.devices, "parallel": "pipeline", "layers_latency_s": pipeline.layers_s,
                           "interconnect_s": pipeline.interconnect_s, "interconnect_share": pipeline.interconnect_share,
                           "boundary_bytes": list(pipeline.boundary_bytes),
                           "devices_busy_share": pipeline.busy_share, "interconnect_energy_j": pipeline.interconnect_j,
                           "micro_batches": pipeline.micro_batches}
    if stage_dram:
        out["dram_need_bytes_per_device"] = [u.used_bytes for u in stage_dram]
    return out


def over_budget(power_w: float, budget_w: float | None) -> bool:
    """Whether an average power exceeds a design's power budget (never without a budget)."""
    return budget_w is not None and power_w > budget_w


def resolve_mapping(name: str | None, cascade: Cascade, arch: ArchSpec, stats: SearchStats | None = None,
                    objective: str = "latency") -> Mapping:
    """The design's own mapping (``None``), a named mapping built for ``arch`` (minimising
    ``objective``), or a mapping file."""
    name = name or arch.mappings.default
    buffer = arch.memory.onchip_buffer_bytes
    if name in NAMED_MAPPINGS:
        return named_mapping(name, cascade, None if name == "ideal" else buffer, stats, arch=arch, objective=objective)
    mapping = load_mapping_file(name)
    if mapping.buffer_bytes is None:
        mapping = replace(mapping, buffer_bytes=buffer)
    elif buffer is not None and mapping.buffer_bytes > buffer:  # (a file's own buffer once stood in for the design's)
        raise SpecError(f"the mapping file gives buffer_bytes {mapping.buffer_bytes:,}, more than {arch.name}'s on-chip "
                        f"buffer of {buffer:,} bytes (memory.onchip_buffer_bytes): a mapping is checked against the "
                        f"design it runs on; drop the field, or give the design a larger buffer (--set "
                        f"memory.onchip_buffer_bytes=...)", source=name)
    return check_mapping_file(cascade, mapping, name)


def evaluate(
    arch: ArchSpec | str,
    model_name: str,
    config: ModelConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    mapping: str | None = None,
    scan: str | None = None,
    precision: str | PrecisionPolicy | None = None,
    objective: str = "latency",
    devices: int | None = None,
    parallel: str | None = None,
    micro_batches: int | None = None,
) -> Evaluation:
    """One layer of ``config`` on ``arch`` under its mapping (searched for ``objective``:
    latency, energy or edp). Tensor widths follow ``precision``
    (default: the arch's own policy, ``arch.precision``), whose ``design`` width is the arch's
    ``bits_per_element``. ``scan`` picks Mamba-2's scan form (default: chunked in prefill,
    recurrent in decode). ``devices`` (default 1) runs the model over that many devices of the
    design, ``parallel`` saying how: ``pipeline`` (the default; the layers split in order) or
    ``tensor`` (every layer's heads and channels split, :mod:`mambalaya.cost.tensor_parallel`:
    the layer costed is then one device's part) or ``best`` (the faster of the two, both
    latencies in ``strategies_s``) (:mod:`mambalaya.experiments.devices`). ``micro_batches``
    (default 1) splits the batch between a pipeline's stages: the layer costed is then one
    micro-batch's (``result``; ``batch`` stays the whole batch). A multi-core design (a ``cores``
    section) runs on its cores as on devices, placed by ``cores.placement`` or ``parallel``
    (:mod:`mambalaya.cost.cores`)."""
    spec = load_arch(arch) if isinstance(arch, str) else arch
    if spec.cores is not None:  # the cores as devices joined by the network on chip
        return run_on_cores(spec, devices, parallel, micro_batches, lambda design, **split: evaluate(
            design, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping, scan=scan,
            precision=precision, objective=objective, **split), model_name,
            lambda: require_fits(spec, model_name, config, batch=batch, seq_len=seq_len, precision=precision))
    policy = resolve_policy(spec, precision)
    n_devices = resolve_devices(spec, devices)
    if resolve_parallel(parallel, n_devices) == "best" and n_devices > 1:
        resolve_micro_batches(micro_batches, batch=batch, devices=n_devices, parallel="pipeline")  # (else left out silently)
        return fastest_strategy(lambda strategy: evaluate(
            spec, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping, scan=scan,
            precision=policy, objective=objective, devices=n_devices, parallel=strategy,
            micro_batches=micro_batches if strategy == "pipeline" else None),
            f"{model_name} on {n_devices} {spec.system.unit}s of {spec.name}", strategies_on(spec))
    requested = resolve_parallel(parallel, n_devices)
    strategy = requested if n_devices > 1 else "pipeline"
    if requested == "expert":  # a model of one layer type has no MoE block: refused, naming why (on one device too,
        check_expert_parallel(config, model_name, n_devices, batch=batch)  # where it was once run as if it applied)
    if requested == "sequence":
        check_sequence_parallel(phase)
    tensor, sequence = strategy == "tensor", strategy == "sequence"
    m = resolve_micro_batches(micro_batches, batch=batch, devices=n_devices, parallel=strategy)
    if tensor or sequence:
        dram, stage_dram = require_fits_layer_split(spec, model_name, config, n_devices, strategy=strategy,
                                                    batch=batch, seq_len=seq_len, policy=policy), ()
    else:
        dram, stage_dram = require_fits_across(spec, model_name, config, n_devices, batch=batch, seq_len=seq_len,
                                               policy=policy)
    cascade = cached_layer(config, phase=phase, seq_len=seq_len, batch=batch // m, bits=spec.bits_per_element,
                     name=f"{model_name}-{phase}", scan=scan, precision=policy)
    costed = (device_cascade(cascade, tensor_parallel_ranks(cascade), n_devices) if tensor else
              sequence_device_cascade(cascade, n_devices) if sequence else cascade)
    on_core = core_share(spec, cascade, costed, strategy, n_devices)
    ev = evaluate_cascade(spec, model_name, config, costed, phase=phase, batch=batch, mapping=mapping,
                          policy=policy, objective=objective, n_layers=config.n_layers, dram=dram,
                          dram_share=on_core, whole_tokens=batch * cascade.size("I"))
    if n_devices == 1:
        return ev
    kind = costed_layer_type(config)
    if tensor:
        layers = tensor_parallel_layers(spec.system, cascade, n_devices, count=ev.result.n_layers,
                                        layer_s=ev.result.latency_s)
        multicast = multicast_of(spec, ev.result, on_core, kind, n_devices)
        return replace(ev, layer_split=TensorParallelCost(n_devices, {kind: layers}, multicast))
    if sequence:
        passed = sequence_parallel_layers(spec.system, cascade, n_devices, count=ev.result.n_layers,
                                          layer_s=ev.result.latency_s)
        multicast = multicast_of(spec, ev.result, on_core, kind, n_devices)
        return replace(ev, layer_split=SequenceParallelCost(n_devices, {kind: passed}, multicast))
    return replace(ev, pipeline=pipeline_of(spec, config, n_devices, {kind: ev.result.latency_s}, {kind: ev.cascade},
                                            micro_batches=m), stage_dram=stage_dram)


@dataclass
class CostedLayers:
    """The mappings and costs of layers a run has evaluated, by what decides them: the
    cascade's value (its name, Einsums, tensors, ranks with their sizes, parameters), the
    design's whole spec, the named mapping, the objective, the policy and the layer count.
    A run that meets the same layer again (a decode step's Mamba, MLP or MoE layer, which does
    not read the KV cache, at every context length of the hybrid suite) takes the first
    evaluation's mapping and cost instead of searching again: the same inputs, so the same
    numbers (the search is deterministic). Its :class:`SearchStats` are the first search's.
    Mapping files are never reused (a file may change between evaluations)."""

    entries: dict[tuple, tuple[Mapping, LayerLatency, SearchStats]] = field(default_factory=dict)
    hits: int = 0
    #: The most entries kept (the oldest dropped first; None: no bound): memory only.
    limit: int | None = None

    @staticmethod
    def key(spec: ArchSpec, cascade: Cascade, mapping: str, objective: str, n_layers: int,
            policy: PrecisionPolicy) -> tuple:
        return (cascade.name, cascade.description, cascade.structure_key, tuple(cascade.params.items()),
                tuple(cascade.ranks.items()), spec.model_dump_json(), mapping, objective, n_layers,
                policy.model_dump_json())


def evaluate_cascade(spec: ArchSpec, model_name: str, config: Any, cascade: Cascade, *, phase: str, batch: int,
                     mapping: str | None, policy: PrecisionPolicy, objective: str = "latency",
                     n_layers: int = 1, dram: DramUse | None = None, reuse: CostedLayers | None = None,
                     dram_share: dict[str, float] | None = None, whole_tokens: int | None = None) -> Evaluation:
    """One built layer cascade on ``spec`` under ``mapping`` (the design's own when None),
    the model counting ``n_layers`` such layers; ``dram`` is the model's checked use of the
    design's off-chip memory (:func:`require_fits`), carried to the reports. With ``reuse``, a
    layer costed before under the same inputs (:class:`CostedLayers`) is not searched again.
    ``whole_tokens``: the whole layer's tokens where ``cascade`` is one device's part of fewer
    (:attr:`Evaluation.whole_tokens`)."""
    name = mapping or spec.mappings.default
    key = ((*CostedLayers.key(spec, cascade, name, objective, n_layers, policy), tuple(sorted((dram_share or {}).items())))
           if reuse is not None and name in NAMED_MAPPINGS else None)
    if key is not None and key in reuse.entries:  # type: ignore[union-attr]
        reuse.hits += 1  # type: ignore[union-attr]
        m, result, stats = reuse.entries[key]  # type: ignore[union-attr]
    else:
        stats = SearchStats()
        m = resolve_mapping(mapping, cascade, spec, stats, objective)
        result = layer_latency(spec, cascade, m, n_layers=n_layers, dram_share=dram_share)
        if key is not None:
            reuse.entries[key] = (m, result, stats)  # type: ignore[union-attr]
            if reuse.limit is not None and len(reuse.entries) > reuse.limit:  # type: ignore[union-attr]
                reuse.entries.pop(next(iter(reuse.entries)))  # type: ignore[union-attr]
    if dram is not None:  # the mapped layer's activations, reported beside the model's need
        dram = dram.with_activations(activation_peak(cascade, result.groups))
    return Evaluation(spec, model_name, config, phase, cascade.size("I"), batch, cascade, m, result, stats, policy,
                      objective, dram, whole_tokens=whole_tokens)


def dram_totals(dram: DramUse) -> dict[str, Any]:
    """A result's DRAM figures: the model's need, the capacity and what the need leaves, and the
    mapped layer's activation peak, what the capacity leaves beside it too and whether both fit
    (None where not known): the text's two "left" figures under their own names."""
    peak = dram.activations
    return {"dram_need_bytes": dram.used_bytes, "dram_capacity_bytes": dram.capacity_bytes,
            "dram_left_bytes": dram.left_bytes, "activation_peak_bytes": None if peak is None else peak.bytes,
            "dram_left_after_activations_bytes": dram.left_after_activations_bytes,
            "activations_fit_dram": dram.activations_fit}


_NEEDS: dict[tuple, MemoryNeed] = {}
_NEEDS_SIZE = 256


def model_memory_need(config: Any, *, batch: int, seq_len: int, bits: int, policy: PrecisionPolicy) -> MemoryNeed:
    """What one device holds to run ``config`` at ``batch`` with ``seq_len`` positions (the
    prompt in prefill, the cached context in decode): its parameters at the policy's weight
    width, and each layer type's states and KV cache from its decode step's cascade
    (:func:`mambalaya.cost.capacity.state_bytes`): the one stage of a one-device pipeline
    (:func:`~mambalaya.experiments.devices.stage_needs`). Memoised: sweeps and comparisons ask again."""
    key = (config, batch, seq_len, bits, policy.model_dump_json())
    need = _NEEDS.get(key)
    if need is None:
        (need,) = stage_needs(config, 1, batch=batch, seq_len=seq_len, bits=bits, policy=policy)
        if len(_NEEDS) >= _NEEDS_SIZE:
            _NEEDS.pop(next(iter(_NEEDS)))
        _NEEDS[key] = need
    return need


def require_fits(spec: ArchSpec, model_name: str, config: Any, *, batch: int, seq_len: int,
                 precision: str | PrecisionPolicy | None = None) -> DramUse:
    """The model's use of ``spec``'s off-chip memory at ``batch`` and ``seq_len``, or a
    :class:`~mambalaya.cost.capacity.CapacityError` when it does not fit (naming the need,
    the capacity and the devices that would hold it). Every evaluation calls it before costing:
    :func:`evaluate` (and so compare and reproduce), and the hybrid and sweep evaluations."""
    use = dram_use(spec, config, batch=batch, seq_len=seq_len, precision=precision)
    across = None
    if use.capacity_bytes is not None and use.used_bytes > use.capacity_bytes:
        if spec.system is None:
            across = (f"{spec.name} has no system section, so it runs on one device (a design with one, such as "
                      "gpu-h100, runs a model over several: --devices)")
        else:
            fewest = fewest_pipeline_devices(config, use.capacity_bytes, batch=batch, seq_len=seq_len,
                                             bits=spec.bits_per_element, policy=resolve_policy(spec, precision), start=2)
            across = (f"in a pipeline (its layers split in order) it runs on {fewest}: --devices {fewest}"
                      if fewest is not None else "no pipeline holds it (one layer per device is over the capacity)")
    return check_fits(use.need, use.capacity_bytes, model=model_name, arch=spec.name, across=across)


def require_fits_across(spec: ArchSpec, model_name: str, config: Any, devices: int, *, batch: int, seq_len: int,
                        policy: PrecisionPolicy) -> tuple[DramUse | None, tuple[DramUse, ...]]:
    """The model checked against the memory of ``devices`` devices: on one,
    ``(its use, ())`` (:func:`require_fits`); on several, ``(None, each device's use)``
    (:func:`~mambalaya.experiments.devices.require_fits_on`). Refuses what does not fit."""
    if devices == 1:
        return require_fits(spec, model_name, config, batch=batch, seq_len=seq_len, precision=policy), ()
    return None, require_fits_on(spec, model_name, config, devices, batch=batch, seq_len=seq_len, policy=policy)


def dram_use(spec: ArchSpec, config: Any, *, batch: int, seq_len: int,
             precision: str | PrecisionPolicy | None = None) -> DramUse:
    """The model's need of ``spec``'s off-chip memory at ``batch`` and ``seq_len`` against its
    capacity, whether it fits or not (:func:`require_fits` refuses what does not)."""
    policy = resolve_policy(spec, precision)
    need = model_memory_need(config, batch=batch, seq_len=seq_len, bits=spec.bits_per_element, policy=policy)
    return DramUse(need, spec.memory.offchip_capacity_bytes)


LAYERS: dict[tuple, Cascade] = {}
_LAYER_CACHE_SIZE = 64


def forget_cached_layers() -> None:
    """Empty :func:`cached_layer`'s cache, each layer's memos dropped first
    (:func:`~mambalaya.search.memos.forget_results`: its cost models refer back to it, a cycle
    the collector would otherwise have to find): for a run that moves on to layers no earlier
    one shares (the hybrid suite's next context length), whose memory would otherwise grow
    with every layer it keeps."""
    from mambalaya.search.memos import forget_results

    for cascade in LAYERS.values():
        forget_results(cascade)
    LAYERS.clear()


def cached_layer(config: ModelConfig, *, precision: PrecisionPolicy, **kwargs: Any) -> Cascade:
    """``build_layer``, shared between evaluations of the same layer. A cascade is immutable and
    memoises its per-group closed forms, so designs and parameter variations costed on one
    layer (reproduce, sensitivity, compare) pay for those once."""
    key = (config, precision.model_dump_json(), tuple(sorted(kwargs.items())))
    if key not in LAYERS:
        if len(LAYERS) >= _LAYER_CACHE_SIZE:
            LAYERS.pop(next(iter(LAYERS)))
        LAYERS[key] = build_layer(config, precision=precision, **kwargs)
    return LAYERS[key]


def resolve_policy(spec: ArchSpec, precision: str | PrecisionPolicy | None) -> PrecisionPolicy:
    """The policy asked for, else the arch's own (an error names the arch's field)."""
    if precision is not None:
        return load_policy(precision)
    try:
        return load_policy(spec.precision)
    except SpecError as err:
        raise SpecError(f"architecture {spec.name!r}, field precision: {err}") from None


def scan_form(cascade: Cascade) -> str:
    """A Mamba-2 or gated delta rule layer's scan form: ``chunked`` where its in-chunk mask ``LM``
    is (both chunked forms read it), else ``recurrent``."""
    return "chunked" if "LM" in cascade.tensors else "recurrent"


#: The scan forms a prefill with two may run (:func:`~mambalaya.workloads.has_scan_forms`), in the
#: order a tie keeps (the chunked form first).
SCAN_FORMS = ("chunked", "recurrent")


def run_scan_forms(run: Callable[[str], Any]) -> tuple[list[Any], list[str]]:
    """``run(form)`` of each of :data:`SCAN_FORMS` that maps (in their order, so that ``min`` over
    them keeps the chunked form on a tie), and the others' refusals, "form: reason": the one
    loop behind every command's "the faster form" (:func:`evaluate_best_scan`, a sweep's point)."""
    found, errors = [], []
    for form in SCAN_FORMS:
        try:
            found.append(run(form))
        except MambalayaError as err:
            errors.append(f"{form}: {err}")
    return found, errors


def objective_value(ev: Evaluation) -> float:
    """What ``ev``'s objective minimises, over the whole model: its latency, energy or
    energy-delay product (the transfers and every device's energy included)."""
    if ev.objective == "latency":
        return ev.model_latency_s
    totals = ev.totals()
    return totals["model_energy_j"] if ev.objective == "energy" else totals["edp_js"]


def evaluate_best_scan(arch: ArchSpec | str, model_name: str, config: ModelConfig, *, phase: str, seq_len: int,
                       batch: int, mapping: str | None = None, precision: str | PrecisionPolicy | None = None,
                       scan: str | None = None, **options: Any) -> Evaluation:
    """:func:`evaluate` (``options``: its other keywords); a prefill with two scan forms
    (:func:`~mambalaya.workloads.has_scan_forms`: Mamba-2, the gated delta rule) without a ``scan``
    runs whichever form (chunked SSD or the recurrent scan) is better on the design by the
    objective (:func:`objective_value`: the faster for latency, the one of least energy or EDP for
    those), so no design is judged on a form that suits it badly. The one default of every command: ``evaluate`` and
    ``compare`` without ``--scan`` once ran the chunked form while ``reproduce`` and
    ``sensitivity`` ran the faster, so one design pair printed 2.31x in one and 2.18x in the other."""
    if scan is not None or not has_scan_forms(config) or phase != "prefill":
        return evaluate(arch, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping,
                        precision=precision, scan=scan, **options)
    spec = load_arch(arch) if isinstance(arch, str) else arch
    if spec.cores is None and options.get("devices") in (None, 1):
        require_fits(spec, model_name, config, batch=batch, seq_len=seq_len, precision=precision)  # once, not per form
    found, errors = run_scan_forms(lambda form: evaluate(
        spec, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping, scan=form,
        precision=precision, **options))
    if not found:
        raise MambalayaError(f"{model_name} prefill L={seq_len} on {spec.name}: no scan form maps ({'; '.join(errors)})")
    best = min(found, key=objective_value)  # (by latency alone, an energy search kept the faster form's energy)
    if best.strategies_s and best.objective == "latency":  # --parallel best: each strategy at its faster form
        strategies: dict[str, float] = {}                  # (each form listed those it could take, at its latency)
        for ev in found:
            for strategy, seconds in ev.strategies_s:
                strategies[strategy] = min(seconds, strategies.get(strategy, math.inf))
        best = replace(best, strategies_s=tuple(strategies.items()))
    # (for energy or EDP the kept form's own list: the other form's faster strategies are not what it ran,
    # and a list beside it faster than the kept strategy broke the text's lookup)
    return replace(best, other_scan_refused="; ".join(errors)) if errors else best


#: Architecture fields no evaluation of a layer reads, with why (the kernels fields: only
#: ``validate``'s kernels, which name their launch grids and MMA instructions, read them).
#: ``--set`` and sweeps refuse them, as every value would give the same numbers.
NOT_READ_BY_EVALUATIONS = {
    "kernels.sm_offchip_bytes_per_s": "an SM's bandwidth matters only to a kernel with a launch grid (validate's cases)",
    "kernels.sync_mma_fraction": "only a kernel that issues mma.sync runs at it (validate's FlashAttention-2 cases); "
                                 "an evaluation's groups issue the full-rate instruction",
    "memory.pe_local_bytes_per_cycle": "the model does not slow a PE by its registers' ports (a spec's value is only "
                                       "checked to deliver one operation's operands and result per cycle)",
}


def check_settings_read(specs: list[ArchSpec], fields: list[str], precision: str | None = None,
                        option: str = "--set", devices: int | None = 0, parallel: str | None = "") -> None:
    """Refuse a setting of ``fields`` (:func:`~mambalaya.arch.setting_fields` of ``--set``, or a
    sweep's fields) that no evaluation on any of ``specs`` reads (:data:`NOT_READ_BY_EVALUATIONS`;
    a power budget where no spec has an energy section, so no power is computed to hold to it; a
    ``system`` field where the run has one device, ``devices`` None or 1, on designs that are not
    multi-core chips, so no link is crossed; 0: the device count is not known here); a collective's
    field where the run is a pipeline over several devices (``parallel`` None or pipeline; "": not
    known here): it was accepted and left every number as it was."""
    if precision is not None and "precision" in fields:  # (--precision won, the --set was dropped without a word)
        raise SpecError(f"--set precision and --precision {precision} both set the precision policy; give one")
    labels = set(fields) & {"technology.node_nm", "technology.reference_node_nm"}
    if labels and not {"technology.energy_scale", "technology.area_scale"} <= set(fields):
        raise SpecError(f"{option} {sorted(labels)[0]}: the node is a label; what a node does to energy, area and leakage "
                        "is technology.energy_scale, technology.area_scale and the leakages, so set those with it "
                        "(alone it changed the printed node and no number)")
    for name in fields:
        unread = next((k for k in NOT_READ_BY_EVALUATIONS if name == k or name.startswith(k + ".")), None)
        if unread is not None:
            raise SpecError(f"{option} {name}: {NOT_READ_BY_EVALUATIONS[unread]}; an evaluation would not read it, so "
                            "every value gives the same numbers")
        if name.startswith("system.") and devices in (None, 1) and all(spec.cores is None for spec in specs):
            raise SpecError(f"{option} {name}: the run has one device, so no link between devices is crossed and "
                            "every value gives the same numbers; give --devices N to run over several")
        if name == "power_budget_w" and specs and all(spec.energy is None for spec in specs):
            raise SpecError(f"{option} power_budget_w: {', '.join(spec.name for spec in specs)} "
                            f"{'has' if len(specs) == 1 else 'have'} no energy section, so no power is computed to "
                            "hold to a budget; every value gives the same numbers")
        why = (unread_by_dataflow(specs, name, fields) or unread_without_area(specs, name, fields)
               or unread_unary_pe_ops(specs, name, fields) or unread_mfu_energy(specs, name, fields)
               or unread_level_capacity(specs, name, fields))
        if why:
            raise SpecError(f"{option} {name}: {why}; every value gives the same numbers")
        strategy = "pipeline" if parallel is None else parallel
        readers = COLLECTIVE_FIELD_READERS.get(name)
        if (readers and strategy not in ("", *readers) and isinstance(devices, int) and devices > 1
                and all(spec.cores is None for spec in specs)):
            what = ("a pipeline runs no collective (its stages hand their activations on over the links, "
                    "system.link_*)" if strategy == "pipeline" else
                    f"--parallel {strategy} does not read it ({COLLECTIVE_FIELD_UNREAD_BY[strategy]})")
            raise SpecError(f"{option} {name}: {what}, so every value gives the same numbers; it is read by "
                            f"--parallel {', '.join(readers)}")
        if name == "cores.placement" and parallel and any(spec.cores is not None for spec in specs):
            raise SpecError(f"{option} cores.placement: --parallel {parallel} places the cores of this run, over the "
                            "spec's placement, so every value gives the same numbers; give one of them")


#: The strategies that read each collective field of a system (cost/tensor_parallel.py: the
#: all-reduce's fixed cost and its in-network option; cost/expert_parallel.py: the all-to-all's fixed
#: cost, taken to be an all-reduce's; cost/sequence_parallel.py hands its states on over the links).
COLLECTIVE_FIELD_READERS = {"system.collective_latency_s": ("tensor", "expert", "best"),
                            "system.in_network_reduction": ("tensor", "best")}
#: Why a strategy does not read a collective field.
COLLECTIVE_FIELD_UNREAD_BY = {"sequence": "its devices hand their states on over the links, system.link_*",
                              "expert": "its all-to-all sends each device's tokens; no switch reduces them"}


#: The technology fields only the area model reads (the leakages are per mm² of its logic and per
#: MiB of its SRAM; area_scale scales its logic areas).
AREA_READ_TECHNOLOGY = ("technology.logic_leakage_w_per_mm2", "technology.sram_leakage_w_per_mib",
                        "technology.area_scale")


def unread_without_area(specs: list[ArchSpec], name: str, fields: list[str]) -> str:
    """Why no evaluation on ``specs`` reads ``name``: a technology field of the area model
    (:data:`AREA_READ_TECHNOLOGY`) where no design has an area section (its power line says "no
    leakage"), unless ``fields`` give one; or ""."""
    if name in AREA_READ_TECHNOLOGY and specs and all(spec.area is None for spec in specs) and not any(
            f == "area" or f.startswith("area.") for f in fields):
        return ("the design has no area section, so it computes no leakage and no area for the technology to scale "
                "(its power line says so)")
    return ""


def unread_unary_pe_ops(specs: list[ArchSpec], name: str, fields: list[str]) -> str:
    """Why no evaluation on ``specs`` reads ``compute.unary_cost_pe_ops`` (or one entry of it), the
    cost of a function on the elementwise units of a design without MFUs (cost/spatial.py,
    cost/energy.py): every design has MFUs (``compute.mfu_units``), which run each function with a
    cycle cost; or, for an entry, the function's ``compute.unary_cost_cycles`` is 0 on every
    design, so it is one elementwise operation. Unless ``fields`` set what would read it; or ""."""
    table = "compute.unary_cost_pe_ops"
    if not specs or not (name == table or name.startswith(table + ".")):
        return ""
    if "compute.mfu_units" not in fields and all(spec.compute.mfu_units for spec in specs):
        return ("the design has MFUs (compute.mfu_units), which run every function with a cycle cost "
                "(compute.unary_cost_cycles); unary_cost_pe_ops is what a function costs on a design without MFUs")
    fn = name[len(table) + 1:]
    cycles_set = any(f in ("compute", "compute.unary_cost_cycles", f"compute.unary_cost_cycles.{fn}") for f in fields)
    if fn and not cycles_set and all(not spec.compute.unary_cost_cycles.get(fn, 0.0) for spec in specs):
        return (f"compute.unary_cost_cycles.{fn} is 0, so {fn} is one elementwise operation and its cost in "
                "elementwise operations is never asked")
    return ""


def unread_mfu_energy(specs: list[ArchSpec], name: str, fields: list[str]) -> str:
    """Why no evaluation on ``specs`` reads ``energy.mfu_pj`` (or an entry): no design has MFUs
    (``compute.mfu_units`` 0), so every function runs on the elementwise units, at their energy
    (cost/energy.py reads an MFU's energy per result only for what the MFUs run); unless
    ``fields`` set the MFUs or the compute section; or ""."""
    if not specs or not (name == "energy.mfu_pj" or name.startswith("energy.mfu_pj.")):
        return ""
    if any(f in ("compute", "compute.mfu_units") for f in fields) or any(spec.compute.mfu_units for spec in specs):
        return ""
    return ("the design has no MFUs (compute.mfu_units 0): every function runs on the elementwise units, at "
            "energy.elementwise_pj, so an MFU's energy per result is never asked")


#: A staging level's capacity: read by the energy model (its energy per byte, scaled to its size)
#: and the area model (its SRAM), and by validate's launched kernels (whether the L2 holds a
#: re-read tile), which no evaluation launches.
_LEVEL_CAPACITY = re.compile(r"memory\.levels\.[A-Za-z0-9_]+\.capacity_bytes")


def unread_level_capacity(specs: list[ArchSpec], name: str, fields: list[str]) -> str:
    """Why no evaluation on ``specs`` reads a staging level's ``capacity_bytes``: no design has an
    energy or an area section (or ``fields`` give one), and an evaluation's groups are costed
    with every off-chip byte from DRAM (mambalaya.arch.levels); or ""."""
    if not specs or not _LEVEL_CAPACITY.fullmatch(name):
        return ""
    if any(spec.energy is not None or spec.area is not None for spec in specs) or any(
            f.split(".")[0] in ("energy", "area") for f in fields):
        return ""
    return ("a staging level's capacity sets its energy per byte and its area, and the design has no energy or area "
            "section; an evaluation takes every off-chip byte from DRAM (only validate's launched kernels ask "
            "whether the L2 holds a re-read tile)")


def unread_by_dataflow(specs: list[ArchSpec], name: str, fields: list[str]) -> str:
    """Why no evaluation on ``specs`` reads the compute field ``name`` (a dataflow switch on
    designs of one dataflow, the stationary operand's buffering on roofline designs, which hold
    none, the 1D mode's rate on designs without one; unless ``fields`` set what would read it too),
    or "": each was accepted and changed nothing."""
    if not specs:
        return ""
    dataflows_set, mode_set = "compute.dataflows" in fields, "compute.one_d_mode" in fields
    if name == "compute.dataflow_switch_cycles" and not dataflows_set and all(
            len(spec.compute.dataflows) == 1 for spec in specs):
        return "the design has one dataflow (compute.dataflows), so the array never switches"
    if name == "compute.stationary_double_buffered" and not dataflows_set and all(
            spec.compute.dataflows == ("roofline",) for spec in specs):
        return "a roofline design (compute.dataflows: [roofline]) holds no stationary operand to buffer"
    if name == "compute.one_d_ops_per_lane_per_cycle" and not mode_set and all(
            not spec.compute.one_d_mode for spec in specs):
        return "the design has no 1D mode (compute.one_d_mode false): its vector lanes run elementwise work"
    return ""


def designs_with(names: list[str], settings: tuple[str, ...] | list[str] = (),
                 precision: str | None = None, devices: int | None = 0, parallel: str | None = "") -> dict[str, ArchSpec]:
    """Each named design loaded, with ``--set FIELD=VALUE`` settings applied (checked as
    :func:`check_settings_read` says, for a run over ``devices``)."""
    from mambalaya.arch import load_arch, setting_fields, with_settings

    bases = {a: load_arch(a) for a in names}
    specs = {a: with_settings(spec, list(settings)) for a, spec in bases.items()}
    check_settings_read(list(specs.values()), setting_fields(settings), precision, devices=devices, parallel=parallel)
    check_unary_costs_move(list(bases.values()), list(settings))
    return specs


def check_unary_costs_move(designs: list[ArchSpec], settings: list[str]) -> None:
    """Refuse a ``--set`` of a function's cycle cost (``compute.unary_cost_cycles``, the table or
    an entry) that, set alone, leaves every function's cost
    (:meth:`~mambalaya.arch.spec.ComputeSpec.unary_cost`, the one rule the latency and the
    energy read) as it was on ``designs`` (before the settings) that have no MFUs: there a non-zero cycle cost
    only marks a function as one that costs ``unary_cost_pe_ops`` elementwise operations, so
    ``exp`` at 1 or 2 cycles gave one number (with ``compute.mfu_units`` or the whole ``compute``
    section set too, it is read with them). A setting that cannot stand alone is left to the
    others."""
    from mambalaya.arch import UNARY_FUNCTIONS, setting_fields, with_settings

    fields = setting_fields(settings)
    if any(f in ("compute", "compute.mfu_units") for f in fields):
        return
    cycle_settings = [text for f, text in zip(fields, settings)
                      if f == "compute.unary_cost_cycles" or f.startswith("compute.unary_cost_cycles.")]
    if any(spec.compute.mfu_units for spec in designs):
        return  # a cycle cost is an MFU's time there
    for text in cycle_settings:
        try:
            changed = [with_settings(spec, [text]) for spec in designs]
        except SpecError:
            continue  # read only with the other settings
        functions = set(UNARY_FUNCTIONS).union(*(set(s.compute.unary_cost_cycles) for s in designs + changed))
        if all(a.compute.unary_cost(fn) == b.compute.unary_cost(fn) for a, b in zip(designs, changed) for fn in functions):
            raise SpecError(f"--set {text}: {', '.join(spec.name for spec in designs)} "
                            f"{'has' if len(designs) == 1 else 'have'} no MFUs "
                            "(compute.mfu_units 0), so a function's non-zero cycle cost only marks it as one that costs "
                            "compute.unary_cost_pe_ops elementwise operations: every non-zero value gives the same "
                            "numbers (0 makes the function one elementwise operation)")


def compare_rows(
    archs: list[str],
    model_name: str,
    config: ModelConfig,
    *,
    phase: str,
    seq_lens: list[int],
    batch: int,
    baseline: str,
    mapping_overrides: dict[str, str] | None = None,
    scan: str | None = None,
    precision: str | None = None,
    settings: tuple[str, ...] = (),
    devices: int | None = None,
    parallel: str | None = None,
    micro_batches: int | None = None,
) -> list[dict[str, Any]]:
    """Latency of each design at each sequence length (a decode step's context length), with the
    speedup over ``baseline`` of the whole model's latency, as a hybrid model's comparison takes it
    (over several devices, the interconnect included), and, on a design with an energy section,
    the energy, power against the budget and throttled latency (as a hybrid model's rows and a
    sweep's carry them); ``settings`` (``FIELD=VALUE``) change every design alike; ``devices`` runs each design's model over
    that many devices, ``parallel`` saying how (the layer's latency is one device's part under
    tensor parallelism). Each row says whether the layer's activations fit the DRAM beside the
    model and, for a prefill with two scan forms, why the other scan form did not run where it did not."""
    if baseline not in archs:
        archs = [baseline] + archs
    specs = designs_with(archs, settings, precision if isinstance(precision, str) else None, devices=devices,
                         parallel=parallel)
    rows = []
    for L in seq_lens:
        evals = {a: evaluate_best_scan(specs[a], model_name, config, phase=phase, seq_len=L, batch=batch,
                                       mapping=(mapping_overrides or {}).get(a), scan=scan, precision=precision,
                                       devices=devices, parallel=parallel, micro_batches=micro_batches) for a in archs}
        base = evals[baseline].model_latency_s
        for a, ev in evals.items():
            r = ev.result
            rows.append(
                {
                    "seq_len": L,
                    "arch": a,
                    "mapping": ev.mapping.name,
                    **({"scan": scan_form(ev.cascade), "other_scan_refused": ev.other_scan_refused}
                       if has_scan_forms(config) else {}),
                    "precision": ev.precision.name,
                    "layer_latency_s": r.latency_s,
                    "model_latency_s": ev.model_latency_s,
                    "offchip_bytes": r.offchip_bytes * ev.layer_parts,  # a multi-core chip's: every core's part
                    "compute_util": r.compute_util,
                    "mem_util": r.mem_util,
                    **devices_columns(ev.pipeline or ev.layer_split),
                    "activations_fit_dram": None if ev.dram is None else ev.dram.activations_fit,
                    **{k: v for k, v in ev.totals().items() if k in COMPARED_ENERGY},
                    "speedup_vs_" + baseline: base / ev.model_latency_s,
                }
            )
    return with_devices_columns(rows)


#: A comparison row's energy columns, on a design with an energy section (:meth:`Evaluation.totals`).
#: ``layer_power_w`` is what ``over_power_budget`` judges (a layer's power while it runs; the average
#: over the model, the waits included, may be within a budget a layer is over).
COMPARED_ENERGY = ("model_energy_j", "energy_per_token_j", "average_power_w", "layer_power_w", "power_budget_w",
                   "over_power_budget", "throttled_model_latency_s")

#: A comparison row's device columns for a design run on one device (or one core).
ONE_DEVICE_COLUMNS = {"devices": 1, "parallel": "none", "interconnect_s": 0.0, "interconnect_share": 0.0}


def with_devices_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` each with every column any has, in one order (the speedup last): the device
    columns where any has them (a multi-core design beside a single-array one), and empty ones
    (None) where a row lacks what another has (energy on a design without an energy section)."""
    if any("devices" in r for r in rows):
        rows = [{**r, **{k: v for k, v in ONE_DEVICE_COLUMNS.items() if k not in r}} for r in rows]
    columns = list(dict.fromkeys(k for r in rows for k in r if not k.startswith("speedup_vs_")))
    columns += list(dict.fromkeys(k for r in rows for k in r if k.startswith("speedup_vs_")))
    return [{k: r.get(k) for k in columns} for r in rows]
