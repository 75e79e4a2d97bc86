"""Parts of the reproduction report: Markdown tables and figure links, the headline table it
opens with, the published GPU kernel timings against the model, and which unit and dataflow
runs each Einsum (:mod:`mambalaya.experiments.report` assembles them)."""

from __future__ import annotations

import pandas as pd

from mambalaya.formatting import whole


def md_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                cells.append(whole(v) if abs(v) >= 1e4 else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

def gap_text(ours: float, published: float) -> str:
    return f"{(ours - published) / published:+.0%}"

def figure_markdown(cfg, name: str, caption: str) -> str:
    p = cfg.out / "figures" / f"{name}.png"
    return f"![{caption}](figures/{name}.png)\n\n*{caption}* ([SVG](figures/{name}.svg))\n" if p.exists() else ""

def unfused_share(result) -> float:
    """The share of a layer's latency spent in groups of one Einsum (what a design leaves unfused)."""
    return sum(g.latency for g in result.groups if len(g.einsums) == 1) / result.latency_s


def headline_section(result, details) -> str:
    """The report's first table: every headline ratio, ours beside the published one, the gap
    and one line on why, from this run's numbers; the detail is in the model's section."""
    cfg, t = result.config, result.tables
    take = t.get("what_would_it_take")
    verdicts = {} if take is None or take.empty else dict(zip(take["ratio"], take["verdict"]))
    rows = []
    for r in t["headlines"].itertuples():
        pre = {k[2]: v.result for k, v in details.items() if k[0] == r.model and k[1] == "prefill"}
        gen = {k[2]: v.result for k, v in details.items() if k[0] == r.model and k[1] == "generation"}
        if r.key.startswith("prefill vs marca"):
            ideal = pre["mambalaya/ideal"]
            why = (f"{ideal.bound}-bound: with every intermediate on chip no mapping beats "
                   f"{pre['marca-ideal'].latency_s / ideal.latency_s:.2f}× at L = {cfg.detail_seq_len}")
        elif r.key.startswith("generation"):
            ideal = gen["mambalaya/ideal"]
            why = f"{ideal.bound}-bound: the speed of light is {gen['marca-ideal'].latency_s / ideal.latency_s:.2f}×"
        elif r.key.startswith("prefill vs geens"):
            why = f"{unfused_share(pre['geens-ideal']):.0%} of geens-ideal's prefill time is in Einsums it leaves unfused"
        else:
            why = f"our request: prefill of L + {cfg.generated_tokens} generated tokens (the paper's mix is not known)"
        far = verdicts.get(f"{r.model}: {r.key}")
        if far:
            why += f"; {far}"
        rows.append({"model": r.model, "claim": r.claim, "published": f"{r.published:g}×", f"ours ({r.precision})": f"{r.ours:.2f}×",
                     "gap": gap_text(r.ours, r.published), "why": why})
    ours = next((k for k in (rows[0] if rows else {}) if k.startswith("ours (")), "ours")
    rows.extend(_equal_area_rows(t.get("geens_equal_area"), ours))
    return f"""## Headline ratios: ours beside the published ones

{md_table(pd.DataFrame(rows))}

Each model's section below has the table under both precision policies with how ours is measured,
the mapping each design ran and *why the gaps* in full (`headlines.csv`); the sensitivity study says
what each assumption does to each ratio (`sensitivity.csv`, `what_would_it_take.csv`).
"""

def _equal_area_rows(rows: pd.DataFrame | None, ours: str) -> list[dict]:
    """Geens et al.'s equal-area ratio at the length where it is largest, under each variant
    of the SRAM's bandwidth (the report's Geens section has every split); at 32 bits, their setup."""
    from mambalaya.experiments.claims import PUBLISHED
    from mambalaya.experiments.equal_area import MARCA_MEMORY_SHARE, best_splits

    if rows is None or rows.empty:
        return []
    published = PUBLISHED["geens: vs MARCA at equal area"]
    out = []
    for variant, b in best_splits(rows).groupby("variant", sort=False):
        top = b.loc[b.speedup.idxmax()]
        at = rows[(rows.variant == variant) & (rows.seq_len == top.seq_len)].set_index("memory_share").bound
        out.append({"model": "Geens et al.'s Mamba1-2.7B (32 bits)",
                    "claim": f"Geens et al. over MARCA at equal area ({variant})",
                    "published": f"{published:g}×", ours: f"{top.speedup:.2f}×", "gap": gap_text(float(top.speedup), published),
                    "why": (f"L = {top.seq_len}: the best split has {top.best_memory_share:.0%} SRAM ({at[top.best_memory_share]}-bound) "
                            f"against MARCA's {MARCA_MEMORY_SHARE:.0%} ({at[MARCA_MEMORY_SHARE]}-bound)")})
    return out

def validation_section(result) -> str:
    v = result.tables.get("validation")
    if v is None or v.empty:
        return ""
    shown = v[["case", "arch", "batch", "seq_len", "measured_ms", "read", "predicted_ms", "ratio", "speed_of_light_ms", "sol_ok"]]
    sources = "\n".join(f"- {s}" for s in dict.fromkeys(v["source"]))
    bad = v[~v["sol_ok"]]
    verdict = ("Every speed of light is at or below its measurement." if bad.empty else
               f"**The speed of light is above the measurement in {', '.join(bad['case'])}: the model breaks a bound.**")
    return f"""## Published GPU kernel timings against the model

`mambalaya validate` runs each published measurement's setup (the kernel's Einsums, grouped as the kernel
groups them) on the GPU spec of its hardware: **predicted** at the fractions of peak that measured kernels
reach and the launch floor (each spec's `kernels` section, from microbenchmarks, the same for every case:
nothing is fitted), and its **speed of light** (the `ideal` mapping at the peak rates). {verdict}
Predicted over measured: median {v['ratio'].median():.3g}, range {v['ratio'].min():.3g}-{v['ratio'].max():.3g};
the model is optimistic, as a model without the kernels' own inefficiencies (occupancy, pipeline bubbles, the
host) must be. `validation.csv` has every case with its source and the setup details assumed.

{md_table(shown)}

Sources:

{sources}

{figure_markdown(result.config, "validation", "predicted and speed-of-light times against the measurements")}
"""

def units_section(result, details) -> str:
    """Which Einsums the array runs besides the GEMMs with a weight, the dataflow each design
    picks, and what the dataflows add to each headline ratio (the sensitivity study's 'every
    design weight-stationary' setting)."""
    cfg = result.config
    rows = []
    for model in cfg.models:
        for d in ("marca-ideal", "geens-ideal", "mambalaya"):
            ev = details.get((model, "prefill", d))
            if ev is None:
                continue
            on_array = [r for r in ev.result.einsums if r.spatial.unit == "array_2d"]
            moved = [r.einsum for r in on_array if r.kind != "gemm"]
            flows: dict[str, list[str]] = {}
            for r in on_array:
                flows.setdefault(r.spatial.dataflow, []).append(r.einsum)
            scan = "chunked" if any(e.name == "CB" for e in ev.cascade.einsums) else "recurrent"
            rows.append({"model": model, "design": d, "scan": scan if ev.config.family != "mamba1" else "-",
                         "products of activations on the array": ", ".join(moved) or "-",
                         **{f: ", ".join(flows.get(f, [])) or "-" for f in ("weight-stationary", "input-stationary", "output-stationary")}})
    sens = result.tables.get("sensitivity")
    share = ""
    if sens is not None and not sens.empty:
        ws = sens[(sens.key == "compute.dataflows") & (sens.end == "low")][["ratio", "base", "ours"]]
        ws = ws.rename(columns={"base": "shipped dataflows", "ours": "every design weight-stationary"})
        share = f"""
What the dataflows add to each headline ratio (the sensitivity study's lengths; the rest of the gap is fusion):

{md_table(ws)}
"""
    return f"""## Which unit and which dataflow runs each Einsum

Every contraction the 2D array can run goes to it, with weights or activations on either side: a product of
two activations that is a matrix product (the chunked SSD's `CB`, `YDG`, `ST`, `YO`) no longer runs on the
1D lanes. Each design runs each contraction in the fastest of its own dataflows (`compute.dataflows`, each
with its reason in the spec): `mambalaya` weight-, input- and output-stationary, `marca-ideal` weight- and
input-stationary, `geens-ideal` weight-stationary. Prefill at L = {cfg.detail_seq_len}:

{md_table(pd.DataFrame(rows))}
{share}"""
