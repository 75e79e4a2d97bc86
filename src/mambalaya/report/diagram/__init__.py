"""A cascade drawn as a dataflow graph, in the style of Figure 1 of the Mambalaya paper.

Every tensor that is not a weight is a box showing its name, ranks and shape. The box of a
tensor an Einsum writes stands for that Einsum: it carries the Einsum's number
(:meth:`Cascade.position`) and kind. Data flows top to bottom: an edge runs from each tensor an
Einsum reads to the Einsum's box, dashed when the read is of an initial value (incoming state);
a recurrence is a loop on the left of its box, labelled with the generational rank. Weights
are drawn small and grey beside each Einsum that reads them.

The layout (:func:`layout_cascade`) is computed here, without graphviz: tensors are layered by
the longest path from the inputs (sources sit just above their first reader), long edges get a
virtual node in every layer they cross, a few barycentre sweeps order each layer to reduce
crossings, and x positions are pulled towards the mean of their neighbours while keeping the
order and spacing of each layer (an isotonic regression per layer). Lengths are in inches, so
the figure is sized from the layout and text sizes are real.

One module per question: :mod:`.graph` (what is shown: boxes, edges, weights),
:mod:`.layout` (where each box goes), :mod:`.arrows` (how each read is routed and labelled)
and :mod:`.draw` (the figure drawn and saved, :func:`draw_cascade`).

Figures are made with :class:`matplotlib.figure.Figure` and the Agg canvas; nothing here
touches pyplot or changes matplotlib's global backend.
"""

from mambalaya.report.diagram.draw import GROUP_COLORS, SAVE_FORMATS, draw_cascade
from mambalaya.report.diagram.graph import Edge, EdgeKey, graph_edges, graph_nodes, tensor_category, weight_reads
from mambalaya.report.diagram.layout import (
    BOX_GAP,
    BOX_H,
    DETAIL_PT,
    DUMMY_W,
    HEADER_PT,
    LABEL_PT,
    LAYER_GAP,
    LEGEND_PT,
    LOOP_W,
    MARGIN,
    NAME_PT,
    TITLE_PT,
    WEIGHT_ARROW,
    WEIGHT_DETAIL_PT,
    WEIGHT_GAP,
    WEIGHT_NAME_PT,
    Layout,
    assign_layers,
    assign_x,
    compute_layout,
    layout_cascade,
    order_layers,
)
from mambalaya.report.style import CATEGORY_STYLE, PNG_DPI

__all__ = [
    "BOX_GAP",
    "BOX_H",
    "CATEGORY_STYLE",
    "DETAIL_PT",
    "DUMMY_W",
    "Edge",
    "EdgeKey",
    "GROUP_COLORS",
    "HEADER_PT",
    "LABEL_PT",
    "LAYER_GAP",
    "LEGEND_PT",
    "LOOP_W",
    "Layout",
    "MARGIN",
    "NAME_PT",
    "PNG_DPI",
    "SAVE_FORMATS",
    "TITLE_PT",
    "WEIGHT_ARROW",
    "WEIGHT_DETAIL_PT",
    "WEIGHT_GAP",
    "WEIGHT_NAME_PT",
    "assign_layers",
    "assign_x",
    "compute_layout",
    "draw_cascade",
    "graph_edges",
    "graph_nodes",
    "layout_cascade",
    "order_layers",
    "tensor_category",
    "weight_reads",
]
