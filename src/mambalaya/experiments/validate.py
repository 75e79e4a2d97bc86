"""The model against published GPU measurements of Mamba-family, attention and Gated DeltaNet kernels.

A case (``data/validation/gpu-kernels.yaml``) is one measured kernel: its source, the hardware
(a shipped GPU spec), the setup, the Einsums the kernel runs and the measured time. For each,

* **predicted**: the kernel's Einsums (a part of the layer's cascade, :func:`sub_cascade`)
  grouped as the kernels group them (one group by default), each group one kernel that moves
  only its inputs and outputs, on the spec *with* its ``kernels`` section (the fractions of
  peak measured kernels reach, and the launch floor);
* **speed of light**: the ``ideal`` mapping of the same Einsums on the spec's peak rates alone
  (:func:`~mambalaya.arch.kernels.speed_of_light`).

A speed of light above the measured time is impossible for a correct model: :attr:`Validation.violations`
lists those cases and ``mambalaya validate`` exits non-zero. A realistic prediction lands within
:data:`PREDICTION_BAND` (a factor of 2 either way) of the measured kernel:
:attr:`Validation.outside_band` lists the cases that do not, ``mambalaya validate`` reports
their count, and ``mambalaya validate --strict`` exits non-zero on any. The fractions of peak
come from microbenchmarks named in the spec's sources, the same for every case. One quantity is
fitted (``fits`` in the case file): a block-parallel scan's SM-cycles per element-step, once, on
the cases of one declared source (:func:`fit_scan_cycles`); :attr:`Validation.fits` reports the
fit and the cases outside that subset it moves (:class:`FitResult`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from mambalaya.arch import load_arch
from mambalaya.arch.kernels import speed_of_light
from mambalaya.einsum.dead_work import with_mask_tiles
from mambalaya.einsum.ir import Role
from mambalaya.einsum.select import sub_cascade
from mambalaya.errors import SpecError
from mambalaya.fusion.mapping import FusionGroup, Mapping, check_mapping
from mambalaya.cost.latency import layer_latency, scan_floor_s, scan_steps
from mambalaya.cost.launch import Launch, block_reread_bytes, launched_group_seconds
from mambalaya.search.mappings import ideal
from mambalaya.specio import SPEC_MODEL_CONFIG, describe_validation_error, list_as_tuple, parse_yaml_text, read_spec_file
from mambalaya.workloads import build_layer
from mambalaya.workloads.blocks.attention import ATTENTION_REGION, KEY_BLOCK, AttentionConfig, attention_layer
from mambalaya.workloads.blocks.gated_deltanet import CHUNK_REGION, DELTA_REGION, parse_gdn_config
from mambalaya.workloads.blocks.mamba1 import SSM_REGION, parse_config
from mambalaya.workloads.blocks.mamba2 import SSD_REGION, parse_mamba2_config
from mambalaya.workloads.blocks.mamba2 import SSM_REGION as MAMBA2_STEP_REGION
from mambalaya.workloads.precision import apply_policy, load_policy

_STRICT = SPEC_MODEL_CONFIG

#: The band (predicted / measured) a realistic prediction lands in: within 2x of the measured
#: kernel either way. The project's acceptance bound for predictions (issue 44), not a property
#: of any kernel; the speed of light has its own, strict, bound (at or below the measurement).
PREDICTION_BAND = (0.5, 2.0)
#: How far above its scans' time a fit's subset case may be predicted and still count as bound by
#: them (float rounding only: the fit is exact where the scans bound every kernel).
FIT_BOUND_TOLERANCE = 1e-9
#: A tuple field of a case file, written as a YAML list.
_AS_TUPLE = BeforeValidator(list_as_tuple)


def _tiles(value):
    """A grid rank's tile, or the tiles an autotuner tries (a YAML list)."""
    return list_as_tuple(value) if isinstance(value, list) else value


class MaskTiles(BaseModel):
    """The tiles a kernel computes its masked work by: a tile of ``rows`` queries by ``keys``
    keys is computed whole if any of its keys is seen (a block-skipping kernel stops its key
    loop at the diagonal's tile; one that masks after computing does every tile)."""

    model_config = _STRICT

    rows: int = Field(gt=0, description="Query rows one thread block computes together.")
    keys: int = Field(gt=0, description="Keys per step of its loop over the keys.")
    source: str = Field(min_length=1, description="Where the kernel's code sets them.")


class Kernel(BaseModel):
    """One kernel of a case: the Einsums it runs and, where its source says, its launch grid."""

    model_config = _STRICT

    einsums: Annotated[tuple[str, ...], _AS_TUPLE] = Field(min_length=1)
    grid: dict[str, Annotated[int | tuple[int, ...], BeforeValidator(_tiles)]] = Field(
        default_factory=dict,
        description="The ranks the kernel launches thread blocks over, each with its block's tile (or the tiles "
                    "its autotuner tries: the prediction takes the fastest), in launch order, the fastest-varying "
                    "block index first (each block reads its own tiles: cost.launch.block_reread_bytes); none: it "
                    "fills the GPU and reads each input once.")
    grid_source: str = Field("", description="Where the grid comes from (the kernel's launch code).")
    sync_mma: bool = Field(
        False, description="The kernel drives the tensor cores with the synchronous warp-level MMA instruction "
                           "(mma.sync): on a GPU whose peak needs a newer one, its contractions run at the spec's "
                           "kernels.sync_mma_fraction of the peak.")
    sync_mma_source: str = Field("", description="Where the kernel's MMA instruction is read (its source code).")
    mask_tiles: MaskTiles | None = Field(None, description="The tiles this kernel computes masked work by, where "
                                                           "its case's kernels differ (overrides the case's).")

    @model_validator(mode="after")
    def _grid_has_a_source(self) -> "Kernel":
        tiles = [t for v in self.grid.values() for t in (v if isinstance(v, tuple) else (v,))]
        if any(t < 1 for t in tiles) or any(isinstance(v, tuple) and not v for v in self.grid.values()):
            raise ValueError("a grid tile is a positive integer (or a non-empty list of them)")
        if self.grid and not self.grid_source.strip():
            raise ValueError("a grid needs grid_source: the launch code it is read from")
        if self.sync_mma and not self.sync_mma_source.strip():
            raise ValueError("sync_mma needs sync_mma_source: the kernel code that issues the instruction")
        if self.sync_mma_source.strip() and not self.sync_mma:
            raise ValueError("sync_mma_source is given but sync_mma is not true")
        return self

    def launches(self) -> tuple[Launch | None, ...]:
        """The launch grids the kernel may run on (one per autotuned combination; None: no grid)."""
        if not self.grid:
            return (None,)
        ranks = list(self.grid)
        choices = [v if isinstance(v, tuple) else (v,) for v in self.grid.values()]
        return tuple(Launch(tuple(zip(ranks, combo))) for combo in itertools.product(*choices))


def _tiles_text(tiles: "MaskTiles | None") -> str:
    return "-" if tiles is None else f"{tiles.rows}x{tiles.keys}"


def _kernel_entry(value):
    """A kernel written as a list of Einsums is a kernel without a grid."""
    return {"einsums": value} if isinstance(value, (list, tuple)) else value


class Case(BaseModel):
    """One published measurement and the setup that produced it."""

    model_config = _STRICT

    id: str = Field(min_length=1)
    source: str = Field(description="A key of the file's sources.")
    read: Literal["text", "table", "figure"] = Field(description="How the value was read from the source.")
    uncertainty: float = Field(ge=0, le=1, description="Relative uncertainty of the value as read (0 for text or a table).")
    arch: str = Field(description="The shipped GPU spec that models the hardware.")
    family: Literal["mamba1", "mamba2", "attention", "gated_deltanet"]
    model: dict = Field(description="The layer's sizes, in mambalaya's model-config fields (an attention "
                                    "kernel's: AttentionConfig's).")
    batch: int = Field(gt=0)
    seq_len: int = Field(gt=0, description="The positions of a prefill; of a decode step, the context length.")
    phase: Literal["prefill", "decode"] = Field("prefill", description="A prefill over seq_len positions, or one "
                                                "decode step (a recurrent state read and written once per call).")
    #: A measured kernel time: from 1 us (a kernel launch alone takes a few) to 10^7 ms (hours), so
    #: every ratio to it is finite.
    measured_ms: float = Field(ge=1e-3, le=1e7)
    einsums: Annotated[tuple[str, ...], _AS_TUPLE] | None = Field(None, description="The Einsums the kernel runs; default the scan region.")
    kernels: Annotated[tuple[Annotated[Kernel, BeforeValidator(_kernel_entry)], ...], _AS_TUPLE] | None = Field(
        None, description="How they split into kernels (each a list of Einsums, or einsums with a launch grid); "
                          "default one.")
    assumed: str = Field("", description="Setup details the source does not state, and the choice made.")
    causal: bool | None = Field(None, description="An attention kernel: causal (the default) or not.")
    key_block: int | None = Field(None, gt=0, description="An attention kernel: keys per block of the blocked "
                                                        "softmax (default the attention block's KEY_BLOCK).")
    mask_tiles: MaskTiles | None = Field(None, description="The tiles the kernel computes masked work by; absent: "
                                                           "per key, the least work.")
    writes: Annotated[tuple[str, ...], _AS_TUPLE] | None = Field(
        None, min_length=1, description="The tensors the case's kernels write to memory, where they differ from what "
                                        "the part would write (a tensor another kernel reads is written by default: "
                                        "a kernel that recomputes it from its inputs writes it not; a fused kernel "
                                        "that stores an intermediate and reads it back writes it too, though its "
                                        "speed of light does not); every other tensor its Einsums make stays on chip.")
    writes_source: str = Field("", description="Where the kernel's code shows what it writes.")

    @model_validator(mode="after")
    def _attention_fields(self) -> "Case":
        if self.phase == "decode" and self.family == "attention":
            raise ValueError("phase decode: an attention decode step (a KV cache read) is not a case validate models; "
                             "decode cases are Mamba-1, Mamba-2 and Gated DeltaNet steps")
        if self.family != "attention":
            given = [f for f in ("causal", "key_block") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply to attention kernels only (family {self.family})")
        if self.key_block is not None and self.key_block > self.seq_len:
            raise ValueError(f"key_block {self.key_block} is above seq_len {self.seq_len}: a block of keys holds at "
                             "most the sequence")
        if self.writes is not None and not self.writes_source.strip():
            raise ValueError("writes needs writes_source: the kernel code that shows what it writes")
        if self.writes_source.strip() and self.writes is None:
            raise ValueError("writes_source is given but writes is not")
        return self


class Assumption(BaseModel):
    """An assumption of one GPU spec's kernel model and its range from the spec's sources: a
    ``kernels`` field, or a staging level's bandwidth (which a launched kernel's re-reads the L2
    serves cross, :mod:`mambalaya.cost.launch`)."""

    model_config = _STRICT

    key: str = Field(pattern=r"^(kernels\.[a-z_]+|memory\.levels\.[A-Za-z0-9_]+\.bandwidth_bytes_per_cycle)$")
    arch: str
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> "Assumption":
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}: the range's ends are low, then high")
        return self


class Fit(BaseModel):
    """A kernels quantity fitted once, on the cases of one declared source (``subset``), and
    carried by the specs in ``archs``; ``mambalaya validate`` reports the fit and its error on
    the other cases it moves."""

    model_config = _STRICT

    key: Literal["kernels.scan_sm_cycles_per_step"]
    subset: str
    archs: Annotated[tuple[str, ...], _AS_TUPLE] = Field(min_length=1)


#: The precision policy whose widths the shipped cases' kernels write (the SSD's ``C·B`` scores and
#: chunk states, the softmax's running statistics and output in float32, each entry sourced from
#: the kernels' code: ``data/precision/reference-kernels.yaml``).
KERNEL_PRECISION = "reference-kernels"


class CaseFile(BaseModel):
    model_config = _STRICT

    sources: dict[str, str]
    precision: str = Field(KERNEL_PRECISION, min_length=1, description=(
        "The precision policy (a shipped name or a policy file) whose widths the cases' kernels write: every case's "
        "tensors at those widths, the design's at 16 bits (the kernels' fp16 or bf16)."))
    assumptions: Annotated[tuple[Assumption, ...], _AS_TUPLE] = ()
    fits: Annotated[tuple[Fit, ...], _AS_TUPLE] = ()
    cases: Annotated[tuple[Case, ...], _AS_TUPLE] = Field(min_length=1)


class Judged:
    """A prediction and a speed of light judged against a measurement (``predicted_s``,
    ``speed_of_light_s`` and ``measured_s`` given by the class that takes this one in)."""

    predicted_s: float
    speed_of_light_s: float

    @property
    def measured_s(self) -> float:
        raise NotImplementedError

    @property
    def ratio(self) -> float:
        """Predicted over measured."""
        return self.predicted_s / self.measured_s

    @property
    def speed_of_light_ratio(self) -> float:
        return self.speed_of_light_s / self.measured_s

    @property
    def violates(self) -> bool:
        """A speed of light slower than the measurement."""
        return self.speed_of_light_s > self.measured_s

    @property
    def in_band(self) -> bool:
        """The prediction within :data:`PREDICTION_BAND` of the measurement."""
        low, high = PREDICTION_BAND
        return low <= self.ratio <= high


@dataclass(frozen=True)
class Result(Judged):
    case: Case
    source_text: str
    predicted_s: float
    speed_of_light_s: float
    kernels: tuple[Kernel, ...]
    #: per kernel, the launch grid the prediction took (None: no grid) and the off-chip bytes its
    #: blocks read again on it (:func:`~mambalaya.cost.launch.block_reread_bytes`)
    launched: tuple[tuple[Launch | None, float], ...] = ()

    @property
    def measured_s(self) -> float:
        return self.case.measured_ms / 1e3


@dataclass(frozen=True)
class FitResult:
    """A fitted quantity (:class:`Fit`): the value the subset gives, each carrying spec's value,
    each subset case's own value, and the results of the subset's cases and of the other cases
    the quantity moves (their prediction differs without it): its error on the rest."""

    fit: Fit
    value: float
    shipped: dict[str, float | None]
    per_case: dict[str, float]
    subset: tuple[Result, ...]
    rest: tuple[Result, ...]

    @property
    def stale(self) -> dict[str, float | None]:
        """The specs whose carried value is not the fit at the three significant digits they carry
        (their predictions run at that value, not at the fit)."""
        return {a: v for a, v in self.shipped.items() if v is None or f"{v:.3g}" != f"{self.value:.3g}"}

    def row(self) -> dict:
        ratios = [r.ratio for r in self.subset]
        rest = [r.ratio for r in self.rest]
        return {"key": self.fit.key, "subset": self.fit.subset, "value": self.value, "shipped": self.shipped,
                "per_case": self.per_case, "subset_ratios": [min(ratios), max(ratios)],
                "rest_cases": [r.case.id for r in self.rest], "rest_ratios": [min(rest), max(rest)] if rest else [],
                "rest_in_band": sum(r.in_band for r in self.rest), "stale_specs": self.stale}

    def text(self) -> str:
        """One paragraph: the fit, the subset's spread and the error on the other cases it moves."""
        own = self.per_case.values()
        ratios = [r.ratio for r in self.subset]
        carried = ", ".join(f"{a} {'none' if v is None else f'{v:.3g}'}" for a, v in self.shipped.items())
        text = (f"fitted: {self.fit.key} = {self.value:.3g} on the {len(ratios)} cases of {self.fit.subset} "
                f"(each alone {min(own):.3g}-{max(own):.3g}; predicted / measured {min(ratios):.3g}-{max(ratios):.3g}); "
                f"the specs carry {carried}. ")
        if not self.rest:
            return text + "It moves no other case."
        rest = [r.ratio for r in self.rest]
        return text + (f"On the {len(rest)} other cases it moves ({', '.join(r.case.id for r in self.rest)}): "
                       f"predicted / measured {min(rest):.3g}-{max(rest):.3g}, {sum(r.in_band for r in self.rest)} "
                       f"within [0.5, 2].")


@dataclass(frozen=True)
class Validation:
    source: str
    results: tuple[Result, ...]
    sensitivity: tuple[dict, ...] = ()  # per assumption end: the predicted / measured median of its arch's cases
    fits: tuple[FitResult, ...] = ()
    precision: str = KERNEL_PRECISION  # the policy whose widths every case's tensors take

    @property
    def violations(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.violates)

    @property
    def outside_band(self) -> tuple[Result, ...]:
        """The cases whose prediction is outside :data:`PREDICTION_BAND` of the measurement."""
        return tuple(r for r in self.results if not r.in_band)

    def summary(self) -> dict[str, float]:
        ratios = [r.ratio for r in self.results]
        worst = max(self.results, key=lambda r: abs(r.ratio - 1) if r.ratio >= 1 else 1 / r.ratio - 1)
        return {"cases": len(ratios), "median_ratio": statistics.median(ratios), "worst_ratio": worst.ratio,
                "worst_case": worst.case.id, "violations": len(self.violations),
                "outside_band": len(self.outside_band)}

    def rows(self) -> list[dict]:
        return [{
            "case": r.case.id, "arch": r.case.arch, "phase": r.case.phase, "batch": r.case.batch, "seq_len": r.case.seq_len,
            "precision": self.precision,
            "mask_tiles": " | ".join(_tiles_text(k.mask_tiles or r.case.mask_tiles) for k in r.kernels),
            "kernels": " | ".join(",".join(k.einsums) + (f" on grid {_grid_text(k)}" if k.grid else "")
                                  + (" with mma.sync" if k.sync_mma else "") for k in r.kernels),
            "launched_grids": " | ".join("-" if launch is None else "x".join(f"{rank}/{tile}" for rank, tile in launch.tiles)
                                         for launch, _ in r.launched),
            "block_reread_bytes": sum(reread for _, reread in r.launched),
            "measured_ms": r.measured_s * 1e3, "read": r.case.read, "uncertainty": r.case.uncertainty,
            "predicted_ms": r.predicted_s * 1e3, "ratio": r.ratio,
            "speed_of_light_ms": r.speed_of_light_s * 1e3, "sol_ratio": r.speed_of_light_ratio,
            "sol_ok": not r.violates, "in_band": r.in_band, "source": r.source_text, "assumed": r.case.assumed,
        } for r in self.results]


def _grid_text(kernel: Kernel) -> str:
    return "x".join(f"{r}/{'|'.join(map(str, t)) if isinstance(t, tuple) else t}" for r, t in kernel.grid.items())


SHIPPED_CASES = "gpu-kernels.yaml"


def load_cases(path: str | Path | None = None) -> tuple[CaseFile, str]:
    """The case file (default the shipped one) and its name for messages; its precision policy
    is read here, so a wrong one is refused before any case is built."""
    cases, name = read_case_file(path, SHIPPED_CASES, CaseFile, "validation cases")
    try:
        load_policy(cases.precision)
    except SpecError as err:
        raise SpecError(f"invalid validation cases: precision: {getattr(err, 'message', err)}", source=name) from None
    return cases, name


def read_case_file(path: str | Path | None, shipped: str, model: type, what: str):
    """A file of measured cases (default the shipped ``shipped``) read strictly into ``model``
    (``sources`` and ``cases``, each case naming one of the sources), and its name for messages."""
    if path is None:
        name = f"{shipped} (shipped)"
        text = resources.files("mambalaya.data.validation").joinpath(shipped).read_text(encoding="utf-8")
    else:
        name = str(path)
        text = read_spec_file(path, what)
    data = parse_yaml_text(text, source=name)
    if path is not None:
        data = _files_read_beside(data, Path(path).parent)
    try:
        cases = model.model_validate(data)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, f"invalid {what}"), source=name) from None
    seen: set[str] = set()
    for c in cases.cases:
        if c.id in seen:  # results, parts and reports are keyed by id: a repeated one would take another's
            raise SpecError(f"invalid {what}: case id {c.id!r} is given twice; each case needs its own id",
                            source=name)
        seen.add(c.id)
        if c.source not in cases.sources:
            raise SpecError(f"invalid {what}: case {c.id}: source {c.source!r} is not one of sources "
                            f"({', '.join(cases.sources)})", source=name)
    for fit in getattr(cases, "fits", ()):  # refused when read, not after every case ran
        if fit.subset not in cases.sources:
            raise SpecError(f"fit {fit.key}: subset {fit.subset!r} is not one of sources ({', '.join(cases.sources)})",
                            source=name)
        if not any(c.source == fit.subset for c in cases.cases):
            raise SpecError(f"fit {fit.key}: subset {fit.subset!r} has no case to fit on", source=name)
    return cases, name


def _files_read_beside(data, folder: Path):
    """A case file's data with the relative paths of the files it names (each case's, assumption's
    or collective's ``arch``, a collectives file's own ``arch``, each fit's ``archs``, the file's
    ``precision``) read beside it: one file gave two numbers run from two folders. Shipped
    designs and policies stay names."""
    from mambalaya.arch import path_beside, shipped_archs
    from mambalaya.workloads.precision import shipped_policies

    if not isinstance(data, dict):
        return data
    out = dict(data)
    if "precision" in out:
        out["precision"] = path_beside(out["precision"], folder, shipped_policies())
    if "arch" in out:  # (a collectives file's design)
        out["arch"] = path_beside(out["arch"], folder, shipped_archs())
    if isinstance(out.get("fits"), list):
        out["fits"] = [{**fit, "archs": [path_beside(a, folder, shipped_archs()) for a in fit["archs"]]}
                       if isinstance(fit, dict) and isinstance(fit.get("archs"), list) else fit for fit in out["fits"]]
    for key in ("cases", "assumptions"):
        if isinstance(out.get(key), list):
            out[key] = [{**entry, "arch": path_beside(entry["arch"], folder, shipped_archs())}
                        if isinstance(entry, dict) and "arch" in entry else entry for entry in out[key]]
    return out


def _attention_layer(case: Case, name: str):
    """An attention kernel's layer: the attention block at the case's sizes with FlashAttention's
    blocked softmax (``softmax="blocked"``), causal or not as the case says."""
    try:
        config = AttentionConfig.model_validate(case.model)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, f"case {case.id}: invalid attention sizes"), source=name) from None
    return attention_layer(config, batch=case.batch, seq_len=case.seq_len, softmax="blocked",
                           key_block=case.key_block or KEY_BLOCK, causal=case.causal is not False)


#: A Gated DeltaNet case's fields outside its mixer (the MLP's width, the attention layers' heads,
#: the vocabulary): they never reach the delta rule's Einsums, so a case need not give them.
GDN_OUTSIDE_THE_KERNEL = {"layer_types": ["linear_attention"], "d_ff": 1, "n_heads": 1, "n_kv_heads": 1,
                          "vocab_size": 1}


#: The design width of every case: the measured kernels run in fp16 or bf16.
KERNEL_DESIGN_BITS = 16


def case_cascade(case: Case, name: str, precision: str = KERNEL_PRECISION):
    """The Einsums a case's kernel runs: a part of its layer's cascade (:func:`sub_cascade`),
    each tensor at the width ``precision`` gives it (the kernels' own: :data:`KERNEL_PRECISION`)."""
    if case.model.get("family", case.family) != case.family:  # (it was overwritten by the case's, without a word)
        raise SpecError(f"case {case.id}: model.family {case.model['family']!r} contradicts the case's family "
                        f"{case.family!r}; give the family once, as the case's", source=name)
    if case.family == "attention":
        layer = _attention_layer(case, name)
    elif case.family == "gated_deltanet":
        model = parse_gdn_config({**GDN_OUTSIDE_THE_KERNEL, **case.model}, source=f"{name}, case {case.id}")
        layer = build_layer(model, phase=case.phase, seq_len=case.seq_len, batch=case.batch,
                            scan="chunked" if case.phase == "prefill" else None)
    else:
        model = (parse_config if case.family == "mamba1" else parse_mamba2_config)(
            {"n_layers": 1, **case.model, "family": case.family}, source=f"{name}, case {case.id}")
        scan = "chunked" if case.family == "mamba2" and case.phase == "prefill" else None
        layer = build_layer(model, phase=case.phase, seq_len=case.seq_len, batch=case.batch, scan=scan)
    # by default the scan kernel's Einsums: Mamba-2's SSD with its output Y (intra- plus
    # inter-chunk terms and the D skip, as mamba_chunk_scan_combined writes it), Mamba-1's
    # discretisation, scan and readout; an attention kernel's scores through its per-head output;
    # the chunked delta rule's, from the decay's cumulative sum to its output before the gated norm;
    # a decode step's state update and readout (Mamba's AD, BX, H, YS; the delta rule's AD, KB, H, YD)
    default = {"mamba2": (*SSD_REGION, "YD"), "mamba1": SSM_REGION, "attention": ATTENTION_REGION["blocked"],
               "gated_deltanet": CHUNK_REGION}
    if case.phase == "decode":
        default = {"mamba1": SSM_REGION, "mamba2": MAMBA2_STEP_REGION, "gated_deltanet": DELTA_REGION}
    einsums = case.einsums or default[case.family]
    layer = apply_policy(layer, precision, KERNEL_DESIGN_BITS)
    try:
        if case.mask_tiles is not None:  # the prediction counts the kernel's tiles (the speed of light: with_mask_tiles)
            layer = with_mask_tiles(layer, case.mask_tiles.rows, case.mask_tiles.keys)
        part = sub_cascade(layer, einsums, outputs=case.writes or (), only_outputs=case.writes is not None,
                           name=case.id)
    except SpecError as err:
        raise SpecError(f"case {case.id}: {err.message if hasattr(err, 'message') else err}", source=name) from None
    tiled = [case.mask_tiles] if case.mask_tiles is not None else []
    tiled += [k.mask_tiles for k in case.kernels or () if k.mask_tiles is not None]
    if tiled and not any(spec.mask is not None for spec in part.tensors.values()):
        raise SpecError(f"case {case.id}: mask_tiles are given, but its Einsums read no mask (a non-causal kernel "
                        "whose key block divides the sequence masks nothing): the tiles would change nothing "
                        "while the results name them", source=name)
    return part


def speed_of_light_part(case: Case, part, name: str, precision: str = KERNEL_PRECISION):
    """The Einsums a case's speed of light runs (before every mask is skipped by its own cells,
    :func:`~mambalaya.einsum.dead_work.with_mask_tiles`): the case's own part, but for an attention
    kernel whose key block does not divide the sequence, whose padded keys are work no kernel
    needs. That one runs at the largest key block dividing the sequence and not above the case's,
    the same work per key and no padding: at a key block of 2047 on 2048 keys the padded block
    doubled a non-causal speed of light. And it writes only what must leave the part (of the case's
    ``writes``, those the part writes without them): a fused kernel that stores an intermediate and
    reads it back (vLLM's fused SSD, its chunk states) does more than the least work."""
    update = {}
    if case.writes is not None:
        default = case_cascade(case.model_copy(update={"writes": None, "writes_source": ""}), name, precision)
        needed = tuple(t for t in case.writes if default.tensors[t].role == Role.OUTPUT)
        if needed != case.writes:
            update["writes"] = needed
    block = case.key_block or KEY_BLOCK
    if case.family == "attention" and case.seq_len % block:
        update.update(key_block=max(d for d in range(1, block + 1) if case.seq_len % d == 0), mask_tiles=None)
    return case_cascade(case.model_copy(update=update), name, precision) if update else part


def case_kernels(case: Case, part, name: str) -> tuple[Kernel, ...]:
    """The kernels a case's Einsums split into (default one, without a grid), checked to split
    them exactly and to name only ranks of the case's Einsums in their grids."""
    kernels = case.kernels or (Kernel(einsums=tuple(e.name for e in part.einsums)),)
    listed = [e for k in kernels for e in k.einsums]
    if sorted(listed) != sorted(e.name for e in part.einsums):
        raise SpecError(f"case {case.id}: kernels {tuple(k.einsums for k in kernels)} must split exactly the Einsums "
                        f"{', '.join(e.name for e in part.einsums)}", source=name)
    for k in kernels:
        own = [r for r in part.ranks if any(r in part.iteration_ranks(part.einsum(e)) for e in k.einsums)]
        unknown = [r for r in k.grid if r not in own]
        if unknown:
            raise SpecError(f"case {case.id}: the grid of kernel {','.join(k.einsums)} names rank(s) "
                            f"{', '.join(unknown)}, which its Einsums do not have (their ranks: "
                            f"{', '.join(own)})", source=name)
    return tuple(kernels)


def predicted_s(part, kernels: tuple[Kernel, ...], spec) -> float:
    """A case's predicted time: its kernels, each one group, on ``spec`` with its kernels section,
    each on its launch grid (:mod:`mambalaya.cost.launch`; an autotuned grid at its fastest) and
    at the share of the tensor cores' peak its MMA instruction reaches (``sync_mma``)."""
    return sum(seconds for seconds, _, _ in kernel_costs(part, kernels, spec))


def kernel_costs(part, kernels: tuple[Kernel, ...], spec) -> list[tuple[float, Launch | None, float]]:
    """Per kernel of a case: its predicted seconds (:func:`predicted_s`), the launch grid that
    gives them (the fastest an autotuner tries) and the bytes its blocks read again on it."""
    groups = tuple(FusionGroup(f"K{i + 1}", k.einsums) for i, k in enumerate(kernels))
    mapping = check_mapping(part, Mapping("kernels", groups, None, "the measured kernels' grouping"), ignore_buffer=True)
    out = []
    tiled: dict[tuple[int, int], object] = {}
    for group, kernel in zip(mapping.groups, kernels):
        mine = part
        if kernel.mask_tiles is not None:  # this kernel's own tiles (einsum.dead_work.with_mask_tiles)
            key = (kernel.mask_tiles.rows, kernel.mask_tiles.keys)
            if key not in tiled:
                tiled[key] = with_mask_tiles(part, *key)
            mine = tiled[key]
        seconds, launch = min(((launched_group_seconds(spec, mine, group, launch, kernel.sync_mma), launch)
                               for launch in kernel.launches()), key=lambda pair: pair[0])
        out.append((seconds, launch, 0.0 if launch is None else block_reread_bytes(spec, mine, group, launch)))
    return out


def validate_case(case: Case, source_text: str, name: str, spec=None, part=None,
                  precision: str = KERNEL_PRECISION) -> Result:
    """One case predicted and bounded (``part``: its :func:`case_cascade`, if already built)."""
    part = part if part is not None else case_cascade(case, name, precision)
    kernels = case_kernels(case, part, name)
    spec = spec if spec is not None else load_arch(case.arch)
    if spec.kernels is None:
        raise SpecError(f"case {case.id}: arch {case.arch!r} has no kernels section: a case is a measured GPU "
                        "kernel, predicted with the fractions of peak and the launch floor a GPU spec's kernels "
                        "section gives (its prediction would be its speed of light); use a GPU spec (gpu-h100, "
                        "gpu-a100, gpu-a100-pcie)", source=name)
    least = with_mask_tiles(speed_of_light_part(case, part, name, precision))
    sol = layer_latency(speed_of_light(spec), least, ideal(least), per_einsum=False).latency_s
    try:
        costs = kernel_costs(part, kernels, spec)
    except SpecError as err:
        raise SpecError(f"case {case.id}: {getattr(err, 'message', err)}", source=name) from None
    return Result(case, source_text, sum(seconds for seconds, _, _ in costs), sol, kernels,
                  tuple((launch, reread) for _, launch, reread in costs))


def validate(path: str | Path | None = None) -> Validation:
    """Every case of the file (default the shipped measurements), predicted and bounded, and
    the predicted / measured median of each GPU's cases with each kernel-model assumption at the
    ends of its range (each case's speed of light is computed once, at the spec's values, and its
    cascade built once: a speed of light takes no kernels field, and no shipped case's is bound by
    the L2's bandwidth, tests/test_validate.py)."""
    from mambalaya.arch import with_settings

    cases, name = load_cases(path)
    parts = {c.id: case_cascade(c, name, cases.precision) for c in cases.cases}
    fitted = [checked_fit(f, cases, name, parts) for f in cases.fits]  # (a subset the rate does not bound: refused first)
    results = tuple(validate_case(c, cases.sources[c.source], name, part=parts[c.id], precision=cases.precision)
                    for c in cases.cases)
    sensitivity = []
    for a in cases.assumptions:
        mine = [r for r in results if r.case.arch == a.arch]
        if not mine:
            raise SpecError(f"assumption {a.key} names arch {a.arch!r}, which no case uses", source=name)
        base = statistics.median(r.ratio for r in mine)
        for end, value in (("low", a.low), ("high", a.high)):
            try:  # (the message named the field, not the file that gave it)
                spec = with_settings(load_arch(a.arch), [f"{a.key}={value}"], option="assumption")
            except SpecError as err:
                raise SpecError(f"assumption {a.key} on {a.arch}: {getattr(err, 'message', err)}", source=name) from None
            ratios = [predicted_s(parts[r.case.id], r.kernels, spec) / r.measured_s for r in mine]
            sensitivity.append({"arch": a.arch, "assumption": a.key, "end": end, "value": value,
                                "median_ratio": statistics.median(ratios), "base_median_ratio": base})
    fits = tuple(_fit_result(f, value, results, parts) for f, value in zip(cases.fits, fitted))
    return Validation(name, results, tuple(sensitivity), fits, cases.precision)


def fit_scan_cycles(cases: list[Case], parts: dict, name: str) -> tuple[float, dict[str, float]]:
    """``kernels.scan_sm_cycles_per_step`` fitted on ``cases``: each case's own value (its
    measured time over its elementwise recurrences' element-steps, in SM-cycles of its GPU:
    the value at which its predicted time equals the measurement, where the scan bounds it, as
    on the Mamba-1 selective-scan cases) and their geometric mean, the fit (then the least
    squares of log predicted / measured; :class:`FitResult` shows each subset case's ratio)."""
    own = {}
    for c in cases:
        spec = load_arch(c.arch)
        steps = sum(scan_steps(parts[c.id], e) for e in parts[c.id].einsums)
        if not steps or spec.kernels is None or spec.kernels.sm_count is None:
            raise SpecError(f"case {c.id} cannot fit kernels.scan_sm_cycles_per_step: it needs an elementwise "
                            f"recurrence and a GPU spec with kernels.sm_count", source=name)
        own[c.id] = c.measured_ms / 1e3 * spec.clock_hz * spec.kernels.sm_count / steps
    return math.exp(statistics.fmean(math.log(v) for v in own.values())), own


def checked_fit(fit: Fit, cases: CaseFile, name: str, parts: dict) -> tuple[float, dict[str, float]]:
    """The value of ``fit`` on its subset (:func:`fit_scan_cycles`) and each subset case's own,
    refused (naming the case) where a subset case is not bound by its scans at that value: from
    the subset's parts alone, before the other cases run."""
    from mambalaya.arch import with_settings

    chosen = [c for c in cases.cases if c.source == fit.subset]
    value, own = fit_scan_cycles(chosen, parts, name)
    for c in chosen:  # the measured time over the element-steps is the value only where the scans bound the case
        fitted = with_settings(load_arch(c.arch), [f"{fit.key}={value!r}"], option="fit")
        kernels = case_kernels(c, parts[c.id], name)
        predicted = predicted_s(parts[c.id], kernels, fitted)
        scans = sum(scan_floor_s(fitted, parts[c.id], k.einsums) for k in kernels)
        if predicted > scans * (1 + FIT_BOUND_TOLERANCE):
            raise SpecError(f"fit {fit.key}: case {c.id} of subset {fit.subset!r} is not bound by its scans at the "
                            f"fitted {value:.3g} (predicted {predicted * 1e3:.4g} ms, its scans {scans * 1e3:.4g} ms): a "
                            "subset must be cases the scan rate sets", source=name)
    return value, own


def _fit_result(fit: Fit, fitted: tuple[float, dict[str, float]], results: tuple[Result, ...],
                parts: dict) -> FitResult:
    from mambalaya.arch import with_settings

    value, own = fitted
    specs = {a: load_arch(a) for a in fit.archs}
    without = {a: with_settings(spec, [f"{fit.key}=null"], option="fit") for a, spec in specs.items()}
    rest = [r for r in results if r.case.source != fit.subset and r.case.arch in without
            and predicted_s(parts[r.case.id], r.kernels, without[r.case.arch]) != r.predicted_s]
    shipped = {a: getattr(spec.kernels, fit.key.split(".")[1], None) for a, spec in specs.items()}
    return FitResult(fit, value, shipped, own, tuple(r for r in results if r.case.source == fit.subset), tuple(rest))


# -- collectives: the all-reduce of tensor parallelism against measured NCCL all-reduces ----------------------

SHIPPED_COLLECTIVES = "collectives.yaml"


class CollectiveCase(BaseModel):
    """One measured collective (an nccl-tests all_reduce_perf or alltoall_perf row)."""

    model_config = _STRICT

    id: str = Field(min_length=1)
    source: str = Field(description="A key of the file's sources.")
    collective: Literal["all-reduce", "all-to-all"] = "all-reduce"
    devices: int = Field(ge=2, le=65_536)
    bytes: int = Field(gt=0, description="nccl-tests' size column: the bytes each device all-reduces, or for an "
                                         "all-to-all the bytes each device sends to all devices, itself included.")
    measured_us: float = Field(gt=0, le=1e10)
    algorithm: Literal["auto", "ring"] = Field("auto", description="auto: NCCL's tuner chose; ring: NCCL_ALGO=RING.")

    @model_validator(mode="after")
    def _algorithm_of_an_all_reduce(self) -> "CollectiveCase":
        if self.collective == "all-to-all" and self.algorithm != "auto":
            raise ValueError("algorithm forces an all-reduce's algorithm; an all-to-all has one (a send and a receive "
                             "per peer)")
        return self


class CollectiveFile(BaseModel):
    model_config = _STRICT

    arch: str = Field(description="The shipped spec whose system section models the measured nodes.")
    sources: dict[str, str]
    cases: Annotated[tuple[CollectiveCase, ...], _AS_TUPLE] = Field(min_length=1)


@dataclass(frozen=True)
class CollectiveResult(Judged):
    """A measured all-reduce beside the model's (:mod:`mambalaya.cost.tensor_parallel`): the
    predicted time of the fastest algorithm (the case's, if NCCL was forced to one) and the
    speed of light, the fewest bytes any such algorithm sends over the link's bandwidth."""

    case: CollectiveCase
    arch: str
    source_text: str
    algorithm: str
    predicted_s: float
    speed_of_light_s: float

    @property
    def measured_s(self) -> float:
        return self.case.measured_us / 1e6

    def row(self) -> dict:
        c = self.case
        return {"case": c.id, "arch": self.arch, "collective": c.collective, "devices": c.devices, "bytes": c.bytes, "nccl_algorithm": c.algorithm,
                "model_algorithm": self.algorithm, "measured_us": c.measured_us, "predicted_us": self.predicted_s * 1e6,
                "ratio": self.ratio, "speed_of_light_us": self.speed_of_light_s * 1e6,
                "sol_ratio": self.speed_of_light_ratio, "sol_ok": not self.violates,
                "in_band": self.in_band, "source": self.source_text}


def load_collectives(path: str | Path | None = None) -> tuple[CollectiveFile, str]:
    """The collective cases (default the shipped ``collectives.yaml``) and their name for messages."""
    return read_case_file(path, SHIPPED_COLLECTIVES, CollectiveFile, "collective cases")


def validate_collectives(path: str | Path | None = None) -> tuple[CollectiveResult, ...]:
    """Every measured collective of the file against the model on its arch's system section: an
    all-reduce's (:mod:`mambalaya.cost.tensor_parallel`), an all-to-all's
    (:mod:`mambalaya.cost.expert_parallel`)."""
    from mambalaya.cost.expert_parallel import all_to_all_bound_s, all_to_all_s
    from mambalaya.cost.tensor_parallel import all_reduce_algorithm, all_reduce_bound_s, all_reduce_options

    cases, name = load_collectives(path)
    system = load_arch(cases.arch).system
    if system is None:
        raise SpecError(f"collective cases: arch {cases.arch!r} has no system section to model them", source=name)
    results = []
    for c in cases.cases:
        if system.max_devices is not None and c.devices > system.max_devices:  # another network joins more
            raise SpecError(f"collective cases: case {c.id}: {c.devices} devices, but {cases.arch}'s system joins at "
                            f"most {system.max_devices} (system.max_devices); more are not modelled", source=name)
        if c.collective == "all-to-all":  # each device sends (N-1)/N of its buffer to the others
            moved = c.bytes * (c.devices - 1) / c.devices
            results.append(CollectiveResult(c, cases.arch, cases.sources[c.source], "all-to-all",
                                            all_to_all_s(moved, system), all_to_all_bound_s(moved, system)))
            continue
        if c.algorithm == "ring":
            algorithm, predicted = "ring", all_reduce_options(c.bytes, c.devices, system)["ring"]
            ring_only = system.model_copy(update={"in_network_reduction": False})
            bound = all_reduce_bound_s(c.bytes, c.devices, ring_only)
        else:
            algorithm, predicted = all_reduce_algorithm(c.bytes, c.devices, system)
            bound = all_reduce_bound_s(c.bytes, c.devices, system)
        results.append(CollectiveResult(c, cases.arch, cases.sources[c.source], algorithm, predicted, bound))
    return tuple(results)


__all__ = ["Assumption", "Case", "CollectiveCase", "CollectiveResult", "Judged", "Kernel", "Result", "SHIPPED_CASES",
           "SHIPPED_COLLECTIVES", "Validation", "case_cascade", "case_kernels", "load_cases", "load_collectives",
           "predicted_s", "read_case_file", "validate", "validate_case", "validate_collectives"]
