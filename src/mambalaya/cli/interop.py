"""Other tools: ``export accelforge``, ``crosscheck accelforge``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from mambalaya.cli.options import (
    DEFAULT_BITS,
    DEFAULT_CASCADE_BATCH,
    DEFAULT_CASCADE_MODEL,
    DEFAULT_DESIGN,
    AccelForgeMappingOpt,
    AccelForgeOutOpt,
    ArchOpt,
    SetOpt,
    BatchOpt,
    BitsOpt,
    Format,
    FormatOpt,
    ModelOpt,
    PhaseOpt,
    PhaseOption,
    PrecisionOpt,
    UnrollScanOpt,
)
from mambalaya.cli.readers import size_parser
from mambalaya.formatting import whole
from mambalaya.arch import setting_fields
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.unroll import check_unroll_size
from mambalaya.workloads import resolve_model

from mambalaya.outputs import check_output_path
from mambalaya.cli.common import (
    design_with_settings,
    emit,
    model_layer,
    print_table,
    rows_csv,
    rows_table,
    app,
    err_console,
    out_console,
    user_errors,
)


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
    if family not in ("mamba1", "mamba2"):  # (a hybrid's or a delta rule's; the latter met a padding error)
        raise MambalayaError(f"{model} is a {family} model: the AccelForge export covers Mamba-1 and Mamba-2 layers")
    _, cascade = model_layer(model, phase, unroll or 1, batch, bits, None,
                              "recurrent" if family == "mamba2" else None, precision=precision)
    if unroll is not None:  # refused here, before anything is written or sent to AccelForge
        try:
            check_unroll_size(cascade)
        except SpecError as err:
            raise SpecError(f"--unroll-scan {unroll:,}: {err}") from None
    return cascade


#: The design fields the AccelForge export carries: the DRAM bandwidth, the buffer's size and the
#: peak MAC rate (its array and clock) in arch.yaml, the width and policy in the workload.
EXPORTED_FIELDS = ("memory.offchip_bandwidth_bytes_per_s", "memory.onchip_buffer_bytes", "clock_hz",
                   "compute.array_rows", "compute.array_cols", "bits_per_element", "precision")

#: What ``export accelforge`` writes in its folder.
ACCELFORGE_FILES = ("workload.yaml", "arch.yaml", "mapping_unfused.yaml")


#: The export's own --bits and --precision: without them it writes the design's widths, as
#: evaluate runs it (their help once printed the crosscheck's defaults, uniform at 16 bits, which
#: the export never used: marca-original is 32 bits, the H100-like designs reference-kernels).
ExportBitsOpt = Annotated[Optional[int], typer.Option(
    "--bits", parser=size_parser, help="The workload's bits per element. Default: the design's bits_per_element.")]
ExportPrecisionOpt = Annotated[Optional[str], typer.Option(
    "--precision", help="Precision policy of the workload's tensors: uniform (every tensor at the width), "
                        "reference-kernels, or a policy YAML file. Default: the design's own policy (its precision).")]


@export_app.command("accelforge")
@user_errors
def export_accelforge_cmd(
    output: AccelForgeOutOpt,
    model: ModelOpt = DEFAULT_CASCADE_MODEL,
    phase: PhaseOpt = PhaseOption.decode,
    unroll_scan: UnrollScanOpt = None,
    batch: BatchOpt = DEFAULT_CASCADE_BATCH,
    bits: ExportBitsOpt = None,
    precision: ExportPrecisionOpt = None,
    arch: ArchOpt = DEFAULT_DESIGN,
    settings: SetOpt = None,
) -> None:
    """Write an AccelForge workload (decode step, or prefill with the scan unrolled) and architecture."""
    from mambalaya.interop.accelforge import write_export

    check_output_path(output, kind="directory", option="--output", writes=ACCELFORGE_FILES,
                      inputs={"--model": model, "--arch": arch, "--precision": precision})
    fields, given_bits = setting_fields(settings or []), bits is not None
    unread = [f for f in fields if f not in EXPORTED_FIELDS]
    if unread:  # (once accepted, and the files written as without them)
        raise MambalayaError(f"--set {', '.join(unread)}: the AccelForge export carries only "
                             f"{', '.join(EXPORTED_FIELDS)}; the setting would change no file")
    for option, given, field in (("--precision", precision is not None, "precision"),
                                 ("--bits", given_bits, "bits_per_element")):
        if given and field in fields:  # (the option won and the setting was dropped)
            raise MambalayaError(f"{option} and --set {field} both set the workload's widths; give one")
    design = design_with_settings(arch, settings)
    if design.cores is not None:  # (once written as one core's array and buffer beside the chip's DRAM bandwidth)
        raise MambalayaError(f"{design.name} is a multi-core design ({design.cores.count} cores on a network on chip): "
                             "the AccelForge export writes one array, one buffer and one DRAM, and a core's share of "
                             "the chip's bandwidth is not one of its fields; export a single-array design")
    # the workload at the design's widths, as evaluate runs it, unless --bits / --precision say otherwise
    # (the design's were once ignored: marca-original, a 32-bit design, exported at 16 bits)
    cascade = _accelforge_cascade(model, phase, unroll_scan, batch, bits if given_bits else design.bits_per_element,
                                  precision if precision is not None else design.precision)
    for path in write_export(cascade, design, output, unroll_scan=unroll_scan):
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
    from mambalaya.interop.accelforge import cross_check_via
    from mambalaya.interop.accelforge_worker import find_python312

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
        emit(json.dumps(result, indent=2), None)
    elif fmt == Format.csv:
        emit(rows_csv(rows), None)
    else:
        print_table(rows_table(rows, f"{model} {phase.value}{f' unrolled x{unroll_scan}' if unroll_scan else ''}: "
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
