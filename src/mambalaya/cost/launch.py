"""A GPU kernel's launch grid and what it costs when the grid does not fill the GPU.

A kernel launches thread blocks over some ranks of its Einsums, each block a tile of them
(FlashAttention-2: a block per 128 queries, per head, per sequence; FLA's chunk-state kernel: a
block per 32 or 64 value channels, per head, looping over the chunks inside the block). The
number of blocks is the product of each rank's tiles. A grid of fewer blocks than SMs runs on
that many SMs only (:func:`mambalaya.arch.kernels.grid_shares`): the group's compute and on-chip
seconds grow by the share it leaves idle, its off-chip seconds by what its SMs cannot keep in
flight. A group without a grid is taken to fill the GPU, as every group of an evaluation is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambalaya.arch.kernels import array_share, grid_shares
from mambalaya.cost.latency import combine, group_compute_s, group_totals
from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.fusion.mapping import FusionGroup


@dataclass(frozen=True)
class Launch:
    """The ranks a kernel launches thread blocks over, each with its block's tile of it."""

    tiles: tuple[tuple[str, int], ...]

    def thread_blocks(self, cascade: Cascade) -> int:
        """The grid's size: the product over its ranks of ceil(rank size / tile)."""
        for rank, tile in self.tiles:
            if rank not in cascade.ranks:
                raise SpecError(f"the launch grid names rank {rank!r}, which {cascade.name} does not have "
                                f"(its ranks: {', '.join(cascade.ranks)})")
            if tile < 1:
                raise SpecError(f"the launch grid's tile of rank {rank} is {tile}; a tile is at least 1")
        return math.prod(-(-cascade.size(rank) // tile) for rank, tile in self.tiles)


def launched_group_seconds(arch, cascade: Cascade, group: FusionGroup, launch: Launch | None,
                           sync_mma: bool = False) -> float:
    """The latency of ``group`` as one kernel launched on ``launch``'s grid: its compute and
    on-chip seconds over the share of SMs the grid occupies, its off-chip seconds over the share
    of bandwidth those SMs draw (:func:`~mambalaya.arch.kernels.grid_shares`); without a grid,
    the group's latency as every evaluation costs it. With ``sync_mma`` the kernel issues the
    synchronous MMA instruction: its array contractions run at the spec's ``sync_mma_fraction``
    of the peak (:func:`~mambalaya.arch.kernels.array_share`; the same where the spec has none)."""
    totals = group_totals(arch, cascade, group)
    share = array_share(arch, sync_mma)
    if launch is None and share == 1.0:
        return totals.latency
    comp = totals.comp_latency if share == 1.0 else group_compute_s(arch, cascade, group, share)
    compute_share, offchip_share = (1.0, 1.0) if launch is None else grid_shares(arch, launch.thread_blocks(cascade))
    latency, _ = combine(arch, comp / compute_share, totals.mem_latency / offchip_share,
                         totals.onchip_latency / compute_share, totals.steps, len(group.einsums))
    return float(latency)


__all__ = ["Launch", "launched_group_seconds"]
