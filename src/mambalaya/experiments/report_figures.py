"""Figures of `mambalaya reproduce`: per model, the roofline, utilisation timelines, speedups,
traffic by tensor, latency by Einsum and the cascade with its groups; the end-to-end and
validation figures; one tornado chart per ratio of the sensitivity study.

Like :mod:`mambalaya.experiments.report`, this module reads the result ``reproduce`` hands it
and imports nothing from ``reproduce``; the figure modules are imported inside the writers so
that a run without figures does not load matplotlib.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from mambalaya.experiments.claims import PUBLISHED as P
from mambalaya.experiments.evaluate import Evaluation
from mambalaya.fusion.edges import classify_edges


def write_figures(result, details: dict[tuple[str, str, str], Evaluation], specs: dict) -> list[Path]:
    from mambalaya.report import figures as F

    out = result.config.out / "figures"
    paths: list[Path] = []
    for model in result.config.models:
        paths += _model_figures(result, details, specs, model, out)
    e2e = result.tables["end_to_end"].groupby(["model", "baseline"], as_index=False)["speedup"].mean()
    published = {f"{m} vs {b}": P[f"end-to-end vs {b}"] for m in result.config.models for b in ("marca-ideal", "geens-ideal")}
    fig = F.end_to_end_figure(
        e2e, published=published,
        title=f"end to end (prefill L + {result.config.generated_tokens} generated tokens), mean over L",
    )
    paths += F.save_figure(fig, out / "end_to_end")
    if "validation" in result.tables:
        from mambalaya.report.figures.validation import validation_figure

        paths += F.save_figure(validation_figure(result.tables["validation"]), out / "validation")
    return paths


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def tornado_figures(result, out: Path, executor: Any = None) -> list[Path]:
    """One tornado chart per ratio of the sensitivity study (PNG and SVG); with ``executor`` (a
    ``concurrent.futures`` executor of other processes) every other chart is drawn there
    meanwhile. The paths in the ratios' order either way."""
    sens = result.tables.get("sensitivity")
    if sens is None or sens.empty:
        return []
    ratios = list(dict.fromkeys(sens.ratio))
    if executor is None:
        return draw_tornados(sens, ratios, out)
    there = executor.submit(draw_tornados, sens[sens.ratio.isin(ratios[1::2])], ratios[1::2], out)
    here = draw_tornados(sens, ratios[0::2], out)
    drawn = there.result()
    paths: list[Path] = []
    for n in range(len(ratios)):  # each ratio's PNG and SVG
        paths += (here if n % 2 == 0 else drawn)[(n // 2) * 2:(n // 2) * 2 + 2]
    return paths


def draw_tornados(sens: pd.DataFrame, ratios: list[str], out: Path) -> list[Path]:
    """The tornado charts of ``ratios`` from the sensitivity rows ``sens``: two paths each."""
    from mambalaya.report import figures as F
    from mambalaya.report.sensitivity_figures import tornado_figure

    paths: list[Path] = []
    for ratio in ratios:
        key = ratio.split(": ", 1)[-1]
        fig = tornado_figure(sens, ratio, published=P.get(key), title=ratio)
        paths += F.save_figure(fig, out / f"tornado_{_slug(ratio)}")
    return paths


def _model_figures(result, details, specs, model: str, out: Path) -> list[Path]:
    import matplotlib

    from mambalaya.report import figures as F
    from mambalaya.report.diagram import draw_cascade

    t = result.tables
    cfg = result.config
    paths: list[Path] = []
    mb = specs["mambalaya"]
    roof = t["roofline"][t["roofline"].model == model]
    if not roof.empty:
        fig = F.roofline_figure(
            roof,
            peak_ops_per_s=2 * mb.peak_macs_per_s,
            peak_elementwise_ops_per_s=mb.peak_elementwise_ops_per_s,
            bandwidth_bytes_per_s=mb.memory.offchip_bandwidth_bytes_per_s,
            title=f"{model} prefill L={cfg.detail_seq_len}, batch {cfg.batch}: Einsums on the mambalaya budget",
        )
        paths += F.save_figure(fig, out / f"roofline_{model}")
    tl = t["timeline"]
    for phase in ("prefill", "generation"):
        for design, label in (("marca-ideal", "unfused (marca-ideal)"), ("mambalaya", "fused (mambalaya)")):
            rows = tl[(tl.model == model) & (tl.phase == phase) & (tl.design == design)]
            if rows.empty:
                continue
            fig = F.utilisation_timeline_figure(rows, title=f"{model} {phase}, one layer: {label}")
            paths += F.save_figure(fig, out / f"utilisation_{phase}_{design}_{model}")
    sp = t["speedups"][t["speedups"].model == model]
    # a generation step does not depend on the context length (the state has a fixed size):
    # draw its speedup across the same L axis as prefill
    gen = sp[sp.phase == "generation"]
    spread = pd.concat([gen.assign(seq_len=L) for L in cfg.seq_lens], ignore_index=True)
    sp = pd.concat([sp[sp.phase == "prefill"], spread], ignore_index=True)
    fig = F.speedup_figure(
        sp[["seq_len", "baseline", "phase", "speedup"]],
        title=f"{model}, batch {cfg.batch}: mambalaya layer speedup",
        published={"prefill vs marca-ideal": P["prefill vs marca-ideal"], "generation vs marca-ideal": P["generation vs marca-ideal"],
                   "prefill vs geens-ideal": P["prefill vs geens-ideal (max)"]},
    )
    paths += F.save_figure(fig, out / f"speedup_vs_seq_len_{model}")
    tr = t["traffic_by_tensor"]
    tr = tr[(tr.model == model) & (tr.phase == "prefill")]
    order = {"marca-ideal": "unfused", "geens-ideal": "ssm-ri", "mambalaya-greedy": "stitched",
             "mambalaya": "optimal", "mambalaya/ideal": "ideal"}
    tr = tr[tr.design.isin(order)].assign(mapping=lambda d: d.design.map(order))
    fig = F.traffic_by_tensor_figure(tr[["mapping", "tensor", "role", "read_bytes", "write_bytes"]],
                                     title=f"{model} prefill L={cfg.detail_seq_len}: off-chip traffic by tensor")
    paths += F.save_figure(fig, out / f"traffic_by_tensor_{model}")
    ein = t["einsums"]
    ein = ein[(ein.model == model) & (ein.phase == "prefill") & (ein.einsum != "total")
              & ein.design.isin(["marca-ideal", "geens-ideal", "mambalaya-greedy", "mambalaya"])]
    kinds: dict[str, str] = {}
    for d in ("marca-ideal", "geens-ideal", "mambalaya-greedy", "mambalaya"):
        c = details[(model, "prefill", d)].cascade
        kinds.update({e.name: c.kind(e) for e in c.einsums})
    bd = ein.assign(kind=ein.einsum.map(kinds), final_latency_s=ein.final_latency)[["design", "einsum", "kind", "final_latency_s"]]
    fig = F.latency_breakdown_figure(bd, title=f"{model} prefill L={cfg.detail_seq_len}: latency by Einsum")
    paths += F.save_figure(fig, out / f"latency_breakdown_{model}")
    ev = details[(model, "prefill", "mambalaya")]
    labels = {e.key: e.fusion_class for e in classify_edges(ev.cascade) if e.producer != e.consumer}
    groups = {e: g.name for g in ev.mapping.groups for e in g.einsums}  # the tables' names (G1, G2); once 0, 1
    png, svg = out / f"cascade_{model}.png", out / f"cascade_{model}.svg"
    fig = draw_cascade(ev.cascade, png, edge_labels=labels, groups=groups,
                       title=f"{model} prefill: fusion classes and mambalaya's groups")
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # drawn once, saved in both formats
        fig.savefig(svg, format="svg")
    return paths + [png, svg]


__all__ = ["tornado_figures", "write_figures"]
