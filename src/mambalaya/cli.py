"""The ``mambalaya`` command line.

Every command turns user errors (:class:`~mambalaya.errors.MambalayaError`) into one
paragraph on stderr and exit status 1; anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

import atexit
import csv
import functools
import gc
import io
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mambalaya import __version__
from mambalaya.cli_options import (
    DEFAULT_BASELINE,
    DEFAULT_BITS,
    DEFAULT_CASCADE_BATCH,
    DEFAULT_CASCADE_MODEL,
    DEFAULT_DESIGN,
    DEFAULT_DESIGN_BATCH,
    DEFAULT_DESIGN_MODEL,
    DEFAULT_SEQ_LEN,
    AccelForgeMappingOpt,
    AccelForgeOutOpt,
    ArchOpt,
    SetOpt,
    ArchPrecisionOpt,
    LayerTypeOpt,
    BatchOpt,
    BitsOpt,
    BufferOpt,
    CompareBaselineOpt,
    CompareSeqLensOpt,
    DesignMappingOpt,
    ExportFormatOpt,
    Format,
    FormatOpt,
    ImageOutOpt,
    MappingOpt,
    ModelOpt,
    OutlineMappingOpt,
    OutOpt,
    PhaseOpt,
    PhaseOption,
    PlotBaselineOpt,
    PlotDesignOpt,
    PrecisionOpt,
    ReproduceOutDirOpt,
    ReproducePrecisionOpt,
    ReproduceSeqLensOpt,
    ScanOpt,
    SensitivityBaselineOpt,
    SensitivityDesignOpt,
    SensitivityOutDirOpt,
    SensitivitySeqLensOpt,
    SeqLenOpt,
    StateIoOpt,
    UnrollFlag,
    UnrollScanOpt,
)
from mambalaya.formatting import milliseconds, whole
from mambalaya.formatting import rate as rate_text
from mambalaya.errors import MambalayaError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.cascade_file import dump_cascade, load_cascade
from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.einsum.stats import cascade_stats
from mambalaya.fusion.mapping import parse_bytes
from mambalaya.report.tables import cascade_json, cascade_rows
from mambalaya.workloads import PRESETS, SCANS, ModelConfig, build_layer, resolve_model

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

out_console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
err_console = Console(stderr=True, soft_wrap=True)


class Objective(str, Enum):
    latency = "latency"
    energy = "energy"
    edp = "edp"


class Suite(str, Enum):
    paper = "paper"
    hybrid = "hybrid"


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report MambalayaError as one paragraph on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MambalayaError as err:
            err_console.print(f"[bold red]error:[/] {escape(str(err))}", markup=True, highlight=False)
            raise typer.Exit(1) from None

    return wrapper


def _model_layer(model: str, phase: PhaseOption, seq_len: int, batch: int, bits: int, state_io: bool | None,
                 scan: str | None = None, unroll: bool = False, precision: str | None = None,
                 layer_type: str | None = None) -> tuple[ModelConfig, Cascade]:
    config = resolve_model(model)
    if scan is not None and scan not in SCANS:
        raise MambalayaError(f"--scan must be one of {', '.join(SCANS)}, not {scan!r}")
    name = f"{Path(model).stem if model not in PRESETS else model}-{phase.value}"
    if layer_type is not None:
        name = name.replace(f"-{phase.value}", f"-{layer_type}-{phase.value}")
    cascade = build_layer(config, phase=phase.value, seq_len=seq_len, batch=batch, bits=bits, state_io=state_io,
                          name=name, scan=scan, precision=precision, layer_type=layer_type)
    return config, (unroll_recurrences(cascade) if unroll else cascade)


def _policy_name(precision: str | None) -> str:
    return precision or "uniform"


def _width_text(bits: int, precision: str | None) -> str:
    """``16-bit`` under the uniform policy, else the policy's name beside the design width."""
    if precision in (None, "uniform"):
        return f"{bits}-bit"
    return f"precision {precision} (design width {bits} bits)"


def _provenance(model: str, config: ModelConfig, cascade: Cascade, **run: Any) -> dict[str, Any]:
    return {"model": model, "config": config.model_dump(), **run, "mambalaya": __version__}


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as err:
            raise MambalayaError(f"cannot write {output}: {err.strerror or err}") from None
        err_console.print(f"wrote {output}")


def _rows_csv(rows: list[dict[str, Any]]) -> str:
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


def _rows_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for key in rows[0]:
        numeric = isinstance(rows[0][key], (int, float))
        table.add_column(key, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        cells = (Text(_cell(v)) for v in row.values())  # Text: '[b,i]' is not markup
        table.add_row(*cells, style="bold" if row.get("einsum") == "total" else None)
    return table


def _print_stats(cascade: Cascade, n_layers: int, fmt: Format, output: Path | None, provenance: dict[str, Any], title: str) -> None:
    stats = cascade_stats(cascade, n_layers=n_layers)
    if fmt == Format.json:
        _emit(json.dumps(cascade_json(stats, provenance=provenance), indent=2), output)
    elif fmt == Format.csv:
        _emit(_rows_csv(cascade_rows(stats)), output)
    else:
        table = _rows_table(cascade_rows(stats), title)
        if output is None:
            out_console.print(table)
            t = stats.totals
            out_console.print(
                f"layer: {t['macs']:,} MACs, {t['parameters']:,} parameters, "
                f"{whole(t['read_bytes'] + t['write_bytes'])} bytes moved unfused; "
                f"model ({n_layers} layers): {t['model_macs']:,} MACs"
            )
        else:
            console = Console(file=io.StringIO(), width=200)
            console.print(table)
            _emit(console.file.getvalue(), output)  # type: ignore[attr-defined]


def _print_table(table: Table, output: Path | None, append: bool = False) -> None:
    if output is None:
        out_console.print(table)
        return
    console = Console(file=io.StringIO(), width=240)
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    if append and output.exists():
        text = output.read_text(encoding="utf-8") + text
    _emit(text, output)


@app.callback(invoke_without_command=True)
def main(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        out_console.print(f"mambalaya {__version__}")
        raise typer.Exit()


def _family_shape(cfg: ModelConfig) -> str:
    """The shape fields only one model family has."""
    if cfg.family == "mamba1":
        return f"dt_rank={cfg.dt_rank_value}"
    if cfg.family == "bamba":
        counts = ", ".join(f"{n} {t}" for t, n in cfg.layer_counts().items())
        return (f"layers: {counts}; attention heads={cfg.n_heads} kv={cfg.n_kv_heads}; mlp={cfg.d_ff}; "
                f"mamba heads={cfg.mamba_heads} headdim={cfg.mamba_headdim}")
    return f"headdim={cfg.headdim} nheads={cfg.nheads} ngroups={cfg.ngroups} chunk={cfg.chunk_size}"


def _shape_text(cfg: ModelConfig) -> str:
    """One line of a model's shape, for table titles."""
    if cfg.family == "bamba":
        return f"{cfg.family}, d_model={cfg.d_model}, {_family_shape(cfg)}"
    return (f"{cfg.family}, d_model={cfg.d_model}, d_inner={cfg.d_inner}, d_state={cfg.d_state}, "
            f"{_family_shape(cfg)}, d_conv={cfg.d_conv}")


@app.command("models")
@user_errors
def models_cmd(fmt: FormatOpt = Format.table) -> None:
    """List the model presets with their configurations and parameter counts."""
    rows = []
    for name, cfg in PRESETS.items():
        shape = _family_shape(cfg)
        rows.append(
            {
                "model": name,
                "family": cfg.family,
                "d_model": cfg.d_model,
                "n_layers": cfg.n_layers,
                "d_state": cfg.mamba_d_state if cfg.family == "bamba" else cfg.d_state,
                "expand": cfg.mamba_expand if cfg.family == "bamba" else cfg.expand,
                "d_conv": cfg.mamba_d_conv if cfg.family == "bamba" else cfg.d_conv,
                "shape": shape,
                "vocab_size": cfg.vocab_size,
                "parameters": cfg.model_parameters(),
            }
        )
    if fmt == Format.json:
        _emit(json.dumps(rows, indent=2), None)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), None)
    else:
        out_console.print(_rows_table(rows, "model presets (parameters: embedding + layers + final norm)"))


@cascade_app.command("show")
@user_errors
def show_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    state_io: StateIoOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    unroll: UnrollFlag = False,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Print a model layer's cascade: every Einsum with its kind, operation counts and bytes."""
    config, cascade = _model_layer(model, phase, seq_len, batch, bits, state_io, scan, unroll, precision, layer_type)
    prov = _provenance(model, config, cascade, phase=phase.value, seq_len=seq_len, batch=batch, bits=bits,
                       precision=_policy_name(precision))
    title = (
        f"{model}: {phase.value}, I={cascade.size('I')}, batch={batch}, {_width_text(bits, precision)}; "
        f"{_shape_text(config)}; {config.n_layers} layers"
        + (f" (totals count the {config.layer_counts()[layer_type]} {layer_type} layers)" if layer_type else "")
    )
    n_layers = config.layer_counts().get(layer_type, 0) if layer_type and config.family == "bamba" else config.n_layers
    _print_stats(cascade, n_layers, fmt, output, prov, title)


@cascade_app.command("dump")
@user_errors
def dump_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    state_io: StateIoOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    unroll: UnrollFlag = False,
    output: OutOpt = None,
) -> None:
    """Write a model layer's cascade as a cascade file (YAML) that `cascade check` reads back."""
    _, cascade = _model_layer(model, phase, seq_len, batch, bits, state_io, scan, unroll, precision, layer_type)
    _emit(dump_cascade(cascade), output)


@cascade_app.command("check")
@user_errors
def check_cmd(
    path: Annotated[Path, typer.Argument(help="A cascade YAML file.")],
    n_layers: Annotated[int, typer.Option(min=1, help="Layers, for whole-model totals.")] = 1,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Validate a cascade file; print its statistics, or the errors (exit 1)."""
    cascade = load_cascade(path)
    err_console.print(f"{path}: valid cascade {cascade.name!r} with {len(cascade.einsums)} Einsums")
    _print_stats(cascade, n_layers, fmt, output, {"file": str(path)}, f"{path} ({cascade.name})")


@cascade_app.command("diagram")
@user_errors
def diagram_cmd(
    output: ImageOutOpt = Path("cascade.svg"),
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    state_io: StateIoOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    unroll: UnrollFlag = False,
    cascade_file: Annotated[Optional[Path], typer.Option("--cascade", help="Draw this cascade file instead of a model layer.")] = None,
    weights: Annotated[bool, typer.Option("--weights/--no-weights", help="Draw weight tensors.")] = True,
    classes: Annotated[bool, typer.Option("--classes/--no-classes", help="Label edges with their fusion class.")] = False,
    mapping: OutlineMappingOpt = None,
    buffer: BufferOpt = None,
) -> None:
    """Draw the cascade as a dataflow graph (tensors as boxes, Einsums numbered by kind)."""
    from mambalaya.fusion.edges import classify_edges
    from mambalaya.report.diagram import draw_cascade

    if cascade_file is not None:
        cascade = load_cascade(cascade_file)
        title = f"{cascade_file} ({cascade.name})"
    else:
        _, cascade = _model_layer(model, phase, seq_len, batch, bits, state_io, scan, unroll, precision, layer_type)
        title = f"{model} {phase.value}: I={cascade.size('I')}, batch={batch}"
    labels = None
    if classes:
        labels = {e.key: e.fusion_class for e in classify_edges(cascade) if e.producer != e.consumer}
    groups = None
    if mapping is not None:
        m = _resolve_mapping(mapping, cascade, buffer)
        groups = {e: n for n, g in enumerate(m.groups) for e in g.einsums}
        title += f"; mapping {m.name}"
    draw_cascade(cascade, output, title=title, show_weights=weights, edge_labels=labels, groups=groups)
    err_console.print(f"wrote {output}")


DEFAULT_BUFFER = "32MiB"


def _resolve_mapping(name: str, cascade: Cascade, buffer: str | None, stats=None):
    """A named mapping built for ``buffer`` (default 32 MiB), or a mapping file checked against
    ``buffer`` if given, else against the file's own ``buffer_bytes``."""
    from dataclasses import replace

    from mambalaya.fusion.mapping import check_mapping, load_mapping
    from mambalaya.model.search import NAMED_MAPPINGS, named_mapping

    if name in NAMED_MAPPINGS:
        return named_mapping(name, cascade, parse_bytes(buffer or DEFAULT_BUFFER), stats)
    if not Path(name).exists():
        raise MambalayaError(f"unknown mapping {name!r}: use one of {', '.join(NAMED_MAPPINGS)} or the path of a mapping YAML file")
    mapping = load_mapping(name)
    if buffer is not None:
        mapping = replace(mapping, buffer_bytes=parse_bytes(buffer))
    return check_mapping(cascade, mapping)


@fusion_app.command("classes")
@user_errors
def classes_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    state_io: StateIoOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    unroll: UnrollFlag = False,
    inputs: Annotated[bool, typer.Option("--inputs/--no-inputs", help="Include edges from layer inputs and incoming state.")] = True,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Classify every producer -> consumer edge: RI, RSb, RSp or RD, its dependency and pass boundaries."""
    from mambalaya.fusion.edges import classify_edges, edge_rows, edges_json

    _, cascade = _model_layer(model, phase, seq_len, batch, bits, state_io, scan, unroll, precision, layer_type)
    edges = classify_edges(cascade, include_inputs=inputs)
    if fmt == Format.json:
        _emit(json.dumps(edges_json(edges), indent=2), output)
    elif fmt == Format.csv:
        _emit(_rows_csv(edge_rows(edges)), output)
    else:
        title = f"{model}: {phase.value}, I={cascade.size('I')}, batch={batch}: edges (producer '-' = layer input or incoming state)"
        _print_table(_rows_table(edge_rows(edges), title), output)


@fusion_app.command("map")
@user_errors
def map_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    state_io: StateIoOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    unroll: UnrollFlag = False,
    mapping: MappingOpt = "stitched",
    buffer: BufferOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
    save: Annotated[Optional[Path], typer.Option("--save", help="Write the mapping as YAML.")] = None,
) -> None:
    """Build or load a mapping; print its groups, traffic per tensor, off-chip bytes and footprints."""
    from mambalaya.fusion.mapping import dump_mapping
    from mambalaya.model.search import SearchStats
    from mambalaya.model.traffic import mapping_traffic
    from mambalaya.report.fusion_tables import group_rows, mapping_json, tensor_rows

    config, cascade = _model_layer(model, phase, seq_len, batch, bits, state_io, scan, unroll, precision, layer_type)
    stats = SearchStats()
    m = _resolve_mapping(mapping, cascade, buffer, stats)
    buffer_bytes = m.buffer_bytes
    traffic = mapping_traffic(cascade, m)
    if save is not None:
        _emit(dump_mapping(m), save)
    prov = _provenance(model, config, cascade, phase=phase.value, seq_len=seq_len, batch=batch, bits=bits,
                       precision=_policy_name(precision), mapping=mapping, buffer_bytes=buffer_bytes)
    if fmt == Format.json:
        _emit(json.dumps(mapping_json(cascade, traffic, prov), indent=2), output)
        return
    if fmt == Format.csv:
        _emit(_rows_csv(group_rows(traffic)) + "\n" + _rows_csv(tensor_rows(cascade, traffic)), output)
        return
    head = (f"{model}: {phase.value}, I={cascade.size('I')}, batch={batch}, {_width_text(bits, precision)}; mapping {m.name} "
            f"({m.description}); buffer {f'{buffer_bytes:,} bytes' if buffer_bytes else 'unbounded'}")
    _print_table(_rows_table(group_rows(traffic), head + " - groups (loops: rank/tile, outer first)"), output)
    _print_table(_rows_table(tensor_rows(cascade, traffic), "off-chip traffic per tensor"), output, append=True)
    if output is None:
        out_console.print(f"total off-chip: {whole(traffic.offchip_bytes)} bytes; peak group footprint "
                          f"{whole(traffic.peak_footprint_bytes)} bytes"
                          + (f"; search costed {stats.evaluations:,} tilings" if stats.evaluations else ""))


@fusion_app.command("pareto")
@user_errors
def pareto_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.prefill,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    scan: ScanOpt = None,
    layer_type: LayerTypeOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Least off-chip traffic against buffer size (optimal search at 64 KiB .. 4 GiB)."""
    from mambalaya.model.search import pareto_frontier

    _, cascade = _model_layer(model, phase, seq_len, batch, bits, None, scan, precision=precision, layer_type=layer_type)
    rows = [
        {"buffer_bytes": p.buffer_bytes, "peak_footprint_bytes": p.footprint_bytes, "offchip_bytes": p.traffic_bytes, "groups": p.groups}
        for p in pareto_frontier(cascade)
    ]
    if not rows:
        raise MambalayaError("no buffer size up to 4 GiB admits a mapping")
    if fmt == Format.json:
        _emit(json.dumps(rows, indent=2), output)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), output)
    else:
        _print_table(_rows_table(rows, f"{model} {phase.value}: Pareto frontier of buffer size vs off-chip traffic"), output)


@arch_app.command("show")
@user_errors
def arch_show_cmd(
    name: Annotated[str, typer.Argument(help="Shipped design name or arch YAML file.")],
    settings: SetOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Print every value of an architecture spec, its unit and where it comes from."""
    from mambalaya.arch import arch_rows, arch_to_dict

    spec = _design(name, settings)
    if fmt == Format.json:
        _emit(json.dumps(arch_to_dict(spec), indent=2), output)
    elif fmt == Format.csv:
        _emit(_rows_csv(arch_rows(spec)), output)
    else:
        _print_table(_rows_table(arch_rows(spec), f"architecture {spec.name}: {spec.description}"), output)


@arch_app.command("list")
@user_errors
def arch_list_cmd() -> None:
    """List the shipped architecture specs."""
    from mambalaya.arch import load_arch, shipped_archs

    for name in shipped_archs():
        out_console.print(f"{name:16s} {load_arch(name).description}", highlight=False, markup=False)


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
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Latency, traffic, utilisation and (where the arch has an energy section) energy of one
    layer and the whole model on a design."""
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.arch import arch_to_dict
    from mambalaya.fusion.mapping import mapping_to_dict
    from mambalaya.model.energy import energy_rows
    from mambalaya.model.latency import latency_rows

    config = resolve_model(model)
    arch = _design(arch, settings)
    if config.family == "bamba":
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


def _design(name: str, settings: list[str] | None) -> Any:
    """The design named on the command line, with its --set FIELD=VALUE changes."""
    from mambalaya.arch import load_arch, with_settings

    return with_settings(load_arch(name), settings or [])


def _evaluate_hybrid(arch: Any, model: str, config: Any, phase: PhaseOption, seq_len: int, batch: int,
                     mapping: str | None, scan: str | None, precision: str | None, fmt: Format,
                     output: Path | None) -> None:
    """``evaluate`` on a hybrid model: each layer type's Einsum table, and the whole model."""
    from mambalaya.arch import arch_to_dict
    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.fusion.mapping import mapping_to_dict
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


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MambalayaError(f"{what} must be a comma-separated list of integers, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise MambalayaError(f"{what} must list positive integers, not {text!r}")
    return values


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
    if config.family == "bamba":
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
        if config.family == "bamba":  # the table keeps what compares; csv and json hold every column
            keep = ("seq_len", "arch", "model_latency_s", "tokens_per_s", "mamba_mapping", "attention_mapping",
                    "attention_share", f"speedup_vs_{baseline}")
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


@app.command("reproduce")
@user_errors
def reproduce_cmd(
    out: ReproduceOutDirOpt = Path("results"),
    suite: Annotated[Suite, typer.Option("--suite", help="paper: the paper's evaluation (Mamba-1 and Mamba-2). hybrid: how much of the speedup survives in a hybrid model (Mamba + attention + MLP layers), prefill and decode, written to OUT/hybrid/; --models, --seq-lens, --batch, --figures and --precision apply to it, the other options to the paper suite only.")] = Suite.paper,
    models: Annotated[Optional[str], typer.Option("--models", help="Comma-separated model presets (default: mamba-1.4b,mamba2-2.7b; with --suite hybrid: bamba-9b).")] = None,
    seq_lens: ReproduceSeqLensOpt = None,
    batch: BatchOpt = DEFAULT_DESIGN_BATCH,
    generated: Annotated[int, typer.Option("--generated-tokens", min=1, help="Tokens generated per request (end to end).")] = 1024,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Draw the figures.")] = True,
    precision: ReproducePrecisionOpt = None,
    compare_precision: Annotated[str, typer.Option("--compare-precision", help="Also compute the headline ratios under this precision policy ('none' to skip); the main result uses each design's own.")] = "uniform",
    sensitivity: Annotated[str, typer.Option("--sensitivity", help="Sensitivity spec (shipped: h100-like) or YAML file; 'none' to skip the study.")] = "h100-like",
    sensitivity_seq_lens: Annotated[Optional[str], typer.Option("--sensitivity-seq-lens", help="Prefill lengths of the sensitivity study (default 2048,32768,1048576, those in --seq-lens).")] = None,
) -> None:
    """Run the paper's evaluation (or the hybrid-model suite) and write tables, figures,
    report.md and report.html."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mambalaya.experiments.reproduce import DESIGNS, EXTRA_DESIGNS, ReproduceConfig, run_reproduce

    if suite == Suite.hybrid:
        _reproduce_hybrid(out, models or "bamba-9b", seq_lens, batch, figures, precision)
        return
    names = tuple(m.strip() for m in (models or "mamba-1.4b,mamba2-2.7b").split(",") if m.strip())
    for m in names:
        if m not in PRESETS:
            raise MambalayaError(f"unknown model {m!r}: presets are {', '.join(PRESETS)}")
        if PRESETS[m].family == "bamba":
            raise MambalayaError(f"{m} is a hybrid model: the paper's evaluation is of Mamba models; use "
                                 f"`mambalaya reproduce --suite hybrid --models {m}`")
    lens = tuple(_int_list(seq_lens, "--seq-lens")) if seq_lens else ReproduceConfig.seq_lens
    detail = 2048 if 2048 in lens else lens[0]
    sens_lens = tuple(_int_list(sensitivity_seq_lens, "--sensitivity-seq-lens")) if sensitivity_seq_lens \
        else tuple(L for L in ReproduceConfig.sensitivity_seq_lens if L in lens) or lens[:1]
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

        steps += 1 + 2 * len(load_sensitivity_spec(config.sensitivity).assumptions)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task("reproduce", total=steps)

        def tick(message: str) -> None:
            bar.update(task, advance=1, description=message)

        result = run_reproduce(config, tick)
        bar.update(task, completed=steps, description="done")
    err_console.print(f"wrote {result.report} (and report.html) with {len(result.figures)} figure files and "
                      f"{len(result.tables)} tables in {result.seconds:.1f} s")


def _reproduce_hybrid(out: Path, models: str, seq_lens: str | None, batch: int, figures: bool,
                      precision: str | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mambalaya.experiments.hybrid_suite import HybridSuiteConfig, run_hybrid_suite, suite_steps

    names = tuple(m.strip() for m in models.split(",") if m.strip())
    if not names:
        raise MambalayaError("--models names no model")
    lens = tuple(_int_list(seq_lens, "--seq-lens")) if seq_lens else HybridSuiteConfig.seq_lens
    config = HybridSuiteConfig(models=names, batch=batch, seq_lens=lens, out=out / "hybrid", figures=figures,
                               precision=precision)
    steps = suite_steps(config)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task("reproduce --suite hybrid", total=steps)
        result = run_hybrid_suite(config, lambda message: bar.update(task, advance=1, description=message))
        bar.update(task, completed=steps, description="done")
    err_console.print(f"wrote {result.report} (and report.html) with {len(result.figures)} figure files and "
                      f"{len(result.tables)} tables in {result.seconds:.1f} s")


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
    published: Annotated[Optional[float], typer.Option("--published", help="A published value of the ratio: also say what single assumption in range would reach it.")] = None,
    out: SensitivityOutDirOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """How far each documented assumption moves one design's speedup over another (a tornado)."""
    import pandas as pd

    from mambalaya.experiments.sensitivity import RunSetup, load_sensitivity_spec, pair_label, pair_ratio, run_sensitivity

    study = load_sensitivity_spec(spec)
    study = study.model_copy(update={"designs": [design, baseline] if design != baseline else [design]})
    if design == baseline:
        raise MambalayaError("--design and --baseline name the same design; a ratio needs two")
    config = resolve_model(model)
    if config.family == "bamba":
        raise MambalayaError(f"{model} is a hybrid model: the sensitivity study covers Mamba models; for a hybrid "
                             "model use `mambalaya compare` or `mambalaya reproduce --suite hybrid`")
    lens = tuple(_int_list(seq_lens, "--seq-lens")) if phase == PhaseOption.prefill else (1,)
    run = RunSetup(models=(model,), configs={model: config}, seq_lens=lens, batch=batch, precision=precision,
                   phases=("prefill",) if phase == PhaseOption.prefill else ("generation",))
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
        _emit(json.dumps({"ratio": label, "base": result.base[label], "rows": result.rows, "what_would_it_take": result.take},
                         indent=2, default=str), None)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), None)
    else:
        _print_table(_rows_table(rows, title), None)
        for t in result.take:
            out_console.print(f"what would it take to reach {t['published']:g}x: {t['verdict']}", highlight=False)


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
        df = st.dataframe()
    if df.empty:
        raise MambalayaError(f"{store_path} holds no points yet")
    out = output or store_path.with_name(store_path.stem + "_plots")
    paths = save_figure(pareto_figure(df, title=f"{store_path.name}: on-chip buffer vs layer latency"), out / "pareto")
    table = speedup_table(df, x=x, y=y, baseline=baseline, design=design)
    paths += save_figure(
        speedup_heatmap_figure(table, x=x, y=y, title=f"{design} over {baseline}\n(geometric mean over the other axes)"),
        out / "speedup_heatmap",
    )
    table.to_csv(out / "speedup_heatmap.csv")
    err_console.print(f"wrote {', '.join(str(p) for p in paths)}")


export_app = typer.Typer(help="Export cascades to other tools.", no_args_is_help=True)
app.add_typer(export_app, name="export")
crosscheck_app = typer.Typer(help="Cross-check our numbers against other tools.", no_args_is_help=True)
app.add_typer(crosscheck_app, name="crosscheck")


def _accelforge_cascade(model: str, phase: PhaseOption, unroll: int | None, batch: int, bits: int,
                        precision: str | None = None) -> Cascade:
    if phase == PhaseOption.prefill and unroll is None:
        raise MambalayaError("AccelForge cannot express the scan's recurrence over I: export the decode step "
                             "(--phase decode) or a prefill with the scan unrolled (--unroll-scan T)")
    family = resolve_model(model).family
    if family == "bamba":
        raise MambalayaError(f"{model} is a hybrid model: the AccelForge export covers Mamba-1 and Mamba-2 layers")
    _, cascade = _model_layer(model, phase, unroll or 1, batch, bits, None,
                              "recurrent" if family == "mamba2" else None, precision=precision)
    return cascade


@export_app.command("accelforge")
@user_errors
def export_accelforge_cmd(
    output: AccelForgeOutOpt,
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.decode,
    unroll_scan: UnrollScanOpt = None,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    arch: ArchOpt = DEFAULT_DESIGN,
    settings: SetOpt = None,
) -> None:
    """Write an AccelForge workload (decode step, or prefill with the scan unrolled) and architecture."""
    from mambalaya.interop.accelforge import write_export

    cascade = _accelforge_cascade(model, phase, unroll_scan, batch, bits, precision)
    for path in write_export(cascade, _design(arch, settings), output, unroll_scan=unroll_scan):
        err_console.print(f"wrote {path}")


@crosscheck_app.command("accelforge")
@user_errors
def crosscheck_accelforge_cmd(
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.decode,
    unroll_scan: UnrollScanOpt = None,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: BitsOpt = DEFAULT_BITS,
    precision: PrecisionOpt = None,
    mapping: AccelForgeMappingOpt = "unfused",
    python: Annotated[Optional[str], typer.Option("--python", help="A Python >= 3.12 with accelforge and mambalaya (default: found automatically).")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Per tensor: AccelForge's off-chip bits beside ours for the same mapping, and the difference."""
    from mambalaya.interop.accelforge import cross_check_via, find_python312

    if mapping not in ("unfused", "mapper"):
        raise MambalayaError(f"--mapping must be unfused or mapper, not {mapping!r}")
    py = python or find_python312()
    if py is None:
        raise MambalayaError("no Python >= 3.12 with accelforge and mambalaya was found: run scripts/accelforge-env.sh "
                             "(it builds .venv-af) or pass --python")
    cascade = _accelforge_cascade(model, phase, unroll_scan, batch, bits, precision)
    result = cross_check_via(py, cascade, mapping, unroll_scan=unroll_scan)
    rows = result["rows"]
    if fmt == Format.json:
        _emit(json.dumps(result, indent=2), None)
    elif fmt == Format.csv:
        _emit(_rows_csv(rows), None)
    else:
        _print_table(_rows_table(rows, f"{model} {phase.value}{f' unrolled x{unroll_scan}' if unroll_scan else ''}: "
                                       f"off-chip bits, ours vs AccelForge ({mapping} mapping)"), None)
        ours_bits = sum(r["ours_bits"] for r in rows)
        theirs_bits = sum(r["accelforge_bits"] for r in rows)
        out_console.print(f"total: ours {whole(ours_bits)} bits, AccelForge {whole(theirs_bits)} bits; AccelForge "
                          f"{result['accelforge_seconds']:.2f} s, ours {result['ours_seconds']:.3f} s")
        if unroll_scan:
            extra = ours_bits - result["ours_recurrent_bits"]
            out_console.print(f"the recurrent scan (state carried on chip) moves {result['ours_recurrent_bits']:,.0f} bits "
                              f"in our model: unrolling costs {extra:+,.0f} bits")


if __name__ == "__main__":  # pragma: no cover
    app()
