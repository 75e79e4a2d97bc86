"""How busy are the compute units and the memory over one layer's execution? The utilisation
timeline (Figure 2b/2c)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.checks import checked_table, labels, numbers, rows_text
from mambalaya.report.figures.style import (
    COLUMN_IN,
    EDGE_COLOUR,
    NAME_PT,
    kind_handles,
    legend_below,
    new_figure,
    style_axes,
    time_unit,
    figure_title,
    kind_colour,
)
from mambalaya.report.style import text_width_in


def utilisation_timeline_figure(rows: pd.DataFrame, *, title: str) -> Figure:
    """Compute and memory-bandwidth utilisation over one layer's execution (Figure 2b/2c).

    ``rows`` has one row per Einsum with columns ``einsum``, ``kind``, ``group``, ``start_s``,
    ``end_s`` (seconds), ``compute_util`` and ``mem_util`` (fractions in [0, 1]). Einsums of
    one fusion ``group`` run together: they must share start and end, and their utilisations
    are stacked, so each row gives that Einsum's share of the unit's utilisation over the
    interval (the shares of a group add up to at most 1). A missing ``group`` (NaN/None) means
    the Einsum runs alone. Groups of several Einsums are outlined. An optional column
    ``spatial_util`` (the group's compute-weighted spatial utilisation of its PEs, the same for
    every Einsum of a group) adds a third panel: how much of the array its spatial mappings fill.
    """
    what = "utilisation timeline figure"
    cols = ("einsum", "kind", "group", "start_s", "end_s", "compute_util", "mem_util")
    df = checked_table(rows, cols, what)
    keys = ("einsum", "group")
    start = numbers(df, "start_s", what, keys, nonnegative=True)
    end = numbers(df, "end_s", what, keys)
    short = ~(end > start)
    if short.any():
        raise MambalayaError(
            f"{what}: every Einsum needs end_s > start_s; not so in {rows_text(df, short, keys, 'end_s')}"
        )
    hint = " between 0 and 1 (fractions, not percentages)"
    util = {}
    for col in ("compute_util", "mem_util"):
        u = numbers(df, col, what, keys, nonnegative=True, hint=hint)
        over = u > 1 + 1e-6
        if over.any():
            raise MambalayaError(f"{what}: column {col!r} must hold fractions{hint}; {rows_text(df, over, keys, col)}")
        util[col] = u
    names, kinds = labels(df, "einsum", what), labels(df, "kind", what)
    group_ids = [f"\0{n}\0{i}" if pd.isna(g) else str(g) for i, (n, g) in enumerate(zip(names, df["group"]))]

    span = float(end.max() - start.min())
    unit, scale = time_unit(span)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    tol = 1e-9 * max(span, 1e-300)
    for g, members in groups.items():
        s0, e0 = start[members[0]], end[members[0]]
        if any(abs(start[i] - s0) > tol or abs(end[i] - e0) > tol for i in members):
            shown = ", ".join(f"{names[i]} [{start[i]:.6g}, {end[i]:.6g}] s" for i in members[:4])
            raise MambalayaError(f"{what}: the Einsums of group {g!r} must share start_s and end_s; they have {shown}")
        for col, label in (("compute_util", "compute"), ("mem_util", "memory")):
            total = util[col][members].sum()
            if total > 1 + 1e-6:
                raise MambalayaError(
                    f"{what}: the {label} utilisations of group {g!r} ({', '.join(names[i] for i in members)}) add up "
                    f"to {total:.3g} > 1; give each Einsum its share of the group's utilisation"
                )

    spatial = "spatial_util" in rows.columns
    if spatial:
        su = numbers(df.assign(spatial_util=rows["spatial_util"].to_numpy()), "spatial_util", what, keys,
                      nonnegative=True, hint=hint)
        if (su > 1 + 1e-6).any():
            raise MambalayaError(f"{what}: column 'spatial_util' must hold fractions{hint}")
        for g, members in groups.items():
            if np.ptp(su[members]) > 1e-9:
                raise MambalayaError(f"{what}: the Einsums of group {g!r} must share spatial_util (the group's value)")
        util["spatial_util"] = su
    fig = new_figure(COLUMN_IN, 3.9 if spatial else 2.9)
    axes = fig.subplots(3 if spatial else 2, 1, sharex=True)
    panels = (("compute_util", "compute\nutilisation (%)"), ("mem_util", "memory BW\nutilisation (%)"))
    if spatial:
        panels += (("spatial_util", "PEs filled by\nspatial map (%)"),)
    tops: dict[str, dict[str, float]] = {}
    for ax, (col, ylabel) in zip(axes, panels):
        style_axes(ax)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 122)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.axhline(100, color="#999999", linewidth=0.5, linestyle=":", zorder=1)
        tops[col] = {}
        for g, members in groups.items():
            x0, width = start[members[0]] / scale, (end[members[0]] - start[members[0]]) / scale
            bottom = 0.0
            for i in (members[:1] if col == "spatial_util" else members):
                height = 100 * util[col][i]
                ax.add_patch(
                    Rectangle(
                        (x0, bottom), width, height,
                        facecolor="#9e9e9e" if col == "spatial_util" else kind_colour(kinds[i]),
                        edgecolor=EDGE_COLOUR, linewidth=0.4, zorder=2,
                    )
                )  # fmt: skip
                bottom += height
            tops[col][g] = bottom
            if len(members) > 1:
                ax.add_patch(
                    Rectangle(
                        (x0, 0), width, max(bottom, 1.5), facecolor="none", edgecolor="#111111",
                        linewidth=1.2, zorder=3, joinstyle="miter",
                    )
                )  # fmt: skip
    lo, hi = start.min() / scale, end.max() / scale
    axes[0].set_xlim(lo, hi + (hi - lo) * 0.005)
    axes[-1].set_xlabel(f"time ({unit})")
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    fig.align_ylabels(axes)

    handles = kind_handles(kinds)
    if any(len(m) > 1 for m in groups.values()):
        handles.append(Patch(facecolor="white", edgecolor="#111111", linewidth=1.2, label="fused group"))
    figure_title(fig, title)
    legend_below(fig, handles)

    # Names above the bars of the compute panel, where they fit.
    fig.draw_without_rendering()
    ax = axes[0]
    pos = ax.get_position()
    ax_w_in = pos.width * fig.get_figwidth()
    ax_h_in = pos.height * fig.get_figheight()
    xlo, xhi = ax.get_xlim()
    per_in = (xhi - xlo) / ax_w_in
    pct_per_in = 122 / ax_h_in
    text_h_in = NAME_PT / 72 * 1.15
    for g, members in groups.items():
        x0, x1 = start[members[0]] / scale, end[members[0]] / scale
        width_in = (x1 - x0) / per_in
        label = _group_label([names[i] for i in members], width_in)
        top = tops["compute_util"][g]
        if label is not None:
            ax.text((x0 + x1) / 2, top + 2, label, ha="center", va="bottom", fontsize=NAME_PT, zorder=5)
            continue
        # Too narrow for a horizontal name: try it rotated, above the bar or inside it.
        first, last = names[members[0]], names[members[-1]]
        label = "+".join(names[i] for i in members) if len(members) <= 2 else f"{first}…{last}"
        if width_in < text_h_in * 0.9:
            continue
        length = (text_width_in(label, NAME_PT) + 0.03) * pct_per_in
        if top + 2 + length <= 122:
            ax.text((x0 + x1) / 2, top + 2, label, ha="center", va="bottom", rotation=90, fontsize=NAME_PT, zorder=5)
        elif top - 2 - length >= 0:
            ax.text((x0 + x1) / 2, top - 2, label, ha="center", va="top", rotation=90, fontsize=NAME_PT, zorder=5)
    return fig


def _group_label(members: list[str], width_in: float) -> str | None:
    """The longest of 'A+B+C', 'A…C' that fits ``width_in`` inches, or None."""
    candidates = ["+".join(members)]
    if len(members) > 2:
        candidates.append(f"{members[0]}…{members[-1]}")
    for c in candidates:
        if text_width_in(c, NAME_PT) + 0.02 <= width_in:
            return c
    return None
