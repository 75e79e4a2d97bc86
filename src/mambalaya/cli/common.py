"""What every command of the ``mambalaya`` command line shares: the app and its groups, the
consoles, one-paragraph errors, output in table, CSV or JSON, provenance.

The consoles read no markup and no emoji codes (:func:`text_console`): a file named
``:x:.yaml`` or ``[red]a.csv``, a ``--set`` field or a model name prints as given, in a message,
a table title or a progress bar; styles are given as :class:`~rich.text.Text` spans instead."""

from __future__ import annotations

import contextlib

import atexit
import csv
import functools
import gc
import io
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Iterator, Annotated, Any, Callable

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mambalaya import __version__
from mambalaya.cli.options import (
    Format,
    PhaseOption,
)
from mambalaya.cli.readers import empty_text_problem
from mambalaya.formatting import whole
from mambalaya.errors import MambalayaError, SpecError, one_line
from mambalaya.outputs import write_text_output
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.einsum.stats import cascade_stats
from mambalaya.experiments.sweep_workers import tune_collector
from mambalaya.report.tables import cascade_json, cascade_rows
from mambalaya.workloads import PRESETS, SCANS, ModelConfig, build_layer, resolve_model
from mambalaya.workloads.families.base import is_hybrid



# Whatever is alive when a command ends dies with the process. Frozen (gc.freeze), it is left out
# of the cyclic collections the interpreter's teardown runs over every module: about 0.15 s of
# every command here (docs/sweeps.md). Registered first, this runs after the exit handlers
# that libraries register later; it skips no finaliser that reference counting runs.
atexit.register(gc.freeze)

app = typer.Typer(
    help="Einsum-based fusion analysis of state-space models (Mamba) on accelerators.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
cascade_app = typer.Typer(help="Build, inspect, draw and check Einsum cascades.", no_args_is_help=True)
app.add_typer(cascade_app, name="cascade")
fusion_app = typer.Typer(help="Fusion classes of edges, mappings, their traffic and the optimal search.", no_args_is_help=True)
app.add_typer(fusion_app, name="fusion")
arch_app = typer.Typer(help="Architecture specs: the shipped designs or your YAML.", no_args_is_help=True)
app.add_typer(arch_app, name="arch")

def text_console(**kwargs: Any) -> Console:
    """A console that prints text as given: no markup (``[red]`` is text), no emoji codes
    (``:x:`` is text). Every console of the command line is one."""
    return Console(markup=False, emoji=False, **kwargs)


out_console = text_console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
err_console = text_console(stderr=True, soft_wrap=True)


class Objective(str, Enum):
    latency = "latency"
    energy = "energy"
    edp = "edp"


class Suite(str, Enum):
    paper = "paper"
    hybrid = "hybrid"


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report MambalayaError as one paragraph on stderr and exit 1. A text option given as empty
    text (``--buffer ''``) is one such error, before the command runs (:mod:`mambalaya.cli.readers`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tune_collector()  # a command's process is the tool's own (speed only: see tune_collector)
        try:
            empty = empty_text_problem(fn, kwargs)
            if empty is not None:
                raise MambalayaError(empty)
            return fn(*args, **kwargs)
        except MambalayaError as err:
            print_error(str(err))
            raise typer.Exit(1) from None

    return wrapper


def print_error(message: str) -> None:
    """``error: message`` on stderr, ``error:`` in bold red, the message as given (no markup) on
    one line, whatever error raised it (:func:`~mambalaya.errors.one_line`)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", one_line(message)), highlight=False)


def model_layer(model: str, phase: PhaseOption, seq_len: int, batch: int, bits: int, state_io: bool | None,
                 scan: str | None = None, unroll: bool = False, precision: str | None = None,
                 layer_type: str | None = None, softmax: str | None = None) -> tuple[ModelConfig, Cascade]:
    config = resolve_model(model)
    if scan is not None and scan not in SCANS:
        raise MambalayaError(f"--scan must be one of {', '.join(SCANS)}, not {scan!r}")
    name = f"{Path(model).stem if model not in PRESETS else model}-{phase.value}"
    if layer_type is not None:
        name = name.replace(f"-{phase.value}", f"-{layer_type}-{phase.value}")
    try:
        cascade = build_layer(config, phase=phase.value, seq_len=seq_len, batch=batch, bits=bits, state_io=state_io,
                              name=name, scan=scan, precision=precision, layer_type=layer_type,
                              **({} if softmax is None else {"softmax": softmax}))
    except SpecError as err:
        if softmax is None:
            raise
        raise SpecError(f"--softmax {softmax}: {getattr(err, 'message', err)}") from None
    return config, (unroll_recurrences(cascade) if unroll else cascade)


def _policy_name(precision: str | None) -> str:
    return precision or "uniform"


def width_text(bits: int, precision: str | None) -> str:
    """``16-bit`` under the uniform policy, else the policy's name beside the design width."""
    if precision in (None, "uniform"):
        return f"{bits}-bit"
    return f"precision {precision} (design width {bits} bits)"


def provenance_record(model: str, config: ModelConfig, cascade: Cascade, **run: Any) -> dict[str, Any]:
    return {"model": model, "config": config.model_dump(), **run, "mambalaya": __version__}


def emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        write_text_output(output, text)  # whole: an error leaves the old file or none
        err_console.print(f"wrote {output}")


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """``rows`` as CSV, the first row's keys the header; no rows is an empty text."""
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value.is_integer() or abs(value) >= 1000:
            return whole(value)
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def rows_table(rows: list[dict[str, Any]], title: str) -> Table:
    """``rows`` as a table, the first row's keys the columns; no rows is a table saying so."""
    table = Table(title=title, title_justify="left", show_lines=False)
    if not rows:
        table.add_column("(no rows)")
        return table
    for key in rows[0]:
        numeric = isinstance(rows[0][key], (int, float))
        table.add_column(key, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        cells = (Text(_cell(v)) for v in row.values())  # Text: '[b,i]' is not markup
        table.add_row(*cells, style="bold" if row.get("einsum") == "total" else None)
    return table


def print_stats(cascade: Cascade, n_layers: int, fmt: Format, output: Path | None, provenance: dict[str, Any], title: str) -> None:
    stats = cascade_stats(cascade, n_layers=n_layers)
    if fmt == Format.json:
        emit(json.dumps(cascade_json(stats, provenance=provenance), indent=2), output)
    elif fmt == Format.csv:
        emit(rows_csv(cascade_rows(stats)), output)
    else:
        table = rows_table(cascade_rows(stats), title)
        if output is None:
            out_console.print(table)
            t = stats.totals
            out_console.print(
                f"layer: {t['macs']:,} MACs, {t['parameters']:,} parameters, "
                f"{whole(t['read_bytes'] + t['write_bytes'])} bytes moved unfused; "
                f"model ({n_layers} layers): {t['model_macs']:,} MACs"
            )
        else:
            emit(_tables_text([table], width=200), output)


def _tables_text(tables: list[Table], width: int = 240) -> str:
    """``tables`` rendered as plain text, one after another."""
    console = text_console(file=io.StringIO(), width=width)
    for table in tables:
        console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def option_given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave option ``name`` (a parameter's name), not its default."""
    return getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"


@contextlib.contextmanager
def tables_and_lines(tables: list[Table], output: Path | None) -> Iterator[None]:
    """``tables`` and then whatever the block prints on ``out_console``: on stdout, or, with
    ``output``, both written to it together (the block's lines, a model's latency, energy and
    DRAM, were once left out of the file)."""
    if output is None:
        for table in tables:
            out_console.print(table)
        yield
        return
    with out_console.capture() as lines:
        yield
    emit(_tables_text(tables) + lines.get(), output)


def print_table(table: Table, output: Path | None) -> None:
    """``table`` on stdout, or written to ``output`` (:func:`print_tables`)."""
    print_tables([table], output)


def print_tables(tables: list[Table], output: Path | None) -> None:
    """``tables`` on stdout, or written to ``output`` together, once (one "wrote" line)."""
    if output is None:
        for table in tables:
            out_console.print(table)
        return
    emit(_tables_text(tables), output)


@app.callback(invoke_without_command=True)
def main(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        out_console.print(f"mambalaya {__version__}")
        raise typer.Exit()


def family_shape(cfg: ModelConfig) -> str:
    """The shape fields only one model family has."""
    if cfg.family == "mamba1":
        return f"dt_rank={cfg.dt_rank_value}"
    if cfg.family in ("jamba", "granitemoehybrid"):
        counts = ", ".join(f"{n} {t}" for t, n in cfg.layer_counts().items())
        mamba = (f"mamba heads={cfg.mamba_heads} headdim={cfg.mamba_headdim}" if cfg.mamba_heads else "mamba-1")
        return (f"layers: {counts}; attention heads={cfg.n_heads} kv={cfg.n_kv_heads}; {cfg.n_experts} experts of "
                f"{cfg.d_ff}, top-{cfg.top_k}" + (f", shared mlp={cfg.shared_d_ff}" if cfg.shared_d_ff else "")
                + f"; {mamba}; routing {'uniform' if cfg.routing == 'uniform' else 'histogram'}")
    if hasattr(cfg, "shape_text"):  # a dense hybrid family (workloads.families)
        return cfg.shape_text()
    if cfg.family == "bamba":
        counts = ", ".join(f"{n} {t}" for t, n in cfg.layer_counts().items())
        return (f"layers: {counts}; attention heads={cfg.n_heads} kv={cfg.n_kv_heads}; mlp={cfg.d_ff}; "
                f"mamba heads={cfg.mamba_heads} headdim={cfg.mamba_headdim}")
    if cfg.family == "gated_deltanet":
        counts = ", ".join(f"{n} {t}" for t, n in cfg.layer_counts().items())
        return (f"layers: {counts} (built: the {cfg.n_layers} linear_attention); k heads={cfg.num_k_heads} "
                f"v heads={cfg.num_v_heads} head dims {cfg.k_head_dim}x{cfg.v_head_dim} chunk={cfg.chunk_size}")
    return f"headdim={cfg.headdim} nheads={cfg.nheads} ngroups={cfg.ngroups} chunk={cfg.chunk_size}"


def model_shape_text(cfg: ModelConfig) -> str:
    """One line of a model's shape, for table titles."""
    if is_hybrid(cfg):
        return f"{cfg.family}, d_model={cfg.d_model}, {family_shape(cfg)}"
    return (f"{cfg.family}, d_model={cfg.d_model}, d_inner={cfg.d_inner}, d_state={cfg.d_state}, "
            f"{family_shape(cfg)}, d_conv={cfg.d_conv}")


def design_with_settings(name: str, settings: list[str] | None) -> Any:
    """The design named on the command line, with its --set FIELD=VALUE changes."""
    from mambalaya.arch import load_arch, with_settings

    return with_settings(load_arch(name), settings or [])


def with_routing(config: Any, routing: Path | None, model: str) -> Any:
    """``config`` with the routing histogram of ``--routing`` (a mixture-of-experts model's)."""
    if routing is None:
        return config
    if not getattr(config, "n_experts", 0):
        raise MambalayaError(f"--routing {routing}: model {model!r} has no mixture-of-experts layer to route")
    if getattr(config, "routing", "uniform") != "uniform":  # (it once replaced the file's list without a word)
        raise MambalayaError(f"--routing {routing}: model {model!r} gives its own routing histogram; give one of them")
    from mambalaya.workloads.blocks.moe import load_routing_histogram

    return config.model_copy(update={"routing": load_routing_histogram(routing, config.n_experts, config.top_k)})
