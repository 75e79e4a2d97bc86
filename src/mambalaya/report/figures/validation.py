"""Does the model predict measured GPU kernels? Predicted and speed-of-light times against the
published measurements (``mambalaya validate``)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from mambalaya.report.figures.checks import checked_table


def validation_figure(df: pd.DataFrame) -> Figure:
    """Log-log predicted (and speed-of-light) time against the measured time, one point per
    case, with the line where they agree: a speed of light must lie on or below it."""
    df = checked_table(df, ["case", "measured_ms", "predicted_ms", "speed_of_light_ms", "arch"], "validation figure")
    fig = Figure(figsize=(6.0, 5.0))  # no pyplot state: nothing to close
    ax = fig.subplots()
    for arch, rows in df.groupby("arch", sort=True):
        ax.scatter(rows["measured_ms"], rows["predicted_ms"], marker="o", label=f"predicted ({arch})")
        ax.scatter(rows["measured_ms"], rows["speed_of_light_ms"], marker="v", facecolors="none",
                   edgecolors="black", label=f"speed of light ({arch})")
    lo = min(df[["measured_ms", "predicted_ms", "speed_of_light_ms"]].min()) * 0.7
    hi = max(df[["measured_ms", "predicted_ms", "speed_of_light_ms"]].max()) * 1.4
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (ms)", ylabel="model (ms)",
           title="Published GPU kernel timings against the model")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


__all__ = ["validation_figure"]
