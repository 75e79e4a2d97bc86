"""Every result mambalaya prints or stores is finite: a spec field outside its documented range is
refused naming the field and the range, a power budget at or below the design's leakage is
refused naming both, and a result whose figure is not finite is refused naming the figure and
the inputs (issue 42, "absurd values that print inf")."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mambalaya.arch import ArchSpec, load_arch, with_settings
from mambalaya.arch.quantities import (AREA_UM2_RANGE, BYTES_PER_CYCLE_RANGE, CLOCK_RANGE, OFFCHIP_BANDWIDTH_RANGE,
                                       OPS_PER_LANE_RANGE, PICOJOULES_RANGE, POWER_BUDGET_RANGE, UNARY_CYCLES_RANGE)
from mambalaya.cli import app
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.evaluate import evaluate
from mambalaya.cost.area import leakage_w
from mambalaya.cost.energy import PowerBudgetError, layer_energy
from mambalaya.cost.latency import NonFiniteResult, layer_latency
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads import PRESETS, build_layer

runner = CliRunner()
SMALL = ["-m", "mamba-130m", "-L", "64", "-B", "1"]


@pytest.mark.parametrize("setting, field, shown", [
    ("clock_hz=1e-300", "clock_hz", "1 kHz to 100 GHz"),
    ("clock_hz=1e300", "clock_hz", "1 kHz to 100 GHz"),
    ("memory.offchip_bandwidth_bytes_per_s=1e-300", "memory.offchip_bandwidth_bytes_per_s", "1 MB/s to 1 PB/s"),
    ("memory.onchip_bandwidth_bytes_per_cycle=1e-300", "memory.onchip_bandwidth_bytes_per_cycle", "0.125 (one bit)"),
    ("memory.pe_local_bytes_per_cycle=1e300", "memory.pe_local_bytes_per_cycle", "1e12 bytes per cycle"),
    ("compute.one_d_ops_per_lane_per_cycle=1e-300", "compute.one_d_ops_per_lane_per_cycle", "0.001 to 1000"),
    ("compute.unary_cost_cycles.exp=1e300", "compute.unary_cost_cycles.exp", "a million cycles"),
    ("compute.pipeline_wind_up_cycles=1e300", "compute.pipeline_wind_up_cycles", "a billion cycles"),
    ("energy.dram_pj_per_bit=1e300", "energy.dram_pj_per_bit", "1e6 pJ"),
    ("energy.mac_pj.16=1e300", "energy.mac_pj[16]", "1e6 pJ"),
    ("area.mac_um2.16=1e300", "area.mac_um2[16]", "1e6 um^2"),
    ("power_budget_w=1e-300", "power_budget_w", "1 uW to 1 GW"),
    ("bits_per_element=4096", "bits_per_element", "64"),
])
def test_an_absurd_field_is_refused_naming_the_field_and_its_range(setting: str, field: str, shown: str) -> None:
    r = runner.invoke(app, ["evaluate", *SMALL, "--set", setting])
    assert r.exit_code == 1, r.output
    message = " ".join(r.stderr.split())
    assert message.startswith("error:") and f"{field}:" in message and shown in message, message
    assert "Traceback" not in r.output and r.stdout == ""


def test_gpu_kernel_fractions_and_staging_levels_have_ranges_too() -> None:
    for setting, field in (("kernels.compute_fraction=1e-300", "kernels.compute_fraction"),
                           ("kernels.min_kernel_s=1e300", "kernels.min_kernel_s"),
                           ("memory.levels.l2.bandwidth_bytes_per_cycle=1e-300", "memory.levels.l2.bandwidth_bytes_per_cycle")):
        with pytest.raises(SpecError, match=f"{field}: must be from"):
            with_settings(load_arch("gpu-h100"), [setting])


def test_every_ranged_field_names_its_range_in_its_description() -> None:
    fields = ArchSpec.model_fields
    memory = fields["memory"].annotation.model_fields  # type: ignore[union-attr]
    assert CLOCK_RANGE.note in fields["clock_hz"].description
    assert POWER_BUDGET_RANGE.note in fields["power_budget_w"].description
    assert OFFCHIP_BANDWIDTH_RANGE.note in memory["offchip_bandwidth_bytes_per_s"].description
    from mambalaya.arch.physical import EnergySpec

    assert all(PICOJOULES_RANGE.note in f.description for n, f in EnergySpec.model_fields.items() if n.endswith("pj")
               or n.endswith("pj_per_bit"))


def test_every_shipped_design_is_within_the_ranges() -> None:
    from mambalaya.arch import shipped_archs

    for name in shipped_archs():
        load_arch(name)  # a range a shipped design breaks would refuse it here


def test_a_budget_at_or_below_the_leakage_is_refused_naming_both() -> None:
    """No speed meets a budget the leakage alone exceeds: refused, never 'held to the budget ... inf ms'."""
    spec = load_arch("mambalaya")
    leak = leakage_w(spec)
    for budget in (leak / 2, leak):
        r = runner.invoke(app, ["evaluate", *SMALL, "--set", f"power_budget_w={budget!r}"])
        assert r.exit_code == 1, r.output
        message = " ".join(r.stderr.split())
        assert "power_budget_w" in message and f"{budget:g} W" in message and f"{leak:.4g} W" in message, message
        assert "inf" not in message
    starved = with_settings(spec, [f"power_budget_w={leak / 2!r}"])
    with pytest.raises(PowerBudgetError):
        evaluate(starved, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1).energy  # noqa: B018
    held = evaluate(with_settings(spec, ["power_budget_w=1"]), "mamba-130m", PRESETS["mamba-130m"], phase="prefill",
                    seq_len=64, batch=1).totals()
    assert held["over_power_budget"] and math.isfinite(held["throttled_latency_s"]) and held["throttled_latency_s"] > held["latency_s"]


def _unchecked(spec: ArchSpec, **fields) -> ArchSpec:
    """``spec`` with fields set past validation: inputs that slipped through every range."""
    return spec.model_copy(update=fields)


def test_a_result_with_a_non_finite_figure_is_refused_naming_the_figure_and_the_inputs() -> None:
    spec = load_arch("mambalaya")
    cascade = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    mapping = named_mapping("unfused", cascade, spec.memory.onchip_buffer_bytes, arch=spec)
    slow = _unchecked(spec, clock_hz=1e-320)
    with pytest.raises(NonFiniteResult) as info:
        layer_latency(slow, cascade, mapping)
    message = str(info.value)
    assert "latency_s" in message and "'mambalaya'" in message and "batch 1" in message and "64 positions" in message
    assert "\n" not in message and isinstance(info.value, MambalayaError)
    ok = layer_latency(spec, cascade, mapping)
    costly = _unchecked(spec, energy=spec.energy.model_copy(update={"dram_pj_per_bit": 1e308}))
    with pytest.raises(NonFiniteResult, match="total_pj"):
        layer_energy(costly, cascade, ok)


_ANY_NUMBER = st.one_of(
    st.floats(min_value=1e-320, max_value=1e308, allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1e-300, 1e300, float("inf"), float("nan")]),
)


def _in_range(r) -> st.SearchStrategy:
    """Either end of a documented range, or a value between: the corners where a product or
    quotient of in-range values would overflow if a range were too wide."""
    return st.one_of(_ANY_NUMBER, st.sampled_from([r.low, r.high, math.sqrt(r.low * r.high) if r.low else r.high / 2]))


_FIELDS = {
    "clock_hz": _in_range(CLOCK_RANGE), "memory.offchip_bandwidth_bytes_per_s": _in_range(OFFCHIP_BANDWIDTH_RANGE),
    "memory.onchip_bandwidth_bytes_per_cycle": _in_range(BYTES_PER_CYCLE_RANGE),
    "compute.one_d_ops_per_lane_per_cycle": _in_range(OPS_PER_LANE_RANGE),
    "energy.dram_pj_per_bit": _in_range(PICOJOULES_RANGE), "energy.mac_pj.16": _in_range(PICOJOULES_RANGE),
    "power_budget_w": _in_range(POWER_BUDGET_RANGE), "technology.logic_leakage_w_per_mm2": st.sampled_from([0, 1e-9, 100]),
    "area.sram_um2_per_bit": _in_range(AREA_UM2_RANGE), "compute.unary_cost_cycles.softplus": _in_range(UNARY_CYCLES_RANGE),
    "compute.array_rows": st.sampled_from([1, 2, 2**20, 2**53, 2**60]),
    "compute.array_cols": st.sampled_from([1, 3, 2**30]),
    "bits_per_element": st.sampled_from([0, 1, 8, 32, 64, 65, 2**40]),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_extreme_settings_give_a_finite_result_or_one_error(data) -> None:
    """Any mix of extreme values (or values across the documented ranges) on the fields rates,
    sizes, energies and budgets come from: either one MambalayaError of one paragraph, or a
    result whose every figure is finite."""
    fields = data.draw(st.lists(st.sampled_from(sorted(_FIELDS)), min_size=1, max_size=4, unique=True))
    changes = [(f, data.draw(_FIELDS[f])) for f in fields]
    try:
        spec = with_settings(load_arch("mambalaya"), [f"{k}={v!r}" for k, v in changes])
        ev = evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1, mapping="unfused")
        totals = ev.totals()
    except MambalayaError as err:
        assert "\n" not in str(err).strip()
        return
    for name, value in totals.items():
        if isinstance(value, float):
            assert math.isfinite(value), (name, value, changes)
