"""Commands that cost designs: ``evaluate``, ``compare``, ``validate``."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mambalaya.cli.common import Objective, emit, rows_csv, rows_table, app, err_console, out_console, user_errors
from mambalaya.cli.evaluate_text import emit_comparison, emit_evaluation, emit_hybrid
from mambalaya.cli.layer_options import DesignArgs, design_options
from mambalaya.cli.options import (DEFAULT_BASELINE, DEFAULT_DESIGN, DEFAULT_SEQ_LEN, ArchOpt, CompareBaselineOpt,
                                   CompareSeqLensOpt, DesignMappingOpt, Format, FormatOpt, OutOpt, SeqLenOpt)
from mambalaya.cli.readers import read_int_list, read_list
from mambalaya.arch import load_arch
from mambalaya.arch.spec import MAPPING_NAMES
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.outputs import check_output_path, write_text_output
from mambalaya.workloads.families.base import is_hybrid

ObjectiveOpt = Annotated[Objective, typer.Option("--objective", help="What the mapping search minimises: latency, energy (needs the arch's energy section) or edp.")]
DevicesOpt = Annotated[Optional[int], typer.Option("--devices", min=1, help="Devices to run the model on (the design's system section joins them), split as --parallel says. Default: 1.")]


class Parallel(str, Enum):
    pipeline = "pipeline"
    tensor = "tensor"
    expert = "expert"
    sequence = "sequence"
    best = "best"


MicroBatchesOpt = Annotated[Optional[int], typer.Option("--micro-batches", min=1, help="Split the batch into this many micro-batches between a pipeline's stages (GPipe's schedule; with --devices N and --parallel pipeline). Default: 1.")]
ParallelOpt = Annotated[Optional[Parallel], typer.Option("--parallel", help="How --devices split the model: pipeline (its layers in order), tensor (every layer's heads and channels, an all-reduce where an Einsum sums over them), expert (a MoE model's experts, the batch's sequences elsewhere; two all-to-alls per MoE block), sequence (a prefill's positions, the scans' states passed along the devices) or best (the fastest the model takes). Default: pipeline; on a multi-core design, its cores.placement.")]


def check_parallel_has_devices(parallel: Parallel | None, devices: int | None, specs: Iterable[Any]) -> None:
    """Refuse ``--parallel`` on a run of one device (``--devices`` absent or 1) on designs that are
    not multi-core chips: every strategy is then the one-device evaluation, so it changed no number
    and said nothing (as ``--micro-batches`` is refused there). ``specs`` is read only then (a
    generator loads no design otherwise)."""
    if parallel is not None and devices in (None, 1) and all(spec.cores is None for spec in specs):
        raise SpecError(f"--parallel {parallel.value} says how --devices N splits the model over several devices; "
                        f"this run has one ({'--devices 1' if devices else 'no --devices'}), where every strategy is "
                        "the one-device evaluation and changes no number: give --devices N (N > 1)")


@app.command("evaluate")
@user_errors
@design_options()
def evaluate_cmd(
    run: DesignArgs,
    arch: ArchOpt = DEFAULT_DESIGN,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    mapping: DesignMappingOpt = None,
    objective: ObjectiveOpt = Objective.latency,
    devices: DevicesOpt = None,
    parallel: ParallelOpt = None,
    micro_batches: MicroBatchesOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Latency, traffic, utilisation and (where the arch has an energy section) energy of one
    layer and the whole model on a design (or, with --devices, several of it)."""
    from mambalaya.experiments.evaluate import evaluate_best_scan
    from mambalaya.experiments.hybrid import evaluate_hybrid

    check_output_path(output, kind="file", option="--output",
                      inputs={**run.input_paths(), "--arch": arch, "--mapping": mapping})

    if objective != Objective.latency and mapping is not None and (mapping == "ideal" or mapping not in MAPPING_NAMES):
        fixed = "every intermediate on chip" if mapping == "ideal" else "its groups and tiles as written"
        raise SpecError(f"--objective {objective.value} chooses a searched mapping's groups or a fixed grouping's "
                        f"tiles; --mapping {mapping} fixes both ({fixed}), so the objective would change nothing")
    config, design = run.config(), run.design(arch, devices, parallel.value if parallel else None)
    check_parallel_has_devices(parallel, devices, [design])
    softmax = run.softmax_form(config)
    common = dict(phase=run.phase.value, seq_len=seq_len, batch=run.batch, mapping=mapping, scan=run.scan,
                  precision=run.precision, devices=devices, parallel=parallel.value if parallel else None, micro_batches=micro_batches)
    if not is_hybrid(config):  # (without --scan, a Mamba-2 or delta-rule prefill in its faster form, as every command)
        ev = evaluate_best_scan(design, run.model, config, objective=objective.value, **common)
        emit_evaluation(ev, run, config, seq_len, fmt, output)
    elif objective != Objective.latency:
        raise MambalayaError("--objective energy/edp is for single-layer-type models; a hybrid model's "
                             "layers are searched for latency")
    else:
        hv = evaluate_hybrid(design, run.model, config, softmax=softmax, **common)  # refuses a model over the DRAM
        emit_hybrid(hv, run, config, seq_len, fmt, output, dram=hv.dram)


@app.command("compare")
@user_errors
@design_options()
def compare_cmd(
    run: DesignArgs,
    archs: Annotated[str, typer.Option("--archs", help="Comma-separated designs.")] = "mambalaya,marca-ideal,geens-ideal",
    seq_lens: CompareSeqLensOpt = "2048,16384,131072,1048576",
    baseline: CompareBaselineOpt = DEFAULT_BASELINE,
    devices: DevicesOpt = None,
    parallel: ParallelOpt = None,
    micro_batches: MicroBatchesOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Latencies of several designs across sequence lengths, with speedups over a baseline
    (--set changes every design alike; --devices runs each over that many devices)."""
    from mambalaya.experiments.evaluate import compare_rows
    from mambalaya.experiments.hybrid import hybrid_compare_rows

    names = read_list(archs, "--archs")
    lens = read_int_list(seq_lens, "--seq-lens")
    check_output_path(output, kind="file", option="--output",
                      inputs={**run.input_paths(), "--archs": names, "--baseline": baseline})

    config = run.config()
    check_parallel_has_devices(parallel, devices, (load_arch(name) for name in names))
    softmax = run.softmax_form(config)
    common = dict(phase=run.phase.value, seq_lens=lens, batch=run.batch, baseline=baseline, scan=run.scan,
                  precision=run.precision, settings=tuple(run.settings or ()), devices=devices,
                  parallel=parallel.value if parallel else None, micro_batches=micro_batches)
    rows = (hybrid_compare_rows(names, run.model, config, softmax=softmax, **common) if is_hybrid(config)
            else compare_rows(names, run.model, config, **common))
    emit_comparison(rows, run, config, baseline, fmt, output)


#: What ``validate --out`` writes in its folder.
VALIDATE_FILES = ("validation.csv", "validation.png", "validation.svg", "collectives.csv")


@app.command("validate")
@user_errors
def validate_cmd(
    cases: Annotated[Optional[Path], typer.Option("--cases", help="A YAML file of measured cases (default: the shipped published measurements).")] = None,
    collectives: Annotated[Optional[Path], typer.Option("--collectives", help="A YAML file of measured all-reduces and all-to-alls (default: the shipped NCCL measurements on H100 nodes).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write validation.csv and the predicted-vs-measured figure here.")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format: table, csv (every kernel case and collective, one row each, kind naming which; the fits and the assumptions' table are in table and json) or json.")] = Format.table,
    strict: Annotated[bool, typer.Option("--strict", help="Also exit 1 when a prediction is outside [0.5, 2] of its measurement.")] = False,
) -> None:
    """The model against published GPU kernel timings: each case predicted with the kernel's
    own grouping, and its speed of light; and the all-reduce of tensor parallelism and the
    all-to-all of expert parallelism against measured NCCL collectives. Exits 1 where a speed of light is above a measurement,
    where a spec carries a fitted value other than its cases' fit (and, with
    --strict, where a prediction is outside [0.5, 2] of it)."""
    from mambalaya.experiments.validate import validate, validate_collectives

    check_output_path(out, kind="directory", option="--out", inputs={"--cases": cases, "--collectives": collectives},
                      writes=VALIDATE_FILES)
    result = validate(cases)
    reduced = validate_collectives(collectives)
    rows = result.rows()
    reduce_rows = [r.row() for r in reduced]
    if fmt == Format.json:
        emit(json.dumps({"cases": rows, "summary": result.summary(), "sensitivity": list(result.sensitivity),
                         "fits": [f.row() for f in result.fits], "collectives": reduce_rows}, indent=2), None)
    elif fmt == Format.csv:  # the kernel cases and the collectives, one row each (the collectives were left out)
        both = [{"kind": "kernel", **r} for r in rows] + [{"kind": "collective", **r} for r in reduce_rows]
        columns = list(dict.fromkeys(k for r in both for k in r))
        emit(rows_csv([{k: r.get(k) for k in columns} for r in both]), None)
    else:
        shown = [{**{k: r[k] for k in ("case", "arch", "measured_ms", "read", "predicted_ms", "ratio", "speed_of_light_ms")},
                  "sol_at_or_below": "yes" if r["sol_ok"] else "NO"}
                 for r in rows]
        out_console.print(rows_table(shown, f"published GPU measurements ({result.source}) against the model"))
        s = result.summary()
        out_console.print(f"{s['cases']} cases: predicted / measured median {s['median_ratio']:.3g}, worst "
                          f"{s['worst_ratio']:.3g} ({s['worst_case']}); predictions outside [0.5, 2] of the measurement: "
                          f"{s['outside_band']}; speed of light above the measurement: {s['violations']} "
                          f"(tensors at the {result.precision} widths)")
        for fit in result.fits:
            out_console.print(fit.text())
        if result.sensitivity:
            out_console.print(rows_table(list(result.sensitivity), "predicted / measured median with each kernel-model "
                                          "assumption at the ends of its range (the speed of light takes no kernels field, "
                                          "and none is bound by the L2's bandwidth)"))
        keep = ("case", "collective", "devices", "bytes", "nccl_algorithm", "model_algorithm", "measured_us",
                "predicted_us", "ratio", "speed_of_light_us")
        out_console.print(rows_table([{**{k: r[k] for k in keep}, "sol_at_or_below": "yes" if r["sol_ok"] else "NO"}
                                      for r in reduce_rows], "measured NCCL collectives against the model's"))
        for kind in dict.fromkeys(r.case.collective for r in reduced):
            these = [r for r in reduced if r.case.collective == kind]
            out_console.print(f"{len(these)} {kind}s: predicted / measured median "
                              f"{statistics.median(r.ratio for r in these):.3g}; "
                              f"outside [0.5, 2]: {sum(not r.in_band for r in these)}; speed of light above the "
                              f"measurement: {sum(r.violates for r in these)}")
    if out is not None:
        from mambalaya.report.figures.save import save_figure
        from mambalaya.report.figures.validation import validation_figure

        write_text_output(out / "validation.csv", rows_csv(rows))
        write_text_output(out / "collectives.csv", rows_csv(reduce_rows))
        save_figure(validation_figure(__import__("pandas").DataFrame(rows)), out / "validation")
    violations = [*result.violations, *(r for r in reduced if r.violates)]
    if violations:
        err_console.print("error: the speed of light is slower than the measurement in "
                          + ", ".join(r.case.id for r in violations) + ": the model breaks a bound it claims")
        raise typer.Exit(1)
    stale = [(fit, a, v) for fit in result.fits for a, v in fit.stale.items()]
    if stale:
        err_console.print("error: " + "; ".join(f"{a} carries {fit.fit.key} = {'none' if v is None else f'{v:.3g}'}, "
                                                 f"where the fit on {fit.fit.subset} gives {fit.value:.3g}"
                                                 for fit, a, v in stale)
                          + ": its predictions run at its value, not the fit (set the spec's value, or fit on the "
                            "cases the spec's value came from)")
        raise typer.Exit(1)
    outside = [*result.outside_band, *(r for r in reduced if not r.in_band)]
    if strict and outside:
        err_console.print(f"error (--strict): {len(outside)} of {len(result.results) + len(reduced)} predictions are "
                          "outside [0.5, 2] of their measurements: " + ", ".join(f"{r.case.id} ({r.ratio:.2g}x)"
                                                                               for r in outside))
        raise typer.Exit(1)
