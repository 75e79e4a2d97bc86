"""Tables of cascade statistics: rows for a terminal table or CSV, and a JSON document."""

from __future__ import annotations

from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.stats import CascadeStats, EinsumStats


def _ops_text(ops: dict[str, int]) -> str:
    return " ".join(f"{k}={v:,}" for k, v in ops.items()) or "-"


def cascade_rows(stats: CascadeStats) -> list[dict[str, Any]]:
    """One flat row per Einsum plus a ``total`` row (layer totals)."""
    rows = []
    for s in stats.einsums:
        rows.append(
            {
                "#": s.number,
                "einsum": s.name,
                "kind": s.kind,
                "expression": s.expression,
                "iteration_ranks": ",".join(s.iteration_ranks),
                "macs": s.macs,
                "other_ops": _ops_text({k: v for k, v in s.ops.items() if k != "mac"}),
                "ops_total": s.ops_total,
                "runs": s.runs or "all",
                "read_bytes": s.read_bytes,
                "write_bytes": s.write_bytes,
                "intensity": round(s.intensity, 4),
            }
        )
    t = stats.totals
    rows.append(
        {
            "#": "",
            "einsum": "total",
            "kind": "",
            "expression": f"layer; x{stats.n_layers} layers: {t['model_ops_total']:,} ops",
            "iteration_ranks": "",
            "macs": t["macs"],
            "other_ops": _ops_text({k[4:]: int(v) for k, v in t.items() if k.startswith("ops_") and k not in ("ops_mac", "ops_total")}),
            "ops_total": t["ops_total"],
            "runs": "",
            "read_bytes": t["read_bytes"],
            "write_bytes": t["write_bytes"],
            "intensity": round(t["intensity"], 4),
        }
    )
    return rows


def _einsum_json(cascade: Cascade, s: EinsumStats) -> dict[str, Any]:
    e = cascade.einsum(s.name)
    return {
        "number": s.number,
        "name": s.name,
        "expression": s.expression,
        "kind": s.kind,
        "output": e.name,
        "output_ranks": list(s.output_ranks),
        "iteration_ranks": list(s.iteration_ranks),
        "reduced_ranks": [v.upper() for v in e.reduced_variables],
        "reduce_op": e.reduce_op,
        "generational_rank": cascade.generational_rank(e),
        "inputs": [{"tensor": a.tensor, "indices": [str(i) for i in a.indices]} for a in e.inputs],
        "initial_values": list(cascade.initial_reads(e)),
        "ops": dict(s.ops),
        "ops_total": s.ops_total,
        "runs": s.runs or "all",
        "read_elements": dict(s.read_elements),
        "read_bytes_by_tensor": dict(s.read_bytes_by_tensor),
        "read_bytes": s.read_bytes,
        "write_elements": s.write_elements,
        "write_bytes": s.write_bytes,
        "intensity": s.intensity,
    }


def cascade_json(stats: CascadeStats, *, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole cascade with its statistics, for ``--format json``."""
    c = stats.cascade
    return {
        "cascade": c.name,
        "description": c.description,
        "provenance": provenance or {},
        "params": dict(c.params),
        "ranks": {r.name: {"size": r.size, "expr": r.size_expr} for r in c.ranks.values()},
        "tensors": {
            t.name: {
                "ranks": list(t.ranks),
                "shape": list(c.shape(t.name)),
                "role": t.role.value,
                "bits": t.bits,
                "initial": t.initial,
                "updates": t.updates,
            }
            for t in c.tensors.values()
        },
        "einsums": [_einsum_json(c, s) for s in stats.einsums],
        "totals": dict(stats.totals),
    }
