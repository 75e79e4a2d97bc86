"""Property: a sweep spec mutated from a valid one (wrong types, NaN/inf, fractional sizes, huge
numbers, empty lists, text for numbers, a field in both 'fixed' and 'grid') either loads to
points whose every field has its type, or is one SpecError of one paragraph naming a field it
changed. No point is evaluated: every check happens when the spec is read."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambalaya.errors import SpecError
from mambalaya.experiments import sweep
from mambalaya.experiments.sweep_spec import MAX_POINT_SIZE, PHASES, POINT_KEYS, POINT_MAPPINGS, load_sweep_spec

VALID: dict[str, Any] = {
    "name": "props",
    "chunk_size": 4,
    "grid": {
        "arch": ["mambalaya", "marca-ideal"],
        "model": ["mamba-130m"],
        "phase": ["prefill", "decode"],
        "seq_len": [256, 1024],
        "batch": [2],
        "memory.onchip_buffer_bytes": ["8MiB", 16777216],
        "clock_hz": [1.0e9],
    },
    "fixed": {"compute.mfu_units": 16, "mapping": "default", "compute.one_d_mode": True},
}

#: Fields a mutation may name: the spec's own, other point and architecture fields, and names
#: that are no field at all.
FIELDS = [*POINT_KEYS, "memory.onchip_buffer_bytes", "memory.offchip_bandwidth_bytes_per_s", "clock_hz",
          "compute.mfu_units", "compute.array_rows", "compute.one_d_mode", "compute.unary_cost_cycles",
          "compute.unary_cost_cycles.exp", "power_budget_w", "precision", "energy.dram_pj_per_bit", "sources",
          "compute", "bandwidth", "memory.nothing"]

#: Values each field may take (mutations that keep a spec valid are tried as often as odd ones).
FAIR_VALUES: dict[str, list[Any]] = {
    "arch": ["mambalaya", "marca-ideal", "geens-ideal"], "model": ["mamba-130m", "mamba2-130m"],
    "phase": ["prefill", "decode"], "seq_len": [1, 512, 2048], "batch": [1, 8], "mapping": ["default", "unfused"],
    "memory.onchip_buffer_bytes": ["16MiB", 2**24, 64], "memory.offchip_bandwidth_bytes_per_s": [1.5e12, "2039 GB/s"],
    "clock_hz": ["1GHz", 2.0e9], "compute.mfu_units": [0, 8], "compute.array_rows": [64, 256],
    "compute.one_d_mode": [True, False], "power_budget_w": [300, 1.5], "precision": ["uniform", "reference-kernels"],
}


def value_for(key: str) -> st.SearchStrategy:
    fair = st.sampled_from(FAIR_VALUES.get(key, [1]))
    return st.one_of(fair, fair, fair, ODD_VALUES)


ODD_VALUES = st.one_of(
    st.sampled_from([64.9, 2.9, 64.0, 0, -1, 2**53 + 1, 10**30, 10**80, 1e400, -1e400,
                     float("nan"), "64", "fast", "8MiB", "", "decode", "optimal", "mambalaya", "mamba-130m", True,
                     False, None, [], [1, 2], {}, {"exp": 1}, "1e3", "2.5e9", ".inf"]),
    st.integers(min_value=-10, max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)


@st.composite
def mutated_specs(draw) -> tuple[dict[str, Any], set[str]]:
    """A copy of VALID with one to three mutations, and the names of the fields they touched."""
    data = copy.deepcopy(VALID)
    touched: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["grid-value", "grid-value", "grid-value", "grid-list", "fixed", "fixed", "both",
                                       "new-axis", "new-axis", "top"]))
        if not isinstance(data["grid"], dict) or not data["grid"] or not isinstance(data["fixed"], dict):
            action = "top"  # (a grid or fixed replaced by a scalar: nothing inside to mutate)
        if action == "grid-value":
            axis = draw(st.sampled_from(sorted(data["grid"])))
            values = data["grid"][axis]
            if isinstance(values, list) and values:
                values[draw(st.integers(0, len(values) - 1))] = draw(value_for(axis))
            touched.add(axis)
        elif action == "grid-list":
            axis = draw(st.sampled_from(sorted(data["grid"])))
            data["grid"][axis] = draw(st.one_of(ODD_VALUES, st.lists(value_for(axis), max_size=3)))
            touched.add(axis)
        elif action == "fixed":
            key = draw(st.sampled_from(FIELDS))
            data["fixed"][key] = draw(value_for(key))
            touched.add(key)
        elif action == "both":  # a field of the grid set in 'fixed' too
            key = draw(st.sampled_from(sorted(data["grid"])))
            data["fixed"][key] = draw(ODD_VALUES)
            touched.add(key)
        elif action == "new-axis":
            key = draw(st.sampled_from(FIELDS))
            data["grid"][key] = draw(st.lists(value_for(key), min_size=0, max_size=2))
            touched.add(key)
        else:
            key = draw(st.sampled_from(["chunk_size", "name", "store", "grid", "fixed", "extra"]))
            data[key] = draw(ODD_VALUES)
            touched.add(key)
    return data, touched


def _check_point(point: dict[str, Any]) -> None:
    """Every field of a loaded point has its type: sizes integers in range, names text, the
    phase and mapping from their lists; its design builds or fails with one SpecError."""
    for key in ("seq_len", "batch"):
        assert type(point[key]) is int and 1 <= point[key] <= MAX_POINT_SIZE, point
    assert point["phase"] in PHASES and point["mapping"] in POINT_MAPPINGS
    assert all(isinstance(point[k], str) and point[k].strip() for k in ("arch", "model"))
    for key, value in point.items():
        if key not in POINT_KEYS and isinstance(value, float):
            assert math.isfinite(value), (key, value)
    try:
        sweep._build_arch(point)
    except SpecError as err:  # a combination of valid values that is impossible: that point's failure
        assert "\n" not in str(err)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated_specs())
def test_a_mutated_sweep_spec_loads_to_typed_points_or_is_one_error_naming_a_field(tmp_path: Path, mutated) -> None:
    data, touched = mutated
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        spec = load_sweep_spec(path, store=tmp_path / "never-written.sqlite")
    except SpecError as err:
        message = str(err)
        assert "\n" not in message and str(path) in message
        assert any(name in message for name in touched | {"grid", "fixed"}), (message, touched)
        return
    points = spec.points()
    assert points
    for point in points[:16]:
        _check_point(point)
    assert not (tmp_path / "never-written.sqlite").exists()
