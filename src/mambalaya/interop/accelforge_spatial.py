"""Per-Einsum latency of unfused GEMMs in AccelForge, an independent check of our spatial model.

For one GEMM of a cascade (an Einsum reducing against a weight) this module writes a one-Einsum
AccelForge workload and an architecture with the arch spec's PE array as a weight-stationary
fanout, the layout of AccelForge's own TPU example (``examples/arches/tpu_v4i.yaml``): DRAM and a
global buffer of unbounded size and bandwidth (so that only compute counts), a
``ProcessingElement`` container with two spatial dimensions (``array_rows`` PEs that must
*reuse the output*, i.e. take reduced ranks, and ``array_cols`` PEs that must *reuse the
input*, i.e. take the weight's output ranks), a one-weight register per PE and a MAC doing one
multiply-accumulate per cycle at ``clock_hz``. AccelForge's mapper then searches the spatial
and temporal mapping for least latency, and its model gives the latency.

Needs Python >= 3.12 with ``accelforge`` (see :func:`mambalaya.interop.accelforge_worker.find_python312`);
:func:`accelforge_gemm_cycles_via` runs it from another interpreter.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import MambalayaError


#: Per dataflow: what each spatial dimension must reuse (rows, cols) and the tensor the PE's
#: register keeps, as our model places them (mambalaya.cost.spatial): weight-stationary puts
#: the reduced ranks on the rows (reusing the output) and the weight-only ranks on the columns
#: (reusing the input); output-stationary the activation-only ranks (reusing the weight) and
#: the weight-only ranks; input-stationary the reduced and the activation-only ranks.
DATAFLOW_PLACEMENT = {
    "weight-stationary": ("output", "input", "weight"),
    "output-stationary": ("weight", "input", "output"),
    "input-stationary": ("output", "weight", "input"),
}


def array_arch_yaml(spec: Any, dataflow: str = "weight-stationary") -> str:
    """AccelForge architecture: the spec's PE array in one dataflow, at its clock."""
    c = spec.compute
    rows_reuse, cols_reuse, kept = DATAFLOW_PLACEMENT[dataflow]
    return f"""# AccelForge architecture exported by mambalaya from arch spec {spec.name!r}: a
# {c.array_rows}x{c.array_cols} {dataflow} PE array at {spec.clock_hz:g} Hz; memories unbounded
arch:
  nodes:
  - !Memory
    name: MainMemory
    size: inf
    leak_power: 0
    area: 0
    actions:
    - {{name: read, energy: 0, throughput: inf}}
    - {{name: write, energy: 0, throughput: inf}}
    tensors: {{keep: ~Intermediates, may_keep: All}}
  - !Memory
    name: GlobalBuffer
    size: inf
    leak_power: 0
    area: 0
    actions:
    - {{name: read, energy: 0, throughput: inf}}
    - {{name: write, energy: 0, throughput: inf}}
    tensors: {{keep: ~MainMemory.tensors, may_keep: All}}
  - !Container
    name: ProcessingElement
    spatial:
    - {{name: rows, fanout: {c.array_rows}, reuse: {rows_reuse}}}
    - {{name: cols, fanout: {c.array_cols}, reuse: {cols_reuse}}}
  - !Memory
    name: Register
    size: {kept}.bits_per_value if {kept} else 0
    area: 0
    leak_power: 0
    actions:
    - {{name: read, energy: 0, throughput: inf}}
    - {{name: write, energy: 0, throughput: inf}}
    tensors: {{keep: {kept}}}
  - !Compute
    name: MAC
    leak_power: 0
    area: 0
    actions:
    - {{name: compute, energy: 1, throughput: {spec.clock_hz:g}}}
"""


def gemm_workload_dict(cascade: Cascade, name: str) -> dict:
    """A one-Einsum AccelForge workload for GEMM ``name`` (the product only: a bias add is
    elementwise work our model puts on the 1D mode)."""
    e = cascade.einsum(name)
    if cascade.kind(e) != "gemm":
        raise MambalayaError(f"Einsum {name} is a {cascade.kind(e)}, not a GEMM (a reduction against a weight)")
    weight = activation = None
    reduced = set(e.reduced_variables)
    for a in e.inputs:
        if not reduced & set(a.variables):
            continue
        if cascade.tensors[a.tensor].role == Role.WEIGHT:
            weight = a
        else:
            activation = a
    if weight is None or activation is None:
        raise MambalayaError(f"Einsum {name}: no weight-activation product found")
    for a in (weight, activation):
        if any(idx.plain_variable is None for idx in a.indices):
            raise MambalayaError(f"Einsum {name}: {a} is not indexed by plain variables; AccelForge export needs them")
    variables = list(dict.fromkeys([*e.output_variables, *e.reduced_variables]))
    sizes = cascade.variable_sizes
    return {
        "workload": {
            "iteration_space_shape": {v: f"0 <= {v} < {sizes[v]}" for v in variables},
            "bits_per_value": {"All": max(cascade.tensors[t].bits for t in (weight.tensor, activation.tensor, name))},
            "einsums": [{
                "name": name,
                "tensor_accesses": [
                    {"name": activation.tensor, "projection": [str(idx) for idx in activation.indices]},
                    {"name": weight.tensor, "projection": [str(idx) for idx in weight.indices]},
                    {"name": name, "projection": list(e.output_variables), "output": True},
                ],
                "renames": {"weight": weight.tensor, "input": activation.tensor, "output": name},
            }],
        }
    }


def gemm_cycles_inputs(cascade: Cascade, names: list[str], spec: Any,
                       dataflow: str = "weight-stationary") -> dict:
    """Everything AccelForge reads to time each GEMM of ``names`` alone on ``spec``'s array in
    ``dataflow``, as text (no AccelForge needed): ``{"arch", "workloads": {name: YAML},
    "clock_hz"}``."""
    return {
        "arch": array_arch_yaml(spec, dataflow),
        "workloads": {name: yaml.safe_dump(gemm_workload_dict(cascade, name), sort_keys=False) for name in names},
        "clock_hz": spec.clock_hz,
    }


def run_gemm_cycles(inputs: dict) -> dict[str, dict[str, Any]]:
    """AccelForge's latency (in cycles of the inputs' clock) of each GEMM alone, with the mapping
    its mapper chose: ``{name: {"cycles", "seconds", "spatial", "mapper_s"}}`` (Python >= 3.12
    with accelforge)."""
    try:
        import accelforge as af
        from accelforge.mapper.FFM.main import map_workload_to_arch
    except ImportError as err:  # pragma: no cover - environment
        raise MambalayaError(f"AccelForge is not importable here ({err}); use accelforge_gemm_cycles_via") from None
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mambalaya-af-lat-") as tmp:
        arch = Path(tmp, "arch.yaml")
        arch.write_text(inputs["arch"], encoding="utf-8")
        for name, workload in inputs["workloads"].items():
            wl = Path(tmp, f"{name}.yaml")
            wl.write_text(workload, encoding="utf-8")
            s = af.Spec.from_yaml(str(arch), str(wl))
            s.mapper.metrics = af.Metrics.LATENCY  # the mapper minimises latency
            t0 = time.perf_counter()
            found = map_workload_to_arch(s, print_progress=False, eval_in_detail=False)
            mapper_s = time.perf_counter() - t0
            row = found.data.iloc[0]
            seconds = float(row["Total<SEP>latency"])
            mapping = row["Total<SEP>mapping"]()
            spatial = [_spatial_text(n) for n in mapping.nodes if type(n).__name__ == "Spatial"]
            out[name] = {"cycles": seconds * inputs["clock_hz"], "seconds": seconds, "spatial": spatial,
                         "mapper_s": mapper_s}
    return out


def accelforge_gemm_cycles(cascade: Cascade, names: list[str], spec: Any,
                           dataflow: str = "weight-stationary") -> dict[str, dict[str, Any]]:
    """:func:`run_gemm_cycles` on :func:`gemm_cycles_inputs` in this interpreter."""
    return run_gemm_cycles(gemm_cycles_inputs(cascade, names, spec, dataflow))


def _spatial_text(node: Any) -> str:
    text = str(node)  # e.g. "Spatial(k, in [0..256) shape=1, rows, ProcessingElement)"
    inner = text[text.find("(") + 1 : text.rfind(")")]
    parts = [p.strip() for p in inner.split(",")]
    return f"{parts[0]} over {parts[-2]}" if len(parts) >= 3 else text


def accelforge_gemm_cycles_via(accelforge: Any, cascade: Cascade, names: list[str], arch: str = "mambalaya",
                               dataflow: str = "weight-stationary") -> dict[str, dict[str, Any]]:
    """:func:`accelforge_gemm_cycles` with AccelForge in another interpreter (``accelforge``: a
    Python >= 3.12 with accelforge and this mambalaya, an
    :class:`~mambalaya.interop.accelforge_worker.AccelForgeWorker` or
    :class:`~mambalaya.interop.accelforge_worker.AccelForgeRecords`): the inputs are made here
    from the arch spec named ``arch`` and go over as text."""
    from mambalaya.arch import load_arch
    from mambalaya.interop.accelforge_worker import call_accelforge

    return call_accelforge(accelforge, "gemm_cycles", gemm_cycles_inputs(cascade, names, load_arch(arch), dataflow))


__all__ = ["accelforge_gemm_cycles", "accelforge_gemm_cycles_via", "array_arch_yaml", "gemm_cycles_inputs",
           "gemm_workload_dict", "run_gemm_cycles"]
