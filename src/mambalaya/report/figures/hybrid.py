"""How much of Mambalaya's speedup survives in a hybrid model, as the context (and the share of
time in attention) grows?"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.speedup import BASELINE_MARKERS, baseline_colours
from mambalaya.report.figures.style import COLUMN_IN, _legend_below, _new_figure, _style_axes, _title

_NEEDED = ("phase", "seq_len", "baseline", "speedup", "baseline_attention_share")
_PHASE_STYLE = {"prefill": "-", "decode": "--"}


def _checked(table: pd.DataFrame, what: str) -> pd.DataFrame:
    missing = [c for c in _NEEDED if c not in table.columns]
    if missing:
        raise MambalayaError(f"{what}: the hybrid speedup table lacks column(s) {', '.join(missing)}")
    if table.empty:
        raise MambalayaError(f"{what}: the hybrid speedup table has no rows")
    return table


def hybrid_speedup_vs_length(table: pd.DataFrame, *, model: str) -> Figure:
    """Whole-model speedup of Mambalaya over each baseline against the context length, prefill
    (solid) and decode (dashed)."""
    t = _checked(table, "hybrid speedup figure")
    baselines = list(dict.fromkeys(t["baseline"]))
    colours = baseline_colours(baselines)
    fig = _new_figure(COLUMN_IN, 2.6)
    ax = fig.add_subplot(1, 1, 1)
    handles = []
    for n, b in enumerate(baselines):
        for phase, style in _PHASE_STYLE.items():
            rows = t[(t["baseline"] == b) & (t["phase"] == phase)].sort_values("seq_len")
            if rows.empty:
                continue
            (line,) = ax.plot(rows["seq_len"], rows["speedup"], style, color=colours[b],
                              marker=BASELINE_MARKERS[n % len(BASELINE_MARKERS)], markersize=3,
                              label=f"vs {b}, {phase}")
            handles.append(line)
    ax.axhline(1.0, color="0.6", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context L (prefill tokens; decode: KV-cache tokens)")
    ax.set_ylabel("Mambalaya speedup")
    _style_axes(ax)
    _title(fig, f"{model}: speedup vs context length")
    _legend_below(fig, handles, ncol=2)
    return fig


def hybrid_speedup_vs_attention_share(table: pd.DataFrame, *, model: str) -> Figure:
    """Speedup of Mambalaya over each baseline against the share of that baseline's time spent
    in attention layers, one point per (phase, L)."""
    t = _checked(table, "hybrid attention-share figure")
    baselines = list(dict.fromkeys(t["baseline"]))
    colours = baseline_colours(baselines)
    fig = _new_figure(COLUMN_IN, 2.6)
    ax = fig.add_subplot(1, 1, 1)
    handles = []
    for n, b in enumerate(baselines):
        for phase, style in _PHASE_STYLE.items():
            rows = t[(t["baseline"] == b) & (t["phase"] == phase)].sort_values("baseline_attention_share")
            if rows.empty:
                continue
            (line,) = ax.plot(rows["baseline_attention_share"] * 100, rows["speedup"], style, color=colours[b],
                              marker=BASELINE_MARKERS[n % len(BASELINE_MARKERS)], markersize=3,
                              label=f"vs {b}, {phase}")
            handles.append(line)
    ax.axhline(1.0, color="0.6", linewidth=0.6)
    ax.set_xlabel("share of the baseline's time in attention layers (%)")
    ax.set_ylabel("Mambalaya speedup")
    _style_axes(ax)
    _title(fig, f"{model}: speedup vs attention share")
    _legend_below(fig, handles, ncol=2)
    return fig


__all__ = ["hybrid_speedup_vs_attention_share", "hybrid_speedup_vs_length"]
