"""Lower bounds on the cost of every connected convex group of a cascade, computed over all of
them at once from per-Einsum and per-tensor facts, without a group's candidate table: what lets
the convex search (:mod:`mambalaya.search.convex_search`) cost only the groups that could be in an
optimal grouping and stay exact.

* **Off-chip bytes.** Whatever its tiles, a group reads each tensor it takes from off chip at
  least once and writes each tensor it hands on once: the bytes of
  :func:`~mambalaya.cost.traffic.untiled_traffic`, which every tiling's traffic includes (a
  loop only multiplies a term by trips of at least one; residency saves at most the repeats).
  A tensor read by several members is charged the least any one of its readers reads alone
  (their union reads at least that).
* **Compute cycles.** A group's cycles at a tiling add its Einsums' unit cycles at the step
  shapes of that tiling. A group tiles only ranks every member writes, so each member's step
  shapes are among those of the member alone (the same tile options per rank, the full size
  among them): per Einsum and unit, the least over its own grid bounds it in any group. With
  units that overlap, the group's cycles are at least the largest unit's sum of those least
  cycles; with units in series, the sum of each Einsum's least total.
* **Latency** is :func:`~mambalaya.search.picks.row_latencies`' formula at those bounds with one
  step and no on-chip Einsum bytes: every term of it grows with the traffic, the cycles and
  the on-chip bytes, and the pipeline terms of several steps only add.
* **Energy** (:func:`energy_lower_bounds`) adds what every tiling spends at least: each member's
  arithmetic, special-function and register energy run once (a member that re-runs per tile
  spends more, :func:`~mambalaya.cost.energy.compute_energy_pj`), the off-chip bytes' bound at
  the DRAM's and staging levels' energy per byte, no buffer access, and the leakage over the
  latency's bound (:mod:`mambalaya.cost.energy`: every term grows with the runs, the bytes and
  the latency).

``tests/test_convex.py`` checks each bound against the costs the search finds for every group
of the Mamba-1 and both Mamba-2 layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mambalaya.arch.keys import spec_key
from mambalaya.einsum.cascade import Cascade
from mambalaya.search.candidates import cost_model, tileable_ranks
from mambalaya.search.candidates import einsum_grid_cycles
from mambalaya.search.convex import ConvexSpace
from mambalaya.search.picks import row_latencies
from mambalaya.cost.area import leakage_w
from mambalaya.cost.energy import compute_energy_pj, movement_pj_per_byte, staging_pj_per_byte
from mambalaya.cost.traffic import written_bytes, untiled_traffic
from mambalaya.einsum.stats import einsum_ops


def traffic_lower_bounds(cascade: Cascade, space: ConvexSpace) -> np.ndarray:
    """Per group of ``space`` (in its order), the least off-chip bytes any tiling moves;
    memoised on the cascade per space (a sweep searches one layer at many buffers and
    bandwidths). Read-only: the caller must not write to it."""
    return _on_cascade(cascade, "_traffic_bounds_memo", (id(space),), space, lambda: _traffic_bounds(cascade, space))


def _on_cascade(cascade: Cascade, memo_name: str, key: tuple, space: ConvexSpace, make: Any) -> np.ndarray:
    """A bound array memoised on ``cascade`` under ``key`` (which holds ``id(space)``: the space
    is kept with it, so its id is never reused while the entry lives), made read-only."""
    memo = cascade.__dict__.setdefault(memo_name, {})
    hit = memo.get(key)
    if hit is None:
        bounds = make()
        bounds.flags.writeable = False
        hit = memo[key] = (space, bounds)
    return hit[1]


def _traffic_bounds(cascade: Cascade, space: ConvexSpace) -> np.ndarray:
    masks = space.masks
    bit = {n: 1 << i for i, n in enumerate(space.names)}
    # (tensor, is it a member's own earlier value) -> [readers mask, producer mask, least bytes]
    reads: dict[tuple[str, bool], list[Any]] = {}
    for name in space.names:
        for tensor, nbytes in untiled_traffic(cascade, (name,))[0].items():
            own = tensor == name
            entry = reads.setdefault((tensor, own), [0, 0 if own else bit.get(tensor, 0), nbytes])
            entry[0] |= bit[name]
            entry[2] = min(entry[2], nbytes)
    total = np.zeros(masks.size)
    for readers, producer, nbytes in reads.values():
        total += np.where((masks & readers != 0) & (masks & producer == 0), nbytes, 0.0)
    handed_back = set(cascade.output_tensors())
    for name in space.names:
        consumers = sum(bit[c.name] for c in cascade.consumers(name) if c.name != name)
        member = masks & bit[name] != 0
        leaves = member if name in handed_back else member & (consumers & ~masks != 0)
        total += np.where(leaves, written_bytes(cascade, name, 1), 0.0)
    return total


def cycles_lower_bounds(cascade: Cascade, space: ConvexSpace, compute: Any) -> np.ndarray:
    """Per group of ``space``, the fewest compute cycles any tiling takes on ``compute``;
    memoised on the cascade per space and compute section (read-only, like the traffic's)."""
    return _on_cascade(cascade, "_cycles_bounds_memo", (id(space), spec_key(compute)), space,
                       lambda: _cycles_bounds(cascade, space, compute))


def _cycles_bounds(cascade: Cascade, space: ConvexSpace, compute: Any) -> np.ndarray:
    unit_least = {k: np.zeros(len(space.names)) for k in ("array", "vector", "mfu", "total")}
    for i, name in enumerate(space.names):
        a, b, c = _einsum_least_cycles(cascade, name, compute)
        unit_least["array"][i], unit_least["vector"][i], unit_least["mfu"][i], unit_least["total"][i] = a, b, c[0], c[1]
    member = (space.masks[:, None] >> np.arange(len(space.names)) & 1).astype(float)
    if compute.overlap_compute_units:
        return np.maximum(np.maximum(member @ unit_least["array"], member @ unit_least["vector"]), member @ unit_least["mfu"])
    return member @ unit_least["total"]


def _einsum_least_cycles(cascade: Cascade, name: str, compute: Any) -> tuple[float, float, tuple[float, float]]:
    """One Einsum's least array, vector and (MFU, total) cycles over its own grid of tilings,
    memoised on the cascade per compute section."""
    memo = cascade.__dict__.setdefault("_least_cycles_memo", {})
    key = (spec_key(compute), name)
    if key not in memo:
        ranks = tileable_ranks(cascade, [name])
        tiles = cost_model(cascade, [name], ranks).grid()[0]
        cyc = {k: np.asarray(v, dtype=float) for k, v in einsum_grid_cycles(compute, cascade, name, ranks, tiles).items()}
        array = cyc["array_2d"] + cyc["array_1d"]
        total = array + cyc["vector"] + cyc["mfu"]
        memo[key] = (float(array.min()), float(cyc["vector"].min()), (float(cyc["mfu"].min()), float(total.min())))
    return memo[key]


def latency_lower_bounds(arch: Any, traffic_bytes: np.ndarray, cycles: np.ndarray) -> np.ndarray:
    """Seconds no tiling of each group beats on ``arch``, from its traffic and cycle bounds: the
    picks' latency (:func:`~mambalaya.search.picks.row_latencies`) at one step and no on-chip
    Einsum bytes, every term of which grows with the traffic, the cycles and those bytes."""
    one = np.ones_like(cycles)
    return row_latencies(arch, traffic_bytes, one, cycles, one, np.zeros_like(cycles))


def energy_lower_bounds(arch: Any, cascade: Cascade, space: ConvexSpace) -> np.ndarray:
    """Picojoules no tiling of each group spends on ``arch`` (which has an energy section): its
    members' arithmetic run once, its off-chip bytes' bound moved through DRAM and the staging
    levels, and the leakage over its latency's bound (see the module doc)."""
    traffic = traffic_lower_bounds(cascade, space)
    latency = latency_lower_bounds(arch, traffic, cycles_lower_bounds(cascade, space, arch.compute))
    arithmetic = np.array([compute_energy_pj(arch, cascade, n, einsum_ops(cascade, cascade.einsum(n)))
                           for n in space.names])
    member = (space.masks[:, None] >> np.arange(len(space.names)) & 1).astype(float)
    dram_pj, _, _ = movement_pj_per_byte(arch)
    return member @ arithmetic + traffic * (dram_pj + staging_pj_per_byte(arch)) + leakage_w(arch) * latency * 1e12


__all__ = ["cycles_lower_bounds", "energy_lower_bounds", "latency_lower_bounds", "traffic_lower_bounds"]
