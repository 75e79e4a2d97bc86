"""The evaluation figures of the Mambalaya paper, drawn from plain tables.

Each figure function takes a :class:`pandas.DataFrame` with the columns its docstring names,
checks it, and returns a :class:`matplotlib.figure.Figure` (Agg canvas) sized for one column of
a two-column paper; :func:`save_figure` writes it as PNG and SVG. The experiment modules compute
the numbers; nothing here models hardware.

One module per question a figure answers:

* :mod:`.roofline`: is each Einsum bound by compute or by memory, unfused and fused (Figure 2a)?
* :mod:`.timeline`: how busy are compute and memory over one layer's execution (Figure 2b/2c)?
* :mod:`.speedup`: how much faster is mambalaya than each baseline, against L and end to end?
* :mod:`.traffic`: which tensors make each mapping's off-chip traffic?
* :mod:`.latency`: where does each design's layer latency go, Einsum by Einsum?

and what they share: :mod:`.checks` (is the table drawable?), :mod:`.style` (sizes, fonts,
kind colours, title, legend, time units), :mod:`.placement` (where a label goes without hiding
data) and :mod:`.save` (PNG and SVG).

Conventions shared by every figure:

* quantities are in SI base units: seconds, bytes, operations per second, bytes per second;
  utilisations are fractions in [0, 1]. The figures choose display units (µs or ms, GB, ...);
* Einsums are coloured by kind with the colours of the cascade diagram
  (:data:`mambalaya.report.style.CATEGORY_STYLE`);
* bad input (no rows, a missing column, a value that cannot be drawn) raises
  :class:`~mambalaya.errors.MambalayaError` naming the figure, the column and offending rows;
* legends sit outside the axes, so they never hide data.

Nothing here touches pyplot or matplotlib's global state.
"""

from mambalaya.report.figures.latency import latency_breakdown_figure
from mambalaya.report.figures.roofline import SERIES_MARKERS, roofline_figure
from mambalaya.report.figures.save import IMAGE_SUFFIXES, save_figure
from mambalaya.report.figures.speedup import (
    BASELINE_COLOURS,
    BASELINE_CYCLE,
    BASELINE_MARKERS,
    PHASE_ORDER,
    baseline_colours,
    end_to_end_figure,
    speedup_figure,
)
from mambalaya.report.figures.style import (
    AXIS_PT,
    COLUMN_IN,
    EDGE_COLOUR,
    KIND_LEGEND,
    LEGEND_PT,
    NAME_PT,
    NOTE_PT,
    TICK_PT,
    TITLE_PT,
    UNKNOWN_KIND_COLOUR,
    kind_colour,
)
from mambalaya.report.figures.timeline import utilisation_timeline_figure
from mambalaya.report.figures.traffic import MAPPING_ORDER, OTHER_COLOUR, TENSOR_COLOURS, traffic_by_tensor_figure

__all__ = [
    "AXIS_PT",
    "BASELINE_COLOURS",
    "BASELINE_CYCLE",
    "BASELINE_MARKERS",
    "COLUMN_IN",
    "EDGE_COLOUR",
    "IMAGE_SUFFIXES",
    "KIND_LEGEND",
    "LEGEND_PT",
    "MAPPING_ORDER",
    "NAME_PT",
    "NOTE_PT",
    "OTHER_COLOUR",
    "PHASE_ORDER",
    "SERIES_MARKERS",
    "TENSOR_COLOURS",
    "TICK_PT",
    "TITLE_PT",
    "UNKNOWN_KIND_COLOUR",
    "baseline_colours",
    "end_to_end_figure",
    "kind_colour",
    "latency_breakdown_figure",
    "roofline_figure",
    "save_figure",
    "speedup_figure",
    "traffic_by_tensor_figure",
    "utilisation_timeline_figure",
]
