"""`mambalaya reproduce --suite hybrid`: how much of Mambalaya's speedup survives in a hybrid
model (Mamba-2 layers interleaved with attention, each followed by an MLP), prefill and
generation, as the context grows and the KV cache with it.

For each model (default :data:`HYBRID_MODELS`: Bamba, Nemotron-H, OLMo-Hybrid and Falcon-H1), each context length L (default 2^11 .. 2^20), both
phases (prefill of L tokens; one decode step with L tokens in the KV cache) and each design
(the three H100-like designs of the paper's evaluation and the H100 roofline), it evaluates
every layer type on the design (:func:`~mambalaya.experiments.hybrid.evaluate_hybrid`: Mamba
layers under the design's own mapping, attention unfused on MARCA and Geens et al., searched
on Mambalaya) and writes, under ``results/hybrid/``:

* ``hybrid_latency.csv``: per (model, phase, L, design) the whole-model latency, each layer
  type's latency, mapping, cascade and share of the time;
* ``hybrid_speedups.csv``: Mambalaya's speedup over each other design, with the share of that
  design's time in attention;
* two figures (speedup against L; speedup against the attention share, for a model with
  attention layers) and ``report.md`` / ``report.html`` naming every input.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from mambalaya import __version__
from mambalaya.arch import load_arch
from mambalaya.errors import MambalayaError
from mambalaya.experiments.evaluate import CostedLayers, forget_cached_layers
from mambalaya.experiments.hybrid import HybridEvaluation, evaluate_hybrid
from mambalaya.experiments.sweep_workers import run_tuned, usable_cores
from mambalaya.workloads import resolve_model
from mambalaya.workloads.families.base import is_hybrid

HYBRID_DESIGNS = ("mambalaya", "marca-ideal", "geens-ideal", "gpu-h100")
#: The hybrid presets the suite evaluates by default, one per family.
HYBRID_MODELS = ("bamba-9b", "nemotron-h-8b", "olmo-hybrid-7b", "falcon-h1-7b", "zamba2-2.7b", "jamba-v0.1",
                 "granite-4.0-h-tiny")
STUDIED = "mambalaya"


@dataclass
class HybridSuiteConfig:
    models: tuple[str, ...] = HYBRID_MODELS
    batch: int = 64
    seq_lens: tuple[int, ...] = tuple(2**k for k in range(11, 21))
    phases: tuple[str, ...] = ("prefill", "decode")
    designs: tuple[str, ...] = HYBRID_DESIGNS
    out: Path = Path("results") / "hybrid"
    figures: bool = True
    #: The precision policy of every design (None: each design's own, its spec's ``precision``).
    precision: str | None = None
    #: Worker processes (None: one per core; 1: this process). Speed only: the tables are the same.
    workers: int | None = None
    #: The attention layers' softmax form (``three-pass``, ``online`` or ``blocked``).
    softmax: str = "three-pass"


@dataclass
class HybridSuiteResult:
    config: HybridSuiteConfig
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    report: Path | None = None
    seconds: float = 0.0


def suite_steps(config: HybridSuiteConfig) -> int:
    """Progress steps of :func:`run_hybrid_suite`: one per evaluation, then figures and report."""
    return len(config.models) * len(config.phases) * len(config.seq_lens) * len(config.designs) + 2


def _row(model: str, ev: HybridEvaluation) -> dict[str, Any]:
    return {"model": model, "phase": ev.phase, "seq_len": ev.seq_len, "batch": ev.batch, "arch": ev.arch.name,
            "precision": next(iter(ev.layers.values())).precision.name, **ev.totals(),
            # NaN (reported '-') where attention sits inside another layer type (Falcon-H1, Zamba2)
            "attention_share": float("nan") if ev.attention_share is None else ev.attention_share,
            # the suite evaluates a model over one device's DRAM as on one device of enough capacity:
            # how much it needs and on how many such devices it would fit (1: it fits)
            "dram_need_bytes": ev.dram.used_bytes if ev.dram else float("nan"),
            "activation_peak_bytes": ev.dram.activations.bytes if ev.dram and ev.dram.activations else float("nan"),
            "devices_needed": ev.dram.devices_needed if ev.dram and ev.dram.devices_needed else 1,
            # a layer type whose scan ran in the only form that maps, and why the other did not (the
            # report says so beside its Method's "the faster form", with that reason: it once gave one
            # reason, a padded length, for every model, Jamba's Mamba-1 layers included)
            "only_scan_form": " ".join(t for t, e in ev.layers.items() if e.other_scan_refused),
            "scan_form_refused": "; ".join(dict.fromkeys(e.other_scan_refused for e in ev.layers.values()
                                                         if e.other_scan_refused))}


def speedup_rows(latency: pd.DataFrame, studied: str = STUDIED) -> pd.DataFrame:
    """Per (model, phase, L, other design): ``studied``'s whole-model speedup over it and the
    share of the other design's time in attention layers."""
    keys = ["model", "phase", "seq_len"]
    own = latency[latency["arch"] == studied].set_index(keys)
    rows = []
    for _, r in latency[latency["arch"] != studied].iterrows():
        mine = own.loc[tuple(r[k] for k in keys)]
        rows.append({**{k: r[k] for k in keys}, "baseline": r["arch"],
                     "speedup": r["model_latency_s"] / mine["model_latency_s"],
                     "baseline_attention_share": r.get("attention_share", 0.0),
                     "studied_attention_share": mine.get("attention_share", 0.0)})
    return pd.DataFrame(rows)


def model_phase_rows(config: HybridSuiteConfig, model: str, phase: str,
                     progress: Callable[[str, int], None] | None = None,
                     seq_lens: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """The suite's rows of one model in one phase: every context length (``seq_lens``, default
    the config's) on every design, in order. A layer that does not change with L (a decode
    step's Mamba, MLP or MoE layer) is searched once and its mapping and cost reused
    (:class:`~mambalaya.experiments.evaluate.CostedLayers`); the layers built for a length, with
    their memos, are dropped once every design has been costed on them
    (:func:`~mambalaya.experiments.evaluate.forget_cached_layers`): the next length's layers
    share none of them, and kept they held gigabytes. Speed and memory only: every number is
    the same."""
    tick = progress or (lambda _msg, _steps: None)
    specs = {d: load_arch(d) for d in config.designs}
    cfg = resolve_model(model)
    reuse = CostedLayers()
    rows = []
    for L in config.seq_lens if seq_lens is None else seq_lens:
        for d in config.designs:
            tick(f"{model} {phase} L={L} {d}", 1)
            rows.append(_row(model, evaluate_hybrid(specs[d], model, cfg, phase=phase, seq_len=L, batch=config.batch,
                                                    precision=config.precision, softmax=config.softmax,
                                                    over_capacity="report", reuse=reuse)))
        forget_cached_layers()
    return rows


#: A task of the suite: a model, a phase and the context lengths it evaluates in one process.
SuiteTask = tuple[str, str, tuple[int, ...]]


def suite_tasks(config: HybridSuiteConfig) -> list[SuiteTask]:
    """The suite's tasks, in the order worker processes take them: each model's decode phase as
    one task (its lengths share the decode layers that do not change with L,
    :class:`~mambalaya.experiments.evaluate.CostedLayers`), first, as the longest tasks that
    cannot be split; then each model's prefill one length per task (lengths share no layer),
    so that two workers end within about one length's evaluation of each other. Speed only:
    the rows are put back in the grid's order."""
    decode = [(m, p, config.seq_lens) for m in config.models for p in config.phases if p == "decode"]
    rest = [(m, p, (L,)) for m in config.models for p in config.phases if p != "decode" for L in config.seq_lens]
    return decode + rest


def suite_workers(config: HybridSuiteConfig) -> int:
    """Worker processes the suite runs on: ``config.workers``, else one per core this process
    may use, never more than its tasks (:func:`suite_tasks`)."""
    tasks = len(suite_tasks(config))
    if config.workers is not None:
        return max(1, min(config.workers, tasks))
    return max(1, min(usable_cores(), tasks))


def _suite_rows(config: HybridSuiteConfig, tick: Callable[[str, int], None]) -> list[dict[str, Any]]:
    """Every row of the grid, in the order (model, phase, L, design), computed in this process or
    in :func:`suite_workers` worker processes, one :func:`suite_tasks` task each; a task's
    progress is counted when it ends."""
    workers = suite_workers(config)
    if workers == 1:
        return [row for model in config.models for phase in config.phases
                for row in model_phase_rows(config, model, phase, tick)]
    done: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    # spawned, not forked: the caller may run threads (a progress bar's); each task runs tuned as
    # a sweep's (run_tuned: allocator and collector tuned, what it leaves frozen; speed only)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_tuned, model_phase_rows, config, model, phase, None, lengths): (model, phase, lengths)
                   for model, phase, lengths in suite_tasks(config)}
        for future in as_completed(futures):
            model, phase, lengths = futures[future]
            rows = future.result()
            per_length = len(config.designs)
            for k, L in enumerate(lengths):
                done[(model, phase, L)] = rows[k * per_length:(k + 1) * per_length]
            tick(f"{model} {phase}: {len(lengths)} length{'s' if len(lengths) > 1 else ''} on "
                 f"{len(config.designs)} designs", len(lengths) * per_length)
    return [row for model in config.models for phase in config.phases for L in config.seq_lens
            for row in done[(model, phase, L)]]


def run_hybrid_suite(config: HybridSuiteConfig,
                     progress: Callable[[str, int], None] | None = None) -> HybridSuiteResult:
    """Evaluate the grid, write the tables, figures and report. ``progress(message, steps)`` is
    told of each step done (:func:`suite_steps` in all)."""
    t0 = time.perf_counter()
    tick = progress or (lambda _msg, _steps: None)
    result = HybridSuiteResult(config)
    config.out.mkdir(parents=True, exist_ok=True)
    specs = {d: load_arch(d) for d in config.designs}
    if STUDIED not in specs:
        raise MambalayaError(f"the hybrid suite studies {STUDIED!r}: include it in the designs")
    for model in config.models:
        if not is_hybrid(resolve_model(model)):
            raise MambalayaError(f"model {model!r} is not a hybrid model (family {resolve_model(model).family}); the "
                                 f"hybrid suite takes hybrid presets ({', '.join(HYBRID_MODELS)}) or their config files")
    latency = pd.DataFrame(_suite_rows(config, tick))
    speedups = speedup_rows(latency)
    result.tables = {"hybrid_latency": latency, "hybrid_speedups": speedups}
    for name, table in result.tables.items():
        table.to_csv(config.out / f"{name}.csv", index=False)
    tick("figures", 1)
    if config.figures:
        result.figures = _write_figures(config, speedups)
    result.seconds = time.perf_counter() - t0
    tick("report", 1)
    result.report = _write_report(config, result, specs)
    from mambalaya.report.html import write_html_report

    write_html_report(result.report, result.figures)
    return result


def _write_figures(config: HybridSuiteConfig, speedups: pd.DataFrame) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from mambalaya.report.figures.hybrid import hybrid_speedup_vs_attention_share, hybrid_speedup_vs_length
    from mambalaya.report.figures.save import save_figure

    paths: list[Path] = []
    for model in config.models:
        table = speedups[speedups["model"] == model]
        for name, draw in (("speedup_vs_length", hybrid_speedup_vs_length),
                           ("speedup_vs_attention_share", hybrid_speedup_vs_attention_share)):
            if name.endswith("attention_share") and table["baseline_attention_share"].isna().all():
                continue  # no separate attention layer: no share to plot against
            fig = draw(table, model=model)
            paths += save_figure(fig, config.out / "figures" / f"{model}_{name}")
            plt.close(fig)
    return paths


def _design_text(name: str, spec: Any) -> str:
    c, m = spec.compute, spec.memory
    return (f"`{name}`: {spec.clock_hz / 1e9:g} GHz, {c.array_rows}x{c.array_cols} array, "
            f"{m.offchip_bandwidth_bytes_per_s / 1e12:g} TB/s off-chip, {m.onchip_buffer_bytes:,} B buffer, "
            f"own mapping {spec.mappings.default}")


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _share(x: Any) -> str:
    """A share of the time; '-' where the model has no separate attention layer (Falcon-H1's
    parallel layer holds its attention beside the Mamba mixer, Zamba2's hybrid layer before it)."""
    return "-" if pd.isna(x) else f"{x:.1%}"


def _energy_cell(row: Any, column: str, scale: float) -> str:
    """A row's energy figure, scaled, marked where the design's power budget throttles it; "-"
    for a design without an energy section."""
    value = row.get(column)
    if value is None or pd.isna(value):
        return "-"
    return _fmt(value * scale) + (" (over budget)" if column == "average_power_w" and row.get("over_power_budget") else "")


def _from_lengths(rows: pd.DataFrame) -> str:
    """Per model and phase of ``rows``, the least length among them: "bamba-9b prefill from L = 8,192"."""
    first = rows.groupby(["model", "phase"], sort=False)["seq_len"].min()
    return "; ".join(f"{model} {phase} from L = {L:,}" for (model, phase), L in first.items())


def _activation_lines(latency: pd.DataFrame, specs: dict) -> list[str]:
    """The points that fit one device but whose layer's activations, as mapped, exceed what the
    memory leaves beside the model (as ``evaluate`` and the paper suite's report say)."""
    fits = latency[latency["devices_needed"] <= 1]
    capacity = fits["arch"].map(lambda a: specs[a].memory.offchip_capacity_bytes or float("inf"))
    over = fits[fits["dram_need_bytes"] + fits["activation_peak_bytes"] > capacity]
    if over.empty:
        return []
    where = _from_lengths(over)
    return [f"**Activations.** {len(over)} of the {len(fits)} evaluations that fit one device have a layer's "
            f"activations, as mapped, beyond what its memory leaves beside the model ({where}; "
            "`activation_peak_bytes` in the CSV, `mambalaya evaluate` says by how much): their numbers assume the "
            "activations stream through DRAM, as a design running the layer in pieces would, without re-reading the "
            "weights per piece (not modelled).", ""]


def _scan_form_lines(latency: pd.DataFrame) -> list[str]:
    """The points whose Mamba layers ran the only scan form that maps, not the faster one."""
    only = latency[latency["only_scan_form"].fillna("") != ""]
    if only.empty:
        return []
    lines = []
    for reason, rows in only.groupby(only["scan_form_refused"].fillna(""), sort=False):
        where = "; ".join(f"{m} {p} L = {L:,}" for (m, p, L) in
                          dict.fromkeys(zip(rows["model"], rows["phase"], rows["seq_len"])))
        lines += [f"**Scan forms.** At {where} every design runs its Mamba layers' only scan form that maps, not the "
                  f"faster of two ({reason or 'the other form was refused'})."
                  " The Method's \"the faster form\" does not apply to these rows.", ""]
    return lines


def _capacity_lines(latency: pd.DataFrame) -> list[str]:
    """The report's paragraph on the points whose weights, states and KV cache exceed one
    device's off-chip memory (``devices_needed`` > 1): how many, and from which length on."""
    over = latency[latency["devices_needed"] > 1]
    if over.empty:
        return ["**Memory.** Every point fits its design's off-chip memory (weights, recurrent and conv states, KV "
                "cache at the batch and length).", ""]
    where = _from_lengths(over)
    return [f"**Memory.** {len(over)} of {len(latency)} evaluations need more off-chip memory than one device has "
            f"(weights, recurrent and conv states, KV cache at batch and L): {where}. Their latencies (marked † with "
            "the devices whose joined memory would hold the model) are those of one device with enough memory. "
            "`mambalaya evaluate` refuses such a point on one device, naming the devices a pipeline needs; "
            "`--set memory.offchip_capacity_bytes=...` gives the one device of enough memory these rows are, and "
            "`--devices N` runs it pipeline parallel on a design whose spec joins its devices (`system`, up to its "
            "`max_devices`).", ""]


def _write_report(config: HybridSuiteConfig, result: HybridSuiteResult, specs: dict) -> Path:
    latency, speedups = result.tables["hybrid_latency"], result.tables["hybrid_speedups"]
    lines = [
        "# Hybrid models: how much of Mambalaya's speedup survives",
        "",
        f"mambalaya {__version__}; `mambalaya reproduce --suite hybrid`; {result.seconds:.1f} s. Batch {config.batch}; "
        f"context lengths {', '.join(str(L) for L in config.seq_lens)}; phases {', '.join(config.phases)} (a decode "
        "step's L is the context already in the KV cache). Tensor widths: "
        + (f"the `{config.precision}` precision policy on every design."
           if config.precision else "each design's own precision policy (its spec's `precision`: "
           + ", ".join(f"{d} `{specs[d].precision}`" for d in config.designs) + "), under the `bamba` "
           "family's entries, except OLMo-Hybrid's delta-rule layers (`gated_deltanet`'s). A tensor the family's "
           "entries do not name (a router's, for instance) takes the design width."),
        "",
        "**Method.** Every layer type of the model is one cascade (its mixer block, then its MLP block) evaluated on "
        "each design; the whole model's latency is the sum over layers (embedding and LM head excluded, as "
        "`mambalaya reproduce` counts a Mamba model). Mamba layers run the design's own mapping (MARCA unfused, Geens et al. fusing the SSM "
        "region, Mambalaya the optimal search) and, in prefill, whichever scan form (chunked SSD or recurrent) is "
        "faster on the design. **Attention layers run unfused on MARCA and Geens et al.**, whose papers describe no "
        "attention fusion, **and with the best fusion our engine finds on Mambalaya** (the same optimal search as for "
        "Mamba layers). "
        + ("Attention runs the three-pass softmax form per (query, key) pair; the pairs its causal mask hides are "
           "skipped work, in every form (`einsum.dead_work`; the blocked form, `--softmax blocked`, skips whole blocks "
           "of keys as FlashAttention does)." if config.softmax == "three-pass" else
           f"Attention runs the `{config.softmax}` softmax form (`--softmax {config.softmax}`)"
           + (": FlashAttention's key blocks, a causal prefill skipping the blocks its mask hides." if
              config.softmax == "blocked" else ": one pass, a recurrence per key.")),
        "",
        "Designs (shipped specs `mambalaya/arch/specs/<name>.yaml`, `mambalaya arch show <name>` prints every field): "
        + "; ".join(_design_text(d, specs[d]) for d in config.designs) + ".",
        "",
        *_capacity_lines(latency),
        *_activation_lines(latency, specs),
        *_scan_form_lines(latency),
        "An attention share is '-' where attention sits inside another layer type and has no time of its own "
        "(Falcon-H1's parallel layers, Zamba2's hybrid blocks).",
        "",
    ]
    for model in config.models:
        cfg = resolve_model(model)
        counts = ", ".join(f"{n} {t}" for t, n in cfg.layer_counts().items())  # type: ignore[union-attr]
        lines += [f"## {model}", "",
                  f"{cfg.n_layers} layers ({counts}), hidden {cfg.d_model}, {cfg.model_parameters():,} parameters.", ""]
        s = speedups[speedups["model"] == model]
        lines += ["| phase | L | " + " | ".join(f"vs {b}" for b in dict.fromkeys(s["baseline"]))
                  + " | attention share on mambalaya |",
                  "|---|---|" + "---|" * (len(set(s["baseline"])) + 1)]
        for (phase, L), g in s.groupby(["phase", "seq_len"], sort=False):
            cells = [f"{_fmt(v)}x" for v in g["speedup"]]
            lines.append(f"| {phase} | {L} | " + " | ".join(cells) + f" | {_share(g['studied_attention_share'].iloc[0])} |")
        lines.append("")
        m = latency[latency["model"] == model]
        types = list(cfg.layer_counts())  # type: ignore[union-attr]
        lines += ["Whole-model latency (s), energy per token and average power (all layer types together) per design, with the attention layers' share of the time and the mappings "
                  f"({' / '.join(types)}):", "",
                  "| phase | L | design | latency (s) | energy per token (uJ) | average power (W) | attention share "
                  "| mappings | cascades |", "|---|---|---|---|---|---|---|---|---|"]
        for _, r in m.iterrows():
            over = f" † {int(r['devices_needed']):,} devices" if r.get("devices_needed", 1) > 1 else ""
            lines.append(f"| {r['phase']} | {r['seq_len']} | {r['arch']} | {_fmt(r['model_latency_s'])}{over} | "
                         f"{_energy_cell(r, 'energy_per_token_j', 1e6)} | {_energy_cell(r, 'average_power_w', 1.0)} | "
                         f"{_share(r.get('attention_share', 0.0))} | "
                         + " / ".join(str(r.get(f"{t}_mapping", "-")) for t in types) + " | "
                         + ", ".join(str(r.get(f"{t}_cascade", "-")) for t in types) + " |")
        lines.append("")
        for fig in (p for p in result.figures if p.suffix == ".png" and p.name.startswith(model)):
            lines += [f"![{fig.stem}](figures/{fig.name}) ([SVG](figures/{fig.with_suffix('.svg').name}))", ""]
    lines += ["Tables: `hybrid_latency.csv` (every evaluation, each layer type's latency, share, mapping and cascade) "
              "and `hybrid_speedups.csv`. Each number comes from `mambalaya evaluate --model MODEL --arch DESIGN "
              "--phase PHASE -L L --batch B`, which prints the per-Einsum tables behind it.", ""]
    path = config.out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


__all__ = ["HYBRID_DESIGNS", "HYBRID_MODELS", "HybridSuiteConfig", "HybridSuiteResult", "model_phase_rows",
           "run_hybrid_suite", "speedup_rows", "suite_steps", "suite_tasks", "suite_workers", "SuiteTask"]
