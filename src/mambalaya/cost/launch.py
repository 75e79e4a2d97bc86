"""A GPU kernel's launch grid and what it costs when the grid does not fill the GPU.

A kernel launches thread blocks over some ranks of its Einsums, each block a tile of them
(FlashAttention-2: a block per 128 queries, per head, per sequence; FLA's chunk-state kernel: a
block per 32 or 64 value channels, per head, looping over the chunks inside the block). The
number of blocks is the product of each rank's tiles. A grid of fewer blocks than SMs runs on
that many SMs only (:func:`mambalaya.arch.kernels.grid_shares`): the group's compute and on-chip
seconds grow by the share it leaves idle, its off-chip seconds by what its SMs cannot keep in
flight. A group without a grid is taken to fill the GPU, as every group of an evaluation is.

**Blocks read their own tiles** (:func:`block_reread_bytes`). Each block reads from off chip the
tiles of its inputs that its part of the grid needs; a tensor whose accesses do not mention a
grid rank is read again by every tile of that rank (FlashAttention's keys by each query block;
the SSD chunk-scan kernel's ``C·B`` scores, shared by a chunk's heads, by each head's blocks).
Such a re-read comes from the L2 when the blocks launched between the two reads of a tile (the
blocks of the grid's ranks launched faster, in launch order) are no more than the GPU runs at once
(one per SM at least: they read it together) or read no more than the L2 holds; else from DRAM. The grid's ranks are listed in launch order, the fastest-varying block index
first (CUDA's ``blockIdx.x`` before ``y`` before ``z``, and within one axis the index its code
takes modulo the others first).

**Every read crosses the L2's port** (:func:`block_rereads`): a re-read the L2 serves costs no
DRAM time, but it passes the L2's SM-facing port as every DRAM byte does, so a staging level's
seconds count the group's off-chip bytes and all its blocks' re-reads, from DRAM or from the L2,
at the level's bandwidth (``memory.levels``). A tile re-read by blocks on other SMs is taken to
come from the L2, not from an SM's L1 (an upper bound on the L2's bytes where two blocks that
read one tile share an SM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambalaya.arch.kernels import array_share, grid_shares, offchip_bytes_per_s
from mambalaya.cost.latency import combine, group_compute_s, group_totals, onchip_seconds
from mambalaya.cost.traffic import untiled_traffic
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import rank_of_variable
from mambalaya.errors import SpecError
from mambalaya.fusion.mapping import FusionGroup


@dataclass(frozen=True)
class Launch:
    """The ranks a kernel launches thread blocks over, each with its block's tile of it, in launch
    order (the fastest-varying block index first)."""

    tiles: tuple[tuple[str, int], ...]

    def thread_blocks(self, cascade: Cascade) -> int:
        """The grid's size: the product over its ranks of ceil(rank size / tile)."""
        return math.prod(self.trips(cascade))

    def trips(self, cascade: Cascade) -> tuple[int, ...]:
        """Per grid rank, in launch order, the blocks along it: ceil(rank size / tile)."""
        for rank, tile in self.tiles:
            if rank not in cascade.ranks:
                raise SpecError(f"the launch grid names rank {rank!r}, which {cascade.name} does not have "
                                f"(its ranks: {', '.join(cascade.ranks)})")
            if tile < 1:
                raise SpecError(f"the launch grid's tile of rank {rank} is {tile}; a tile is at least 1")
        return tuple(-(-cascade.size(rank) // tile) for rank, tile in self.tiles)


def cache_bytes(arch) -> int:
    """Bytes a re-read tile can be found in on its way from DRAM: the outermost staging level's
    capacity (a GPU's L2; 0 without a staging level, every re-read from DRAM)."""
    levels = list(arch.memory.levels.values())
    return levels[0].capacity_bytes if levels else 0


@dataclass(frozen=True)
class BlockRereads:
    """The bytes a launch's blocks read beyond the group's own reads (:func:`block_rereads`):
    those that come again from DRAM, and those the L2 serves."""

    dram_bytes: float
    cache_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.dram_bytes + self.cache_bytes


def block_rereads(arch, cascade: Cascade, group: FusionGroup, launch: Launch) -> BlockRereads:
    """Bytes the blocks of ``launch`` read beyond the group's own reads (see the module doc):
    per tensor the group reads from off chip, its bytes times, for each grid rank its accesses in
    the group do not mention, that rank's blocks, less the bytes read once. A re-read comes from
    DRAM where the blocks launched between two reads of one of its tiles are more than the GPU's
    SMs (``kernels.sm_count``; they do not run together) and read more than :func:`cache_bytes`;
    else the L2 serves it."""
    reads, _ = untiled_traffic(cascade, group.einsums)
    trips = launch.trips(cascade)
    mentioned = {t: _mentioned(cascade, group, t) for t in reads}
    per_block = sum(b / math.prod(n for (r, _), n in zip(launch.tiles, trips) if r in mentioned[t])
                    for t, b in reads.items())
    held = cache_bytes(arch)
    kernels = getattr(arch, "kernels", None)
    together = kernels.sm_count if kernels is not None and kernels.sm_count is not None else 1
    missed = [math.prod(trips[:k]) > together and math.prod(trips[:k]) * per_block > held for k in range(len(trips))]
    dram = every = 0.0
    for t, b in reads.items():
        unmentioned = [k for k, ((r, _), _) in enumerate(zip(launch.tiles, trips)) if r not in mentioned[t]]
        dram += b * (math.prod(trips[k] for k in unmentioned if missed[k]) - 1)
        every += b * (math.prod(trips[k] for k in unmentioned) - 1)
    return BlockRereads(dram, every - dram)


def block_reread_bytes(arch, cascade: Cascade, group: FusionGroup, launch: Launch) -> float:
    """Off-chip bytes the blocks of ``launch`` read again from DRAM (:func:`block_rereads`)."""
    return block_rereads(arch, cascade, group, launch).dram_bytes


def _mentioned(cascade: Cascade, group: FusionGroup, tensor: str) -> frozenset[str]:
    """The ranks of the variables of the group's accesses to ``tensor`` (its own ranks where no
    member reads it directly: an initial value read with the tensor it starts)."""
    found = {rank_of_variable(v) for n in group.einsums for a in cascade.einsum(n).inputs if a.tensor == tensor
             for v in a.variables}
    return frozenset(found) if found else frozenset(cascade.tensors[tensor].ranks)


def launched_group_seconds(arch, cascade: Cascade, group: FusionGroup, launch: Launch | None,
                           sync_mma: bool = False) -> float:
    """The latency of ``group`` as one kernel launched on ``launch``'s grid: its compute and
    on-chip seconds over the share of SMs the grid occupies, its off-chip seconds (its reads
    and writes and its blocks' re-reads from DRAM, :func:`block_reread_bytes`) over the share of
    bandwidth those SMs draw (:func:`~mambalaya.arch.kernels.grid_shares`); without a grid, the
    group's latency as every evaluation costs it; its staging levels' seconds count every
    re-read too, from DRAM or from the L2 (every read crosses the L2's port). With ``sync_mma`` the kernel issues the
    synchronous MMA instruction: its array contractions run at the spec's ``sync_mma_fraction``
    of the peak (:func:`~mambalaya.arch.kernels.array_share`; the same where the spec has none)."""
    totals = group_totals(arch, cascade, group)
    share = array_share(arch, sync_mma)
    if launch is None and share == 1.0:
        return totals.latency
    comp = totals.comp_latency if share == 1.0 else group_compute_s(arch, cascade, group, share)
    if launch is None:
        compute_share, offchip_share, mem, onchip = 1.0, 1.0, totals.mem_latency, totals.onchip_latency
    else:
        compute_share, offchip_share = grid_shares(arch, launch.thread_blocks(cascade))
        again = block_rereads(arch, cascade, group, launch)
        mem = totals.mem_latency + again.dram_bytes / offchip_bytes_per_s(arch)
        buffer_bytes = totals.buffer.total_bytes if totals.buffer is not None else 0.0
        onchip = float(onchip_seconds(arch, buffer_bytes, totals.traffic.total_bytes + again.total_bytes))
    latency, _ = combine(arch, comp / compute_share, mem / offchip_share,
                         onchip / compute_share, totals.steps, len(group.einsums))
    return float(latency)


__all__ = ["BlockRereads", "Launch", "block_reread_bytes", "block_rereads", "cache_bytes", "launched_group_seconds"]
