"""Our per-Einsum cycles of unfused GEMMs against AccelForge's (its mapper searching spatial and
temporal mappings on the same weight-stationary PE array), and the export under 3.11.

The comparison needs a Python >= 3.12 with accelforge and mambalaya importable
(:func:`find_python312`) and is skipped, with the reason printed, only when none exists.
"""

from __future__ import annotations

import pytest
import yaml

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch
from mambalaya.errors import MambalayaError
from mambalaya.interop.accelforge_spatial import accelforge_gemm_cycles_via, array_arch_yaml, gemm_workload_dict
from mambalaya.cost.latency import einsum_cycles
from mambalaya.workloads import PRESETS, build_layer

SPEC = load_arch("mambalaya")
CASES = {
    # D = 2560 (10 folds of rows), E = 5120, R = 160 (160 of 256 columns), one position
    "mamba-2.8b decode, batch 1": build_layer(PRESETS["mamba-2.8b"], phase="decode", seq_len=1, batch=1),
    # heads x head dim on the columns, 128-wide B and C projections
    "mamba2-130m prefill, L 256, batch 1": build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=256, batch=1),
}


@pytest.fixture
def py312(accelforge_worker):
    """The shared AccelForge worker (tests/conftest.py); skipped, saying why, without Python >= 3.12."""
    return accelforge_worker


def test_export_is_a_weight_stationary_array_and_a_one_gemm_workload() -> None:
    arch = yaml.safe_load(array_arch_yaml(SPEC).replace("!Memory", "").replace("!Container", "").replace("!Compute", ""))
    pe = next(n for n in arch["arch"]["nodes"] if n["name"] == "ProcessingElement")
    assert [(s["fanout"], s["reuse"]) for s in pe["spatial"]] == [(256, "output"), (256, "input")]
    c = CASES["mamba-2.8b decode, batch 1"]
    wl = gemm_workload_dict(c, "DL")["workload"]
    assert wl["einsums"][0]["renames"] == {"weight": "WDL", "input": "U", "output": "DL"}
    assert wl["iteration_space_shape"]["r"] == "0 <= r < 160"
    with pytest.raises(MambalayaError, match="Einsum SS is a reduction, not a GEMM"):
        gemm_workload_dict(c, "SS")


def pinned(dataflow: str):
    """The mambalaya spec with its array pinned to one dataflow."""
    data = arch_to_dict(SPEC)
    data["compute"]["dataflows"] = [dataflow]
    return arch_from_dict(data)


@pytest.mark.parametrize("dataflow", ["weight-stationary", "output-stationary", "input-stationary"])
@pytest.mark.parametrize("case", list(CASES))
def test_gemm_cycles_equal_accelforges(py312, case, dataflow) -> None:
    """AccelForge constrained to the same dataflow (the spatial dimensions' reuse and the
    register's tensor) finds the same cycles as our spatial search, GEMM by GEMM."""
    c = CASES[case]
    gemms = [e.name for e in c.einsums if c.kind(e) == "gemm"]
    theirs = accelforge_gemm_cycles_via(py312, c, gemms, dataflow=dataflow)
    compute = pinned(dataflow).compute
    rows = []
    for g in gemms:
        ours = einsum_cycles(compute, c, c.einsum(g))[0].array_2d
        rows.append((g, ours, theirs[g]["cycles"], ours / theirs[g]["cycles"]))
    print("\n".join(f"{case} {dataflow} {g}: ours {o:.0f} cycles, AccelForge {t:.0f}, ratio {r:.3f}" for g, o, t, r in rows))
    for g, ours, af, ratio in rows:
        assert ratio == pytest.approx(1.0, rel=1e-6), (g, ours, af)  # AccelForge reports seconds in float32-ish precision
