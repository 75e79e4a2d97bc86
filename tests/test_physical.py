"""The physical model: a finite memory hierarchy, area per component, energy at the design's
node with leakage, power budgets, and Geens et al.'s equal-area setup."""

from __future__ import annotations

import math

import pytest

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch, shipped_archs, with_settings
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.equal_area import MARCA_MEMORY_SHARE, array_shape, split_design
from mambalaya.experiments.evaluate import evaluate
from mambalaya.cost.area import area_rows, component_areas, leakage_w, total_area_mm2
from mambalaya.workloads import PRESETS

H100_LIKE = ("mambalaya", "marca-ideal", "geens-ideal")


def _changed(name: str, section: str, **fields):
    data = arch_to_dict(load_arch(name))
    data[section].update(fields)
    return arch_from_dict(data, source=f"{name} changed")


# ----------------------------------------------------------------------------------- hierarchy


@pytest.mark.parametrize("name", shipped_archs())
def test_no_shipped_design_has_an_unbounded_level(name: str) -> None:
    spec = load_arch(name)
    assert spec.memory.buffer_bandwidth_bytes_per_cycle is not None and spec.memory.buffer_bandwidth_bytes_per_cycle > 0
    assert spec.memory.offchip_bandwidth_bytes_per_s > 0
    assert "memory.onchip_banks" in spec.sources  # the organisation has a source


def test_the_buffer_bandwidth_is_banks_times_port_width_unless_given() -> None:
    spec = load_arch("mambalaya")
    assert spec.memory.buffer_bandwidth_bytes_per_cycle == 4224 * 4
    assert with_settings(spec, ["memory.onchip_banks=1024"]).memory.buffer_bandwidth_bytes_per_cycle == 4096
    given = with_settings(spec, ["memory.onchip_bandwidth_bytes_per_cycle=999"])
    assert given.memory.buffer_bandwidth_bytes_per_cycle == 999  # a sweep or --set moving it


@pytest.mark.parametrize("section,fields,words", [
    ("memory", {"onchip_bank_port_bytes": 0}, "onchip_bank_port_bytes"),
    ("memory", {"onchip_bandwidth_bytes_per_cycle": 0}, "onchip_bandwidth_bytes_per_cycle"),
    ("memory", {"offchip_bandwidth_bytes_per_s": 0}, "offchip_bandwidth_bytes_per_s"),
    ("memory", {"onchip_banks": None}, "onchip_bank_port_bytes"),
    ("memory", {"offchip_capacity_bytes": 1 << 20}, "larger than the one inside it"),
    ("memory", {"pe_local_bytes": 64 << 20}, "larger than the one inside it"),
    ("memory", {"pe_local_bytes_per_cycle": 2}, "pe_local_bytes_per_cycle"),
    ("memory", {"pe_local_bytes": 1}, "cannot hold one operation's two operands"),
    # null dropped the registers' area and leakage while their energy was still charged
    ("memory", {"pe_local_bytes": None}, "charges every operation's two operands and result to the PE registers"),
    # a vector unit beside a 1D mode added area and leakage and no speed (elementwise work runs on one unit)
    ("compute", {"vector_lanes": 65536}, "one_d_mode is true"),
    ("area", {"sram_um2_per_bit": -0.03}, "area.sram_um2_per_bit"),
    ("area", {"mac_um2": {16: -1.0}}, "area.mac_um2"),
    ("technology", {"energy_scale": 0}, "technology.energy_scale"),
    ("technology", {"logic_leakage_w_per_mm2": -1}, "technology.logic_leakage_w_per_mm2"),
])
def test_bad_physical_specs_end_in_one_error_naming_the_field(section: str, fields: dict, words: str) -> None:
    with pytest.raises(SpecError) as info:
        _changed("mambalaya", section, **fields)
    message = str(info.value)
    assert words in message and "\n" not in message.strip()


def test_a_slower_buffer_never_makes_a_layer_faster() -> None:
    cfg = PRESETS["mamba-370m"]
    base = load_arch("mambalaya")
    fast = evaluate(base, "mamba-370m", cfg, phase="prefill", seq_len=2048, batch=8).result.latency_s
    slow = evaluate(with_settings(base, ["memory.onchip_banks=64"]), "mamba-370m", cfg, phase="prefill",
                    seq_len=2048, batch=8)
    assert slow.result.latency_s >= fast
    assert any(g.bound == "onchip" for g in slow.result.groups)  # 256 B/cycle cannot feed 64K lanes


# ---------------------------------------------------------------------------------------- area


@pytest.mark.parametrize("name", [n for n in shipped_archs() if not n.startswith("gpu-")])
def test_every_accelerator_has_an_area_per_component(name: str) -> None:
    spec = load_arch(name)
    rows = area_rows(spec)
    assert rows[-1]["component"] == "total" and rows[-1]["area_mm2"] > 0
    assert rows[-1]["area_mm2"] == pytest.approx(sum(r["area_mm2"] for r in rows[:-1]))
    for path in ("technology.energy_scale", "technology.area_scale", "area.mac_um2", "area.sram_um2_per_bit",
                 "technology.logic_leakage_w_per_mm2", "technology.sram_leakage_w_per_mib"):
        assert path in spec.sources, (name, path)


def test_areas_follow_the_counts_and_the_node() -> None:
    spec = load_arch("mambalaya")
    by = {r.component: r for r in component_areas(spec)}
    pe = spec.area.mac_um2[16] * spec.technology.area_scale
    assert by["2D-array PEs"].area_mm2 == pytest.approx(65536 * pe / 1e6)
    assert by["on-chip buffer"].area_mm2 == pytest.approx(50 * 2**20 * 8 * spec.area.sram_um2_per_bit / 1e6)
    doubled = with_settings(spec, ["compute.array_rows=512"])
    assert total_area_mm2(doubled) - total_area_mm2(spec) == pytest.approx(
        by["2D-array PEs"].area_mm2 + by["PE registers"].area_mm2)
    at45 = with_settings(spec, ["technology.area_scale=1"])
    assert {r.component: r.area_mm2 for r in component_areas(at45)}["2D-array PEs"] == pytest.approx(65536 * 3000 / 1e6)


def test_the_h100_like_designs_share_one_area() -> None:
    """They differ in mapping and dataflows, not in components: equal PE counts are equal areas."""
    areas = {n: total_area_mm2(load_arch(n)) for n in H100_LIKE}
    assert max(areas.values()) == pytest.approx(min(areas.values()))


# ------------------------------------------------------------------------- energy, leakage, power


def test_on_chip_energy_scales_with_the_node_and_dram_does_not() -> None:
    cfg = PRESETS["mamba-130m"]
    spec = load_arch("mambalaya")
    at45 = with_settings(spec, ["technology.energy_scale=1", "technology.logic_leakage_w_per_mm2=0",
                                "technology.sram_leakage_w_per_mib=0"])
    nodal = with_settings(spec, ["technology.logic_leakage_w_per_mm2=0", "technology.sram_leakage_w_per_mib=0"])
    e45 = evaluate(at45, "mamba-130m", cfg, phase="prefill", seq_len=512, batch=4).energy.by_component_j()
    e4 = evaluate(nodal, "mamba-130m", cfg, phase="prefill", seq_len=512, batch=4).energy.by_component_j()
    assert e4["dram"] == pytest.approx(e45["dram"])
    for part in ("buffer", "register", "mac", "mfu"):
        assert e4[part] == pytest.approx(spec.technology.energy_scale * e45[part]), part
    assert e4["leakage"] == e45["leakage"] == 0


def test_leakage_is_static_power_over_the_latency() -> None:
    spec = load_arch("mambalaya")
    ev = evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4)
    energy = ev.energy
    assert energy.leakage_w == pytest.approx(leakage_w(spec)) and energy.leakage_w > 0
    assert energy.by_component_j()["leakage"] == pytest.approx(energy.leakage_w * ev.result.latency_s)


def test_a_result_over_its_power_budget_is_flagged_and_throttled() -> None:
    cfg = PRESETS["mamba-370m"]
    spec = load_arch("mambalaya")
    within = evaluate(spec, "mamba-370m", cfg, phase="prefill", seq_len=2048, batch=16)
    t = within.totals()
    assert not t["over_power_budget"] and t["throttled_latency_s"] == t["latency_s"]
    tight = with_settings(spec, [f"power_budget_w={t['average_power_w'] / 4}"])
    over = evaluate(tight, "mamba-370m", cfg, phase="prefill", seq_len=2048, batch=16).totals()
    assert over["over_power_budget"]
    # held to the budget: dynamic energy plus leakage over the longer time equals budget x time
    t_held = over["throttled_latency_s"]
    dynamic = over["layer_energy_j"] - over["leakage_w"] * over["latency_s"]
    assert dynamic + over["leakage_w"] * t_held == pytest.approx(tight.power_budget_w * t_held)
    assert 4.0 * over["latency_s"] < t_held < 4.1 * over["latency_s"]  # a little over 4x: leakage takes part of the budget
    # no speed meets a budget below the leakage: refused, naming both, instead of an infinite latency
    starved = with_settings(spec, [f"power_budget_w={leakage_w(spec) / 2}"])
    with pytest.raises(MambalayaError, match="not above the design's leakage power"):
        evaluate(starved, "mamba-370m", cfg, phase="prefill", seq_len=2048, batch=16).totals()


@pytest.mark.parametrize("name", H100_LIKE)
def test_the_h100_like_designs_stay_within_700_w_at_the_papers_setup(name: str) -> None:
    t = evaluate(name, "mamba-1.4b", PRESETS["mamba-1.4b"], phase="prefill", seq_len=2048, batch=64).totals()
    assert 0 < t["average_power_w"] <= t["power_budget_w"] == 700


# ----------------------------------------------------------------------------------- equal area


def test_array_shapes_follow_the_artifacts_rule() -> None:
    assert array_shape(8192) == (64, 128)
    assert array_shape(16384) == (128, 128)
    assert array_shape(8000) == (64, 128)  # within 5% of a power of two: snapped to it
    rows, cols = array_shape(38913)
    assert rows * cols == 38913 and cols / rows < 3
    with pytest.raises(ValueError):
        array_shape(0)


def test_the_marca_point_of_the_split_is_marca() -> None:
    base = load_arch("marca-original")
    marca = split_design(base, MARCA_MEMORY_SHARE)
    assert (marca.compute.array_rows, marca.compute.array_cols) == (64, 128)
    assert marca.memory.onchip_buffer_bytes == 24 * 2**20
    assert marca.memory.offchip_bandwidth_bytes_per_s == base.memory.offchip_bandwidth_bytes_per_s
    quarter = split_design(base, 0.5, area_fraction=0.25)
    assert quarter.memory.offchip_bandwidth_bytes_per_s == pytest.approx(base.memory.offchip_bandwidth_bytes_per_s / 2)
    assert quarter.memory.onchip_buffer_bytes == int(0.25 * 30 * 2**20 * 0.5)
    assert quarter.compute.pe_count == pytest.approx(math.ceil(0.25 * 40960 * 0.5), rel=0.05)


def test_every_split_takes_the_artifacts_pe_count() -> None:
    """Each split's PEs are Geens et al.'s artifact's, ceil(area x 40960 x (1 - m)) with 40960 =
    8192 / 0.2 exactly (scripts/util.py NB_PE_FULL_AREA): the full area was 8192 / (1 - 0.8) =
    40960.00000000001 PEs here, one PE more at ten of the nineteen splits, and other arrays
    (the 5% split 119 x 327 where the artifact builds 152 x 256)."""
    from mambalaya.experiments.equal_area import MEMORY_SHARES

    base = load_arch("marca-original")
    for m in MEMORY_SHARES:
        rows, cols = array_shape(math.ceil(1.0 * (8192 / 0.2) * (1 - m)))
        design = split_design(base, m)
        assert (design.compute.array_rows, design.compute.array_cols) == (rows, cols), m
    assert (split_design(base, 0.05).compute.array_rows, split_design(base, 0.05).compute.array_cols) == (152, 256)


def test_specs_that_differ_only_in_energy_node_or_area_share_their_searches() -> None:
    """The latency model never reads energy, technology, area or the budget: a spec moved in those
    has the same latency key, the same mapping and the same latency, and a different energy."""
    from mambalaya.arch.keys import latency_key, spec_key
    from mambalaya.experiments.sensitivity import latency_blind, load_sensitivity_spec

    base = load_arch("mambalaya")
    moved = with_settings(base, ["technology.energy_scale=0.117", "area.sram_um2_per_bit=0.045", "power_budget_w=300"])
    assert latency_key(moved) == latency_key(base) and spec_key(moved) != spec_key(base)
    assert latency_key(with_settings(base, ["memory.onchip_banks=1024"])) != latency_key(base)
    cfg = PRESETS["mamba-130m"]
    a = evaluate(base, "mamba-130m", cfg, phase="prefill", seq_len=512, batch=4)
    b = evaluate(moved, "mamba-130m", cfg, phase="prefill", seq_len=512, batch=4)
    assert a.mapping.groups == b.mapping.groups and a.result.latency_s == b.result.latency_s
    assert b.energy.layer_j > a.energy.layer_j
    blind = {x.key for x in load_sensitivity_spec("h100-like").assumptions if latency_blind(x)}
    assert blind == {"technology.energy_scale", "technology.logic_leakage_w_per_mm2", "technology.sram_leakage_w_per_mib"}
