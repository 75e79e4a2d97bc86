"""Which tensors make each mapping's off-chip traffic? Stacked bars per mapping, by tensor."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mambalaya.errors import MambalayaError
from mambalaya.report.figures.checks import labels, numbers, ordered, checked_table
from mambalaya.report.figures.style import COLUMN_IN, LEGEND_PT, NOTE_PT, new_figure, style_axes, figure_title


#: Mapping order of the traffic figure; other mappings follow in order of appearance.
MAPPING_ORDER: tuple[str, ...] = ("unfused", "ssm-ri", "stitched", "optimal", "ideal")

#: Qualitative colours of the tensors in the traffic figure; "other" is grey.
TENSOR_COLOURS: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#f1ce63", "#86bcb6", "#d37295",
)  # fmt: skip
OTHER_COLOUR = "#bdbdbd"


def traffic_by_tensor_figure(df: pd.DataFrame, *, title: str, top: int = 12) -> Figure:
    """Stacked bars of off-chip traffic (GB = 10⁹ bytes) per mapping, split by tensor.

    ``df`` has columns ``mapping``, ``tensor``, ``role`` (e.g. "input", "weight",
    "intermediate"), ``read_bytes`` and ``write_bytes`` (non-negative); rows repeating a
    (mapping, tensor) pair are added. Mappings are ordered unfused, ssm-ri, stitched, optimal,
    ideal (others after, as they come). The ``top`` tensors with the most traffic over all
    mappings get their own colour; the rest are summed as "other".
    """
    what = "traffic figure"
    data = checked_table(df, ("mapping", "tensor", "role", "read_bytes", "write_bytes"), what)
    if not isinstance(top, (int, np.integer)) or top < 1:
        raise MambalayaError(f"{what}: top must be a positive integer, got {top!r}")
    keys = ("mapping", "tensor")
    total = numbers(data, "read_bytes", what, keys, nonnegative=True) + numbers(
        data, "write_bytes", what, keys, nonnegative=True
    )
    mapping_col, tensor_col = labels(data, "mapping", what), labels(data, "tensor", what)
    role_col = ["" if pd.isna(r) else str(r) for r in data["role"]]
    mappings = ordered(mapping_col, MAPPING_ORDER)

    table = pd.DataFrame({"mapping": mapping_col, "tensor": tensor_col, "bytes": total})
    per = table.groupby(["mapping", "tensor"], sort=False)["bytes"].sum()
    overall = table.groupby("tensor", sort=False)["bytes"].sum().sort_values(ascending=False, kind="stable")
    chosen = [t for t in overall.index[:top] if overall[t] > 0] or list(overall.index[:1])
    rest = [t for t in overall.index if t not in chosen]
    roles: dict[str, str] = {}
    for t, r in zip(tensor_col, role_col):
        roles.setdefault(t, r)
    stacks = chosen + (["other"] if rest and overall[rest].sum() > 0 else [])
    shown_roles = [roles[t] for t in chosen if roles[t]]
    common = max(sorted(set(shown_roles)), key=shown_roles.count) if shown_roles else ""  # not noted

    gb = 1e9
    heights = np.zeros((len(stacks), len(mappings)))
    for j, m in enumerate(mappings):
        for i, t in enumerate(chosen):
            heights[i, j] = per.get((m, t), 0.0) / gb
        if len(stacks) > len(chosen):
            heights[-1, j] = sum(per.get((m, t), 0.0) for t in rest) / gb

    fig = new_figure(COLUMN_IN, 2.6)
    ax = fig.add_subplot()
    style_axes(ax)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.5, zorder=0)
    xs = np.arange(len(mappings))
    bottom = np.zeros(len(mappings))
    handles = []
    for i, t in enumerate(stacks):
        colour = OTHER_COLOUR if t == "other" else TENSOR_COLOURS[i % len(TENSOR_COLOURS)]
        ax.bar(xs, heights[i], 0.62, bottom=bottom, color=colour, edgecolor="white", linewidth=0.4, zorder=2)
        bottom += heights[i]
        if t == "other":
            label = f"other ({len(rest)} tensors)"
        else:
            label = t if roles[t] in ("", common) else f"{t} ({roles[t]})"
        handles.append(Patch(facecolor=colour, edgecolor="white", linewidth=0.4, label=label))
    peak = bottom.max() if bottom.max() > 0 else 1.0
    for x, h in zip(xs, bottom):
        ax.text(x, h + peak * 0.015, f"{h:.3g}", ha="center", va="bottom", fontsize=NOTE_PT, zorder=4)
    ax.set_xticks(xs, mappings)
    ax.set_xlim(-0.6, len(mappings) - 0.4)
    ax.set_ylim(0, peak * 1.12)
    ax.set_ylabel("off-chip traffic (GB)")
    ax.set_xlabel("mapping")
    figure_title(fig, title)
    ax.legend(
        handles=handles[::-1],  # top of the stack first
        title="tensor",
        title_fontsize=LEGEND_PT - 0.5,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=LEGEND_PT - 0.5,
        frameon=False,
        handlelength=1.0,
        handletextpad=0.4,
        labelspacing=0.3,
        alignment="left",
    )
    _fit_xticklabels(fig, ax)
    return fig


def _fit_xticklabels(fig: Figure, ax) -> None:
    """Slant the x tick labels if, laid out, any two of them touch."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    if any(a.x1 + 2 > b.x0 for a, b in zip(boxes, boxes[1:])):
        for t in ax.get_xticklabels():
            t.set_rotation(25)
            t.set_ha("right")
            t.set_rotation_mode("anchor")
