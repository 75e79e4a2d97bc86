"""The options the ``mambalaya`` commands share, each declared once (flag, type, help).

A command takes an option as ``model: ModelOpt = DEFAULT_CASCADE_MODEL``: the alias carries the
flag and help, the parameter default (typer takes it from the signature, not the alias) comes
from the constants below where several commands share it. Where commands give one flag different
meanings (``--precision``, ``--mapping``, ``--seq-lens``, ``--baseline``, ``--design``,
``--output``, ``--out``, ``--format``), each meaning is its own alias here, side by side, and its
help text says which. Options only one command has stay with that command in :mod:`mambalaya.cli`.

Every size option is read by :func:`mambalaya.cli.readers.size_parser` (ASCII digits, at least 1).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from mambalaya.cli.readers import size_parser
from mambalaya.workloads import PRESETS

# --------------------------------------------------------------------------------------------
# Choices
# --------------------------------------------------------------------------------------------


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class PhaseOption(str, Enum):
    prefill = "prefill"
    decode = "decode"


class SoftmaxOption(str, Enum):
    """The attention layers' softmax form (:data:`mambalaya.workloads.blocks.attention.SOFTMAX_FORMS`)."""

    three_pass = "three-pass"
    online = "online"
    blocked = "blocked"


# --------------------------------------------------------------------------------------------
# Defaults several commands share
# --------------------------------------------------------------------------------------------

#: The model of the commands that build, draw or map one layer's cascade.
DEFAULT_CASCADE_MODEL = "mamba-130m"
#: The model of the commands that evaluate designs (the paper's main Mamba-1 model).
DEFAULT_DESIGN_MODEL = "mamba-1.4b"
DEFAULT_SEQ_LEN = 2048
#: Batch of a single cascade; design evaluations use the paper's batch.
DEFAULT_CASCADE_BATCH = 1
DEFAULT_DESIGN_BATCH = 64
DEFAULT_BITS = 16
#: The design evaluated by default (the paper's own).
DEFAULT_DESIGN = "mambalaya"
DEFAULT_BASELINE = "marca-ideal"

# --------------------------------------------------------------------------------------------
# The model layer: which model, phase and shape
# --------------------------------------------------------------------------------------------

ModelOpt = Annotated[str, typer.Option("--model", "-m", help=f"Preset ({', '.join(PRESETS)}) or a YAML/JSON model config file.")]
PhaseOpt = Annotated[PhaseOption, typer.Option(help="prefill: I = seq-len from a zero state; decode: one step, I = 1, state in and out.")]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", "-L", parser=size_parser, help="Sequence length L (prefill), a positive integer.")]
BatchOpt = Annotated[int, typer.Option("--batch", "-B", parser=size_parser, help="Batch size, a positive integer.")]
BitsOpt = Annotated[int, typer.Option("--bits", parser=size_parser, help="The design's bits per element (every tensor's width under the uniform precision policy).")]
StateIoOpt = Annotated[Optional[bool], typer.Option("--state-io/--no-state-io", help="Read and write the SSM and conv states (default: only in decode).")]
SoftmaxOpt = Annotated[Optional[SoftmaxOption], typer.Option("--softmax", help="A hybrid model's attention: three-pass (eager, every query-key pair; the default), online (one pass, a recurrence per key) or blocked (FlashAttention's: key blocks of 64, masked blocks skipped).")]
LayerTypeOpt = Annotated[Optional[str], typer.Option("--layer-type", help="A hybrid model's layer type to build, as its family names them (mamba, attention, mlp, mamba-moe, attention-moe, parallel for Falcon-H1, hybrid for Zamba2, gdn for OLMo-Hybrid; `mambalaya models` shows each model's).")]
ScanOpt = Annotated[Optional[str], typer.Option("--scan", help="Scan form of a Mamba-2 or gated delta rule layer: chunked (the SSD algorithm, the chunked delta rule) or recurrent (the only decode form). Default: evaluate and compare run a prefill in the faster form on each design (by the objective: the least energy or EDP with --objective); the cascade commands build the chunked form (at a length the chunk size divides: elsewhere it is refused, its padded rows counted after the scan).")]
UnrollFlag = Annotated[bool, typer.Option("--unroll", help="Unroll every recurrence into one Einsum per step (the graph a tool without recurrences, e.g. AccelForge, costs).")]
UnrollScanOpt = Annotated[Optional[int], typer.Option("--unroll-scan", parser=size_parser, help="Prefill of T positions with the scan unrolled into T Einsums (AccelForge has no recurrences).")]

# Comma-separated sequence lengths: compare sweeps them, sensitivity averages over them,
# reproduce defaults to the paper's range.
CompareSeqLensOpt = Annotated[str, typer.Option("--seq-lens", help="Comma-separated sequence lengths.")]
SensitivitySeqLensOpt = Annotated[str, typer.Option("--seq-lens", help="Comma-separated prefill lengths (the ratio is their mean).")]
ReproduceSeqLensOpt = Annotated[Optional[str], typer.Option("--seq-lens", help="Comma-separated prefill lengths (default 2^11..2^20).")]

# --------------------------------------------------------------------------------------------
# Precision policy: of a cascade at --bits, or of a design (its spec's own by default)
# --------------------------------------------------------------------------------------------

PrecisionOpt = Annotated[Optional[str], typer.Option("--precision", help="Precision policy: uniform (default; every tensor at --bits), reference-kernels (what the reference Mamba code computes in), or a policy YAML file.")]
ArchPrecisionOpt = Annotated[Optional[str], typer.Option("--precision", help="Precision policy: uniform, reference-kernels or a policy YAML file (default: each design's own, its spec's precision field).")]
ReproducePrecisionOpt = Annotated[Optional[str], typer.Option("--precision", help="Precision policy of the main result (default: each design's own, reference-kernels for the shipped designs).")]

# --------------------------------------------------------------------------------------------
# Designs, mappings and buffers
# --------------------------------------------------------------------------------------------

ArchOpt = Annotated[str, typer.Option("--arch", "-a", help="Shipped design (mambalaya, marca-ideal, geens-ideal, marca-original, marca-multicore, gpu-h100, gpu-a100, gpu-a100-pcie; `mambalaya arch list`) or an arch YAML file.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Change one field of the design(s): FIELD=VALUE with the sweep's dotted names and units, e.g. --set memory.onchip_buffer_bytes=16MiB; repeatable.")]
CompareBaselineOpt = Annotated[str, typer.Option("--baseline", help="Design the speedups are relative to.")]
SensitivityBaselineOpt = Annotated[str, typer.Option("--baseline", help="The design it is compared with.")]
PlotBaselineOpt = Annotated[str, typer.Option("--baseline", help="plot: design the speedups are relative to.")]
SensitivityDesignOpt = Annotated[str, typer.Option("--design", help="The design whose speedup is studied.")]
PlotDesignOpt = Annotated[str, typer.Option("--design", help="plot: design whose speedup is mapped.")]

MappingOpt = Annotated[str, typer.Option("--mapping", help="unfused, ssm-ri, stitched, optimal, optimal-convex (every non-contiguous group too; slower), ideal, or a mapping YAML file.")]
DesignMappingOpt = Annotated[Optional[str], typer.Option("--mapping", help="Default: the design's own (arch mappings.default); or unfused, ssm-ri, stitched, optimal, optimal-convex, ideal, or a mapping file.")]
OutlineMappingOpt = Annotated[Optional[str], typer.Option("--mapping", help="Outline the fusion groups of this mapping (name or file).")]
AccelForgeMappingOpt = Annotated[str, typer.Option("--mapping", help="unfused, or mapper (AccelForge's mapper picks a fused mapping).")]
BufferOpt = Annotated[Optional[str], typer.Option("--buffer", help="On-chip buffer capacity, e.g. 32MiB, 24MB, 1048576 (default: 32MiB for a named mapping; for a mapping file, its own buffer_bytes, unbounded where it gives none).")]

# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
ExportFormatOpt = Annotated[str, typer.Option("--format", "-f", help="export: csv or parquet.")]
OutOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write to this file instead of stdout.")]
ImageOutOpt = Annotated[Path, typer.Option("--output", "-o", help="Image file: .svg, .png or .pdf.")]
AccelForgeOutOpt = Annotated[Path, typer.Option("--output", "-o", help="Folder for workload.yaml, arch.yaml, mapping_unfused.yaml.")]
ReproduceOutDirOpt = Annotated[Path, typer.Option("--out", help="Output folder for tables, figures, report.md and report.html.")]
SensitivityOutDirOpt = Annotated[Optional[Path], typer.Option("--out", help="Folder for sensitivity.csv and the tornado chart (PNG and SVG).")]

RoutingOpt = Annotated[Optional[Path], typer.Option("--routing", help="A mixture-of-experts model's routing histogram (YAML/JSON: one token fraction per expert, summing to 1) instead of uniform routing: how many tokens each expert gets, and which experts' weights are read.")]
