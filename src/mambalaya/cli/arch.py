"""Commands on architecture specs: ``arch show|list``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from mambalaya.cli.options import (
    SetOpt,
    Format,
    FormatOpt,
    OutOpt,
)

from mambalaya.outputs import check_output_path
from mambalaya.cli.common import (
    design_with_settings,
    emit,
    print_tables,
    rows_csv,
    rows_table,
    arch_app,
    out_console,
    user_errors,
)


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

    check_output_path(output, kind="file", option="--output", inputs={"NAME": name})
    spec = design_with_settings(name, settings)
    if fmt == Format.json:
        emit(json.dumps(arch_to_dict(spec), indent=2), output)
    elif fmt == Format.csv:
        emit(rows_csv(arch_rows(spec)), output)
    else:
        tables = [rows_table(arch_rows(spec), f"architecture {spec.name}: {spec.description}")]
        if spec.area is not None:
            from mambalaya.cost.area import area_rows, leakage_w

            per_core = "" if spec.cores is None else (
                f"one of its {spec.cores.count} cores, the chip {spec.cores.count} times this; ")
            title = (f"area of {spec.name} by component ({per_core}leakage {leakage_w(spec):.3g} W"
                     + (f", power budget {spec.power_budget_w:g} W)" if spec.power_budget_w else ")"))
            tables.append(rows_table(area_rows(spec), title))
        print_tables(tables, output)


@arch_app.command("list")
@user_errors
def arch_list_cmd() -> None:
    """List the shipped architecture specs."""
    from mambalaya.arch import load_arch, shipped_archs

    for name in shipped_archs():
        out_console.print(f"{name:16s} {load_arch(name).description}", highlight=False, markup=False)
