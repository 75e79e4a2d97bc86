"""How ``evaluate`` and ``compare`` print their results: a table, JSON or CSV, and the summary
lines under a table. The commands (:mod:`mambalaya.cli.evaluate`) compute; this module only
renders what they computed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mambalaya import __version__
from mambalaya.cli.common import width_text, emit, print_table, provenance_record, rows_csv, rows_table, out_console, tables_and_lines
from mambalaya.cli.layer_options import DesignArgs
from mambalaya.cli.options import Format, PhaseOption
from mambalaya.experiments.evaluate import chip_cores, dram_totals, scan_form
from mambalaya.search.mappings import NAMED_MAPPINGS
from mambalaya.formatting import milliseconds, whole
from mambalaya.formatting import rate as rate_text
from mambalaya.workloads import has_scan_forms
from mambalaya.workloads.families.base import is_hybrid


def emit_evaluation(ev: Any, run: DesignArgs, config: Any, seq_len: int, fmt: Format, output: Path | None) -> None:
    """One layer and the whole model on a design (:func:`mambalaya.experiments.evaluate.evaluate`)."""
    from mambalaya.arch import arch_to_dict
    from mambalaya.fusion.mapping_file import mapping_to_dict
    from mambalaya.cost.latency import latency_rows

    energy = ev.energy
    rows = with_energy_column(latency_rows(ev.result), energy)
    prov = provenance_record(run.model, config, ev.cascade, phase=run.phase.value, seq_len=seq_len, batch=run.batch,
                       mapping=ev.mapping.name, mapping_description=ev.mapping.description,
                       bits=ev.arch.bits_per_element, precision=ev.precision.name,
                       **({"scan": scan_form(ev.cascade)} if has_scan_forms(config) else {}))
    if fmt == Format.json:
        doc = {
            "provenance": prov,
            "arch": arch_to_dict(ev.arch),
            "mapping": mapping_to_dict(ev.mapping),
            "einsums": rows[:-1],
            "groups": [
                {"group": g.group, "einsums": list(g.einsums), "steps": g.steps, "comp_latency": g.comp_latency,
                 "mem_latency": g.mem_latency, "wind_up": g.wind_up, "latency": g.latency,
                 "traffic_bytes": g.traffic.total_bytes, "footprint_bytes": g.traffic.footprint_bytes}
                for g in ev.result.groups
            ],
            "totals": ev.totals(),
            # the layer's energy by action, as the text's energy line gives it
            **({"layer_energy_by_component_j": energy.by_component_j()} if energy is not None else {}),
        }
        emit(json.dumps(doc, indent=2), output)
        return
    if fmt == Format.csv:
        emit(rows_csv(rows), output)
        return
    t = ev.totals()
    form = ""
    if has_scan_forms(config) and run.phase.value == "prefill":
        why = (f", the only form that runs here ({ev.other_scan_refused})" if ev.other_scan_refused
               else ", the faster form on this design" if ev.objective == "latency"
               else f", the form of least {'energy' if ev.objective == 'energy' else 'EDP'} on this design")
        form = f" ({scan_form(ev.cascade)} scan{why if run.scan is None else ''})"
    title = (f"{run.model} {run.phase.value}{form} I={ev.cascade.size('I')} batch={run.batch} on {ev.arch.name} "
             f"({width_text(ev.arch.bits_per_element, ev.precision.name)}, {ev.arch.clock_hz / 1e9:g} GHz, "
             f"{ev.arch.memory.offchip_bandwidth_bytes_per_s / 1e9:g} GB/s, buffer {ev.arch.memory.onchip_buffer_bytes:,} B); "
             f"mapping {ev.mapping.name}: {ev.mapping.description}. Latencies in s, traffic in bytes.")
    with tables_and_lines([rows_table(rows, title)], output):
        rate = (f"{rate_text(t['tokens_per_s'])} tokens/s" if run.phase == PhaseOption.decode
                else f"{rate_text(t['tokens_per_s'])} tokens/s prefill throughput")
        out_console.print(
            ("" if ev.layer_split is None else f"each {ev.arch.system.unit}'s part: ")
            + ("" if ev.pipeline is None or ev.pipeline.micro_batches == 1
               else f"each micro-batch's (batch {ev.batch // ev.pipeline.micro_batches}): ")
            + f"layer {milliseconds(t['latency_s'])} ms; model ({t['n_layers']} layers"
            + (f"; without {t['model_leaves_out']}" if "model_leaves_out" in t else "")
            + f") {milliseconds(t['model_latency_s'])} ms; "
            f"{rate}; off-chip {whole(t['offchip_bytes'])} B; compute util {t['compute_util']:.1%}, memory util {t['mem_util']:.1%}; "
            f"2D spatial util {t['spatial_util']:.1%}; bound: {t['bound']}",
            highlight=False,
        )
        if energy is not None:
            parts = ", ".join(f"{k} {v * 1e3:.4g} mJ" for k, v in energy.by_component_j().items())
            tp = ev.layer_split
            layer_what = "layer" if tp is None else f"one {ev.arch.system.unit}'s part of a layer"
            if ev.pipeline is not None and ev.pipeline.micro_batches > 1:
                layer_what = f"one micro-batch's (batch {ev.batch // ev.pipeline.micro_batches}) layer"
            model_what = "model" if tp is None else f"model on all {tp.devices} {ev.arch.system.unit}s and their links"
            out_console.print(
                f"energy: {layer_what} {t['layer_energy_j'] * 1e3:.4g} mJ ({parts}); {model_what} {t['model_energy_j']:.4g} J; "
                f"{t['energy_per_token_j'] * 1e6:.4g} uJ/token; EDP {t['edp_js']:.4g} J*s ({objective_text(ev)})",
                highlight=False,
            )
            out_console.print(power_text(ev.arch, t, throttled_key="throttled_latency_s", what="the layer", cores=ev.cores),
                              highlight=False)
        print_devices(ev, ev.dram)
        if "area_mm2" in t:
            chip = "" if ev.cores == 1 else f"; {ev.cores} cores of {t['area_mm2'] / ev.cores:.4g} mm^2"
            out_console.print(f"area {t['area_mm2']:.4g} mm^2 of components at the design's node{chip} (`mambalaya arch "
                              f"show {ev.arch.name.removesuffix('-core')}` has them one by one)", highlight=False)
        for line in kernel_lines(ev):
            out_console.print(line, highlight=False)
        if ev.arch.memory.buffer_bandwidth_bytes_per_cycle is None:
            out_console.print("note: the on-chip buffer's bandwidth is unbounded (the spec gives neither "
                              "memory.onchip_banks with memory.onchip_bank_port_bytes nor "
                              "memory.onchip_bandwidth_bytes_per_cycle), so no group is bound by it", highlight=False)


def kernel_lines(ev: Any) -> list[str]:
    """What sets an evaluated layer's time beside its groups, on a spec that has them: its scans'
    floor (:func:`scan_floor_text`) and each on-chip level's time alone beside the DRAM's."""
    lines = [text] if (text := scan_floor_text(ev.arch, ev.cascade)) else []
    if ev.arch.memory.levels:
        from mambalaya.cost.latency import layer_level_seconds

        level_s = layer_level_seconds(ev.arch, ev.result)
        lines.append(f"on-chip levels, each alone (DRAM {milliseconds(ev.result.offchip_bytes / ev.result.bandwidth)} "
                     "ms): " + "; ".join(f"{n} {milliseconds(v)} ms" for n, v in level_s.items()))
    return lines


def scan_floor_text(arch: Any, cascade: Any) -> str:
    """The scan floor's inputs on a GPU spec with a scan rate (``kernels.scan_sm_cycles_per_step``):
    each elementwise recurrence's element-steps and the least time they take; on a GPU spec
    without one, a note that its scans run at the lanes' peak; empty without a kernels section."""
    from mambalaya.arch.kernels import scan_seconds_per_step
    from mambalaya.cost.latency import scan_steps

    k = getattr(arch, "kernels", None)
    if k is None:
        return ""
    steps = [(e.name, n) for e in cascade.einsums if (n := scan_steps(cascade, e))]
    if not steps:
        return ""
    per_step = scan_seconds_per_step(arch)
    if not per_step:
        return (f"note: {arch.name}'s kernels section has no scan_sm_cycles_per_step, so its scans ("
                + ", ".join(name for name, _ in steps) + ") run at the lanes' peak, far faster than measured scan "
                "kernels (the shipped GPU specs carry the fitted 0.585 SM-cycles per element-step)")
    return (f"scan kernels (kernels.scan_sm_cycles_per_step {k.scan_sm_cycles_per_step:g} SM-cycles per element-step, "
            f"the shipped specs' value fitted by validate being 0.585; {k.sm_count} SMs at {arch.clock_hz / 1e9:g} GHz): "
            "its group computes no faster than "
            + "; ".join(f"{name} {whole(n)} element-steps, {milliseconds(n * per_step)} ms" for name, n in steps))


def pipeline_text(arch: Any, pipeline: Any, stage_dram: tuple[Any, ...]) -> str:
    """The pipeline line: the devices and their layers, the transfers' time and share (and
    energy where the links have one), how busy the devices are, and each device's memory."""
    from mambalaya.cost.capacity import byte_size

    system = arch.system
    stages = ", ".join(f"{s.start}-{s.stop - 1}" for s in pipeline.stages)
    energy = ("" if pipeline.interconnect_j is None
              else f", {pipeline.interconnect_j * 1e3:.4g} mJ over the links")
    memory = "; ".join(f"{system.unit} {d}: {byte_size(u.used_bytes)}" + (f" of {byte_size(u.capacity_bytes)}"
                                                                   if u.capacity_bytes else "")
                       for d, u in enumerate(stage_dram))
    sizes = sorted(set(pipeline.boundary_bytes))  # (a zamba2 boundary after the last hybrid layer sends no EMB)
    sent = ("0 B" if not sizes else byte_size(sizes[0]) if len(sizes) == 1
            else f"{byte_size(sizes[0])} to {byte_size(sizes[-1])}")
    m = pipeline.micro_batches
    schedule = ("one batch, no micro-batches" if m == 1 else
                f"{m} micro-batches, GPipe's schedule: the first through every stage, then one per "
                f"{milliseconds(pipeline.interval_s(pipeline.bottleneck))} ms of stage {pipeline.bottleneck}")
    return (f"pipeline over {pipeline.devices} {system.unit}s (layers {stages}): layers {milliseconds(pipeline.layers_s)} ms "
            f"+ interconnect {milliseconds(pipeline.interconnect_s)} ms ({pipeline.interconnect_share:.2%} of the time: "
            f"{len(pipeline.boundary_bytes)} transfer{'s' if len(pipeline.boundary_bytes) != 1 else ''} of {sent}{' a micro-batch' if m > 1 else ''} at {system.link_bandwidth_bytes_per_s / 1e9:g} GB/s "
            f"after {system.link_latency_s * 1e6:g} us{energy}); each {system.unit} computes {pipeline.busy_share:.1%} of the "
            f"time (the pipeline's bubble: {schedule})" + (f"; DRAM {memory}" if memory else ""))


#: The mappings that search their groups (the others fix them and choose only tiles, or nothing).
SEARCHED_MAPPINGS = ("stitched", "optimal", "optimal-convex")


def objective_text(ev: Any) -> str:
    """What the objective chose: a searched mapping's groups and tiles, a fixed grouping's tiles
    (unfused, ssm-ri, a mapping file), or nothing (ideal: one group, no tiles)."""
    if ev.mapping.name == "ideal":
        return "ideal mapping: no groups or tiles to choose"
    if ev.mapping.name in SEARCHED_MAPPINGS:
        return f"mapping searched for {ev.objective}"
    if ev.mapping.name not in NAMED_MAPPINGS:
        return f"mapping file {ev.mapping.name}: its groups and tiles as written"
    return f"{ev.mapping.name}: its groups fixed, tiles chosen for {ev.objective}"


def print_devices(evaluation: Any, dram: Any) -> None:
    """The memory line (each device's under tensor parallelism) and, over several devices, the
    pipeline or tensor-parallel line and ``--parallel best``'s choice, for a Mamba model's or a
    hybrid model's evaluation (both carry ``arch``, ``pipeline``, ``stage_dram``,
    ``tensor_parallel``, ``strategies_s`` and ``model_latency_s``)."""
    tp = evaluation.layer_split
    if dram is not None:
        split = tp or evaluation.pipeline
        on_chip = evaluation.arch.system is not None and evaluation.arch.system.unit == "core" and split is not None
        each = (f"the chip, shared by its {split.devices} cores: " if on_chip else
                "" if tp is None else f"each of the {tp.devices} {evaluation.arch.system.unit}s: ")
        out_console.print(each + dram.text(), highlight=False)
    if evaluation.pipeline is not None:
        out_console.print(pipeline_text(evaluation.arch, evaluation.pipeline, evaluation.stage_dram), highlight=False)
    if tp is not None:
        text = {"tensor": tensor_parallel_text, "expert": expert_parallel_text,
                "sequence": sequence_parallel_text}[tp.strategy]
        out_console.print(text(evaluation.arch, tp), highlight=False)
    if evaluation.strategies_s:
        out_console.print(strategies_text(evaluation.strategies_s, evaluation.model_latency_s), highlight=False)


def strategies_text(strategies_s: tuple[tuple[str, float], ...], chosen_s: float) -> str:
    """``--parallel best``: each strategy's model latency and the one kept."""
    chosen = next(s for s, latency in strategies_s if latency == chosen_s)
    return ("--parallel best: " + "; ".join(f"{s} {milliseconds(latency)} ms" for s, latency in strategies_s)
            + f"; kept {chosen}")


def _links_text(system: Any, split: Any, step: str = "step") -> str:
    """The links' part of a strategy's line: their bandwidth, latency, a collective's fixed cost
    (where the strategy has collectives), the energy over them (where they have one) and, on the
    cores of one chip, the network's multicast of the tensors every core reads whole."""
    energy = "" if split.interconnect_j is None else f", {split.interconnect_j * 1e3:.4g} mJ over the links"
    call = "" if split.strategy == "sequence" else f", {system.collective_latency_s * 1e6:g} us a call"
    shared = "" if not split.multicast else f"; the network's multicast of whole tensors {milliseconds(split.multicast_s)} ms of it"
    return (f"links {system.link_bandwidth_bytes_per_s / 1e9:g} GB/s, {system.link_latency_s * 1e6:g} us a {step}"
            f"{call}{energy}{shared}")


def tensor_parallel_text(arch: Any, tp: Any) -> str:
    """The tensor-parallel line: the devices, the layers' time on each, the all-reduces' time,
    share, bytes and (where the links have one) energy."""
    from mambalaya.cost.capacity import byte_size

    per_layer = "; ".join(f"{t or 'layer'}: " + ", ".join(f"{r.einsum} {a}" for r, a in zip(lt.all_reduces, lt.algorithms))
                          for t, lt in tp.layers.items())
    unit = arch.system.unit
    return (f"tensor parallel over {tp.devices} {unit}s (every layer's heads and channels split): layers "
            f"{milliseconds(tp.layers_s)} ms on each {unit} + all-reduces {milliseconds(tp.interconnect_s)} ms "
            f"({tp.interconnect_share:.2%} of the time; {byte_size(tp.collective_bytes)} all-reduced per {unit}, "
            f"{_links_text(arch.system, tp)}); all-reduced per layer, with the algorithm ({per_layer})")


def expert_parallel_text(arch: Any, ep: Any) -> str:
    """The expert-parallel line: the devices, the layers' time on the most loaded one, the
    all-to-alls' time, share, bytes and (where the links have one) energy."""
    from mambalaya.cost.capacity import byte_size

    moe = {t: lt for t, lt in ep.layers.items() if lt.all_to_alls}
    per_layer = "; ".join(f"{t or 'layer'}: " + ", ".join(f"{a.tensor} {a.direction}" for a in lt.all_to_alls)
                          for t, lt in moe.items())
    unit = arch.system.unit
    return (f"expert parallel over {ep.devices} {unit}s (each MoE block's experts split, every other layer on a "
            f"{1 / ep.devices:.4g} share of the batch's sequences): layers {milliseconds(ep.layers_s)} ms on the most "
            f"loaded {unit} + all-to-alls {milliseconds(ep.interconnect_s)} ms ({ep.interconnect_share:.2%} of the time; "
            f"the busiest {unit} moves {byte_size(ep.collective_bytes)}, {_links_text(arch.system, ep)}); "
            f"sent per MoE block, one row per token-expert pair on another {unit} ({per_layer})")


def sequence_parallel_text(arch: Any, sp: Any) -> str:
    """The sequence-parallel line: the devices, the layers' time on each, the halos' and passed
    states' time, share, bytes and (where the links have one) energy."""
    from mambalaya.cost.capacity import byte_size

    per_layer = "; ".join(f"{t or 'layer'}: " + ", ".join([*(f"{h.tensor} halo of {h.positions}" for h in lt.halos),
                                                          *(f"{c.einsum} state" for c in lt.crossings)] or ["nothing"])
                          for t, lt in sp.layers.items())
    unit = arch.system.unit
    return (f"sequence parallel over {sp.devices} {unit}s (each prefill's positions split, the scans' states passed "
            f"along the {unit}s): layers {milliseconds(sp.layers_s)} ms on each {unit} (its positions, the "
            f"coefficients' products and the corrections) + transfers {milliseconds(sp.interconnect_s)} ms "
            f"({sp.interconnect_share:.2%} of the time; the last {unit} receives {byte_size(sp.collective_bytes)}, "
            f"{_links_text(arch.system, sp, 'transfer')}); received per layer ({per_layer}), each state "
            f"{sp.devices - 1} times in turn")


def with_energy_column(rows: list[dict[str, Any]], energy: Any) -> list[dict[str, Any]]:
    """The per-Einsum rows with each Einsum's energy (``energy_pj``, the total row's the layer's),
    on a design with energy (``energy`` None: the rows as they are); a hybrid model's layer types
    carry it too (they once had none)."""
    if energy is None:
        return rows
    from mambalaya.cost.energy import energy_rows

    by_einsum = {r["einsum"]: r["total_pj"] for r in energy_rows(energy)}
    return [{**r, "energy_pj": by_einsum[r["einsum"]]} for r in rows]


#: A layer type's totals in a hybrid model's JSON that cover only that type's layers, renamed to
#: say so (they were named as the model's: ``model_latency_s`` of 36 of 40 layers beside the
#: model's own), and those that only the whole model has (its tokens per second, energy per token
#: and EDP: the model's ``totals`` carry them), left out.
LAYER_TYPE_TOTALS = {"model_latency_s": "layers_latency_s", "model_energy_j": "layers_energy_j",
                     "throttled_model_latency_s": "layers_throttled_latency_s", "tokens_per_s": None,
                     "energy_per_token_j": None, "edp_js": None}


def layer_type_totals(ev: Any) -> dict[str, Any]:
    """One layer type's :meth:`Evaluation.totals` in a hybrid model's JSON (:data:`LAYER_TYPE_TOTALS`)."""
    out = {}
    for key, value in ev.totals().items():
        name = LAYER_TYPE_TOTALS.get(key, key)
        if name is not None:
            out[name] = value
    return out


def power_text(arch: Any, totals: dict[str, Any], *, throttled_key: str, what: str, cores: int = 1) -> str:
    """The average-power line: against the design's budget, at its node, and (over the budget)
    the time ``what`` takes held to it (``totals[throttled_key]``). On a chip of ``cores`` cores
    the figures are a core's (the busiest's) against its share of the chip's budget, and say so."""
    budget = totals["power_budget_w"]
    average, layer = totals["average_power_w"], totals.get("layer_power_w", totals["average_power_w"])
    # the budget holds at every moment: judged on a layer's power while it runs, which on several
    # devices (their waits in the average) or across layer types may exceed the average
    drawn = (f"{layer / budget:.2f}x" if math.isclose(layer, average, rel_tol=1e-9)
             else f"a layer draws {layer:.4g} W while it runs, {layer / budget:.2f}x") if budget else ""
    share = ("" if budget is None else f"the {budget:g} W budget" if cores == 1 else
             f"its {budget:g} W share of the chip's {budget * cores:g} W budget")
    verdict = ("no power budget in the spec" if budget is None else
               f"OVER {share} ({drawn})" if totals["over_power_budget"] else f"within {share}")
    node = ("energies as the spec gives them, no leakage (no technology section)" if arch.technology is None else
            f"energies at {arch.technology.node_nm:g} nm, no leakage (no area section: the technology's leakage "
            "densities are per mm^2 and per MiB of it)" if arch.area is None else
            f"energies at {arch.technology.node_nm:g} nm, leakage {totals['leakage_w']:.3g} W included")
    throttled = ""
    if totals["over_power_budget"]:  # (the figures above were printed as if the budget held, unlabelled)
        model_s, held_s = totals.get("model_latency_s"), totals.get("throttled_model_latency_s")
        whole = (f", the model {milliseconds(held_s)} ms, {totals['tokens_per_s'] * model_s / held_s:,.0f} tokens/s"
                 if throttled_key != "throttled_model_latency_s" and model_s and held_s and "tokens_per_s" in totals
                 else "")
        throttled = (f"; held to the budget {what} takes {milliseconds(totals[throttled_key])} ms{whole} (the "
                     "latency, throughput, energy and EDP above are unthrottled)")
    whose = "" if cores == 1 else f" of the busiest of the chip's {cores} cores"
    return f"average power{whose} {totals['average_power_w']:.4g} W: {verdict} ({node}){throttled}"


def emit_hybrid(hv: Any, run: DesignArgs, config: Any, seq_len: int, fmt: Format, output: Path | None,
                dram: Any = None) -> None:
    """A hybrid model on a design: each layer type's Einsum table, and the whole model; ``dram``
    (:class:`~mambalaya.cost.capacity.DramUse`) its use of the design's off-chip memory."""
    from mambalaya.arch import arch_to_dict
    from mambalaya.fusion.mapping_file import mapping_to_dict
    from mambalaya.cost.latency import latency_rows

    prov = {"model": run.model, "config": config.model_dump(), "phase": run.phase.value, "seq_len": seq_len, "batch": run.batch,
            "bits": hv.arch.bits_per_element, "mambalaya": __version__,
            "mappings": {t: ev.mapping.name for t, ev in hv.layers.items()},
            "precision": next(iter(hv.layers.values())).precision.name}
    rows = {t: with_energy_column(latency_rows(ev.result), ev.energy) for t, ev in hv.layers.items()}
    if fmt == Format.json:
        totals = hv.totals()
        if dram is not None:
            totals.update(dram_totals(dram))
        energy = hv.energy
        doc = {"provenance": prov, "arch": arch_to_dict(hv.arch), "totals": totals,
               **({"model_energy_by_component_j": energy.by_component_j()} if energy is not None else {}),
               "layers": {t: {"cascade": ev.cascade.name, "layers": ev.result.n_layers, "totals": layer_type_totals(ev),
                              "mapping": mapping_to_dict(ev.mapping), "einsums": rows[t][:-1]}
                          for t, ev in hv.layers.items()}}
        emit(json.dumps(doc, indent=2), output)
        return
    if fmt == Format.csv:
        emit(rows_csv([{"layer_type": t, **r} for t, rs in rows.items() for r in rs]), output)
        return
    tables = []
    for t, ev in hv.layers.items():
        form = (f" ({scan_form(ev.cascade)} scan, the only form that runs here ({ev.other_scan_refused}))"
                if ev.other_scan_refused else "")
        title = (f"{run.model} {t} layers ({ev.result.n_layers} of {config.n_layers}), {run.phase.value}{form} L={seq_len} "
                 f"batch={run.batch} on {hv.arch.name}; cascade {ev.cascade.name}; mapping {ev.mapping.name}: "
                 f"{ev.mapping.description}. Latencies in s, traffic in bytes.")
        tables.append(rows_table(rows[t], title))
    with tables_and_lines(tables, output):
        for t, ev in hv.layers.items():  # what sets a GPU's scans and levels, per layer type, as for a Mamba model
            for line in kernel_lines(ev):
                out_console.print(f"{t} layers: {line}", highlight=False)
        parts = "; ".join(f"{t} layer {milliseconds(ev.result.latency_s)} ms x {ev.result.n_layers} "
                          f"({hv.share_of_time(t):.1%} of the time, mapping {ev.mapping.name})" for t, ev in hv.layers.items())
        rate = "tokens/s" if run.phase == PhaseOption.decode else "tokens/s prefill throughput"
        if hv.pipeline is not None and hv.pipeline.micro_batches > 1:
            parts = f"each micro-batch's (batch {hv.batch // hv.pipeline.micro_batches}) {parts}"
        if hv.layer_split is not None:
            parts = f"each {hv.arch.system.unit}'s part: {parts}"
        out_console.print(f"model ({config.n_layers} layers) {milliseconds(hv.model_latency_s)} ms: {parts}; "
                          f"{rate_text(hv.tokens_per_s)} {rate}; off-chip {whole(hv.offchip_bytes)} B per pass"
                          + ("" if hv.layer_split is None else f" on each {hv.arch.system.unit}"),
                          highlight=False)
        print_devices(hv, dram)
        energy = hv.energy
        if energy is not None:
            t = hv.totals()
            parts = ", ".join(f"{k} {v:.4g} J" for k, v in energy.by_component_j().items())
            layers = "; ".join(f"{lt} layer {t[f'{lt}_layer_energy_j'] * 1e3:.4g} mJ x {ev.result.n_layers}"
                               for lt, ev in hv.layers.items())
            out_console.print(f"energy: {hybrid_energy_text(hv, t, energy.model_j, f'{parts}; {layers}')}; "
                              f"{t['energy_per_token_j'] * 1e6:.4g} uJ/token; EDP {t['edp_js']:.4g} J*s", highlight=False)
            out_console.print(power_text(hv.arch, t, throttled_key="throttled_model_latency_s", what="the model",
                                         cores=chip_cores(hv.arch, hv.layer_split or hv.pipeline)),
                              highlight=False)


def hybrid_energy_text(hv: Any, t: dict[str, Any], pass_j: float, breakdown: str) -> str:
    """A hybrid model's energy and the terms it is the sum of, so that its breakdown (one pass of
    every layer on one device, ``pass_j``) adds up to what it is printed beside: on one device the
    model's; across devices each device's (or each micro-batch's) times their count, with each
    device's leakage while it waits and the links' transfers."""
    tp, pipeline = hv.layer_split, hv.pipeline
    if tp is None and pipeline is None:
        return f"model {t['model_energy_j']:.4g} J ({breakdown})"
    unit = hv.arch.system.unit
    if tp is not None:
        count, what = tp.devices, f"each {unit}'s part"
    else:
        count, what = pipeline.micro_batches, "one micro-batch's pass"
    times = f" x {count} {unit}s" if tp is not None else f" x {count} micro-batch{'es' if count > 1 else ''}"
    extra = "".join(f" + {label} {t[key]:.4g} J" for key, label in (("waiting_leakage_j", f"each {unit}'s leakage while it waits"),
                                                                    ("interconnect_energy_j", "the links"))
                    if t.get(key))
    devices = tp.devices if tp is not None else pipeline.devices
    return (f"model on all {devices} {unit}s and their links {t['model_energy_j']:.4g} J = {what} {pass_j:.4g} J "
            f"({breakdown}){times}{extra}")


def emit_comparison(rows: list[dict[str, Any]], run: DesignArgs, config: Any, baseline: str, fmt: Format,
                    output: Path | None) -> None:
    """Several designs across lengths (:func:`mambalaya.experiments.evaluate.compare_rows`)."""
    if fmt == Format.json:
        emit(json.dumps(rows, indent=2), output)
    elif fmt == Format.csv:
        emit(rows_csv(rows), output)
    else:
        title = (f"{run.model} {run.phase.value}, batch {run.batch}: each design with its own mapping; speedup of the "
                 f"model's latency over {baseline}" + ("; seq_len: the context a decode step follows"
                                                       if run.phase.value == "decode" else ""))
        if is_hybrid(config):  # the table keeps what compares; csv and json hold every column
            keep = ("seq_len", "arch", "model_latency_s", "tokens_per_s",
                    *(f"{t}_mapping" for t in config.layer_counts()), "attention_share", "devices", "interconnect_s",
                    f"speedup_vs_{baseline}")
            title += " (whole model; --format csv for each layer type's latency, cascade and share)"
        else:
            keep = ("seq_len", "arch", "mapping", "scan", "precision", "layer_latency_s", "model_latency_s", "offchip_bytes",
                    "compute_util", "mem_util", "devices", "parallel", "interconnect_s", "interconnect_share",
                    f"speedup_vs_{baseline}")
            title += " (whole model; --format csv for energy and power)"
        shown = [{k: r[k] for k in keep if k in r} for r in rows]
        print_table(rows_table(shown, title), output)
        notes: dict[str, list[str]] = {}
        for r in rows:
            if r.get("other_scan_refused"):
                notes.setdefault(f"at L={r['seq_len']} run the {r['scan']} scan, the only form that runs there "
                                 f"({r['other_scan_refused']})", []).append(r["arch"])
            if r.get("activations_fit_dram") is False:
                notes.setdefault(f"at L={r['seq_len']}: the layer's activations as mapped exceed what the DRAM leaves "
                                 "beside the model; the numbers assume they stream through DRAM (evaluate says by how "
                                 "much)", []).append(r["arch"])
        for note, designs in notes.items():
            out_console.print(f"note: {', '.join(designs)} {note}", highlight=False)
