"""How a figure is written: PNG and SVG (text kept as text, reproducible ids) side by side."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from mambalaya.errors import MambalayaError
from mambalaya.report.style import PNG_DPI


IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def save_figure(fig: Figure, base_path: str | os.PathLike[str]) -> list[Path]:
    """Write ``fig`` to ``<base_path>.png`` (150 dpi) and ``<base_path>.svg`` (text kept as
    text), creating parent directories; return both paths. A ``.png``/``.svg``/``.pdf`` suffix
    on ``base_path`` is dropped; any other dot stays part of the name."""
    if not isinstance(fig, Figure):
        raise MambalayaError(f"save_figure: expected a matplotlib Figure, got {type(fig).__name__}")
    base = Path(base_path)
    if base.suffix.lower() in IMAGE_SUFFIXES:
        base = base.with_suffix("")
    if not base.name:
        raise MambalayaError(f"save_figure: {os.fspath(base_path)!r} has no file name")
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MambalayaError(f"save_figure: cannot create directory {str(base.parent)!r}: {err}") from err
    png = base.with_name(base.name + ".png")
    svg = base.with_name(base.name + ".svg")
    engine = fig.get_layout_engine()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mambalaya"}):
        fig.savefig(png, format="png", dpi=PNG_DPI)
        if engine is not None:  # the first save's layout (sizes in points) serves the second: laid out once
            fig.set_layout_engine("none")
        try:
            fig.savefig(svg, format="svg", metadata={"Date": None})
        finally:
            if engine is not None:
                fig.set_layout_engine(engine)
    return [png, svg]
