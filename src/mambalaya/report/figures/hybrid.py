"""How much of Mambalaya's speedup survives in a hybrid model, as the context (and the share of
time in attention) grows?"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.speedup import BASELINE_MARKERS, baseline_colours
from mambalaya.report.figures.style import COLUMN_IN, legend_below, new_figure, style_axes, figure_title

_NEEDED = ("phase", "seq_len", "baseline", "speedup", "baseline_attention_share")
_PHASE_STYLE = {"prefill": "-", "decode": "--"}


def _checked(table: pd.DataFrame, what: str) -> pd.DataFrame:
    missing = [c for c in _NEEDED if c not in table.columns]
    if missing:
        raise MambalayaError(f"{what}: the hybrid speedup table lacks column(s) {', '.join(missing)}")
    if table.empty:
        raise MambalayaError(f"{what}: the hybrid speedup table has no rows")
    return table


def _speedup_figure(table: pd.DataFrame, *, x: str, x_scale: float, xlabel: str, title: str, log_x: bool,
                    what: str) -> Figure:
    """Mambalaya's speedup over each baseline (colour, marker) against column ``x`` (times
    ``x_scale``), prefill solid and decode dashed."""
    t = _checked(table, what)
    baselines = list(dict.fromkeys(t["baseline"]))
    colours = baseline_colours(baselines)
    fig = new_figure(COLUMN_IN, 2.6)
    ax = fig.add_subplot(1, 1, 1)
    handles = []
    for n, b in enumerate(baselines):
        for phase, style in _PHASE_STYLE.items():
            rows = t[(t["baseline"] == b) & (t["phase"] == phase)].sort_values(x)
            if rows.empty:
                continue
            (line,) = ax.plot(rows[x] * x_scale, rows["speedup"], style, color=colours[b],
                              marker=BASELINE_MARKERS[n % len(BASELINE_MARKERS)], markersize=3,
                              label=f"vs {b}, {phase}")
            handles.append(line)
    ax.axhline(1.0, color="0.6", linewidth=0.6)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Mambalaya speedup")
    style_axes(ax)
    figure_title(fig, title)
    legend_below(fig, handles, ncol=2)
    return fig


def hybrid_speedup_vs_length(table: pd.DataFrame, *, model: str) -> Figure:
    """Whole-model speedup of Mambalaya over each baseline against the context length, prefill
    (solid) and decode (dashed)."""
    return _speedup_figure(table, x="seq_len", x_scale=1, log_x=True,
                           xlabel="context L (prefill tokens; decode: KV-cache tokens)",
                           title=f"{model}: speedup vs context length", what="hybrid speedup figure")


def hybrid_speedup_vs_attention_share(table: pd.DataFrame, *, model: str) -> Figure:
    """Speedup of Mambalaya over each baseline against the share of that baseline's time spent
    in attention layers, one point per (phase, L)."""
    return _speedup_figure(table, x="baseline_attention_share", x_scale=100, log_x=False,
                           xlabel="share of the baseline's time in attention layers (%)",
                           title=f"{model}: speedup vs attention share", what="hybrid attention-share figure")


__all__ = ["hybrid_speedup_vs_attention_share", "hybrid_speedup_vs_length"]
