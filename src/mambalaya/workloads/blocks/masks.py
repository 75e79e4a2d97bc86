"""The causal mask that several layers read as a constant input: ``0`` where a column is at or
before its row (``s <= q``, ``t <= i``), ``-inf`` above the diagonal, added to scores before a
softmax or an exponent. Mamba-2's and the gated delta rule's chunked forms (``LM[Q,S]``) and
attention (``CM[I,T]``, and the ``AMK`` of the Falcon-H1 and Zamba2 layers) share it."""

from __future__ import annotations

import numpy as np


def causal_mask(rows: int, cols: int) -> np.ndarray:
    """A ``rows x cols`` float64 mask: 0 on and below the diagonal, ``-inf`` above it."""
    mask = np.zeros((rows, cols))
    mask[np.triu_indices(rows, k=1, m=cols)] = -np.inf
    return mask


__all__ = ["causal_mask"]
