"""`mambalaya reproduce`: the paper's evaluation in one command (DESIGN.md §6).

The defaults are the paper's setup as reported: the 48-layer Mamba-1 model (we take
mamba-1.4b, the largest published Mamba-1 with 48 layers; the paper's text does not name the
size), batch 64, prefill at L = 2^11 .. 2^20 and generation (I = 1), on three designs with the
same H100-like budget: ``mambalaya`` (greedy stitching), ``marca-ideal`` (unfused, the
algorithmic minimum of traffic) and ``geens-ideal`` (RI fusion of the SSM region). Every
design's mapping is built for its own buffer and minimises latency on it.

It writes CSV tables, PNG+SVG figures and ``report.md`` (which embeds them, names every input,
and sets our ratios beside the published ones with the gap explained) to ``results/``.
"""

from __future__ import annotations

import json
import math
import re
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from mambalaya.arch import arch_rows, load_arch
from mambalaya.einsum.stats import cascade_stats
from mambalaya.errors import MambalayaError
from mambalaya.experiments.validate import validate
from mambalaya.experiments.claims import FAR_GAP, GEENS_AREA_SETUP, GEENS_FUSION_SETUP, HEADLINES, PUBLISHED, gap, headline_ratios
from mambalaya.experiments.equal_area import geens_equal_area_rows
from mambalaya.experiments.evaluate import Evaluation, evaluate, evaluate_best_scan, over_budget, scan_form
from mambalaya.experiments.report import write_report
from mambalaya.experiments.report_figures import tornado_figures, write_figures
from mambalaya.fusion.edges import classify_edges, edge_rows
from mambalaya.fusion.mapping_file import mapping_to_dict
from mambalaya.cost.area import area_rows, total_area_mm2
from mambalaya.cost.latency import latency_rows
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads import PRESETS

DESIGNS = ("mambalaya", "marca-ideal", "geens-ideal")
BASELINES = ("marca-ideal", "geens-ideal")
#: Reported beside the designs: (label, design, mapping). The paper's greedy stitching pass on
#: the mambalaya budget, next to the stitching the search finds (mambalaya's own mapping).
EXTRA_DESIGNS = (("mambalaya-greedy", "mambalaya", "stitched"),)

@dataclass
class ReproduceConfig:
    models: tuple[str, ...] = ("mamba-1.4b", "mamba2-2.7b")
    batch: int = 64
    seq_lens: tuple[int, ...] = tuple(2**k for k in range(11, 21))
    generated_tokens: int = 1024  # end-to-end request: prefill L, then generate this many tokens
    detail_seq_len: int = 2048  # per-Einsum tables, roofline and timelines at this L
    out: Path = Path("results")
    figures: bool = True
    #: The precision policy of the main result (None: each design's own, its spec's
    #: ``precision``; reference-kernels for the shipped H100-like designs).
    precision: str | None = None
    #: The headline ratios are also computed with every design under this precision policy
    #: (None: not), beside the main result.
    compare_precision: str | None = "uniform"
    #: The sensitivity study (None: skipped): a shipped spec name or a YAML file.
    sensitivity: str | None = "h100-like"
    #: Prefill lengths of the sensitivity study's headline ratios: a subset of ``seq_lens``
    #: spanning them, so that each of its settings costs a fraction of the full grid.
    sensitivity_seq_lens: tuple[int, ...] = (2048, 32768, 1048576)
    #: Background processes that evaluate the sensitivity study's settings while this process
    #: runs the main grid and draws the figures (0: everything in this process). One keeps the
    #: two cores of the reference machine busy without contention.
    workers: int = 1

    @property
    def study_seq_lens(self) -> tuple[int, ...]:
        """The lengths the sensitivity study runs: ``sensitivity_seq_lens`` that the grid has (the
        grid's first where it has none), as its tables and the report name them."""
        return tuple(L for L in self.sensitivity_seq_lens if L in self.seq_lens) or self.seq_lens[:1]


@dataclass
class ReproduceResult:
    config: ReproduceConfig
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    report: Path | None = None
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


def _evaluate(spec, model: str, cfg, *, phase: str, seq_len: int, batch: int, mapping: str | None = None,
              precision: str | None = None) -> Evaluation:
    return evaluate_best_scan(spec, model, cfg, phase=phase, seq_len=seq_len, batch=batch, mapping=mapping,
                              precision=precision)


def _eval_row(ev: Evaluation, phase_label: str, label: str) -> dict[str, Any]:
    t = ev.totals()
    return {
        "precision": ev.precision.name,
        "model": ev.model,
        "phase": phase_label,
        "seq_len": ev.seq_len if ev.phase == "prefill" else 1,
        "batch": ev.batch,
        "arch": label,
        "scan": scan_form(ev.cascade),
        "mapping": ev.mapping.name,
        "groups": t["groups"],
        "layer_latency_s": t["latency_s"],
        "model_latency_s": t["model_latency_s"],
        "offchip_bytes": t["offchip_bytes"],
        "compute_util": t["compute_util"],
        "mem_util": t["mem_util"],
        "tokens_per_s": t["tokens_per_s"],
        "spatial_util": t["spatial_util"],
        "bound": t["bound"],
        "layer_energy_j": t.get("layer_energy_j", float("nan")),
        # the mapped layer's off-chip activations at their peak, and whether they fit beside the model
        # (the numbers take them to stream through DRAM whole: mambalaya.cost.capacity)
        "activation_peak_bytes": t.get("activation_peak_bytes", float("nan")),
        "activations_fit_dram": t.get("activations_fit_dram"),
    }


def _timeline(ev: Evaluation, label: str) -> list[dict[str, Any]]:
    """Each Einsum over its group's interval; a fused group's utilisation is split among its
    Einsums in proportion to their own compute and memory demands (the shares add up to the
    group's utilisation)."""
    rows, start = [], 0.0
    groups = {g.group: g for g in ev.result.groups}
    for g in ev.mapping.groups:
        gl = groups[g.name]
        members = [r for r in ev.result.einsums if r.fusion_group == g.name]
        comp_total = sum(r.comp_latency for r in members)
        mem_total = sum(r.mem_latency for r in members)
        # the group's spatial utilisation: its Einsums' own, weighted by their compute time
        spatial = (sum(r.spatial_util * r.comp_latency for r in members) / comp_total if comp_total
                   else sum(r.spatial_util for r in members) / len(members))
        for r in members:
            c_share = r.comp_latency / comp_total if comp_total else 1.0 / len(members)
            m_share = r.mem_latency / mem_total if mem_total else 1.0 / len(members)
            rows.append({"design": label, "einsum": r.einsum, "kind": r.kind, "group": g.name,
                         "start_s": start, "end_s": start + gl.latency,
                         "compute_util": r.compute_util * c_share, "mem_util": r.mem_util * m_share,
                         "spatial_util": spatial})
        start += gl.latency
    return rows


def _roofline_points(ev: Evaluation, series: str) -> list[dict[str, Any]]:
    """Each Einsum's intensity (ops per off-chip byte) and achieved ops/s under ``ev``'s mapping.

    An Einsum that moves no bytes of its own inside a fused group takes its group's intensity.
    """
    stats = {s.name: s for s in cascade_stats(ev.cascade).einsums}
    group_ops: dict[str, float] = {}
    for r in ev.result.einsums:
        group_ops[r.fusion_group] = group_ops.get(r.fusion_group, 0.0) + stats[r.einsum].ops_total
    group_bytes = {g.group: g.traffic.total_bytes for g in ev.result.groups}
    points = []
    for r in ev.result.einsums:
        ops = stats[r.einsum].ops_total
        if ops == 0 or r.final_latency == 0:
            continue
        own = r.total_traffic
        intensity = ops / own if own else (group_ops[r.fusion_group] / group_bytes[r.fusion_group] if group_bytes[r.fusion_group] else math.inf)
        if not math.isfinite(intensity):
            continue
        points.append({"einsum": r.einsum, "kind": r.kind, "series": series,
                       "intensity_ops_per_byte": intensity, "performance_ops_per_s": ops / r.final_latency})
    return points


def run_reproduce(config: ReproduceConfig, progress: Callable[[str], None] | None = None) -> ReproduceResult:
    """Compute every table (and, if asked, every figure and the report)."""
    t0 = time.perf_counter()
    tick = progress or (lambda _msg: None)
    result = ReproduceResult(config)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    specs = {d: load_arch(d) for d in DESIGNS}

    background = _Background()
    if config.sensitivity and config.workers > 0:
        from mambalaya.experiments.sensitivity import setting_task, load_sensitivity_spec, prefetch_settings

        pool = background.pool = ProcessPoolExecutor(max_workers=config.workers,
                                                     mp_context=multiprocessing.get_context("spawn"))
        # first the comparison pass (every design at every L under the other policy), then the
        # sensitivity settings: its precision setting then finds that pass's tables there
        comparison = _comparison_run(config, specs)
        if comparison is not None:
            background.compared = pool.submit(setting_task, list(DESIGNS), comparison, None, None)
        background.prefetched = prefetch_settings(load_sensitivity_spec(config.sensitivity), _sensitivity_run(config), pool)
    try:
        _run(config, result, specs, tick, background)
    finally:
        if background.pool is not None:  # its process ends while the report is written
            background.pool.shutdown(wait=False, cancel_futures=True)
    result.seconds = time.perf_counter() - t0
    tick("report")
    result.report = write_report(result, result.details, specs)
    from mambalaya.report.html import write_html_report

    write_html_report(result.report, result.figures)
    return result


@dataclass
class _Background:
    """What a worker process computes while this one runs the main grid: the comparison pass
    (a future of its rows) and the sensitivity settings (futures by setting)."""

    pool: Any = None
    compared: Any = None
    prefetched: dict = field(default_factory=dict)


def _comparison_run(config: ReproduceConfig, specs: dict):
    """Every design at every L under the comparison policy, as a sensitivity run (None: no
    comparison, or the policy is the main result's)."""
    from mambalaya.experiments.sensitivity import RunSetup

    main_policy = config.precision or _main_policy(specs)
    if not config.compare_precision or config.compare_precision == main_policy:
        return None
    return RunSetup(models=config.models, configs={m: PRESETS[m] for m in config.models}, seq_lens=config.seq_lens,
                    batch=config.batch, generated_tokens=config.generated_tokens, precision=config.compare_precision)


def _run(config: ReproduceConfig, result: ReproduceResult, specs: dict, tick, background: _Background) -> None:
    out = config.out
    latency_rows_all: list[dict[str, Any]] = []
    details: dict[tuple[str, str, str], Evaluation] = {}
    runs = [(d, d, None) for d in DESIGNS] + list(EXTRA_DESIGNS)
    for model in config.models:
        cfg = PRESETS[model]
        for L in config.seq_lens:
            for label, d, mapping in runs:
                tick(f"{model} prefill L={L} on {label}")
                ev = _evaluate(specs[d], model, cfg, phase="prefill", seq_len=L, batch=config.batch, mapping=mapping,
                               precision=config.precision)
                latency_rows_all.append(_eval_row(ev, "prefill", label))
                if L == config.detail_seq_len:
                    details[(model, "prefill", label)] = ev
        for label, d, mapping in runs:
            tick(f"{model} generation on {label}")
            ev = _evaluate(specs[d], model, cfg, phase="decode", seq_len=1, batch=config.batch, mapping=mapping,
                           precision=config.precision)
            latency_rows_all.append(_eval_row(ev, "generation", label))
            details[(model, "generation", label)] = ev
        for phase in ("prefill", "generation"):
            tick(f"{model} {phase}: ideal fusion")
            ev = _evaluate(specs["mambalaya"], model, cfg, phase="prefill" if phase == "prefill" else "decode",
                           seq_len=config.detail_seq_len if phase == "prefill" else 1, batch=config.batch,
                           mapping="ideal", precision=config.precision)
            details[(model, phase, "mambalaya/ideal")] = ev
    lat = pd.DataFrame(latency_rows_all)
    result.tables["latency"] = lat
    main_policy = config.precision or _main_policy(specs)

    # speedups of mambalaya over each baseline, per phase and L
    result.tables["speedups"] = _speedups(lat)
    result.tables["end_to_end"] = _end_to_end(lat, config)

    # the headline ratios under the main policy, and under the comparison policy
    alt = None
    comparison = _comparison_run(config, specs)
    if comparison is not None:
        from mambalaya.experiments.sensitivity import evaluate_setting

        tick(f"every design at every L, precision {config.compare_precision}")
        alt = pd.DataFrame(background.compared.result() if background.compared is not None
                           else evaluate_setting({d: specs[d] for d in DESIGNS}, comparison, None, None))
        failed = alt[alt.error != ""]
        if not failed.empty:
            raise MambalayaError(f"under precision {config.compare_precision}: {failed.error.iloc[0]}")
        result.tables[f"latency_{_policy_label(config.compare_precision)}"] = alt
    result.tables["headlines"] = _headline_table(config, lat, alt, main_policy)
    result.tables["precision"] = _precision_rows(details, specs)

    # per-Einsum tables, traffic by tensor, timelines, roofline, fusion classes (detail L)
    einsum_frames, traffic_rows, timeline_rows, roof_rows = [], [], [], []
    for (model, phase, label), ev in details.items():
        df = pd.DataFrame(latency_rows(ev.result))
        df.insert(0, "design", label)
        df.insert(0, "phase", phase)
        df.insert(0, "model", model)
        einsum_frames.append(df)
        tr = mapping_traffic(ev.cascade, ev.mapping)
        for t, (rb, wb) in tr.by_tensor.items():
            traffic_rows.append({"model": model, "phase": phase, "design": label, "mapping": ev.mapping.name, "tensor": t,
                                 "role": ev.cascade.tensors[t].role.value, "read_bytes": rb, "write_bytes": wb})
        if label in ("marca-ideal", "mambalaya"):
            timeline_rows += [dict(r, model=model, phase=phase) for r in _timeline(ev, label)]
        if phase == "prefill" and label in ("marca-ideal", "mambalaya/ideal"):
            series = "unfused" if label == "marca-ideal" else "ideal fusion"
            roof_rows += [dict(p, model=model) for p in _roofline_points(ev, series)]
    energy_details = dict(details)
    for (model, phase, label), ev in details.items():  # mambalaya's mapping searched for energy instead
        if label == "mambalaya" and ev.arch.energy is not None:
            tick(f"{model} {phase}: mambalaya, mapping searched for energy")
            energy_details[(model, phase, "mambalaya (energy objective)")] = evaluate_best_scan(
                ev.arch, model, ev.config, phase=ev.phase, seq_len=ev.seq_len, batch=ev.batch,
                precision=config.precision, objective="energy")  # a Mamba-2 prefill's form of least energy
    result.tables["energy"] = _energy_rows(energy_details)
    result.tables["residency"] = _residency_rows(details)
    result.tables["einsums"] = pd.concat(einsum_frames, ignore_index=True)
    result.tables["traffic_by_tensor"] = pd.DataFrame(traffic_rows)
    result.tables["timeline"] = pd.DataFrame(timeline_rows)
    result.tables["roofline"] = pd.DataFrame(roof_rows)
    result.tables["fusion_classes"] = pd.concat(
        [pd.DataFrame(edge_rows(classify_edges(details[(m, "prefill", "mambalaya")].cascade))).assign(model=m)
         for m in config.models],
        ignore_index=True,
    )
    result.tables["areas"] = pd.DataFrame(
        [dict(r, design=d) for d in (*DESIGNS, "marca-original") for spec in [specs.get(d) or load_arch(d)]
         if spec.area is not None for r in area_rows(spec)])
    tick("Geens et al.'s claim on its own workload")
    result.tables["geens_claims"] = _geens_rows()
    tick("MARCA on 32 cores against one array")
    result.tables["multicore"] = multicore_rows()
    tick("Geens et al.'s equal-area comparison")
    result.tables["geens_equal_area"] = geens_equal_area_rows(seq_lens=GEENS_AREA_SETUP.seq_lens)
    result.tables["scan_forms"] = _scan_form_rows(config)
    result.tables["validation"] = pd.DataFrame(validate().rows())  # published GPU kernels: about 2 s
    # every spec a section prints from: the compared designs, Geens et al.'s and the multi-core
    # sections' MARCA, and the GPUs the validation runs (once only the compared designs were here)
    others = ("marca-original", "marca-multicore", *dict.fromkeys(result.tables["validation"]["arch"]))
    result.tables["architectures"] = pd.DataFrame(
        [dict(r, design=d) for d in dict.fromkeys((*DESIGNS, *others))
         for r in arch_rows(specs.get(d) or load_arch(d))])
    result.details = details
    if config.figures:
        tick("figures")
        result.figures = write_figures(result, details, specs)
    if config.sensitivity:  # its settings ran in the background meanwhile (config.workers)
        sens = _sensitivity(config, result.tables["latency"], tick, background.prefetched, background.pool)
        result.tables["sensitivity"] = pd.DataFrame(sens.rows)
        result.tables["what_would_it_take"] = pd.DataFrame(sens.take, columns=TAKE_COLUMNS)
        if config.figures:
            result.figures += tornado_figures(result, config.out / "figures", background.pool)

    for name, df in result.tables.items():
        df.to_csv(out / f"{name}.csv", index=False)
    # every evaluation's mapping, the energy-objective rows' too (energy.csv names them: they were missing)
    mappings = {f"{m}/{p}/{d}": mapping_to_dict(ev.mapping) for (m, p, d), ev in {**details, **energy_details}.items()}
    (out / "mappings.json").write_text(json.dumps(mappings, indent=1), encoding="utf-8")


ENERGY_COLUMNS = ["model", "phase", "design", "mapping", "scan", "layer_latency_s", "layer_energy_j", "energy_per_token_j",
                  "edp_js", "average_power_w", "power_budget_w", "over_power_budget", "throttled_latency_s", "leakage_w",
                  "area_mm2", "dram_j", "buffer_j", "register_j", "mac_j", "elementwise_j", "mfu_j", "leakage_j",
                  "energy_gain_vs_marca"]


def _energy_rows(details: dict) -> pd.DataFrame:
    """Energy of each design's layer at the detail length (prefill) and in generation, broken
    down by action, with the energy ratio of MARCA (ideal) over the design."""
    rows = []
    for (model, phase, label), ev in details.items():
        energy = ev.energy
        if energy is None or label == "mambalaya/ideal":
            continue
        parts = energy.by_component_j()
        rows.append({"model": model, "phase": phase, "design": label, "mapping": ev.mapping.name,
                     "scan": scan_form(ev.cascade),  # (the energy objective's may differ from the latency's)
                     "layer_latency_s": ev.result.latency_s, "layer_energy_j": energy.layer_j,
                     "energy_per_token_j": energy.per_token_j, "edp_js": energy.edp_js,
                     "average_power_w": energy.average_power_w, "power_budget_w": ev.arch.power_budget_w,
                     "over_power_budget": over_budget(energy.average_power_w, ev.arch.power_budget_w),
                     "throttled_latency_s": energy.throttled_latency_s, "leakage_w": energy.leakage_w,
                     "area_mm2": total_area_mm2(ev.arch) if ev.arch.area is not None else float("nan"),
                     **{f"{k}_j": v for k, v in parts.items()}})
    df = pd.DataFrame(rows, columns=ENERGY_COLUMNS[:-1])
    base = df[df.design == "marca-ideal"].set_index(["model", "phase"]).layer_energy_j
    df["energy_gain_vs_marca"] = [base.get((m, p), float("nan")) / e for m, p, e in zip(df.model, df.phase, df.layer_energy_j)]
    return df


def _residency_rows(details: dict) -> pd.DataFrame:
    """How many weight bytes residency removes from each design's mapping: the same groups and
    tiles with every tensor streamed (read in every step) against the mapping as searched."""
    from dataclasses import replace

    from mambalaya.einsum.ir import Role

    rows = []
    for (model, phase, label), ev in details.items():
        if label == "mambalaya/ideal":
            continue
        c = ev.cascade
        streamed = replace(ev.mapping, groups=tuple(replace(g, resident=()) for g in ev.mapping.groups))
        kept, plain = mapping_traffic(c, ev.mapping), mapping_traffic(c, streamed)
        weights = [t for t in c.tensors if c.tensors[t].role == Role.WEIGHT]
        w_kept = sum(kept.by_tensor.get(t, (0.0, 0.0))[0] for t in weights)
        w_plain = sum(plain.by_tensor.get(t, (0.0, 0.0))[0] for t in weights)
        rows.append({"model": model, "phase": phase, "design": label, "mapping": ev.mapping.name,
                     "resident_tensors": ", ".join(sorted({t for g in ev.mapping.groups for t in g.resident})) or "-",
                     "weight_read_bytes_streamed": w_plain, "weight_read_bytes": w_kept,
                     "weight_bytes_removed": w_plain - w_kept,
                     "offchip_bytes_streamed": plain.offchip_bytes, "offchip_bytes": kept.offchip_bytes})
    return pd.DataFrame(rows)


def _scan_form_rows(config: ReproduceConfig) -> pd.DataFrame:
    """For each Mamba-2 model: the two scan forms' Einsums, edge classes and intermediates."""
    from mambalaya.einsum.ir import Role
    from mambalaya.workloads import build_layer

    rows = []
    for model in config.models:
        cfg = PRESETS[model]
        if getattr(cfg, "family", "") != "mamba2":
            continue
        for scan in ("recurrent", "chunked"):
            c = build_layer(cfg, phase="prefill", seq_len=config.detail_seq_len, batch=config.batch, scan=scan,
                            precision=config.precision or load_arch("mambalaya").precision)
            classes = pd.Series([e.fusion_class for e in classify_edges(c) if e.producer]).value_counts()
            inter = sorted(((c.nbytes(t), t) for t, sp in c.tensors.items() if sp.role == Role.INTERMEDIATE), reverse=True)
            rows.append({
                "model": model, "scan": scan, "einsums": len(c.einsums),
                **{f"edges_{k}": int(classes.get(k, 0)) for k in ("RI", "RSb", "RSp", "RD")},
                "intermediate_bytes": float(sum(b for b, _ in inter)),
                "largest_intermediates": "; ".join(f"{t} {b / 1e9:.2f} GB" for b, t in inter[:4]),
                "generational_ranks": ",".join(c.generational_ranks),
            })
    return pd.DataFrame(rows)


#: Geens et al.'s model of MARCA costs exp, sigmoid, sqrt, div and reciprocal one elementwise
#: operation each and softplus nothing (their artifact: Stream ae6a7788, OP_TYPE_TO_PARSER).
#: SiLU is sigmoid and a multiply (2), rsqrt a sqrt and a reciprocal (2), and softplus 1, the
#: least ``unary_cost_pe_ops`` admits (theirs: 0). A function their model does not cost (gelu,
#: which no Mamba-1 layer evaluates) keeps marca-original's own cost.
GEENS_UNARY_PE_OPS = {"exp": 1.0, "log": 1.0, "sqrt": 1.0, "rsqrt": 2.0, "silu": 2.0, "softplus": 1.0,
                      "sigmoid": 1.0, "tanh": 1.0}


def _geens_rows() -> pd.DataFrame:
    """Geens et al.'s "4.8x over unfused" on its own setup (GEENS_FUSION_SETUP): their
    Mamba1-2.7B (d_state 64, 64 layers), batch 1, prefill at each of their lengths, on
    marca-original at 32 bits; Fuse-All (ssm-ri) against unfused, whole layer and SSM region,
    under our marca-original costs and under their model's costs of nonlinear functions."""
    from mambalaya.arch import arch_from_dict, arch_to_dict
    from mambalaya.workloads.blocks.mamba1 import parse_config

    setup = GEENS_FUSION_SETUP
    cfg = parse_config(dict(setup.model_config), source="Geens et al.'s Mamba1-2.7B")
    spec = load_arch("marca-original")
    theirs = arch_to_dict(spec)
    theirs["compute"]["unary_cost_pe_ops"] = {**spec.compute.unary_cost_pe_ops, **GEENS_UNARY_PE_OPS}
    variants = {"marca-original spec costs": spec,
                "Geens et al.'s costs": arch_from_dict(theirs, source="marca-original with Geens et al.'s unary costs")}
    rows = []
    for variant, arch in variants.items():
        for L in (1,) + tuple(setup.seq_lens):
            unf = evaluate(arch, "geens-mamba1-2.7b", cfg, phase="prefill", seq_len=L, batch=setup.batch, mapping="unfused")
            ssm = evaluate(arch, "geens-mamba1-2.7b", cfg, phase="prefill", seq_len=L, batch=setup.batch, mapping="ssm-ri")
            region = set(unf.cascade.regions.get("ssm", ()))
            unf_region = sum(r.final_latency for r in unf.result.einsums if r.einsum in region)
            ssm_region = sum(g.latency for g in ssm.result.groups if set(g.einsums) <= region and len(g.einsums) > 1)
            rows.append({"costs": variant, "seq_len": L, "point": "decode (L = 1 run as a prefill)" if L == 1 else "prefill",
                         "batch": setup.batch, "precision": unf.precision.name, "bits": arch.bits_per_element,
                         "unfused_ms_per_token": unf.result.model_latency_s / L * 1e3,
                         "fused_ms_per_token": ssm.result.model_latency_s / L * 1e3,
                         "speedup_fused_vs_unfused": unf.result.latency_s / ssm.result.latency_s,
                         "ssm_region_speedup": unf_region / ssm_region if ssm_region else float("nan")})
    return pd.DataFrame(rows)


def multicore_rows() -> pd.DataFrame:
    """MARCA on 32 cores (``marca-multicore``, Geens et al.'s multi-core model of it: 16x16 PEs and
    768 KB per core, the channels split over the cores, DRAM shared) against MARCA as one 64x128
    array (``marca-original``), on Geens et al.'s own workload (GEENS_FUSION_SETUP), unfused and
    with their Fuse-All group: per-token latency, the chip's off-chip bytes and the cores' share
    of the time in their all-reduces."""
    from mambalaya.workloads.blocks.mamba1 import parse_config

    setup = GEENS_FUSION_SETUP
    cfg = parse_config(dict(setup.model_config), source="Geens et al.'s Mamba1-2.7B")
    rows = []
    for L in setup.seq_lens:
        for mapping in ("unfused", "ssm-ri"):
            one = evaluate("marca-original", "geens-mamba1-2.7b", cfg, phase="prefill", seq_len=L, batch=setup.batch,
                           mapping=mapping)
            many = evaluate("marca-multicore", "geens-mamba1-2.7b", cfg, phase="prefill", seq_len=L,
                            batch=setup.batch, mapping=mapping)
            split = many.layer_split
            rows.append({"seq_len": L, "batch": setup.batch, "mapping": mapping, "cores": split.devices,
                         "placement": split.strategy,
                         "one_array_ms_per_token": one.model_latency_s / L * 1e3,
                         "multicore_ms_per_token": many.model_latency_s / L * 1e3,
                         "multicore_over_one_array": many.model_latency_s / one.model_latency_s,
                         "one_array_layer_offchip_bytes": one.result.offchip_bytes,
                         "multicore_chip_layer_offchip_bytes": many.result.offchip_bytes * split.devices,
                         "multicore_interconnect_share": split.interconnect_share})
    return pd.DataFrame(rows)


def _policy_label(policy: str) -> str:
    """A policy's own name (a file's ``name:`` field), for table names."""
    from mambalaya.workloads.precision import load_policy

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", load_policy(policy).name)


def _main_policy(specs: dict) -> str:
    names = {specs[d].precision for d in DESIGNS}
    return names.pop() if len(names) == 1 else "each design's own"


def _speedups(lat: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (model, phase, L), grp in lat.groupby(["model", "phase", "seq_len"]):
        by = grp.set_index("arch")["layer_latency_s"]
        for b in BASELINES:
            rows.append({"model": model, "phase": phase, "seq_len": L, "baseline": b, "speedup": by[b] / by["mambalaya"]})
    return pd.DataFrame(rows)


def _end_to_end(lat: pd.DataFrame, config: ReproduceConfig) -> pd.DataFrame:
    """Prefill L then generate N tokens, per L (the report averages over L)."""
    rows = []
    for model in config.models:
        gen = lat[(lat.model == model) & (lat.phase == "generation")].set_index("arch")["model_latency_s"]
        for L in config.seq_lens:
            pre = lat[(lat.model == model) & (lat.phase == "prefill") & (lat.seq_len == L)].set_index("arch")["model_latency_s"]
            total = {d: pre[d] + config.generated_tokens * gen[d] for d in DESIGNS}
            for b in BASELINES:
                rows.append({"model": model, "seq_len": L, "baseline": b, "speedup": total[b] / total["mambalaya"],
                             "mambalaya_s": total["mambalaya"], "baseline_s": total[b]})
    return pd.DataFrame(rows)


def _headline_table(config: ReproduceConfig, lat: pd.DataFrame, alt: pd.DataFrame | None, main_policy: str) -> pd.DataFrame:
    rows = []
    for model in config.models:
        ours = headline_ratios(lat, model, config.generated_tokens)
        other = headline_ratios(alt, model, config.generated_tokens) if alt is not None else {}
        for key, label in HEADLINES:
            value, how = ours[key]
            row = {"model": model, "claim": label, "key": key, "published": PUBLISHED[key],
                   "precision": main_policy, "ours": value, "gap": gap(value, PUBLISHED[key]), "how": how}
            if key in other:
                row.update({"alt_precision": config.compare_precision, "alt_ours": other[key][0],
                            "alt_gap": gap(other[key][0], PUBLISHED[key])})
            rows.append(row)
    return pd.DataFrame(rows)


def _precision_rows(details: dict, specs: dict) -> pd.DataFrame:
    """Each tensor's width under the policy each form ran under, per model and cascade form: every
    form a design ran (geens-ideal's recurrent Mamba-2 prefill was missing when only mambalaya's
    forms were listed), once per policy and design width."""
    from mambalaya.workloads.precision import policy_rows

    rows = []
    seen = set()
    for (model, phase, label), ev in details.items():
        form = f"{phase}, {scan_form(ev.cascade)} scan"
        key = (model, form, ev.precision.name, ev.arch.bits_per_element)
        if key in seen:
            continue
        seen.add(key)
        for r in policy_rows(ev.precision, ev.cascade, ev.arch.bits_per_element):
            rows.append({"model": model, "form": form, "policy": ev.precision.name, **r})
    return pd.DataFrame(rows)


TAKE_COLUMNS = ["ratio", "published", "ours", "gap", "closest_assumption", "key", "value_needed",
                "closest_value_in_range", "ratio_at_value", "base_value", "verdict", "all"]


def _sensitivity_run(config: ReproduceConfig):
    from mambalaya.experiments.sensitivity import RunSetup

    return RunSetup(models=config.models, configs={m: PRESETS[m] for m in config.models}, seq_lens=config.study_seq_lens,
                    precision=config.precision,
                    batch=config.batch, generated_tokens=config.generated_tokens)


def _sensitivity(config: ReproduceConfig, latency: pd.DataFrame, tick: Callable[[str], None], prefetched: dict | None = None,
                 pool: Any = None):
    """The sensitivity study of the headline ratios (main policy, ``sensitivity_seq_lens``)."""
    from mambalaya.experiments.sensitivity import load_sensitivity_spec, run_sensitivity

    spec = load_sensitivity_spec(config.sensitivity)
    run = _sensitivity_run(config)

    def ratios(df: pd.DataFrame) -> dict[str, float]:
        out = {}
        for model in (m for m in config.models if m in set(df.model)):
            for key, (value, _) in headline_ratios(df, model, config.generated_tokens).items():
                out[f"{model}: {key}"] = value
        return out

    # "far" is judged on the main grid's ratios (the ones the report quotes), the search runs on
    # the study's lengths
    published = {}
    for m in config.models:
        main = headline_ratios(latency, m, config.generated_tokens)
        for k, _ in HEADLINES:
            if abs(gap(main[k][0], PUBLISHED[k])) > FAR_GAP:
                published[f"{m}: {k}"] = PUBLISHED[k]
    return run_sensitivity(spec, run, ratios, published=published, far=0.0, progress=tick, prefetched=prefetched,
                           models_of=lambda ratio: (ratio.split(": ", 1)[0],), executor=pool)


__all__ = ["ReproduceConfig", "ReproduceResult", "run_reproduce"]
