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


def key_block_mask(rows: int, blocks: int, block: int, *, first: int = 0, keys: int | None = None) -> np.ndarray:
    """The blocked softmax's key mask ``[rows, blocks, block]`` (float64): ``0`` where key
    ``tb*block + tq`` is at or before query ``first + i`` (``first``: the query's absolute
    position offset, the cache length in decode), ``-inf`` for a later key, which includes
    every padded key past the last real one (the last real key is the last query's). With
    ``keys`` (a non-causal block of that many keys), ``0`` for every real key, ``-inf`` for the
    padded ones only."""
    index = np.arange(blocks * block).reshape(1, blocks, block)
    if keys is not None:
        return np.broadcast_to(np.where(index < keys, 0.0, -np.inf), (rows, blocks, block)).copy()
    queries = (np.arange(rows) + first).reshape(rows, 1, 1)
    return np.where(index <= queries, 0.0, -np.inf)


__all__ = ["causal_mask", "key_block_mask"]
