"""Design-space sweeps: ``sweep``, locally or on a Dask cluster."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from mambalaya.cli.options import (
    DEFAULT_BASELINE,
    DEFAULT_DESIGN,
    ExportFormatOpt,
    OutOpt,
    PlotBaselineOpt,
    PlotDesignOpt,
)
from mambalaya.cli.readers import size_parser
from mambalaya.errors import MambalayaError
from mambalaya.outputs import atomic_output, check_output_path, write_text_output

from mambalaya.cli.common import (
    emit,
    app,
    err_console,
    option_given,
    user_errors,
)


if TYPE_CHECKING:
    import pandas as pd


@app.command("sweep", context_settings={"help_option_names": ["-h", "--help"]})
@user_errors
def sweep_cmd(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="A sweep spec YAML to run, or 'plot' / 'export' followed by a store.")],
    store_arg: Annotated[Optional[Path], typer.Argument(metavar="[STORE]", help="The store, for plot and export.")] = None,
    scheduler: Annotated[Optional[str], typer.Option("--scheduler", help="Run on an existing Dask cluster: tcp://HOST:PORT.")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", parser=size_parser, help="Local worker processes (default: one per core).")] = None,
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
    mode = target if target in ("plot", "export") else "run"
    misplaced = [name for name, (_, modes) in SWEEP_MODE_OPTIONS.items() if mode not in modes and option_given(ctx, name)]
    if misplaced:  # (accepted, and dropped: a run's -o wrote nothing, an export's --store read the first store)
        raise MambalayaError(f"sweep {'SPEC' if mode == 'run' else mode} does not take "
                             + "; ".join(f"{SWEEP_MODE_OPTIONS[n][0]} (for {' and '.join(SWEEP_MODE_OPTIONS[n][1])})"
                                         for n in misplaced))
    if target in ("plot", "export"):
        if store_arg is None:
            raise MambalayaError(f"mambalaya sweep {target} needs the path of a store")
        if target == "export":
            check_output_path(output, kind="file", option="--output", inputs={"STORE": store_arg})
            _sweep_export(store_arg, fmt, output)
        else:
            from mambalaya.report.sweep_figures import check_plot_axes

            check_plot_axes(x, y)
            check_output_path(output or default_plot_folder(store_arg), kind="directory", option="--output",
                              inputs={"STORE": store_arg}, writes=PLOT_FILES)
            _sweep_plot(store_arg, output, x, y, baseline, design)
        return
    _sweep_run(Path(target), scheduler, workers, store)


#: Each option of ``sweep`` and the modes it applies to (run a SPEC, plot or export a store).
SWEEP_MODE_OPTIONS = {"scheduler": ("--scheduler", ("run",)), "workers": ("--workers", ("run",)),
                      "store": ("--store", ("run",)), "fmt": ("--format", ("export",)),
                      "output": ("--output", ("export", "plot")), "x": ("--x", ("plot",)), "y": ("--y", ("plot",)),
                      "baseline": ("--baseline", ("plot",)), "design": ("--design", ("plot",))}


def _sweep_run(spec_path: Path, scheduler: str | None, workers: int | None, store: Path | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from mambalaya.experiments.sweep import load_sweep_spec, run_sweep

    check_output_path(store, kind="file", option="--store", inputs={"SPEC": spec_path})
    spec = load_sweep_spec(spec_path, store=store)
    check_output_path(spec.store, kind="file", option="--store", inputs={"SPEC": spec_path})
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:>8.1f} points/s"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    # redrawn as each chunk is stored, not by a refresh thread: the local workers are forked
    # from this process, and a fork should not copy a thread that may hold the console's lock.
    # Shown from the first progress report on: a store or spec refused before is its error alone.
    with contextlib.ExitStack() as showing:
        shown: list[Any] = []
        said: set[str] = set()

        def progress(done: int, total: int, summary) -> None:
            if not shown:
                shown.append(showing.enter_context(Progress(*columns, console=err_console, auto_refresh=False)))
                shown.append(shown[0].add_task(f"sweep {spec.name}", total=None, rate=0.0))
            bar, task = shown
            for line in _start_lines(spec.name, summary, scheduler, said):
                bar.console.print(line, highlight=False, markup=False)
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


def _start_lines(name: str, summary, scheduler: str | None, said: set[str]) -> list[str]:
    """What a sweep says as it starts, each once (``said`` remembers): before any point runs,
    the points to compute, their chunks and workers; after the first chunk, the time they are
    expected to take, from the seconds its points took (:meth:`SweepSummary.estimate_s`)."""
    lines = []
    if "count" not in said:
        said.add("count")
        where = f"the Dask cluster at {scheduler}" if scheduler else (
            "a Dask cluster" if summary.workers is None else
            f"{summary.workers} local worker process{'es' if summary.workers != 1 else ''}")
        lines.append(f"sweep {name}: {summary.total:,} points, {summary.already_done:,} already in {summary.store}; "
                     f"{summary.to_compute:,} to compute in {summary.chunks:,} chunk{'s' if summary.chunks != 1 else ''} "
                     f"on {where}")
    estimate = summary.estimate_s()
    if "estimate" not in said and estimate is not None and summary.computed < summary.to_compute:
        said.add("estimate")
        per_point = summary.point_seconds / summary.computed
        of = "of worker time " if summary.workers is None else ""
        lines.append(f"estimated time: about {_duration(estimate)} {of}for the {summary.to_compute - summary.computed:,} "
                     f"points left (the first {summary.computed:,} took {per_point:.3g} s a point on one worker; "
                     "points of other models, lengths or designs may take longer or shorter: the bar's ETA follows "
                     "the measured rate)")
    return lines


def _duration(seconds: float) -> str:
    """``seconds`` as the two largest units (``2 h 13 min``, ``4 min 5 s``, ``0.8 s``)."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    first = next(k for k, (v, _) in enumerate(parts) if v)
    return " ".join(f"{v} {unit}" for v, unit in parts[first:first + 2] if v)


def _sweep_export(store_path: Path, fmt: str, output: Path | None) -> None:
    from mambalaya.experiments.store import ResultStore

    if fmt not in ("csv", "parquet"):
        raise MambalayaError(f"--format must be csv or parquet, not {fmt!r}")
    if fmt == "parquet" and output is None:
        raise MambalayaError("parquet export needs -o FILE")
    with ResultStore(store_path, create=False) as st:
        df = st.dataframe()
    if fmt == "parquet":
        df, as_text = parquet_columns(df)
        with atomic_output(output) as partial:  # whole: an error leaves the old file or none
            df.to_parquet(partial, index=False)
        note = (f"; {', '.join(as_text)} mix{'es' if len(as_text) == 1 else ''} numbers and text, written as text"
                if as_text else "")
        err_console.print(f"wrote {output} ({len(df)} rows{note})", highlight=False)
    else:
        emit(df.to_csv(index=False), output)


def parquet_columns(df: "pd.DataFrame") -> tuple["pd.DataFrame", list[str]]:
    """``df`` with every column Parquet cannot hold as one type (a grid giving one field as
    ``32MiB`` and ``33554432``) as text, and the names of those columns. Parquet columns have
    one type; a store's column holds whatever each point's spec gave."""
    import pyarrow as pa

    as_text = []
    for column in df.columns:
        if df[column].dtype != object:
            continue
        try:
            pa.array(df[column], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            as_text.append(column)
    if not as_text:
        return df, []
    converted = {c: df[c].map(lambda v: v if v is None or (isinstance(v, float) and v != v) else str(v)) for c in as_text}
    return df.assign(**converted), as_text


#: What ``sweep plot`` writes in its folder.
PLOT_FILES = ("pareto.png", "pareto.svg", "speedup_heatmap.png", "speedup_heatmap.svg", "speedup_heatmap.csv")


def default_plot_folder(store_path: Path) -> Path:
    """Where ``sweep plot`` writes without ``-o``: ``STORE_plots`` beside the store."""
    return store_path.with_name(store_path.stem + "_plots")


def _sweep_plot(store_path: Path, output: Path | None, x: str, y: str, baseline: str, design: str) -> None:
    """Draw every figure and table first, then write them: a refusal (an unknown axis, a design
    with no points) leaves no file and no folder."""
    from mambalaya.experiments.store import ResultStore
    from mambalaya.report.figures import save_figure
    from mambalaya.report.sweep_figures import check_plot_axes, pareto_figure, speedup_heatmap_figure, speedup_table

    from mambalaya.experiments.sweep_spec import FILES_KEY

    with ResultStore(store_path, create=False) as st:
        df, inputs = st.dataframe(), st.input_columns()
    if df.empty:
        raise MambalayaError(f"{store_path} holds no points yet")
    check_plot_axes(x, y, inputs=inputs)
    inputs = [c for c in inputs if c != FILES_KEY]  # two designs' files never share their hash: match the rest
    out = output or default_plot_folder(store_path)
    pareto = pareto_figure(df, title=f"{store_path.name}: on-chip buffer vs layer latency")
    table = speedup_table(df, x=x, y=y, baseline=baseline, design=design, inputs=inputs)
    what = f"{design} over {baseline}: speedup of the model's latency"
    heatmap = speedup_heatmap_figure(table, x=x, y=y, title=f"{what}\n(geometric mean over the other axes' points both ran)")
    paths = save_figure(pareto, out / "pareto") + save_figure(heatmap, out / "speedup_heatmap")
    write_text_output(out / "speedup_heatmap.csv",
                      table.to_csv(index_label=f"{y} (rows) / {x} (columns); {what}, geometric mean over the other "
                                               "axes' points both ran"))
    err_console.print(f"wrote {', '.join(str(p) for p in paths)}, {out / 'speedup_heatmap.csv'}", highlight=False)
