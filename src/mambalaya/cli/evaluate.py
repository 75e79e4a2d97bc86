"""Commands that cost designs: ``evaluate``, ``compare``, ``validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mambalaya import __version__
from mambalaya.cli.options import (
    RoutingOpt,
    DEFAULT_BASELINE,
    DEFAULT_DESIGN,
    DEFAULT_DESIGN_BATCH,
    DEFAULT_DESIGN_MODEL,
    DEFAULT_SEQ_LEN,
    ArchOpt,
    SetOpt,
    ArchPrecisionOpt,
    BatchOpt,
    CompareBaselineOpt,
    CompareSeqLensOpt,
    DesignMappingOpt,
    Format,
    FormatOpt,
    ModelOpt,
    OutOpt,
    PhaseOpt,
    PhaseOption,
    ScanOpt,
    SeqLenOpt,
)
from mambalaya.formatting import milliseconds, whole
from mambalaya.formatting import rate as rate_text
from mambalaya.errors import MambalayaError
from mambalaya.workloads import resolve_model
from mambalaya.workloads.families import is_hybrid

from mambalaya.cli.common import (
    _with_routing,
    Objective,
    _design,
    _emit,
    _int_list,
    _print_table,
    _provenance,
    _rows_csv,
    _rows_table,
    _width_text,
    app,
    err_console,
    out_console,
    user_errors,
)


@app.command("evaluate")
@user_errors
def evaluate_cmd(
    arch: ArchOpt = DEFAULT_DESIGN,
    model: ModelOpt = DEFAULT_DESIGN_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_DESIGN_BATCH,
    mapping: DesignMappingOpt = None,
    scan: ScanOpt = None,
    precision: ArchPrecisionOpt = None,
    objective: Annotated[Objective, typer.Option("--objective", help="What the mapping search minimises: latency, energy (needs the arch's energy section) or edp.")] = Objective.latency,
    settings: SetOpt = None,
    routing: RoutingOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Latency, traffic, utilisation and (where the arch has an energy section) energy of one
    layer and the whole model on a design."""
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.arch import arch_to_dict
    from mambalaya.fusion.mapping_file import mapping_to_dict
    from mambalaya.model.energy import energy_rows
    from mambalaya.model.latency import latency_rows

    config = _with_routing(resolve_model(model), routing, model)
    arch = _design(arch, settings)
    if is_hybrid(config):
        if objective != Objective.latency:
            raise MambalayaError("--objective energy/edp is for single-layer-type models; a hybrid model's "
                                 "layers are searched for latency")
        _evaluate_hybrid(arch, model, config, phase, seq_len, batch, mapping, scan, precision, fmt, output)
        return
    ev = evaluate(arch, model, config, phase=phase.value, seq_len=seq_len, batch=batch, mapping=mapping, scan=scan,
                  precision=precision, objective=objective.value)
    rows = latency_rows(ev.result)
    energy = ev.energy
    if energy is not None:
        by_einsum = {r["einsum"]: r["total_pj"] for r in energy_rows(energy)}
        for r in rows:
            r["energy_pj"] = by_einsum[r["einsum"]]
    prov = _provenance(model, config, ev.cascade, phase=phase.value, seq_len=seq_len, batch=batch,
                       mapping=ev.mapping.name, mapping_description=ev.mapping.description,
                       bits=ev.arch.bits_per_element, precision=ev.precision.name)
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
        }
        _emit(json.dumps(doc, indent=2), output)
        return
    if fmt == Format.csv:
        _emit(_rows_csv(rows), output)
        return
    t = ev.totals()
    title = (f"{model} {phase.value} I={ev.cascade.size('I')} batch={batch} on {ev.arch.name} "
             f"({_width_text(ev.arch.bits_per_element, ev.precision.name)}, {ev.arch.clock_hz / 1e9:g} GHz, "
             f"{ev.arch.memory.offchip_bandwidth_bytes_per_s / 1e9:g} GB/s, buffer {ev.arch.memory.onchip_buffer_bytes:,} B); "
             f"mapping {ev.mapping.name}: {ev.mapping.description}. Latencies in s, traffic in bytes.")
    _print_table(_rows_table(rows, title), output)
    if output is None:
        rate = (f"{rate_text(t['tokens_per_s'])} tokens/s" if phase == PhaseOption.decode
                else f"{rate_text(t['tokens_per_s'])} tokens/s prefill throughput")
        out_console.print(
            f"layer {milliseconds(t['latency_s'])} ms; model ({t['n_layers']} layers) {milliseconds(t['model_latency_s'])} ms; "
            f"{rate}; off-chip {whole(t['offchip_bytes'])} B; compute util {t['compute_util']:.1%}, memory util {t['mem_util']:.1%}; "
            f"2D spatial util {t['spatial_util']:.1%}; bound: {t['bound']}",
            highlight=False,
        )
        if energy is not None:
            parts = ", ".join(f"{k} {v * 1e3:.4g} mJ" for k, v in energy.by_component_j().items())
            out_console.print(
                f"energy: layer {t['layer_energy_j'] * 1e3:.4g} mJ ({parts}); model {t['model_energy_j']:.4g} J; "
                f"{t['energy_per_token_j'] * 1e6:.4g} uJ/token; EDP {t['edp_js']:.4g} J*s (mapping searched for {ev.objective})",
                highlight=False,
            )
            budget = t["power_budget_w"]
            verdict = ("no power budget in the spec" if budget is None else
                       f"OVER the {budget:g} W budget ({t['average_power_w'] / budget:.2f}x)" if t["over_power_budget"]
                       else f"within the {budget:g} W budget")
            node = (f"energies at {ev.arch.technology.node_nm:g} nm, leakage {t['leakage_w']:.3g} W included"
                    if ev.arch.technology is not None else "energies as the spec gives them, no leakage (no technology section)")
            throttled = (f"; held to the budget the layer takes {milliseconds(t['throttled_latency_s'])} ms"
                         if t["over_power_budget"] else "")
            out_console.print(f"average power {t['average_power_w']:.4g} W: {verdict} ({node}){throttled}", highlight=False)
        if "area_mm2" in t:
            out_console.print(f"area {t['area_mm2']:.4g} mm^2 of components at the design's node (`mambalaya arch show "
                              f"{ev.arch.name}` has them one by one)", highlight=False)
        if ev.arch.memory.levels:
            from mambalaya.model.latency import layer_level_seconds

            level_s = layer_level_seconds(ev.arch, ev.result)
            out_console.print("on-chip levels, each alone (DRAM " + f"{milliseconds(t['offchip_bytes'] / ev.result.bandwidth)} ms): "
                              + "; ".join(f"{n} {milliseconds(v)} ms" for n, v in level_s.items()), highlight=False)
        if ev.arch.memory.buffer_bandwidth_bytes_per_cycle is None:
            out_console.print("note: the on-chip buffer's bandwidth is unbounded (the spec gives neither "
                              "memory.onchip_banks with memory.onchip_bank_port_bytes nor "
                              "memory.onchip_bandwidth_bytes_per_cycle), so no group is bound by it", highlight=False)


def _evaluate_hybrid(arch: Any, model: str, config: Any, phase: PhaseOption, seq_len: int, batch: int,
                     mapping: str | None, scan: str | None, precision: str | None, fmt: Format,
                     output: Path | None) -> None:
    """``evaluate`` on a hybrid model: each layer type's Einsum table, and the whole model."""
    from mambalaya.arch import arch_to_dict
    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.fusion.mapping_file import mapping_to_dict
    from mambalaya.model.latency import latency_rows

    hv = evaluate_hybrid(arch, model, config, phase=phase.value, seq_len=seq_len, batch=batch, mapping=mapping,
                         scan=scan, precision=precision)
    prov = {"model": model, "config": config.model_dump(), "phase": phase.value, "seq_len": seq_len, "batch": batch,
            "bits": hv.arch.bits_per_element, "mambalaya": __version__,
            "mappings": {t: ev.mapping.name for t, ev in hv.layers.items()},
            "precision": next(iter(hv.layers.values())).precision.name}
    rows = {t: latency_rows(ev.result) for t, ev in hv.layers.items()}
    if fmt == Format.json:
        doc = {"provenance": prov, "arch": arch_to_dict(hv.arch), "totals": hv.totals(),
               "layers": {t: {"cascade": ev.cascade.name, "layers": ev.result.n_layers, "totals": ev.totals(),
                              "mapping": mapping_to_dict(ev.mapping), "einsums": rows[t][:-1]}
                          for t, ev in hv.layers.items()}}
        _emit(json.dumps(doc, indent=2), output)
        return
    if fmt == Format.csv:
        _emit(_rows_csv([{"layer_type": t, **r} for t, rs in rows.items() for r in rs]), output)
        return
    first = True
    for t, ev in hv.layers.items():
        title = (f"{model} {t} layers ({ev.result.n_layers} of {config.n_layers}), {phase.value} L={seq_len} "
                 f"batch={batch} on {hv.arch.name}; cascade {ev.cascade.name}; mapping {ev.mapping.name}: "
                 f"{ev.mapping.description}. Latencies in s, traffic in bytes.")
        _print_table(_rows_table(rows[t], title), output, append=not first)
        first = False
    if output is None:
        parts = "; ".join(f"{t} layer {milliseconds(ev.result.latency_s)} ms x {ev.result.n_layers} "
                          f"({hv.share_of_time(t):.1%} of the time, mapping {ev.mapping.name})" for t, ev in hv.layers.items())
        rate = "tokens/s" if phase == PhaseOption.decode else "tokens/s prefill throughput"
        out_console.print(f"model ({config.n_layers} layers) {milliseconds(hv.model_latency_s)} ms: {parts}; "
                          f"{rate_text(hv.tokens_per_s)} {rate}; off-chip {whole(hv.offchip_bytes)} B per pass",
                          highlight=False)


@app.command("compare")
@user_errors
def compare_cmd(
    archs: Annotated[str, typer.Option("--archs", help="Comma-separated designs.")] = "mambalaya,marca-ideal,geens-ideal",
    model: ModelOpt = DEFAULT_DESIGN_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_lens: CompareSeqLensOpt = "2048,16384,131072,1048576",
    batch: BatchOpt = DEFAULT_DESIGN_BATCH,
    baseline: CompareBaselineOpt = DEFAULT_BASELINE,
    scan: ScanOpt = None,
    precision: ArchPrecisionOpt = None,
    settings: SetOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Latencies of several designs across sequence lengths, with speedups over a baseline
    (--set changes every design alike)."""
    from mambalaya.experiments.evaluate import compare_rows

    names = [a.strip() for a in archs.split(",") if a.strip()]
    if not names:
        raise MambalayaError("--archs names no design")
    config = resolve_model(model)
    if is_hybrid(config):
        from mambalaya.experiments.hybrid import hybrid_compare_rows

        rows = hybrid_compare_rows(names, model, config, phase=phase.value, seq_lens=_int_list(seq_lens, "--seq-lens"),
                                   batch=batch, baseline=baseline, scan=scan, precision=precision,
                                   settings=tuple(settings or ()))
    else:
        rows = compare_rows(names, model, config, phase=phase.value, seq_lens=_int_list(seq_lens, "--seq-lens"),
                            batch=batch, baseline=baseline, scan=scan, precision=precision, settings=tuple(settings or ()))
    if fmt == Format.json:
        _emit(json.dumps(rows, indent=2), output)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), output)
    else:
        title = f"{model} {phase.value}, batch {batch}: each design with its own mapping; speedup over {baseline}"
        if is_hybrid(config):  # the table keeps what compares; csv and json hold every column
            keep = ("seq_len", "arch", "model_latency_s", "tokens_per_s",
                    *(f"{t}_mapping" for t in config.layer_counts()), "attention_share", f"speedup_vs_{baseline}")
            rows = [{k: r[k] for k in keep if k in r} for r in rows]
            title += " (whole model; --format csv for each layer type's latency, cascade and share)"
        _print_table(_rows_table(rows, title), output)


@app.command("validate")
@user_errors
def validate_cmd(
    cases: Annotated[Optional[Path], typer.Option("--cases", help="A YAML file of measured cases (default: the shipped published measurements).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write validation.csv and the predicted-vs-measured figure here.")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """The model against published GPU kernel timings: each case predicted with the kernel's
    own grouping, and its speed of light; exits 1 where a speed of light is above a measurement."""
    from mambalaya.experiments.validate import validate

    result = validate(cases)
    rows = result.rows()
    if fmt == Format.json:
        _emit(json.dumps({"cases": rows, "summary": result.summary(), "sensitivity": list(result.sensitivity)}, indent=2), None)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), None)
    else:
        shown = [{**{k: r[k] for k in ("case", "arch", "measured_ms", "read", "predicted_ms", "ratio", "speed_of_light_ms")},
                  "sol_at_or_below": "yes" if r["sol_ok"] else "NO"}
                 for r in rows]
        out_console.print(_rows_table(shown, f"published GPU measurements ({result.source}) against the model"))
        s = result.summary()
        out_console.print(f"{s['cases']} cases: predicted / measured median {s['median_ratio']:.3g}, worst "
                          f"{s['worst_ratio']:.3g} ({s['worst_case']}); speed of light above the measurement: {s['violations']}")
        if result.sensitivity:
            out_console.print(_rows_table(list(result.sensitivity), "predicted / measured median with each kernels "
                                          "assumption at the ends of its range (the speed of light does not depend on them)"))
    if out is not None:
        from mambalaya.report.figures.save import save_figure
        from mambalaya.report.figures.validation import validation_figure

        out.mkdir(parents=True, exist_ok=True)
        (out / "validation.csv").write_text(_rows_csv(rows), encoding="utf-8")
        save_figure(validation_figure(__import__("pandas").DataFrame(rows)), out / "validation")
    if result.violations:
        err_console.print("error: the speed of light is slower than the measured kernel in "
                          + ", ".join(r.case.id for r in result.violations) + ": the model breaks a bound it claims")
        raise typer.Exit(1)
