"""The look every drawing of mambalaya shares: the colour of each Einsum kind (the boxes of the
cascade diagram, the bars and markers of the figures), the PNG resolution, and the width of a
text as the Agg renderer draws it (to size boxes, wrap titles and fit labels).
"""

from __future__ import annotations

from functools import lru_cache

from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.font_manager import FontProperties


#: Box categories in legend order: (face colour, legend text).
CATEGORY_STYLE: dict[str, tuple[str, str]] = {
    "input": ("#c9daf8", "input / incoming state"),
    "gemm": ("#f6b26b", "GEMM with a weight"),
    "recurrent": ("#e88080", "recurrent (scan)"),
    "window": ("#ffe599", "window (causal conv)"),
    "reduction": ("#9fd3cc", "reduction"),
    "elementwise": ("#b6d7a8", "elementwise / broadcast / copy"),
    "unary": ("#c5b6e3", "unary / nonlinear"),
    "weight": ("#eeeeee", "weight"),
}

#: The box category (a key of CATEGORY_STYLE) of each Einsum kind.
KIND_CATEGORY: dict[str, str] = {
    "recurrent": "recurrent",
    "window": "window",
    "gemm": "gemm",
    "reduction": "reduction",
    "unary": "unary",
    "broadcast": "elementwise",
    "elementwise": "elementwise",
    "copy": "elementwise",
}

#: Resolution of every PNG written (the cascade diagram and the figures).
PNG_DPI = 150


@lru_cache(maxsize=4096)
def text_width_in(text: str, size: float, weight: str = "normal", style: str = "normal") -> float:
    """Width of a one-line text in inches, measured with the Agg renderer."""
    renderer = RendererAgg(8, 8, 72)
    prop = FontProperties(size=size, weight=weight, style=style)
    width, _, _ = renderer.get_text_width_height_descent(text, prop, ismath=False)
    return float(width) / 72.0
