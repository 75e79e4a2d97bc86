"""Commands on models and cascades: ``models``, ``cascade show|dump|check|diagram``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from mambalaya.cli.options import (
    BufferOpt,
    Format,
    FormatOpt,
    ImageOutOpt,
    OutlineMappingOpt,
    OutOpt,
)
from mambalaya.einsum.cascade_file import dump_cascade, load_cascade
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.specio import MAX_SPEC_BYTES
from mambalaya.workloads import HYBRID_FAMILIES, PRESETS
from mambalaya.workloads.families.base import is_hybrid

from mambalaya.cli.layer_options import LayerArgs, check_buffer_is_read, layer_cascade, layer_options
from mambalaya.cli.readers import size_parser
from mambalaya.outputs import atomic_output, check_output_path, write_text_output
from mambalaya.cli.common import (
    model_shape_text,
    width_text,
    emit,
    family_shape,
    print_stats,
    provenance_record,
    rows_csv,
    rows_table,
    app,
    cascade_app,
    err_console,
    out_console,
    user_errors,
)


def model_layer_count(cfg: object) -> int:
    """Every layer of the model, the layers its parameter count sums over. The same as
    ``n_layers`` except for a Gated DeltaNet model (the ``olmo-hybrid`` preset), whose
    ``n_layers`` counts the ``linear_attention`` layers it builds while its parameters are the
    whole model's, its ``full_attention`` layers and every MLP included."""
    counts = getattr(cfg, "layer_counts", None)
    return sum(counts().values()) if callable(counts) else cfg.n_layers  # type: ignore[attr-defined]


def model_active_parameters(cfg: object) -> int:
    """The weight elements one token's forward pass uses: a mixture-of-experts model's
    ``active_parameters()`` (every weight but the experts its router does not pick:
    :meth:`~mambalaya.workloads.families.jamba_granite.MoEHybridConfig.active_parameters`);
    every parameter of a model without experts."""
    active = getattr(cfg, "active_parameters", None)
    return active() if callable(active) else cfg.model_parameters()  # type: ignore[attr-defined]


@app.command("models")
@user_errors
def models_cmd(fmt: FormatOpt = Format.table) -> None:
    """List the model presets with their configurations, parameter counts and, for a
    mixture-of-experts model, the parameters one token uses (active)."""
    rows = []
    for name, cfg in PRESETS.items():
        shape = family_shape(cfg)
        rows.append(
            {
                "model": name,
                "family": cfg.family,
                "d_model": cfg.d_model,
                "n_layers": model_layer_count(cfg),
                "d_state": cfg.mamba_d_state if cfg.family in HYBRID_FAMILIES else cfg.d_state,
                "expand": cfg.mamba_expand if cfg.family in HYBRID_FAMILIES else cfg.expand,
                "d_conv": cfg.mamba_d_conv if cfg.family in HYBRID_FAMILIES else cfg.d_conv,
                "shape": shape,
                "vocab_size": cfg.vocab_size,
                "parameters": cfg.model_parameters(),
                "active_parameters": model_active_parameters(cfg),
            }
        )
    if fmt == Format.json:
        emit(json.dumps(rows, indent=2), None)
    elif fmt == Format.csv:
        emit(rows_csv(rows), None)
    else:
        out_console.print(rows_table(rows, "model presets (n_layers: every layer of the model; parameters: embedding "
                                           "+ layers + final norm; active_parameters: those one token uses, top-k of "
                                           "a MoE layer's experts, all of a model without experts)"))


@cascade_app.command("show")
@user_errors
@layer_options()
def show_cmd(layer: LayerArgs, fmt: FormatOpt = Format.table, output: OutOpt = None) -> None:
    """Print a model layer's cascade: every Einsum with its kind, operation counts and bytes."""
    check_output_path(output, kind="file", option="--output", inputs=layer.input_paths())
    config, cascade = layer_cascade(layer)
    prov = provenance_record(layer.model, config, cascade, **layer.run_fields())
    kind = layer.layer_type
    title = (
        f"{layer.title(cascade)}, {width_text(layer.bits, layer.precision)}; {model_shape_text(config)}; "
        f"{config.n_layers} layers"
        + (f" (totals count the {config.layer_counts()[kind]} {kind} layers)" if kind else "")
    )
    n_layers = config.layer_counts().get(kind, 0) if kind and is_hybrid(config) else config.n_layers
    print_stats(cascade, n_layers, fmt, output, prov, title)


@cascade_app.command("dump")
@user_errors
@layer_options()
def dump_cmd(
    layer: LayerArgs,
    output: OutOpt = None,
) -> None:
    """Write a model layer's cascade as a cascade file (YAML) that `cascade check` reads back.
    With --unroll, a cascade whose file would pass the largest spec file mambalaya reads
    (16 MiB) is refused before it is built."""
    check_output_path(output, kind="file", option="--output", inputs=layer.input_paths())
    _, cascade = layer_cascade(layer)
    text = dump_cascade(cascade)
    size_bytes = len(text.encode("utf-8"))
    if size_bytes > MAX_SPEC_BYTES:
        raise SpecError(f"the cascade file of {cascade.name!r} would be {size_bytes:,} bytes, over the "
                        f"{MAX_SPEC_BYTES:,}-byte limit of what `mambalaya cascade check` reads back; nothing was written")
    if output is None:
        emit(text, None)
    else:
        write_text_output(output, text)
        err_console.print(f"wrote {output}")


@cascade_app.command("check")
@user_errors
def check_cmd(
    path: Annotated[Path, typer.Argument(help="A cascade YAML file.")],
    n_layers: Annotated[int, typer.Option("--n-layers", parser=size_parser, help="Layers, for whole-model totals.")] = 1,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Validate a cascade file; print its statistics, or the errors (exit 1)."""
    check_output_path(output, kind="file", option="--output", inputs={"PATH": path})
    cascade = load_cascade(path)
    err_console.print(f"{path}: valid cascade {cascade.name!r} with {len(cascade.einsums)} Einsums")
    print_stats(cascade, n_layers, fmt, output, {"file": str(path)}, f"{path} ({cascade.name})")


@cascade_app.command("diagram")
@user_errors
@layer_options()
def diagram_cmd(
    layer: LayerArgs,
    output: ImageOutOpt = Path("cascade.svg"),
    cascade_file: Annotated[Optional[Path], typer.Option("--cascade", help="Draw this cascade file instead of a model layer.")] = None,
    weights: Annotated[bool, typer.Option("--weights/--no-weights", help="Draw weight tensors.")] = True,
    classes: Annotated[bool, typer.Option("--classes/--no-classes", help="Label edges with their fusion class.")] = False,
    mapping: OutlineMappingOpt = None,
    buffer: BufferOpt = None,
) -> None:
    """Draw the cascade as a dataflow graph (tensors as boxes, Einsums numbered by kind)."""
    from mambalaya.fusion.edges import classify_edges
    from mambalaya.report.diagram import SAVE_FORMATS, draw_cascade

    check_output_path(output, kind="file", option="--output", suffixes=SAVE_FORMATS,
                      inputs={**layer.input_paths(), "--cascade": cascade_file, "--mapping": mapping})
    if cascade_file is not None:
        from dataclasses import fields as dataclass_fields

        moved = [f"--{f.name.replace('_', '-')}" for f in dataclass_fields(LayerArgs)
                 if getattr(layer, f.name) != getattr(LayerArgs(), f.name)]
        if moved:  # (once drawn as the file without a word: --unroll, -L, --precision ignored)
            raise MambalayaError(f"--cascade draws that file as it is: {', '.join(moved)} appl"
                                 f"{'ies' if len(moved) == 1 else 'y'} to a model's layer, not to it")
        cascade = load_cascade(cascade_file)
        title = f"{cascade_file} ({cascade.name})"
    else:
        _, cascade = layer_cascade(layer)
        title = layer.title(cascade)
    if buffer is not None and mapping is None:  # (once accepted and ignored: it sizes a mapping's groups)
        raise MambalayaError("--buffer sizes the groups of --mapping; without a mapping the diagram has none")
    check_buffer_is_read(buffer, mapping)
    widths = layer.width_options()
    if widths and mapping is None and cascade_file is None:  # (once accepted and ignored: the drawing has no widths)
        raise MambalayaError(f"{' and '.join(widths)} set the tensors' widths, which only the groups of --mapping "
                             "depend on; without a mapping the diagram draws none")
    labels = None
    if classes:
        labels = {e.key: e.fusion_class for e in classify_edges(cascade) if e.producer != e.consumer}
    groups = None
    if mapping is not None:
        from mambalaya.cli.fusion import resolve_mapping

        m = resolve_mapping(mapping, cascade, buffer)
        groups = {e: g.name for g in m.groups for e in g.einsums}  # named as fusion map names them
        sized = f"buffer {m.buffer_bytes:,} B" if m.buffer_bytes else "buffer unbounded"
        if cascade_file is None:  # the widths and the buffer the groups were sized for
            sized = f"{layer.bits}-bit design, precision {layer.precision or 'uniform'}, {sized}"
        title += f"; mapping {m.name} ({sized})"
    with atomic_output(output) as partial:
        draw_cascade(cascade, partial, title=title, show_weights=weights, edge_labels=labels, groups=groups)
    err_console.print(f"wrote {output}")
