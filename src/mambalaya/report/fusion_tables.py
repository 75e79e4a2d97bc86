"""Tables of fusion mappings: groups with their loops and footprint, traffic per tensor."""

from __future__ import annotations

from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.mapping_file import mapping_to_dict
from mambalaya.cost.traffic import MappingTraffic


def group_rows(traffic: MappingTraffic) -> list[dict[str, Any]]:
    rows = []
    for g in traffic.groups:
        rows.append(
            {
                "group": g.group,
                "einsums": ",".join(g.einsums),
                "loops": " ".join(f"{r}/{t}" for r, t in g.loops) or "-",
                "steps": g.steps,
                "read_bytes": sum(g.read_bytes.values()),
                "write_bytes": sum(g.write_bytes.values()),
                "footprint_bytes": g.footprint_bytes,
            }
        )
    rows.append(
        {
            "group": "total",
            "einsums": "",
            "loops": "",
            "steps": sum(g.steps for g in traffic.groups),
            "read_bytes": traffic.read_bytes,
            "write_bytes": traffic.write_bytes,
            "footprint_bytes": traffic.peak_footprint_bytes,
        }
    )
    return rows


def tensor_rows(cascade: Cascade, traffic: MappingTraffic) -> list[dict[str, Any]]:
    rows = []
    for t, (r, w) in traffic.by_tensor.items():
        if not cascade.nbytes(t):  # a declared mask: made from the indices, it moves and holds nothing
            continue
        rows.append(
            {
                "tensor": t,
                "role": cascade.tensors[t].role.value,
                "size_bytes": cascade.nbytes(t),
                "read_bytes": r,
                "write_bytes": w,
                "times_size": round((r + w) / cascade.nbytes(t), 4),
            }
        )
    return sorted(rows, key=lambda row: -(row["read_bytes"] + row["write_bytes"]))


def mapping_json(cascade: Cascade, traffic: MappingTraffic, provenance: dict[str, Any]) -> dict[str, Any]:
    return {
        "provenance": provenance,
        "mapping": mapping_to_dict(traffic.mapping),
        "groups": [
            {
                "name": g.group,
                "einsums": list(g.einsums),
                "loops": [{"rank": r, "tile": t} for r, t in g.loops],
                "steps": g.steps,
                "read_bytes": g.read_bytes,
                "write_bytes": g.write_bytes,
                "footprint_bytes": g.footprint_bytes,
            }
            for g in traffic.groups
        ],
        "tensors": tensor_rows(cascade, traffic),
        "totals": {
            "offchip_bytes": traffic.offchip_bytes,
            "read_bytes": traffic.read_bytes,
            "write_bytes": traffic.write_bytes,
            "peak_footprint_bytes": traffic.peak_footprint_bytes,
            "groups": len(traffic.groups),
        },
    }
