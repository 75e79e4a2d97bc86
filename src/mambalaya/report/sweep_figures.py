"""Figures of a sweep store: Pareto frontiers of buffer against latency, and speedup heat maps."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from mambalaya.errors import MambalayaError


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def pareto_points(df: pd.DataFrame, x: str, y: str = "latency_s") -> pd.DataFrame:
    """The points no other point beats on both ``x`` and ``y`` (smaller is better)."""
    d = df[[x, y]].dropna().sort_values([x, y])
    keep, best = [], math.inf
    for idx, row in d.iterrows():
        if row[y] < best:
            keep.append(idx)
            best = row[y]
    return df.loc[keep].sort_values(x)


WORKLOAD = ("model", "phase", "seq_len", "batch")


def axis_label(column: str) -> str:
    """A store column as an axis label, its unit once: ``latency_s`` -> ``latency (s)``,
    ``buffer_bytes`` -> ``buffer (MiB)`` (the ticks' unit; it read ``latency s (s)`` and
    ``buffer bytes (bytes)`` beside ticks in MiB)."""
    for suffix, unit in (("_bytes", "MiB"), ("_s", "s"), ("_j", "J"), ("_w", "W")):
        if column.endswith(suffix):
            return f"{column[:-len(suffix)].replace('_', ' ')} ({unit})"
    return column.replace("_", " ")


def pareto_figure(df: pd.DataFrame, *, x: str = "buffer_bytes", y: str = "latency_s", by: str = "arch", title: str,
                  max_panels: int = 4) -> Figure:
    """One panel per workload (model, phase, L, batch): every point, and each design's frontier."""
    ok = df[df.status == "ok"] if "status" in df else df
    if ok.empty:
        raise MambalayaError("the store has no successful points to plot")
    for col in (x, y, by, *WORKLOAD):
        if col not in ok:
            raise MambalayaError(f"the store has no column {col!r} (columns: {', '.join(ok.columns)})")
    workloads = list(ok.groupby(list(WORKLOAD)))
    shown = workloads[:max_panels]
    fig = _figure(4.2 * len(shown), 4.0)
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    colours = ["#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]
    designs = sorted(map(str, ok[by].unique()))
    for ax, (wl, w) in zip(axes, shown):
        for design, d in w.groupby(by):
            c = colours[designs.index(str(design)) % len(colours)]
            ax.scatter(d[x], d[y], s=10, color=c, alpha=0.3, linewidths=0)
            front = pareto_points(d, x, y)
            ax.step(front[x], front[y], where="post", color=c, lw=2, label=str(design))
            ax.scatter(front[x], front[y], s=24, color=c, edgecolors="black", linewidths=0.5, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        values = sorted(float(v) for v in w[x].unique())
        if len(values) <= 12:  # a tick at each value swept (a range inside one decade had none)
            ax.set_xticks(values)
            ax.xaxis.set_minor_locator(NullLocator())
        if x.endswith("_bytes"):
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2**20:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        ax.set_title(f"{wl[0]} {wl[1]} L={wl[2]} B={wl[3]}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best", title="frontier per design", title_fontsize=7)
    more = f" (first {len(shown)} of {len(workloads)} workloads)" if len(workloads) > len(shown) else ""
    fig.suptitle(title + more, fontsize=10)
    return fig


def _order(values) -> list:
    """Sort axis values numerically when they are numbers or quantities a sweep reads (byte
    sizes, bandwidths, frequencies: ``10 TB/s`` after ``900 GB/s``, which text order reversed),
    else as text."""
    from mambalaya.arch.quantities import BANDWIDTH_UNITS, BYTE_UNITS, HZ_UNITS, parse_float_quantity

    def key(v):
        try:
            return (0, float(v))
        except (TypeError, ValueError):
            pass
        for units in (BYTE_UNITS, BANDWIDTH_UNITS, HZ_UNITS):
            try:
                return (0, float(parse_float_quantity(v, units, "a quantity")))
            except Exception:  # noqa: BLE001 - not this kind of quantity
                continue
        return (1, str(v))

    return sorted(values, key=key)


#: What a heat map's axis shows for a point that leaves the field at the design's own value.
DESIGNS_OWN = "(each design's own)"


def check_plot_axes(x: str, y: str, *, inputs: list[str] | None = None, by: str = "arch") -> None:
    """Refuse heat-map axes ``x`` and ``y`` that cannot make one: the same field twice, or (given
    the store's ``inputs``) a field that is not one of the points' inputs, or the ``by`` field
    the speedup compares (its designs are the ratio, not an axis)."""
    if x == y:
        raise MambalayaError(f"--x and --y both name {x!r}: a heat map needs two different input fields")
    if inputs is None:
        return
    axes = [c for c in inputs if c != by]
    for option, field in (("--x", x), ("--y", y)):
        if field == by:
            raise MambalayaError(f"{option} {field!r}: the designs are what the speedup compares, not an axis; "
                                 f"name one of the store's input fields: {', '.join(axes)}")
        if field not in inputs:
            raise MambalayaError(f"{option} {field!r} is not an input field of the store; its input fields are: "
                                 f"{', '.join(axes)}")


def speedup_table(df: pd.DataFrame, *, x: str, y: str, baseline: str, design: str, inputs: list[str],
                  by: str = "arch") -> pd.DataFrame:
    """Geometric-mean speedup of ``design``'s whole-model latency over ``baseline``'s per (x, y),
    over every other axis and the points both ran (``compare``'s speedup: over several devices,
    the transfers included); ``inputs`` names the columns that are the points' inputs (a point is
    matched with the baseline's point of equal other inputs: the caller leaves out the hash of the
    files a point names, which two designs' files never share); ``x`` and ``y`` two of them
    (:func:`check_plot_axes`). A point leaving an axis field at the design's own value is shown as
    :data:`DESIGNS_OWN` (such rows were dropped)."""
    check_plot_axes(x, y, inputs=inputs, by=by)
    if design == baseline:
        raise MambalayaError(f"--design and --baseline both name {design!r}: the speedup of a design over itself is 1")
    ok = df[df.status == "ok"] if "status" in df else df
    for col in (x, y):
        if col not in ok:
            raise MambalayaError(f"the store has no column {col!r} (columns: {', '.join(ok.columns)})")
    designs = set(ok[by])
    for d in (baseline, design):
        if d not in designs:
            raise MambalayaError(f"no successful points for {by}={d!r} (have: {', '.join(sorted(map(str, designs)))})")
    inputs = [c for c in inputs if c in ok.columns and c != by]
    ok = ok.assign(**{c: ok[c].astype(object).where(ok[c].notna(), DESIGNS_OWN) for c in (x, y)})
    base = ok[ok[by] == baseline].set_index(inputs)["model_latency_s"]
    mine = ok[ok[by] == design].set_index(inputs)["model_latency_s"]
    joined = pd.concat([base.rename("base"), mine.rename("mine")], axis=1, join="inner").dropna().reset_index()
    if joined.empty:
        raise MambalayaError(f"{design!r} and {baseline!r} share no points with equal other inputs")
    joined["log_speedup"] = np.log(joined["base"] / joined["mine"])
    table = joined.groupby([y, x])["log_speedup"].mean().map(np.exp).unstack(x)
    return table.loc[_order(table.index), _order(table.columns)]


def speedup_heatmap_figure(table: pd.DataFrame, *, x: str, y: str, title: str) -> Figure:
    fig = _figure(1.6 + 0.9 * len(table.columns), 1.4 + 0.5 * len(table.index))
    ax = fig.add_subplot()
    data = table.to_numpy(dtype=float)
    im = ax.imshow(data, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(table.columns)), [str(c) for c in table.columns], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(table.index)), [str(i) for i in table.index], fontsize=8)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}×", ha="center", va="center", fontsize=8,
                    color="white" if v < np.nanmean(data) else "black")
    fig.colorbar(im, ax=ax, label="speedup (×)")
    ax.set_title(title, fontsize=9, wrap=True)
    return fig
