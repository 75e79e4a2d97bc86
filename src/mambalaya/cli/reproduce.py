"""The paper's evaluation and its sensitivity study: ``reproduce``, ``sensitivity``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mambalaya.cli.options import (
    DEFAULT_BASELINE,
    DEFAULT_DESIGN,
    DEFAULT_DESIGN_BATCH,
    DEFAULT_DESIGN_MODEL,
    ArchPrecisionOpt,
    BatchOpt,
    Format,
    FormatOpt,
    ModelOpt,
    PhaseOpt,
    PhaseOption,
    ReproduceOutDirOpt,
    ReproducePrecisionOpt,
    ReproduceSeqLensOpt,
    SensitivityBaselineOpt,
    SensitivityDesignOpt,
    SensitivityOutDirOpt,
    SensitivitySeqLensOpt,
    SoftmaxOpt,
)
from mambalaya.errors import MambalayaError
from mambalaya.workloads import PRESETS, resolve_model
from mambalaya.workloads.families.base import is_hybrid

from mambalaya.cli.readers import ratio_parser, read_int_list, read_list, size_parser
from mambalaya.outputs import check_output_path
from mambalaya.cli.common import (
    Suite,
    option_given,
    emit,
    print_table,
    rows_csv,
    rows_table,
    app,
    err_console,
    out_console,
    user_errors,
)


@app.command("reproduce")
@user_errors
def reproduce_cmd(
    ctx: typer.Context,
    out: ReproduceOutDirOpt = Path("results"),
    suite: Annotated[Suite, typer.Option("--suite", help="paper: the paper's evaluation (Mamba-1 and Mamba-2). hybrid: how much of the speedup survives in a hybrid model (Mamba + attention + MLP layers), prefill and decode, written to OUT/hybrid/; --models, --seq-lens, --batch, --figures, --precision, --workers and --softmax apply to it, the other options to the paper suite only.")] = Suite.paper,
    models: Annotated[Optional[str], typer.Option("--models", help="Comma-separated model presets (default: mamba-1.4b,mamba2-2.7b; with --suite hybrid: bamba-9b,nemotron-h-8b,olmo-hybrid-7b,falcon-h1-7b,zamba2-2.7b,jamba-v0.1,granite-4.0-h-tiny).")] = None,
    seq_lens: ReproduceSeqLensOpt = None,
    batch: BatchOpt = DEFAULT_DESIGN_BATCH,
    generated: Annotated[int, typer.Option("--generated-tokens", parser=size_parser, help="Tokens generated per request (end to end).")] = 1024,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Draw the figures.")] = True,
    precision: ReproducePrecisionOpt = None,
    compare_precision: Annotated[str, typer.Option("--compare-precision", help="Also compute the headline ratios under this precision policy ('none' to skip); the main result uses each design's own.")] = "uniform",
    sensitivity: Annotated[str, typer.Option("--sensitivity", help="Sensitivity spec (shipped: h100-like) or YAML file; 'none' to skip the study.")] = "h100-like",
    sensitivity_seq_lens: Annotated[Optional[str], typer.Option("--sensitivity-seq-lens", help="Prefill lengths of the sensitivity study (default 2048,32768,1048576, those in --seq-lens).")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", parser=size_parser, help="With --suite hybrid: worker processes, each taking a model's decode phase or one length of its prefill at a time (default: one per core; 1 runs in this process). The tables are the same.")] = None,
    softmax: SoftmaxOpt = None,
) -> None:
    """Run the paper's evaluation (or the hybrid-model suite) and write tables, figures,
    report.md and report.html."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mambalaya.experiments.reproduce import DESIGNS, EXTRA_DESIGNS, ReproduceConfig, run_reproduce

    # the lists first (no work), then the output folder against the inputs they name
    given_models = read_list(models, "--models") if models is not None else None
    given_lens = tuple(read_int_list(seq_lens, "--seq-lens")) if seq_lens is not None else None
    given_sens_lens = (tuple(read_int_list(sensitivity_seq_lens, "--sensitivity-seq-lens"))
                       if sensitivity_seq_lens is not None else None)
    check_reproduce_out(out, suite, figures, {"--models": given_models, "--precision": precision,
                                              "--compare-precision": compare_precision, "--sensitivity": sensitivity})
    if suite == Suite.hybrid:
        from mambalaya.experiments.hybrid_suite import HYBRID_MODELS

        paper_only = [f"--{name.replace('_', '-')}" for name in
                      ("generated", "compare_precision", "sensitivity", "sensitivity_seq_lens")
                      if option_given(ctx, name)]
        if paper_only:  # accepted and ignored, they once left the hybrid suite's numbers as they were
            raise MambalayaError(f"{', '.join(o.replace('--generated', '--generated-tokens') for o in paper_only)} "
                                 "appl{} to the paper suite only; the hybrid suite takes --models, --seq-lens, "
                                 "--batch, --figures, --precision, --workers and --softmax".format(
                                     "ies" if len(paper_only) == 1 else "y"))

        _reproduce_hybrid(out, tuple(given_models or HYBRID_MODELS), given_lens, batch, figures, precision, workers,
                          softmax.value if softmax else "three-pass")
        return
    if workers is not None:
        raise MambalayaError("--workers applies to --suite hybrid only: the paper suite runs in this process")
    if softmax is not None:
        raise MambalayaError("--softmax applies to --suite hybrid only: the paper's models have no attention layers")
    names = tuple(given_models or ("mamba-1.4b", "mamba2-2.7b"))
    for m in names:
        if m not in PRESETS:
            raise MambalayaError(f"unknown model {m!r}: presets are {', '.join(PRESETS)}")
        if is_hybrid(PRESETS[m]):
            raise MambalayaError(f"{m} is a hybrid model: the paper's evaluation is of Mamba models; use "
                                 f"`mambalaya reproduce --suite hybrid --models {m}`")
    lens = given_lens or ReproduceConfig.seq_lens
    if given_sens_lens is not None:  # (replaced or ignored without a word, once)
        if sensitivity == "none":
            raise MambalayaError("--sensitivity-seq-lens sets the sensitivity study's lengths, which --sensitivity none "
                                 "does not run; drop one of them")
        outside = [L for L in given_sens_lens if L not in lens]
        if outside:
            raise MambalayaError(f"--sensitivity-seq-lens {', '.join(map(str, outside))}: not in --seq-lens "
                                 f"({', '.join(map(str, lens))}); the study recomputes the headline ratios at lengths "
                                 "of the main grid, so give them there too")
    detail = 2048 if 2048 in lens else lens[0]
    sens_lens = given_sens_lens or tuple(L for L in ReproduceConfig.sensitivity_seq_lens if L in lens) or lens[:1]
    config = ReproduceConfig(models=names, batch=batch, seq_lens=lens, generated_tokens=generated,
                             detail_seq_len=detail, out=out, figures=figures,
                             precision=precision,
                             compare_precision=None if compare_precision == "none" else compare_precision,
                             sensitivity=None if sensitivity == "none" else sensitivity,
                             sensitivity_seq_lens=sens_lens)
    runs = len(DESIGNS) + len(EXTRA_DESIGNS)
    # per model: every L and generation on every design, ideal fusion (2), energy-objective mambalaya (2)
    steps = len(names) * (len(lens) * runs + runs + 2 + 2) + (1 if figures else 0) + 2
    if config.compare_precision:
        steps += 1
    if config.sensitivity:
        from mambalaya.experiments.sensitivity import load_sensitivity_spec

        study = load_sensitivity_spec(config.sensitivity)
        missing = [d for d in DESIGNS if d not in study.designs]
        if missing:  # the headline ratios compare these (once a KeyError after the main run)
            raise MambalayaError(f"--sensitivity {config.sensitivity}: its designs ({', '.join(study.designs)}) lack "
                                 f"{', '.join(missing)}, which the headline ratios it moves compare")
        steps += 1 + 2 * len(study.assumptions)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task("reproduce", total=steps)

        def tick(message: str) -> None:
            bar.update(task, advance=1, description=message)

        result = run_reproduce(config, tick)
        bar.update(task, completed=steps, description="done")
    err_console.print(f"wrote {result.report} (and report.html) with {len(result.figures)} figure files and "
                      f"{len(result.tables)} tables in {result.seconds:.1f} s")


#: What a suite writes in its folder (``--out``, or ``--out``/hybrid): tables, the mappings,
#: the report and its figures.
REPRODUCE_FILES = ("*.csv", "*.json", "report.md", "report.html", "figures/*")


def check_reproduce_out(out: Path, suite: Suite, figures: bool, inputs: dict[str, Any] | None = None) -> None:
    """Refuse an ``--out`` the suite cannot write into, before any work: the folder itself, the
    suite's own folder in it (``hybrid/``) and its figures folder; and one where the suite would
    write over one of its ``inputs`` (option -> path, :func:`~mambalaya.outputs.check_output_path`)."""
    suite_out = out / "hybrid" if suite == Suite.hybrid else out
    check_output_path(out, kind="directory", option="--out",
                      inputs=inputs if suite_out == out else None, writes=REPRODUCE_FILES)
    if suite_out != out:
        check_output_path(suite_out, kind="directory", option="--out", inputs=inputs, writes=REPRODUCE_FILES)
    if figures:
        check_output_path(suite_out / "figures", kind="directory", option="--out")


def _reproduce_hybrid(out: Path, names: tuple[str, ...], lens: tuple[int, ...] | None, batch: int, figures: bool,
                      precision: str | None, workers: int | None = None, softmax: str = "three-pass") -> None:
    """The hybrid suite on ``names`` at ``lens`` (None: the suite's own), written to ``out``/hybrid."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mambalaya.experiments.hybrid_suite import HybridSuiteConfig, run_hybrid_suite, suite_steps

    lens = lens or HybridSuiteConfig.seq_lens
    config = HybridSuiteConfig(models=names, batch=batch, seq_lens=lens, out=out / "hybrid", figures=figures,
                               precision=precision, workers=workers, softmax=softmax)
    steps = suite_steps(config)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task("reproduce --suite hybrid", total=steps)
        result = run_hybrid_suite(config, lambda message, steps: bar.update(task, advance=steps, description=message))
        bar.update(task, completed=steps, description="done")
    err_console.print(f"wrote {result.report} (and report.html) with {len(result.figures)} figure files and "
                      f"{len(result.tables)} tables in {result.seconds:.1f} s")


#: What ``sensitivity --out`` writes in its folder.
SENSITIVITY_FILES = ("sensitivity.csv", "what_would_it_take.csv", "tornado.png", "tornado.svg")


@app.command("sensitivity")
@user_errors
def sensitivity_cmd(
    design: SensitivityDesignOpt = DEFAULT_DESIGN,
    baseline: SensitivityBaselineOpt = DEFAULT_BASELINE,
    model: ModelOpt = DEFAULT_DESIGN_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_lens: SensitivitySeqLensOpt = "2048,32768",
    batch: BatchOpt = DEFAULT_DESIGN_BATCH,
    precision: ArchPrecisionOpt = None,
    spec: Annotated[str, typer.Option("--spec", help="Sensitivity spec: the assumptions and their ranges (shipped: h100-like) or a YAML file.")] = "h100-like",
    published: Annotated[Optional[float], typer.Option("--published", parser=ratio_parser, help="A published value of the ratio (a positive number): also say what single assumption in range would reach it.")] = None,
    out: SensitivityOutDirOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """How far each documented assumption moves one design's speedup over another (a tornado)."""
    import pandas as pd

    from mambalaya.experiments.sensitivity import (RunSetup, applicable, check_on_designs, latency_blind,
                                                   load_sensitivity_spec, pair_label, pair_ratio, run_sensitivity)

    check_output_path(out, kind="directory", option="--out", writes=SENSITIVITY_FILES,
                      inputs={"--spec": spec, "--model": model, "--design": design, "--baseline": baseline,
                              "--precision": precision})
    study = load_sensitivity_spec(spec)
    if design == baseline:
        raise MambalayaError("--design and --baseline name the same design; a ratio needs two")
    study = study.model_copy(update={"designs": [design, baseline]})
    check_on_designs(study, spec)  # the spec's assumptions, on the designs this run compares
    blind = [a for a in study.assumptions if latency_blind(a)]
    if blind:  # the ratio is of latencies: both ends of these would give the base ratio
        err_console.print(f"not moved (the latency ratio reads none of them; reproduce's energy ratios do): "
                          f"{', '.join(a.key for a in blind)}", highlight=False)
        if len(blind) == len(study.assumptions):
            raise MambalayaError(f"no assumption of {study.name} moves a latency: the ratio would not move")
        study = study.model_copy(update={"assumptions": [a for a in study.assumptions if not latency_blind(a)]})
    config = resolve_model(model)
    if is_hybrid(config):
        raise MambalayaError(f"{model} is a hybrid model: the sensitivity study covers Mamba models; for a hybrid "
                             "model use `mambalaya compare` or `mambalaya reproduce --suite hybrid`")
    lens = tuple(read_int_list(seq_lens, "--seq-lens")) if phase == PhaseOption.prefill else (1,)
    if published is not None and fmt == Format.csv and out is None:  # (accepted, and the CSV was the same without it)
        raise MambalayaError("--published adds what would reach the value, which the CSV of the assumptions' rows does "
                             "not hold: use --format table or json, or --out DIR (what_would_it_take.csv)")
    run = RunSetup(models=(model,), configs={model: config}, seq_lens=lens, batch=batch, precision=precision,
                   phases=("prefill",) if phase == PhaseOption.prefill else ("generation",))
    if not applicable(study, run):  # (once an empty table and exit 0)
        raise MambalayaError(f"no assumption of {study.name} applies to {model} {phase.value} (the scan form moves "
                             "only models with two scan forms, Mamba-2 and the gated delta rule)")
    label = pair_label(model, run.phases[0], design, baseline)
    result = run_sensitivity(study, run, pair_ratio(design, baseline),
                             published=None if published is None else {label: published}, far=0.0,
                             progress=lambda m: err_console.print(m, highlight=False))
    def shown(v: Any) -> Any:
        return str(v).lower() if isinstance(v, bool) else v

    rows = [{k: shown(r[k]) for k in ("assumption", "end", "value", "base_value", "ours", "base")} for r in result.rows]
    title = (f"{label}: the ratio at each assumption's low and high value (base {result.base[label]:.3f}x; "
             f"spec {study.name}, {model} {phase.value}, L = {', '.join(map(str, lens))}, batch {batch})")
    if out is not None:
        from mambalaya.report.figures import save_figure
        from mambalaya.report.sensitivity_figures import tornado_figure

        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(result.rows).to_csv(out / "sensitivity.csv", index=False)
        if result.take:
            pd.DataFrame(result.take).to_csv(out / "what_would_it_take.csv", index=False)
        paths = save_figure(tornado_figure(pd.DataFrame(result.rows), label, published=published, title=label), out / "tornado")
        err_console.print(f"wrote {out / 'sensitivity.csv'}, {', '.join(str(p) for p in paths)}")
    if fmt == Format.json:
        emit(json.dumps({"ratio": label, "base": result.base[label], "rows": result.rows, "what_would_it_take": result.take},
                         indent=2, default=str), None)
    elif fmt == Format.csv:
        emit(rows_csv(rows), None)
    else:
        print_table(rows_table(rows, title), None)
        for t in result.take:
            out_console.print(f"what would it take to reach {t['published']:g}x: {t['verdict']}", highlight=False)
