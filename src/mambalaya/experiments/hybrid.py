"""Evaluate a hybrid model (Mamba-2 and attention layers, each with its MLP) on a design: each
layer type's cascade under the design's mapping, and the whole model as the sum over layers.

Mappings (the question a designer asks: how much of the Mamba speedup survives in a hybrid):

* A Mamba layer runs the design's own mapping, as in the paper's evaluation: MARCA unfused,
  Geens et al. fusing the SSM region (``ssm-ri``), Mambalaya the optimal search.
* An attention layer (and a layer with no SSM region at all, such as Nemotron-H's MLP layers)
  runs unfused on a design whose own mapping is a fixed Mamba-specific one
  (MARCA's ``unfused``, Geens et al.'s ``ssm-ri``, which fuses only an SSM region, absent from
  attention): neither paper describes an attention fusion, so their attention runs one Einsum
  at a time. On a design whose own mapping is a search (Mambalaya's ``optimal``) it runs the
  best fusion the engine finds, for attention as for Mamba.

Whole-model latency = sum over layer types of (layers of that type) x (its layer latency), as
the pure-Mamba evaluation counts ``n_layers`` x one layer (embedding and LM head excluded in
both). A decode step's ``seq_len`` is the context already in the KV cache.
"""

from __future__ import annotations

from dataclasses import replace, dataclass
from typing import Any

from mambalaya.arch import ArchSpec, load_arch
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.cost.expert_parallel import ExpertParallelCost, expert_device_cascade, expert_parallel_layers, is_moe
from mambalaya.cost.sequence_parallel import (SequenceParallelCost, check_sequence_split, sequence_device_cascade,
                                              sequence_parallel_layers, sequence_ranks)
from mambalaya.cost.tensor_parallel import (TensorParallelCost, device_cascade, tensor_parallel_layers,
                                            tensor_parallel_ranks)
from mambalaya.experiments.devices import (check_expert_parallel, check_sequence_parallel, fastest_strategy,
                                           pipeline_of, throttled_model_latency_s, require_fits_layer_split, resolve_devices, resolve_micro_batches,
                                           resolve_parallel, run_on_cores, stage_energies_j, strategies_on)
from mambalaya.experiments.evaluate import (CostedLayers, Evaluation, cached_layer, chip_cores, core_share, dram_use,
                                            evaluate_cascade, multicast_of, with_devices_columns,
                                            pipeline_energy, pipeline_totals, require_fits, require_fits_across,
                                            resolve_policy, layer_split_totals)
from mambalaya.cost.capacity import DramUse, activation_peak
from mambalaya.cost.pipeline import PipelineCost
from mambalaya.cost.energy import ModelEnergy
from mambalaya.workloads.families.base import scanned_layer_types
from mambalaya.workloads.families.bamba import HybridConfig
from mambalaya.workloads.precision import PrecisionPolicy

#: The designs' own mappings that are searches (they fuse attention as they fuse Mamba).
SEARCHED_MAPPINGS = ("optimal", "stitched")
#: Layer types with no SSM region: a fixed Mamba-specific mapping (MARCA's, Geens et al.'s) runs
#: them unfused (attention; Nemotron-H's separate MLP layers).
NO_SSM_REGION = ("attention", "mlp")


@dataclass(frozen=True)
class HybridEvaluation:
    arch: ArchSpec
    model: str
    config: HybridConfig
    phase: str
    seq_len: int
    batch: int
    #: per layer type: its evaluation (``result.n_layers`` = the layers of that type)
    layers: dict[str, Evaluation]
    #: the model's use of the design's off-chip memory (:func:`~mambalaya.experiments.evaluate.dram_use`)
    dram: DramUse | None = None
    #: on several devices (pipeline parallel): the pipeline and each device's use of its memory
    pipeline: PipelineCost | None = None
    stage_dram: tuple[DramUse, ...] = ()
    #: tensor parallel over several devices (each layer type's evaluation is then one device's part)
    layer_split: TensorParallelCost | ExpertParallelCost | SequenceParallelCost | None = None
    #: with ``parallel="best"``: each strategy's model latency, the fastest kept
    strategies_s: tuple[tuple[str, float], ...] = ()

    @property
    def model_latency_s(self) -> float:
        """Every layer's latency, and on several devices the transfers between them."""
        if self.layer_split is not None:
            return self.layer_split.latency_s
        if self.pipeline is not None:
            return self.pipeline.latency_s
        return sum(ev.result.model_latency_s for ev in self.layers.values())

    def share_of_time(self, layer_type: str) -> float:
        """Share of the whole model's time spent in layers of ``layer_type``: their time over the
        model's. With micro-batches (a pipeline's, each layer costed for one micro-batch and its
        stages overlapping) the layers' share of the time, 1 - the interconnect's, split between
        the types by the time each takes over the batch (one micro-batch's layers over the
        whole batch's time once left 60% of it to no type)."""
        ev = self.layers.get(layer_type)
        if not ev or not self.model_latency_s:
            return 0.0
        if self.pipeline is None or self.pipeline.micro_batches == 1:
            return ev.result.model_latency_s / self.model_latency_s
        work = sum(e.result.model_latency_s for e in self.layers.values())
        return ev.result.model_latency_s / work * (1.0 - self.pipeline.interconnect_share)

    @property
    def offchip_bytes(self) -> float:
        """Off-chip bytes of one pass of the batch through every layer (every micro-batch's)."""
        micro_batches = 1 if self.pipeline is None else self.pipeline.micro_batches
        return micro_batches * sum(ev.result.offchip_bytes * ev.result.n_layers for ev in self.layers.values())

    @property
    def tokens(self) -> int:
        """Tokens one pass of the whole model processes: the batch's, a prefill's L positions each."""
        return self.batch * (1 if self.phase == "decode" else self.seq_len)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.model_latency_s if self.model_latency_s else 0.0

    @property
    def attention_share(self) -> float | None:
        """The share of the model's time in its attention layers, every attention layer type
        together (``attention`` and a MoE family's ``attention-moe``); None where attention sits
        inside another layer type (Falcon-H1's parallel layers, Zamba2's hybrid blocks) and has
        no share of its own."""
        attention = [t for t in self.layers if t.split("-")[0] == "attention"]
        return sum(self.share_of_time(t) for t in attention) if attention else None

    @property
    def energy(self) -> ModelEnergy | None:
        """The whole model's energy, every layer type's together (None when the design has no
        energy section): :class:`~mambalaya.cost.energy.ModelEnergy`."""
        if self.arch.energy is None:
            return None
        return ModelEnergy(tuple(ev.energy for ev in self.layers.values()))  # type: ignore[misc]

    def energy_totals(self) -> dict[str, Any]:
        """The model's energy figures, as a Mamba model's :meth:`Evaluation.totals` names them
        (empty without an energy section); ``throttled_model_latency_s`` is the model held to the
        power budget, each layer type throttled on its own."""
        energy = self.energy
        if energy is None:
            return {}
        out = {"model_energy_j": energy.model_j, "energy_per_token_j": energy.per_token_j, "edp_js": energy.edp_js,
               "average_power_w": energy.average_power_w, "power_budget_w": energy.power_budget_w,
               # the budget holds at every moment: the most a layer type draws while it runs
               "layer_power_w": max(p.average_power_w for p in energy.parts),
               "over_power_budget": energy.over_power_budget, "leakage_w": energy.leakage_w,
               "throttled_model_latency_s": self.throttled_model_latency_s()}
        if self.layer_split is not None:  # the devices' energy together, one device's power
            tp = layer_split_totals(self.layer_split, energy.model_j, self.tokens, energy.leakage_w)
            out.update({k: tp[k] for k in ("model_energy_j", "energy_per_token_j", "edp_js", "average_power_w",
                                           "waiting_leakage_j")})
        if self.pipeline is not None:  # each layer costed for one micro-batch; the links' energy, the transfers' time
            stage_j = stage_energies_j(self.config, self.pipeline,
                                       {t: ev.energy.layer_j for t, ev in self.layers.items()})  # type: ignore[union-attr]
            out.update(pipeline_energy(self.pipeline, stage_j, self.tokens, energy.leakage_w))
        return out

    def throttled_model_latency_s(self) -> float:
        """The model held to the power budget (:func:`~mambalaya.experiments.devices.throttled_model_latency_s`)."""
        return throttled_model_latency_s(self.arch, self.config, {t: ev.energy for t, ev in self.layers.items()},
                                         {t: ev.cascade for t, ev in self.layers.items()},
                                         layer_split=self.layer_split, pipeline=self.pipeline)

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_latency_s": self.model_latency_s,
            "model_offchip_bytes": self.offchip_bytes,
            "tokens_per_s": self.tokens_per_s,
            "n_layers": self.config.n_layers,
            "attention_share": self.attention_share,
            **self.energy_totals(),
            **({} if self.pipeline is None else pipeline_totals(self.pipeline, self.stage_dram)),
            **({} if self.layer_split is None else
               {k: v for k, v in layer_split_totals(self.layer_split, None, 0).items()}),
            **({"parallel_strategies_s": dict(self.strategies_s)} if self.strategies_s else {}),
        }
        for t, ev in self.layers.items():
            out[f"{t}_layers"] = ev.result.n_layers
            out[f"{t}_layer_latency_s"] = ev.result.latency_s
            out[f"{t}_mapping"] = ev.mapping.name
            out[f"{t}_cascade"] = ev.cascade.name
            out[f"{t}_share"] = self.share_of_time(t)
            if self.arch.energy is not None:
                out[f"{t}_layer_energy_j"] = ev.energy.layer_j  # type: ignore[union-attr]
        return out


def layer_mapping(spec: ArchSpec, layer_type: str, mapping: str | None) -> str:
    """The mapping a layer of ``layer_type`` runs on ``spec`` (see the module doc); an explicit
    ``mapping`` is used for every layer type."""
    if mapping is not None:
        return mapping
    own = spec.mappings.default
    if (layer_type in NO_SSM_REGION or layer_type.split("-")[0] == "attention") and own not in SEARCHED_MAPPINGS:
        return "unfused"
    return own


def evaluate_hybrid(
    arch: ArchSpec | str,
    model_name: str,
    config: HybridConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    mapping: str | None = None,
    scan: str | None = None,
    softmax: str = "three-pass",
    precision: str | PrecisionPolicy | None = None,
    over_capacity: str = "refuse",
    reuse: CostedLayers | None = None,
    devices: int | None = None,
    parallel: str | None = None,
    micro_batches: int | None = None,
) -> HybridEvaluation:
    """Every layer type of ``config`` on ``arch``. A Mamba layer's prefill runs whichever scan
    form (chunked SSD or the recurrent scan) is faster on the design unless ``scan`` is given,
    as :func:`~mambalaya.experiments.evaluate.evaluate_best_scan` does for Mamba-2 models.
    Tensor widths follow the policy's ``bamba`` family (``reference-kernels``: the mixer's
    kernel widths, softmax statistics and norms in float32, the residual stream at the design
    width).

    A model whose weights, states and KV cache do not fit the design's off-chip memory is
    refused (:func:`~mambalaya.experiments.evaluate.require_fits`); with ``over_capacity="report"``
    it is evaluated as on one device of enough capacity and its :attr:`HybridEvaluation.dram`
    says how many devices it needs (the hybrid suite reports such points, marked). With
    ``reuse``, a layer type already costed under the same inputs is not searched again
    (:class:`~mambalaya.experiments.evaluate.CostedLayers`). ``devices`` (default 1) runs the model over
    that many devices of the design, ``parallel`` saying how: ``pipeline`` (the default; each device
    checked to hold its layers) or ``tensor`` (every layer's heads and channels split, each layer
    type costed as one device's part, :mod:`mambalaya.cost.tensor_parallel`) or ``best`` (the faster,
    both latencies in ``strategies_s``) (:mod:`mambalaya.experiments.devices`). ``micro_batches``
    (default 1) splits the batch between a pipeline's stages, each layer type costed for one
    micro-batch."""
    spec = load_arch(arch) if isinstance(arch, str) else arch
    if spec.cores is not None:  # the cores as devices joined by the network on chip
        def chip_dram() -> DramUse:  # the one copy of the model the cores read, against the chip's memory
            if over_capacity == "refuse":
                return require_fits(spec, model_name, config, batch=batch, seq_len=seq_len, precision=precision)
            return dram_use(spec, config, batch=batch, seq_len=seq_len, precision=precision)

        return run_on_cores(spec, devices, parallel, micro_batches, lambda design, **split: evaluate_hybrid(
            design, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping, scan=scan,
            softmax=softmax, precision=precision, reuse=reuse, **split,
            over_capacity=over_capacity if design is spec else "refuse"),  # a core: the chip is checked
            model_name, chip_dram)
    policy = resolve_policy(spec, precision)
    if over_capacity not in ("refuse", "report"):
        raise ValueError(f"over_capacity is 'refuse' or 'report', not {over_capacity!r}")
    n_devices = resolve_devices(spec, devices)
    if resolve_parallel(parallel, n_devices) == "best" and n_devices > 1:
        resolve_micro_batches(micro_batches, batch=batch, devices=n_devices, parallel="pipeline")  # (else left out silently)
        return fastest_strategy(lambda strategy: evaluate_hybrid(
            spec, model_name, config, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping, scan=scan,
            softmax=softmax, precision=policy, over_capacity=over_capacity, reuse=reuse, devices=n_devices,
            parallel=strategy, micro_batches=micro_batches if strategy == "pipeline" else None),
            f"{model_name} on {n_devices} {spec.system.unit}s of {spec.name}", strategies_on(spec))
    requested = resolve_parallel(parallel, n_devices)
    strategy = requested if n_devices > 1 else "pipeline"
    if requested == "expert":  # (on one device too: a model without experts was run as if it applied)
        check_expert_parallel(config, model_name, n_devices, batch=batch)
    if requested == "sequence":
        check_sequence_parallel(phase)
    tensor, expert, sequence = strategy == "tensor", strategy == "expert", strategy == "sequence"
    m = resolve_micro_batches(micro_batches, batch=batch, devices=n_devices, parallel=strategy)
    share = n_devices if expert else m  # the sequences a costed layer holds: a device's, or a micro-batch's
    if (tensor or expert or sequence) and over_capacity == "refuse":
        dram, stage_dram = require_fits_layer_split(spec, model_name, config, n_devices, strategy=strategy,
                                                    batch=batch, seq_len=seq_len, policy=policy), ()
    elif over_capacity == "refuse":
        dram, stage_dram = require_fits_across(spec, model_name, config, n_devices, batch=batch, seq_len=seq_len,
                                               policy=policy)
    elif n_devices > 1:
        raise SpecError("over_capacity='report' evaluates a model as on one device of enough memory; a "
                        "pipeline's devices are each checked against their capacity")
    else:
        dram, stage_dram = dram_use(spec, config, batch=batch, seq_len=seq_len, precision=policy), ()
    layers: dict[str, Evaluation] = {}
    routing = getattr(config, "routing", "uniform")  # the MoE blocks' token-per-expert assumption
    if requested == "sequence":  # a layer type that cannot split (attention) refuses the model before any search
        # (on one device too, where the split splits nothing: as every strategy the model cannot take)
        for layer_type in config.layer_counts():
            built = cached_layer(config, precision=policy, phase=phase, seq_len=seq_len, batch=batch,
                                 bits=spec.bits_per_element, scan=scan if layer_type in scanned_layer_types(config)
                                 else None, layer_type=layer_type, name=f"{model_name}-{layer_type}-{phase}")
            try:
                check_sequence_split(built, sequence_ranks(built))
            except SpecError as err:
                raise SpecError(f"{model_name} {layer_type} layers cannot run sequence parallel: {err}") from None
    whole: dict[str, Any] = {}  # per costed cascade's name, the whole layer it is a device's part of
    shares: dict[str, Any] = {}  # per costed cascade's name, its tensors' shares of a multi-core chip's memory
    for layer_type, count in config.layer_counts().items():
        forms: list[str | None] = [None]
        if layer_type in scanned_layer_types(config):
            forms = [scan] if scan or phase != "prefill" else ["chunked", "recurrent"]
        found, errors = [], []
        for form in forms:
            try:  # (a form the layer does not have, Jamba's Mamba-1 chunked, is refused here)
                def layer(name: str, form_of_softmax: str = "three-pass") -> Any:
                    return cached_layer(config, precision=policy, phase=phase, seq_len=seq_len, batch=batch // share,
                                        bits=spec.bits_per_element, scan=form, layer_type=layer_type,
                                        softmax=form_of_softmax, name=name)

                cascade = layer(f"{model_name}-{layer_type}-{phase}" + (f"-{form}" if form else ""))
                if softmax != "three-pass" and "attention" in cascade.regions:  # the report names the form
                    cascade = layer(f"{cascade.name}-{softmax}", softmax)  # cached too: the designs share its memos
                if tensor:
                    part = device_cascade(cascade, tensor_parallel_ranks(cascade), n_devices)
                    whole[part.name], cascade = cascade, part
                elif expert and is_moe(cascade):  # the most loaded device's experts
                    cascade = expert_device_cascade(cascade, n_devices, routing,
                                                    total_tokens=batch * (1 if phase == "decode" else seq_len))
                elif sequence:
                    part = sequence_device_cascade(cascade, n_devices)
                    whole[part.name], cascade = cascade, part
                on_core = core_share(spec, whole.get(cascade.name, cascade), cascade, strategy, n_devices)
                found.append(evaluate_cascade(spec, model_name, config, cascade, phase=phase, batch=batch,
                                              mapping=layer_mapping(spec, layer_type, mapping), policy=policy,
                                              n_layers=count, reuse=reuse, dram_share=on_core,
                                              whole_tokens=batch * whole.get(cascade.name, cascade).size("I")
                                              if tensor or expert or sequence else None))
                shares[found[-1].cascade.name] = on_core
            except MambalayaError as err:
                errors.append(f"{form + ' scan: ' if form else ''}{err}")
        if not found:
            raise MambalayaError(f"{model_name} {layer_type} layers, {phase} L={seq_len}, on {spec.name}: "
                                 + "; ".join(errors))
        best = min(found, key=lambda ev: ev.result.latency_s)
        layers[layer_type] = replace(best, other_scan_refused="; ".join(errors)) if errors else best
    if tensor or expert or sequence:
        multicast = {t: c for lt, ev in layers.items()
                     for t, c in multicast_of(spec, ev.result, shares.get(ev.cascade.name), lt, n_devices).items()}
        cost = (TensorParallelCost(n_devices, {t: tensor_parallel_layers(spec.system, whole[ev.cascade.name], n_devices,
                                                                         count=ev.result.n_layers, layer_s=ev.result.latency_s)
                                               for t, ev in layers.items()}, multicast) if tensor else
                SequenceParallelCost(n_devices, {t: sequence_parallel_layers(spec.system, whole[ev.cascade.name], n_devices,
                                                                             count=ev.result.n_layers,
                                                                             layer_s=ev.result.latency_s)
                                                 for t, ev in layers.items()}, multicast) if sequence else
                ExpertParallelCost(n_devices, {t: expert_parallel_layers(spec.system, ev.cascade, n_devices, routing,
                                                                         count=ev.result.n_layers, layer_s=ev.result.latency_s)
                                               for t, ev in layers.items()}))
        return HybridEvaluation(spec, model_name, config, phase, seq_len, batch, layers, _with_layers_activations(dram, layers),
                                layer_split=cost)
    pipeline = None if n_devices == 1 else pipeline_of(
        spec, config, n_devices, {t: ev.result.latency_s for t, ev in layers.items()},
        {t: ev.cascade for t, ev in layers.items()}, micro_batches=m)
    return HybridEvaluation(spec, model_name, config, phase, seq_len, batch, layers, _with_layers_activations(dram, layers),
                            pipeline, stage_dram)


def _with_layers_activations(dram: DramUse | None, layers: dict[str, Evaluation]) -> DramUse | None:
    """The model's DRAM use with the largest activation peak of its layer types, as mapped (layers
    run one at a time: :func:`~mambalaya.cost.capacity.activation_peak`)."""
    if dram is None:
        return None
    for ev in layers.values():
        dram = dram.with_activations(activation_peak(ev.cascade, ev.result.groups))
    return dram


def point_outputs(hv: HybridEvaluation) -> dict[str, Any]:
    """A sweep point's outputs for a hybrid model, in the pure-Mamba points' columns: per-layer
    figures are means over the model's layers (utilisations weighted by time), plus each layer
    type's share of the time (``<type>_share``) and the store's ``attention_share``: the share
    of every attention layer type together (``attention`` and a MoE family's
    ``attention-moe``), as the hybrid suite reports it; None where attention is inside another
    layer type (Falcon-H1's parallel layers, Zamba2's hybrid blocks) and has no share of its own."""
    layers = hv.layers.values()
    total = hv.model_latency_s
    # utilisations: one device's (core's), over its layers' own time as a Mamba point's are (they
    # were over the model's, collectives included: a hybrid row's lower by the interconnect's share)
    busy = sum(ev.result.model_latency_s for ev in layers)
    weighted = lambda attr: sum(getattr(ev.result, attr) * ev.result.model_latency_s for ev in layers) / busy  # noqa: E731
    out = {
        "latency_s": total / hv.config.n_layers,
        "model_latency_s": total,
        # a chip's: every core's part (one core's was stored for a hybrid model, the chip's for Mamba)
        "offchip_bytes": hv.offchip_bytes / hv.config.n_layers * chip_cores(hv.arch, hv.layer_split),
        "compute_util": weighted("compute_util"),
        "mem_util": weighted("mem_util"),
        "tokens_per_s": hv.tokens_per_s,
        # a mean over the costed layers, as the other per-layer figures (it was the layer types' sum)
        "groups": sum(ev.result.n_layers * len(ev.result.groups) for ev in layers) / sum(ev.result.n_layers
                                                                                         for ev in layers),
        "peak_footprint_bytes": max(g.traffic.footprint_bytes for ev in layers for g in ev.result.groups),
        "mapping_used": " ".join(f"{t}:{ev.mapping.name}" for t, ev in hv.layers.items()),
    }
    out.update({f"{t}_share": hv.share_of_time(t) for t in hv.layers})
    out["attention_share"] = hv.attention_share
    e = hv.energy_totals()  # on several devices, every device's energy and links, one device's power
    if e:  # per-layer figures are means over the model's layers, as latency_s is
        out.update({"layer_energy_j": e["model_energy_j"] / hv.config.n_layers,
                    "energy_per_token_j": e["energy_per_token_j"], "average_power_w": e["average_power_w"],
                    "layer_power_w": e["layer_power_w"],  # what over_power_budget judges
                    "power_budget_w": e["power_budget_w"], "over_power_budget": e["over_power_budget"],
                    "throttled_latency_s": e["throttled_model_latency_s"] / hv.config.n_layers})
    split = hv.layer_split or hv.pipeline
    if split is not None:
        out.update(devices=split.devices, parallel_used=getattr(split, "strategy", "pipeline"),
                   interconnect_s=split.interconnect_s)
    return out


def hybrid_compare_rows(archs: list[str], model_name: str, config: HybridConfig, *, phase: str, seq_lens: list[int],
                        batch: int, baseline: str, scan: str | None = None, softmax: str = "three-pass",
                        precision: str | None = None, settings: tuple[str, ...] = (),
                        devices: int | None = None, parallel: str | None = None,
                        micro_batches: int | None = None) -> list[dict[str, Any]]:
    """Whole-model latency of each design at each context length, each layer type's share
    and mapping, and the speedup over ``baseline``. In decode, ``seq_len`` is the context in
    the KV cache, so (unlike a pure Mamba model) every length is its own row. ``settings``
    (``FIELD=VALUE``) change every design alike; ``devices`` runs each design's model over that
    many devices, ``parallel`` (pipeline or tensor) saying how."""
    from mambalaya.experiments.evaluate import designs_with

    if baseline not in archs:
        archs = [baseline] + archs
    specs = designs_with(archs, settings, precision if isinstance(precision, str) else None, devices=devices,
                         parallel=parallel)
    rows = []
    for L in seq_lens:
        evals = {a: evaluate_hybrid(specs[a], model_name, config, phase=phase, seq_len=L, batch=batch, scan=scan,
                                    softmax=softmax, precision=precision, devices=devices, parallel=parallel,
                                    micro_batches=micro_batches)
                 for a in archs}
        base = evals[baseline].model_latency_s
        for a, ev in evals.items():
            totals = ev.totals()
            totals["model_offchip_bytes"] *= chip_cores(ev.arch, ev.layer_split)  # a chip's: every core's part
            rows.append({"seq_len": L, "arch": a, **totals, "speedup_vs_" + baseline: base / ev.model_latency_s})
    return with_devices_columns(rows)


__all__ = ["HybridEvaluation", "SEARCHED_MAPPINGS", "evaluate_hybrid", "hybrid_compare_rows", "layer_mapping",
           "point_outputs"]
