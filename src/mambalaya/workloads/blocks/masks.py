"""The causal mask that several layers read as a constant input: ``0`` where a column is at or
before its row (``s <= q``, ``t <= i``), ``-inf`` above the diagonal, added to scores before a
softmax or an exponent. Mamba-2's and the gated delta rule's chunked forms (``LM[Q,S]``) and
attention (``CM[I,T]``, and the ``AMK`` of the Falcon-H1 and Zamba2 layers) share it.

A builder that reads a mask also declares it on the tensor (:class:`~mambalaya.einsum.ir.Mask`,
the helpers below), so that the cost model skips the work it makes dead
(:mod:`mambalaya.einsum.dead_work`); a test checks every shipped declaration against these
values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from mambalaya.einsum.ir import Mask, TensorSpec

#: The gated delta rule's strictly lower mask ``SL[Q,S]``: 1 where ``s < q``, 0 elsewhere.
STRICTLY_LOWER = Mask(col="S", row="Q", upper=-1, dead=0.0)
#: The identity ``EYE[Q,S]``: 1 where ``s = q``, 0 elsewhere.
DIAGONAL = Mask(col="S", row="Q", lower=0, upper=0, dead=0.0)


def causal_band(row: str, col: str) -> Mask:
    """A causal mask in log space over ``[row, col]`` (:func:`causal_mask`)."""
    return Mask(col=col, row=row, upper=0)


def key_blocks(*, first: int, keys: int | None = None) -> Mask:
    """The blocked softmax's key mask over ``[I, TB, TQ]`` (:func:`key_block_mask`): causal
    from query position ``first``, or, with ``keys``, only the padded keys past ``keys``."""
    if keys is not None:
        return Mask(col="TB", block="TQ", upper=keys - 1)
    return Mask(col="TB", row="I", block="TQ", upper=0, offset=first)


def with_masks(tensors: dict[str, TensorSpec], masks: Mapping[str, Mask]) -> dict[str, TensorSpec]:
    """``tensors`` with each mask of ``masks`` declared on the tensor of its name (those present)."""
    return {name: replace(spec, mask=masks[name]) if name in masks else spec for name, spec in tensors.items()}


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


__all__ = ["DIAGONAL", "STRICTLY_LOWER", "causal_band", "causal_mask", "key_block_mask", "key_blocks", "with_masks"]
