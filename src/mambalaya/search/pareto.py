"""The traffic-buffer trade-off of a layer: the optimal mapping's off-chip traffic at each
buffer size (``mambalaya fusion pareto``)."""

from __future__ import annotations

from dataclasses import dataclass

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.search.mappings import optimal
from mambalaya.cost.traffic import group_traffic


@dataclass(frozen=True)
class ParetoPoint:
    buffer_bytes: int
    footprint_bytes: float
    traffic_bytes: float
    groups: int


def pareto_frontier(cascade: Cascade, buffers: list[int] | None = None) -> list[ParetoPoint]:
    """Optimal traffic at each buffer size (default 64 KiB .. 4 GiB in factors of 2), keeping
    the points no smaller buffer matches."""
    buffers = buffers or [1 << k for k in range(16, 33)]
    points: list[ParetoPoint] = []
    for cap in sorted(buffers):
        try:
            m = optimal(cascade, cap)
        except SpecError:
            continue
        groups = [group_traffic(cascade, g) for g in m.groups]
        traffic = sum(g.total_bytes for g in groups)
        fp = max(g.footprint_bytes for g in groups)
        if points and traffic >= points[-1].traffic_bytes:
            continue
        points.append(ParetoPoint(cap, fp, traffic, len(groups)))
    return points


__all__ = ["ParetoPoint", "pareto_frontier"]
