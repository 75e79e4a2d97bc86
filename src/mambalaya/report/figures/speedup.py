"""How much faster is mambalaya than each baseline, against sequence length and end to end, and
how far from the published ratios?"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.checks import labels, match_rows, numbers, ordered, published_items, checked_table
from mambalaya.report.figures.placement import Placer
from mambalaya.report.figures.style import (
    AXIS_PT,
    COLUMN_IN,
    NAME_PT,
    NOTE_PT,
    legend_below,
    new_figure,
    style_axes,
    figure_title,
)


#: Phase order of the speedup figure.
PHASE_ORDER: tuple[str, ...] = ("prefill", "generation", "decode")

#: Line/bar colours of the baselines (others cycle through BASELINE_CYCLE).
BASELINE_COLOURS: dict[str, str] = {"marca-ideal": "#1f77b4", "geens-ideal": "#d62728"}
BASELINE_CYCLE: tuple[str, ...] = ("#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
BASELINE_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P")


def baseline_colours(baselines: Sequence[str]) -> dict[str, str]:
    """Colour of each baseline: fixed for the paper's baselines, cycled for others."""
    out: dict[str, str] = {}
    spare = iter(BASELINE_CYCLE * (1 + len(baselines) // len(BASELINE_CYCLE)))
    for b in baselines:
        out[b] = BASELINE_COLOURS.get(b) or next(spare)
    return out


def _fmt_ratio(value: float) -> str:
    return f"{value:.3g}×"


def _pow2_axis(ax, values: np.ndarray) -> None:
    """A log2 x axis with ticks labelled 2^k at the powers of two spanned by ``values``."""
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(values.min())), math.ceil(math.log2(values.max()))
    step = max(1, math.ceil((hi - lo + 1) / 10))
    ax.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(lo, hi + 1, step)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"$2^{{{round(math.log2(x))}}}$" if x > 0 else ""))
    pad = 2.0**0.3
    ax.set_xlim(2.0**lo / pad, 2.0**hi * pad)


def speedup_figure(df: pd.DataFrame, *, title: str, published: Mapping[str, float] | None = None) -> Figure:
    """Speedup of mambalaya over each baseline against sequence length, one panel per phase.

    ``df`` has columns ``seq_len`` (tokens, positive), ``baseline`` (e.g. "marca-ideal"),
    ``phase`` ("prefill", "generation", ...) and ``speedup`` (baseline latency / mambalaya
    latency, positive). ``published`` maps keys ``"<phase> vs <baseline>"`` (e.g.
    ``"prefill vs marca-ideal"``) to the paper's ratio, drawn as a dashed line labelled
    "published 4.9×" in that phase's panel; every phase named must be in ``df``.
    """
    what = "speedup figure"
    data = checked_table(df, ("seq_len", "baseline", "phase", "speedup"), what)
    keys = ("baseline", "phase")
    seq = numbers(data, "seq_len", what, keys, positive=True)
    speed = numbers(data, "speedup", what, keys, positive=True)
    baselines = ordered(labels(data, "baseline", what))
    phase_col = labels(data, "phase", what)
    phases = ordered(phase_col, PHASE_ORDER)
    base_col = [str(b) for b in data["baseline"]]
    marks = []
    for left, right, value, key in published_items(published, what):
        marks.append((match_rows(left, phases, key, what, "phase"), right, value))
    colours = baseline_colours(baselines + [r for _, r, _ in marks if r not in baselines])

    every = np.concatenate([speed, [m[2] for m in marks], [1.0]])
    log_y = every.max() / every.min() > 30

    fig = new_figure(COLUMN_IN, 0.95 + 1.3 * len(phases))
    axes = np.atleast_1d(fig.subplots(len(phases), 1, sharex=True, squeeze=False)[:, 0])
    for k, (ax, phase) in enumerate(zip(axes, phases)):
        style_axes(ax)
        ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
        _pow2_axis(ax, seq)
        ax.axhline(1.0, color="#555555", linewidth=0.7, zorder=1)
        for j, b in enumerate(baselines):
            sel = np.array([p == phase and bb == b for p, bb in zip(phase_col, base_col)])
            if not sel.any():
                continue
            o = np.argsort(seq[sel])
            ax.plot(
                seq[sel][o], speed[sel][o], color=colours[b], marker=BASELINE_MARKERS[j % len(BASELINE_MARKERS)],
                markersize=3.2, linewidth=1.1, zorder=3,
            )  # fmt: skip
        here = sorted((v, b) for p, b, v in marks if p == phase)
        sel_phase = np.array([p == phase for p in phase_col])
        values = np.concatenate([speed[sel_phase], [v for v, _ in here], [1.0]])
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(values.min() / 1.6, values.max() * 1.8)
        else:
            ax.set_ylim(0, values.max() * 1.18)
        ax.set_ylabel("speedup (×)")
        ax.set_title(phase, fontsize=AXIS_PT, loc="left", pad=2)
        if k < len(axes) - 1:
            ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel("sequence length L (tokens)")

    handles: list = [
        Line2D([], [], color=colours[b], marker=BASELINE_MARKERS[j % len(BASELINE_MARKERS)], markersize=3.2,
               linewidth=1.1, label=f"vs {b}")
        for j, b in enumerate(baselines)
    ]  # fmt: skip
    if marks:
        handles.append(Line2D([], [], color="#555555", linewidth=0.9, linestyle=(0, (4, 2)), label="published"))
    figure_title(fig, title)
    legend_below(fig, handles)
    fig.draw_without_rendering()
    for ax, phase in zip(axes, phases):
        _published_lines(ax, sorted((v, b) for p, b, v in marks if p == phase), colours)
    return fig


def _published_lines(ax, marks: list[tuple[float, str]], colours: Mapping[str, str]) -> None:
    """Dashed lines at each published value, each labelled "published 4.9×" at whichever end,
    above or below, hides the least of the data and of the other labels."""
    for value, baseline in marks:
        ax.axhline(value, color=colours[baseline], linewidth=0.9, linestyle=(0, (4, 2)), zorder=2)
    if not marks:
        return
    placer = Placer(ax)
    for line in ax.lines:
        x, y = (np.asarray(v, dtype=float) for v in line.get_data())
        if line.get_marker() not in (None, "None", "none", ""):
            placer.add_markers(x, y, radius_pt=2.5)
        if line.get_linestyle() != "None" and len(x) > 1:
            placer.add_line(x, y, transform=line.get_transform())
    for value, baseline in marks:
        spots = [(1.0, "right", 1.5, "bottom"), (0.0, "left", 1.5, "bottom"), (1.0, "right", -1.5, "top"),
                 (0.0, "left", -1.5, "top")]  # fmt: skip
        placer.best_artist(
            lambda spot: ax.annotate(
                f"published {_fmt_ratio(value)}", (spot[0], value), xycoords=("axes fraction", "data"),
                xytext=(-2 if spot[1] == "right" else 2, spot[2]), textcoords="offset points", ha=spot[1],
                va=spot[3], fontsize=NOTE_PT, color=colours[baseline], zorder=5,
            ),
            spots,
        )  # fmt: skip


def end_to_end_figure(df: pd.DataFrame, *, published: Mapping[str, float] | None, title: str) -> Figure:
    """Grouped bars of end-to-end speedup of mambalaya per model and baseline.

    ``df`` has columns ``model`` (e.g. "Mamba-1"), ``baseline`` and ``speedup`` (positive; one
    row per pair). ``published`` maps ``"<model> vs <baseline>"`` to the paper's ratio, drawn
    as a diamond beside that bar; every model named must be in ``df``.
    """
    what = "end-to-end figure"
    data = checked_table(df, ("model", "baseline", "speedup"), what)
    speed = numbers(data, "speedup", what, ("model", "baseline"), positive=True)
    model_col, base_col = labels(data, "model", what), labels(data, "baseline", what)
    models, baselines = ordered(model_col), ordered(base_col)
    seen: set[tuple[str, str]] = set()
    for m, b in zip(model_col, base_col):
        if (m, b) in seen:
            raise MambalayaError(f"{what}: more than one row for model {m!r} and baseline {b!r}")
        seen.add((m, b))
    marks: dict[tuple[str, str], float] = {}
    for left, right, value, key in published_items(published, what):
        m = match_rows(left, models, key, what, "model")
        b = match_rows(right, baselines, key, what, "baseline")
        marks[(m, b)] = value
    colours = baseline_colours(baselines)

    fig = new_figure(COLUMN_IN, 2.5)
    ax = fig.add_subplot()
    style_axes(ax)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
    slot = 0.8 / len(baselines)
    bar_w = slot * (0.62 if marks else 0.85)
    value = {(m, b): s for m, b, s in zip(model_col, base_col, speed)}
    top = max(list(speed) + list(marks.values()) + [1.0])
    for j, b in enumerate(baselines):
        for i, m in enumerate(models):
            if (m, b) not in value:
                continue
            x = i - 0.4 + slot * (j + 0.5) - (slot - bar_w) / 2 * (1 if marks else 0)
            v = value[(m, b)]
            ax.bar(x, v, width=bar_w, color=colours[b], edgecolor="#222222", linewidth=0.5, zorder=2)
            ax.text(x, v + top * 0.015, _fmt_ratio(v), ha="center", va="bottom", fontsize=NOTE_PT, zorder=4)
            if (m, b) in marks:
                px, pv = x + bar_w / 2 + (slot - bar_w) / 2, marks[(m, b)]
                ax.plot(
                    px, pv, linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                    markeredgecolor="#111111", markeredgewidth=0.8, zorder=4,
                )  # fmt: skip
                ax.annotate(
                    _fmt_ratio(pv), (px, pv), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=NAME_PT, color="#333333", style="italic", zorder=4,
                )  # fmt: skip
    ax.axhline(1.0, color="#555555", linewidth=0.7, zorder=1)
    ax.set_xticks(range(len(models)), models)
    ax.set_xlim(-0.55, len(models) - 0.45)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("end-to-end speedup (×)")
    handles: list = [
        Patch(facecolor=colours[b], edgecolor="#222222", linewidth=0.5, label=f"vs {b}") for b in baselines
    ]
    if marks:
        handles.append(
            Line2D([], [], linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                   markeredgecolor="#111111", markeredgewidth=0.8, label="published")
        )  # fmt: skip
    figure_title(fig, title)
    legend_below(fig, handles)
    return fig
