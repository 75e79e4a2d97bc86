"""Commands on fusion: ``fusion classes|map|pareto``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from mambalaya.cli.options import (
    BufferOpt,
    Format,
    FormatOpt,
    MappingOpt,
    OutOpt,
)
from mambalaya.formatting import whole
from mambalaya.errors import MambalayaError
from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.mapping_file import parse_bytes

from mambalaya.cli.layer_options import LayerArgs, check_buffer_is_read, layer_cascade, layer_options
from mambalaya.outputs import check_output_path, check_outputs_differ, write_text_output
from mambalaya.cli.common import (
    width_text,
    emit,
    print_table,
    print_tables,
    provenance_record,
    rows_csv,
    rows_table,
    err_console,
    fusion_app,
    out_console,
    user_errors,
)


DEFAULT_BUFFER = "32MiB"


def resolve_mapping(name: str, cascade: Cascade, buffer: str | None, stats=None):
    """A named mapping built for ``buffer`` (default 32 MiB), or a mapping file checked against
    ``buffer`` if given, else against the file's own ``buffer_bytes``."""
    from dataclasses import replace

    from mambalaya.fusion.mapping_file import check_mapping_file
    from mambalaya.search.mappings import NAMED_MAPPINGS, load_mapping_file, named_mapping

    if name in NAMED_MAPPINGS:
        return named_mapping(name, cascade, parse_bytes(DEFAULT_BUFFER if buffer is None else buffer), stats)
    mapping = load_mapping_file(name)
    if buffer is not None:
        mapping = replace(mapping, buffer_bytes=parse_bytes(buffer))
    return check_mapping_file(cascade, mapping, name)


@fusion_app.command("classes")
@user_errors
@layer_options()
def classes_cmd(
    layer: LayerArgs,
    inputs: Annotated[bool, typer.Option("--inputs/--no-inputs", help="Include edges from layer inputs and incoming state (a state read as an initial value too: dependency initial(RANK)).")] = True,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Classify every producer -> consumer edge: RI, RSb, RSp or RD, its dependency and pass boundaries."""
    from mambalaya.fusion.edges import classify_edges, edge_rows, edges_json

    check_output_path(output, kind="file", option="--output", inputs=layer.input_paths())
    widths = layer.width_options()
    if widths:  # (accepted, and every class the same: the table only echoed the width)
        raise MambalayaError(f"{' and '.join(widths)} set the tensors' widths, and no fusion class depends on a width "
                             "(what each edge needs to fuse is in its accesses); the option would change nothing")
    _, cascade = layer_cascade(layer)
    edges = classify_edges(cascade, include_inputs=inputs)
    if fmt == Format.json:
        emit(json.dumps(edges_json(edges), indent=2), output)
    elif fmt == Format.csv:
        emit(rows_csv(edge_rows(edges)), output)
    else:
        title = (f"{layer.title(cascade)}: edges (producer '-' = layer input or incoming state; the classes do not "
                 "depend on widths)")
        print_table(rows_table(edge_rows(edges), title), output)


@fusion_app.command("map")
@user_errors
@layer_options()
def map_cmd(
    layer: LayerArgs,
    mapping: MappingOpt = "stitched",
    buffer: BufferOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
    save: Annotated[Optional[Path], typer.Option("--save", help="Write the mapping as YAML.")] = None,
) -> None:
    """Build or load a mapping; print its groups, traffic per tensor, off-chip bytes and footprints."""
    from mambalaya.fusion.mapping_file import dump_mapping
    from mambalaya.search.mappings import SearchStats
    from mambalaya.cost.traffic import mapping_traffic
    from mambalaya.report.fusion_tables import group_rows, mapping_json, tensor_rows

    inputs = {**layer.input_paths(), "--mapping": mapping}
    check_outputs_differ({"--save": save, "--output": output})
    check_output_path(output, kind="file", option="--output", inputs=inputs)
    check_output_path(save, kind="file", option="--save", inputs=inputs)
    check_buffer_is_read(buffer, mapping)
    config, cascade = layer_cascade(layer)
    stats = SearchStats()
    m = resolve_mapping(mapping, cascade, buffer, stats)
    buffer_bytes = m.buffer_bytes
    traffic = mapping_traffic(cascade, m)
    if save is not None:
        write_text_output(save, dump_mapping(m))
        err_console.print(f"wrote {save}")
    prov = provenance_record(layer.model, config, cascade, **layer.run_fields(), mapping=mapping, buffer_bytes=buffer_bytes)
    if fmt == Format.json:
        emit(json.dumps(mapping_json(cascade, traffic, prov), indent=2), output)
        return
    if fmt == Format.csv:
        emit(rows_csv(group_rows(traffic)) + "\n" + rows_csv(tensor_rows(cascade, traffic)), output)
        return
    head = (f"{layer.title(cascade)}, {width_text(layer.bits, layer.precision)}; mapping {m.name} "
            f"({m.description}); buffer {f'{buffer_bytes:,} bytes' if buffer_bytes else 'unbounded'}")
    print_tables([rows_table(group_rows(traffic), head + " - groups (loops: rank/tile, outer first)"),
                   rows_table(tensor_rows(cascade, traffic), "off-chip traffic per tensor")], output)
    if output is None:
        out_console.print(f"total off-chip: {whole(traffic.offchip_bytes)} bytes; peak group footprint "
                          f"{whole(traffic.peak_footprint_bytes)} bytes"
                          + (f"; search costed {stats.evaluations:,} tilings" if stats.evaluations else ""))


@fusion_app.command("pareto")
@user_errors
@layer_options(state_io=False, unroll=False)
def pareto_cmd(
    layer: LayerArgs,
    fmt: FormatOpt = Format.table,
    output: OutOpt = None,
) -> None:
    """Least off-chip traffic against buffer size (optimal search at 64 KiB .. 4 GiB)."""
    from mambalaya.search.pareto import pareto_frontier

    check_output_path(output, kind="file", option="--output", inputs=layer.input_paths())
    _, cascade = layer_cascade(layer)
    rows = [
        {"buffer_bytes": p.buffer_bytes, "peak_footprint_bytes": p.footprint_bytes, "offchip_bytes": p.traffic_bytes, "groups": p.groups}
        for p in pareto_frontier(cascade)
    ]
    if not rows:
        raise MambalayaError("no buffer size up to 4 GiB admits a mapping")
    if fmt == Format.json:
        emit(json.dumps(rows, indent=2), output)
    elif fmt == Format.csv:
        emit(rows_csv(rows), output)
    else:
        print_table(rows_table(rows, f"{layer.title(cascade)}, {width_text(layer.bits, layer.precision)}: Pareto "
                                     "frontier of buffer size vs off-chip traffic"), output)
