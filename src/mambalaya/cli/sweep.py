"""Design-space sweeps: ``sweep``, locally or on a Dask cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mambalaya.cli.options import (
    DEFAULT_BASELINE,
    DEFAULT_DESIGN,
    ExportFormatOpt,
    OutOpt,
    PlotBaselineOpt,
    PlotDesignOpt,
)
from mambalaya.errors import MambalayaError

from mambalaya.cli.common import (
    _emit,
    app,
    err_console,
    user_errors,
)


@app.command("sweep", context_settings={"help_option_names": ["-h", "--help"]})
@user_errors
def sweep_cmd(
    target: Annotated[str, typer.Argument(help="A sweep spec YAML to run, or 'plot' / 'export' followed by a store.")],
    store_arg: Annotated[Optional[Path], typer.Argument(metavar="[STORE]", help="The store, for plot and export.")] = None,
    scheduler: Annotated[Optional[str], typer.Option("--scheduler", help="Run on an existing Dask cluster: tcp://HOST:PORT.")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Local worker processes (default: one per core).")] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="Result store (default: the spec's 'store').")] = None,
    fmt: ExportFormatOpt = "csv",
    output: OutOpt = None,
    x: Annotated[str, typer.Option("--x", help="plot: heat-map x axis (an input field).")] = "memory.offchip_bandwidth_bytes_per_s",
    y: Annotated[str, typer.Option("--y", help="plot: heat-map y axis (an input field).")] = "memory.onchip_buffer_bytes",
    baseline: PlotBaselineOpt = DEFAULT_BASELINE,
    design: PlotDesignOpt = DEFAULT_DESIGN,
) -> None:
    """Run a design-space sweep (resumable), or plot / export its store.

    \b
    mambalaya sweep SPEC.yaml [--scheduler tcp://HOST:PORT] [--workers N]
    mambalaya sweep plot STORE [-o DIR] [--x FIELD --y FIELD --baseline D --design D]
    mambalaya sweep export STORE --format csv|parquet -o FILE
    """
    if target in ("plot", "export"):
        if store_arg is None:
            raise MambalayaError(f"mambalaya sweep {target} needs the path of a store")
        if target == "export":
            _sweep_export(store_arg, fmt, output)
        else:
            _sweep_plot(store_arg, output, x, y, baseline, design)
        return
    _sweep_run(Path(target), scheduler, workers, store)


def _sweep_run(spec_path: Path, scheduler: str | None, workers: int | None, store: Path | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from mambalaya.experiments.sweep import load_sweep_spec, run_sweep

    spec = load_sweep_spec(spec_path, store=store)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:>8.1f} points/s"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    # redrawn as each chunk is stored, not by a refresh thread: the local workers are forked
    # from this process, and a fork should not copy a thread that may hold the console's lock
    with Progress(*columns, console=err_console, auto_refresh=False) as bar:
        task = bar.add_task(f"sweep {spec.name}", total=None, rate=0.0)

        def progress(done: int, total: int, summary) -> None:
            elapsed = max(summary.seconds, 1e-9)
            bar.update(task, total=total, completed=done, rate=summary.computed / max(bar.tasks[0].elapsed or elapsed, 1e-9),
                       refresh=True)

        summary = run_sweep(spec, scheduler=scheduler, workers=workers, on_progress=progress)
    err_console.print(
        f"sweep {spec.name}: {summary.total} points ({summary.already_done} already in {summary.store}, "
        f"{summary.computed} computed, {summary.failed} failed) in {summary.seconds:.1f} s "
        f"({summary.points_per_s:.0f} points/s)", highlight=False, markup=False)
    if summary.over_power_budget:
        err_console.print(f"  {summary.over_power_budget} point{'s' if summary.over_power_budget > 1 else ''} draw more than "
                          "their design's power budget (the store's over_power_budget and throttled_latency_s columns)",
                          highlight=False, markup=False)
    for pid, error in summary.failures[:10]:
        err_console.print(f"  failed {pid}: {error}", highlight=False, markup=False)
    if summary.failed > 10:
        err_console.print(f"  ... and {summary.failed - 10} more (see the store's 'error' column)", markup=False)
    if summary.failed:
        err_console.print("commonest errors:", markup=False)
        for error, count in summary.commonest_errors():
            err_console.print(f"  {count} point{'s' if count > 1 else ''}: {error}", highlight=False, markup=False)
    if summary.all_failed:
        raise MambalayaError(f"every one of the {summary.computed} points this sweep computed failed; nothing "
                             "usable was stored (the commonest errors are above)")


def _sweep_export(store_path: Path, fmt: str, output: Path | None) -> None:
    from mambalaya.experiments.store import ResultStore

    if fmt not in ("csv", "parquet"):
        raise MambalayaError(f"--format must be csv or parquet, not {fmt!r}")
    with ResultStore(store_path, create=False) as st:
        df = st.dataframe()
    if fmt == "parquet":
        if output is None:
            raise MambalayaError("parquet export needs -o FILE")
        df.to_parquet(output, index=False)
        err_console.print(f"wrote {output} ({len(df)} rows)")
    else:
        _emit(df.to_csv(index=False), output)


def _sweep_plot(store_path: Path, output: Path | None, x: str, y: str, baseline: str, design: str) -> None:
    from mambalaya.experiments.store import ResultStore
    from mambalaya.report.figures import save_figure
    from mambalaya.report.sweep_figures import pareto_figure, speedup_heatmap_figure, speedup_table

    with ResultStore(store_path, create=False) as st:
        df, inputs = st.dataframe(), st.input_columns()
    if df.empty:
        raise MambalayaError(f"{store_path} holds no points yet")
    out = output or store_path.with_name(store_path.stem + "_plots")
    paths = save_figure(pareto_figure(df, title=f"{store_path.name}: on-chip buffer vs layer latency"), out / "pareto")
    table = speedup_table(df, x=x, y=y, baseline=baseline, design=design, inputs=inputs)
    paths += save_figure(
        speedup_heatmap_figure(table, x=x, y=y, title=f"{design} over {baseline}\n(geometric mean over the other axes)"),
        out / "speedup_heatmap",
    )
    table.to_csv(out / "speedup_heatmap.csv")
    err_console.print(f"wrote {', '.join(str(p) for p in paths)}")
