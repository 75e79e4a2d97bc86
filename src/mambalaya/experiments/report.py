"""Figures and ``report.md`` of `mambalaya reproduce` (tables come from reproduce.py)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import pandas as pd

from mambalaya import __version__
from mambalaya.experiments.evaluate import Evaluation
from mambalaya.fusion.edges import classify_edges


def _md_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                cells.append(f"{v:,.0f}" if abs(v) >= 1e4 else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_figures(result, details: dict[tuple[str, str, str], Evaluation], specs: dict) -> list[Path]:
    from mambalaya.report import figures as F
    from mambalaya.report.diagram import draw_cascade

    out = result.config.out / "figures"
    t = result.tables
    model = result.config.models[0]
    paths: list[Path] = []
    mb = specs["mambalaya"]
    roof = t["roofline"][t["roofline"].model == model]
    if not roof.empty:
        fig = F.roofline_figure(
            roof,
            peak_ops_per_s=2 * mb.peak_macs_per_s,
            peak_elementwise_ops_per_s=mb.peak_elementwise_ops_per_s,
            bandwidth_bytes_per_s=mb.memory.offchip_bandwidth_bytes_per_s,
            title=f"{model} prefill L={result.config.detail_seq_len}, batch {result.config.batch}: Einsums on the mambalaya budget",
        )
        paths += F.save_figure(fig, out / "roofline")
    tl = t["timeline"]
    for phase in ("prefill", "generation"):
        for design, label in (("marca-ideal", "unfused (marca-ideal)"), ("mambalaya", "fused (mambalaya, stitched)")):
            rows = tl[(tl.model == model) & (tl.phase == phase) & (tl.design == design)]
            if rows.empty:
                continue
            fig = F.utilisation_timeline_figure(rows, title=f"{model} {phase}, one layer: {label}")
            paths += F.save_figure(fig, out / f"utilisation_{phase}_{design}")
    sp = t["speedups"][t["speedups"].model == model]
    # a generation step does not depend on the context length (the state has a fixed size):
    # draw its speedup across the same L axis as prefill
    gen = sp[sp.phase == "generation"]
    spread = pd.concat([gen.assign(seq_len=L) for L in result.config.seq_lens], ignore_index=True)
    sp = pd.concat([sp[sp.phase == "prefill"], spread], ignore_index=True)
    fig = F.speedup_figure(
        sp[["seq_len", "baseline", "phase", "speedup"]],
        title=f"{model}, batch {result.config.batch}: mambalaya layer speedup",
        published={
            "prefill vs marca-ideal": 4.9,
            "generation vs marca-ideal": 1.9,
            "prefill vs geens-ideal": 1.5,
        },
    )
    paths += F.save_figure(fig, out / "speedup_vs_seq_len")
    e2e = t["end_to_end"].groupby(["model", "baseline"], as_index=False)["speedup"].mean()
    fig = F.end_to_end_figure(
        e2e, published={f"{model} vs marca-ideal": 3.0, f"{model} vs geens-ideal": 1.3},
        title=f"end to end (prefill L + {result.config.generated_tokens} generated tokens), mean over L",
    )
    paths += F.save_figure(fig, out / "end_to_end")
    tr = t["traffic_by_tensor"]
    tr = tr[(tr.model == model) & (tr.phase == "prefill")]
    order = {"marca-ideal": "unfused", "geens-ideal": "ssm-ri", "mambalaya": "stitched", "mambalaya/optimal": "optimal", "mambalaya/ideal": "ideal"}
    tr = tr[tr.design.isin(order)].assign(mapping=lambda d: d.design.map(order))
    fig = F.traffic_by_tensor_figure(tr[["mapping", "tensor", "role", "read_bytes", "write_bytes"]],
                                     title=f"{model} prefill L={result.config.detail_seq_len}: off-chip traffic by tensor")
    paths += F.save_figure(fig, out / "traffic_by_tensor")
    ein = t["einsums"]
    ein = ein[(ein.model == model) & (ein.phase == "prefill") & (ein.einsum != "total") & ein.design.isin(["marca-ideal", "geens-ideal", "mambalaya"])]
    kinds = {e.name: details[(model, "prefill", "mambalaya")].cascade.kind(e) for e in details[(model, "prefill", "mambalaya")].cascade.einsums}
    bd = ein.assign(kind=ein.einsum.map(kinds), final_latency_s=ein.final_latency)[["design", "einsum", "kind", "final_latency_s"]]
    fig = F.latency_breakdown_figure(bd, title=f"{model} prefill L={result.config.detail_seq_len}: latency by Einsum")
    paths += F.save_figure(fig, out / "latency_breakdown")
    ev = details[(model, "prefill", "mambalaya")]
    labels = {e.key: e.fusion_class for e in classify_edges(ev.cascade) if e.producer != e.consumer}
    groups = {e: n for n, g in enumerate(ev.mapping.groups) for e in g.einsums}
    for ext in ("png", "svg"):
        p = out / f"cascade.{ext}"
        draw_cascade(ev.cascade, p, edge_labels=labels, groups=groups,
                     title=f"{model} prefill: fusion classes and mambalaya's groups (stitched)")
        paths.append(p)
    return paths


def _gap(ours: float, published: float) -> str:
    return f"{(ours - published) / published:+.0%}"


def _gap_text(cfg, model: str, details, bound_pre: float, bound_gen: float) -> str:
    """Why our ratios differ from the published ones, from the numbers of this run."""
    L = cfg.detail_seq_len
    marca_pre = details[(model, "prefill", "marca-ideal")].result
    mb_pre = details[(model, "prefill", "mambalaya")].result
    opt_pre = details[(model, "prefill", "mambalaya/optimal")].result
    ideal_pre = details[(model, "prefill", "mambalaya/ideal")].result
    marca_gen = details[(model, "generation", "marca-ideal")].result
    mb_gen = details[(model, "generation", "mambalaya")].result
    geens_pre = details[(model, "prefill", "geens-ideal")].result
    out = []
    verdict = "below" if bound_pre < 4.9 else "above"
    out.append(
        f"- **Prefill is bounded by compute.** With every intermediate kept on chip (`ideal`: only inputs, "
        f"weights, outputs and state touch DRAM) a prefill layer at L={L} still takes {ideal_pre.latency_s * 1e3:.2f} ms "
        f"(compute utilisation {ideal_pre.compute_util:.0%}) against MARCA's {marca_pre.latency_s * 1e3:.2f} ms "
        f"(compute utilisation {marca_pre.compute_util:.0%}): no mapping can beat **{bound_pre:.2f}×** on this budget, "
        f"{verdict} the published 4.9×. Stitching reaches {marca_pre.latency_s / mb_pre.latency_s:.2f}× and the "
        f"latency-optimal search {marca_pre.latency_s / opt_pre.latency_s:.2f}×."
        + (
            " The published figure therefore needs a compute model in which the unfused MARCA pays more time per "
            "operation than ours, or mambalaya less: our per-operation costs (`compute.unary_cost_cycles`, "
            "`compute.mfu_units`, one elementwise operation per 1D lane per cycle, GEMM MACs only on the 2D array) "
            "are documented assumptions, not values from the paper."
            if bound_pre < 4.9 else ""
        )
    )
    verdict = "below" if bound_gen < 1.9 else "above"
    out.append(
        f"- **Generation is bounded by reading the weights.** At I = 1 the speed-of-light bound over MARCA is "
        f"**{bound_gen:.2f}×** ({verdict} the published 1.9×); mambalaya reaches "
        f"{marca_gen.latency_s / mb_gen.latency_s:.2f}× at {mb_gen.mem_util:.0%} memory utilisation."
        + (
            " A published ratio above our bound implies a baseline that moves more than the algorithmic minimum "
            "of activation traffic (we give MARCA that minimum)."
            if bound_gen < 1.9 else ""
        )
    )
    unfused_share = sum(g.latency for g in geens_pre.groups if len(g.einsums) == 1) / geens_pre.latency_s
    out.append(
        f"- **Over Geens et al.**: with the SSM region fused, {unfused_share:.0%} of `geens-ideal`'s prefill layer time "
        f"is spent in Einsums it still runs unfused; mambalaya removes their intermediate traffic but, being "
        f"compute-bound (utilisation {mb_pre.compute_util:.0%}), gains only what those Einsums spent above their "
        f"compute time."
    )
    out.append(
        "- **Geens et al.'s 4.8×** is their own measurement on MARCA-like hardware; ours runs the same two "
        "mappings (`ssm-ri` vs `unfused`) through our model of `marca-original` (8192 PEs, 256 GB/s, FP32), "
        "whose per-operation costs for nonlinear functions are our assumptions."
    )
    return "\n".join(out)


def write_report(result, details: dict[tuple[str, str, str], Evaluation], specs: dict) -> Path:
    cfg = result.config
    t = result.tables
    model = cfg.models[0]
    sp = t["speedups"][t["speedups"].model == model]
    pre = sp[sp.phase == "prefill"]
    gen = sp[sp.phase == "generation"]
    e2e = t["end_to_end"][t["end_to_end"].model == model]
    lat = t["latency"]

    def mean(df, b):
        return float(df[df.baseline == b].speedup.mean())

    def rng(df, b):
        s = df[df.baseline == b].speedup
        return f"{s.min():.2f}–{s.max():.2f}"

    ideal_pre = details[(model, "prefill", "mambalaya/ideal")].result.latency_s
    opt_pre = details[(model, "prefill", "mambalaya/optimal")].result.latency_s
    marca_pre = details[(model, "prefill", "marca-ideal")].result.latency_s
    mb_pre = details[(model, "prefill", "mambalaya")].result
    ideal_gen = details[(model, "generation", "mambalaya/ideal")].result.latency_s
    marca_gen = details[(model, "generation", "marca-ideal")].result.latency_s
    mb_gen = details[(model, "generation", "mambalaya")].result
    geens = t["geens_claims"]

    claims = [
        ("prefill layer speedup over MARCA", 4.9, mean(pre, "marca-ideal"), f"mean over L (range {rng(pre, 'marca-ideal')})"),
        ("generation layer speedup over MARCA", 1.9, mean(gen, "marca-ideal"), "I = 1"),
        ("prefill speedup over Geens et al. (up to)", 1.5, float(pre[pre.baseline == "geens-ideal"].speedup.max()), f"max over L (range {rng(pre, 'geens-ideal')})"),
        ("end-to-end speedup over MARCA (about)", 3.0, mean(e2e, "marca-ideal"), f"mean over L; prefill L + {cfg.generated_tokens} generated tokens"),
        ("end-to-end speedup over Geens et al. (about)", 1.3, mean(e2e, "geens-ideal"), "as above"),
        ("Geens et al.: fusion over unfused (their claim)", 4.8, float(geens[geens.phase == "prefill"].layer_speedup_ssm_ri_vs_unfused.iloc[0]),
         f"whole layer, ssm-ri vs unfused on marca-original, prefill L={cfg.detail_seq_len}; the SSM region alone: "
         f"{float(geens[geens.phase == 'prefill'].ssm_region_speedup.iloc[0]):.1f}×"),
    ]
    claim_df = pd.DataFrame(
        [{"claim": c, "published": f"{p:g}×", "ours": f"{o:.2f}×", "gap": _gap(o, p), "how ours is measured": how} for c, p, o, how in claims]
        + [{"claim": "Geens et al.: 1.78× over MARCA at equal area", "published": "1.78×", "ours": "not modelled",
            "gap": "n/a", "how ours is measured": "mambalaya has no area model; their accelerator's area budget cannot be reproduced"}]
    )

    arch_keys = ["clock_hz", "compute.array_rows", "compute.array_cols", "compute.one_d_mode", "compute.mfu_units",
                 "compute.pipeline_wind_up_cycles", "memory.onchip_buffer_bytes", "memory.offchip_bandwidth_bytes_per_s",
                 "bits_per_element", "mappings.default"]
    ar = t["architectures"]
    arch_table = ar[ar.field.isin(arch_keys)].pivot_table(index="field", columns="design", values="value", aggfunc="first").reset_index()
    src = ar[(ar.design == "mambalaya") & ar.field.isin(arch_keys)][["field", "unit", "source"]]

    lat_pre = lat[(lat.model == model)][["phase", "seq_len", "arch", "mapping", "layer_latency_s", "model_latency_s",
                                          "offchip_bytes", "compute_util", "mem_util"]]
    ein = t["einsums"]
    ein_mb = ein[(ein.model == model) & (ein.phase == "prefill") & (ein.design == "mambalaya")].drop(columns=["model", "phase", "design"])
    groups_md = []
    for d in ("marca-ideal", "geens-ideal", "mambalaya", "mambalaya/optimal"):
        ev = details[(model, "prefill", d)]
        desc = "; ".join(
            f"{{{', '.join(g.einsums)}}}" + (f" tiled {' '.join(f'{lp.rank}/{lp.tile}' for lp in g.loops)}" if g.loops else "")
            for g in ev.mapping.groups if len(g.einsums) > 1 or g.loops
        ) or "every Einsum alone"
        groups_md.append(f"- **{d}** ({ev.mapping.name}, {len(ev.mapping.groups)} groups): {desc}")

    figs = [p for p in result.figures if p.suffix == ".png"]

    def fig(name: str, caption: str) -> str:
        p = cfg.out / "figures" / f"{name}.png"
        return f"![{caption}](figures/{name}.png)\n\n*{caption}* ([SVG](figures/{name}.svg))\n" if p in figs or p.exists() else ""

    bound_pre = marca_pre / ideal_pre
    bound_gen = marca_gen / ideal_gen
    gap_text = _gap_text(cfg, model, details, bound_pre, bound_gen)
    md = f"""# Mambalaya reproduction report

Generated by `mambalaya reproduce` (mambalaya {__version__}) on {_dt.date.today().isoformat()} in {result.seconds:.1f} s.
Every number below comes from the tables in this folder (`*.csv`), which name their inputs; the
mappings each design ran are in `mappings.json`.

## Setup

- **Workload**: {model} (d_model {details[(model, 'prefill', 'mambalaya')].config.d_model},
  {details[(model, 'prefill', 'mambalaya')].config.n_layers} layers: the paper's "48-layer Mamba-1"; the size is our
  reading), batch {cfg.batch}, prefill at L = {', '.join(str(x) for x in cfg.seq_lens)}, generation with I = 1.
  Mamba-2 joins when its cascade exists (issue 5).
- **Designs**: the same H100-like budget; each runs its own mapping (`mappings.default`), built for its
  buffer and minimising its latency: `marca-ideal` unfused (algorithmic-minimum traffic), `geens-ideal`
  RI fusion of AD, BX, H, YS only, `mambalaya` greedy stitching across the whole cascade.
- **End to end**: a request = prefill of L tokens + {cfg.generated_tokens} generated tokens, all {details[(model, 'prefill', 'mambalaya')].config.n_layers} layers
  (embedding and LM head excluded); our choice, the paper's exact request mix is not known to us.

Architecture values used (`architectures.csv` has every field and its source):

{_md_table(arch_table)}

Where the mambalaya values come from:

{_md_table(src)}

## Headline ratios: ours beside the published ones

{_md_table(claim_df)}

No parameter was tuned to close a gap. Why the gaps:

{gap_text}

## Figures

{fig('roofline', 'Figure 2a: every Einsum unfused (marca-ideal) and under ideal fusion on the mambalaya budget')}
{fig('utilisation_prefill_marca-ideal', 'Figure 2b: utilisation over time, one prefill layer, unfused')}
{fig('utilisation_prefill_mambalaya', 'Figure 2b: utilisation over time, one prefill layer, fused (stitched)')}
{fig('utilisation_generation_marca-ideal', 'Figure 2c: utilisation over time, one generation step, unfused')}
{fig('utilisation_generation_mambalaya', 'Figure 2c: utilisation over time, one generation step, fused')}
{fig('speedup_vs_seq_len', 'mambalaya speedup over each baseline across L, prefill and generation (a generation step does not depend on L: its value is drawn across the axis)')}
{fig('end_to_end', 'end-to-end speedup')}
{fig('traffic_by_tensor', 'off-chip traffic by tensor for each mapping')}
{fig('latency_breakdown', 'latency by Einsum per design')}
{fig('cascade', 'the cascade with fusion classes on its edges and mambalaya stitched groups')}

## Mappings at L = {cfg.detail_seq_len} (prefill)

{chr(10).join(groups_md)}

## Latency by design and sequence length

{_md_table(lat_pre)}

## Per-Einsum table: mambalaya, prefill L = {cfg.detail_seq_len}

Latencies in seconds, traffic in bytes.

{_md_table(ein_mb)}
"""
    path = cfg.out / "report.md"
    path.write_text(md, encoding="utf-8")
    return path
