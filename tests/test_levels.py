"""A memory hierarchy of any depth: staging levels between DRAM and the on-chip buffer
(mambalaya.arch.levels), in the spec, the latency (each level's bandwidth), the search's closed
forms, the energy, the area and the leakage."""

from __future__ import annotations

import pytest

from mambalaya.search import group_choice
from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch, with_settings
from mambalaya.errors import SpecError
from mambalaya.experiments.evaluate import evaluate
from mambalaya.cost.area import component_areas, leakage_w
from mambalaya.cost.energy import layer_energy, movement_pj_per_byte
from mambalaya.cost.latency import layer_level_seconds
from mambalaya.workloads import PRESETS

from test_closed_forms import _BUILDERS, _mapping_summary


def _with_levels(name: str, levels: dict) -> object:
    data = arch_to_dict(load_arch(name))
    data["memory"]["levels"] = levels
    return arch_from_dict(data, source=f"{name} with levels")


def _two_levels(l2_bw: float = 2048.0, l3_bw: float = 1024.0):
    """mambalaya (50 MiB buffer) behind a 64 MiB L2 and a 256 MiB L3: a five-level hierarchy."""
    return _with_levels("mambalaya", {"l3": {"capacity_bytes": "256MiB", "bandwidth_bytes_per_cycle": l3_bw},
                                      "l2": {"capacity_bytes": "64MiB", "banks": 16, "bank_port_bytes": int(l2_bw) // 16}})


@pytest.mark.parametrize("levels,words", [
    ({"l2": {"capacity_bytes": "64MiB"}}, "memory.levels.l2.bandwidth_bytes_per_cycle"),
    ({"l2": {"capacity_bytes": "64MiB", "banks": 8}}, "memory.levels.l2.bank_port_bytes"),
    ({"l2": {"capacity_bytes": "64MiB", "bandwidth_bytes_per_cycle": 0}}, "memory.levels.l2.bandwidth_bytes_per_cycle"),
    ({"l2": {"capacity_bytes": "32MiB", "bandwidth_bytes_per_cycle": 64}}, "larger than the level inside it"),
    ({"l3": {"capacity_bytes": "64MiB", "bandwidth_bytes_per_cycle": 64},
      "l2": {"capacity_bytes": "128MiB", "bandwidth_bytes_per_cycle": 64}}, "memory.levels.l3.capacity_bytes"),
    ({"l2": {"capacity_bytes": "200GB", "bandwidth_bytes_per_cycle": 64}}, "offchip_capacity_bytes"),
    ({"buffer": {"capacity_bytes": "64MiB", "bandwidth_bytes_per_cycle": 64}}, "memory.levels.buffer"),
    ({"l2": {"capacity_bytes": "64MiB", "bandwidth_bytes_per_cycle": 64, "latency": 3}}, "memory.levels.l2.latency"),
])
def test_bad_levels_end_in_one_error_naming_the_field(levels: dict, words: str) -> None:
    with pytest.raises(SpecError) as info:
        _with_levels("mambalaya", levels)
    message = str(info.value)
    assert words in message and "\n" not in message.strip()


def test_set_reaches_a_level_by_name_and_an_unknown_level_is_named() -> None:
    spec = load_arch("gpu-h100")
    assert list(spec.memory.levels) == ["l2"]
    moved = with_settings(spec, ["memory.levels.l2.bandwidth_bytes_per_cycle=2048"])
    assert moved.memory.levels["l2"].bytes_per_cycle == 2048
    with pytest.raises(SpecError, match="l3"):
        with_settings(spec, ["memory.levels.l3.bandwidth_bytes_per_cycle=2048"])
    with pytest.raises(SpecError, match="memory.levels.l2.bandwidth_bytes_per_cycle"):
        with_settings(spec, ["memory.levels.l2.bandwidth_bytes_per_cycle=0"])


@pytest.mark.parametrize("name", ["gpu-h100", "gpu-a100", "gpu-a100-pcie"])
def test_the_gpus_stage_hbm_through_their_l2_into_shared_memory(name: str) -> None:
    m = load_arch(name).memory
    sms = {"gpu-h100": 132}.get(name, 108)
    assert m.onchip_buffer_bytes == sms * {"gpu-h100": 228}.get(name, 164) * 1024  # shared memory per SM x SMs
    assert m.levels["l2"].capacity_bytes > m.onchip_buffer_bytes
    assert m.levels["l2"].bytes_per_cycle == 5120


def test_each_level_bounds_every_group_by_the_off_chip_bytes_it_passes() -> None:
    cfg = PRESETS["mamba-370m"]
    arch = _two_levels(l2_bw=256.0, l3_bw=128.0)  # slow enough to bind
    ev = evaluate(arch, "mamba-370m", cfg, phase="prefill", seq_len=1024, batch=4, mapping="unfused")
    for g in ev.result.groups:
        slowest = g.traffic.total_bytes / (128.0 * arch.clock_hz)  # the L3 is the narrower
        assert g.onchip_latency == pytest.approx(max(slowest, g.onchip_latency), rel=1e-12)
        assert g.onchip_latency >= slowest * (1 - 1e-12)
        assert g.latency >= slowest * (1 - 1e-12)
    assert ev.result.bound == "onchip"
    levels = layer_level_seconds(arch, ev.result)
    assert list(levels) == ["buffer", "l3", "l2"]
    assert levels["l3"] == pytest.approx(ev.result.offchip_bytes / (128.0 * arch.clock_hz), rel=1e-12)
    assert levels["l2"] == pytest.approx(levels["l3"] / 2, rel=1e-12)


def test_a_level_wider_than_it_needs_to_be_changes_no_latency_only_energy_area_and_leakage() -> None:
    cfg = PRESETS["mamba-370m"]
    base = load_arch("mambalaya")
    staged = _two_levels(l2_bw=1e9, l3_bw=1e9)
    runs = [evaluate(a, "mamba-370m", cfg, phase="prefill", seq_len=1024, batch=4) for a in (base, staged)]
    assert runs[1].result.latency_s == pytest.approx(runs[0].result.latency_s, rel=1e-12)
    assert [g.einsums for g in runs[1].result.groups] == [g.einsums for g in runs[0].result.groups]
    e0, e1 = (layer_energy(a, r.cascade, r.result) for a, r in zip((base, staged), runs))
    spec, scale = staged.energy, staged.technology.energy_scale
    per_byte = sum(8 * scale * (spec.buffer_pj_per_bit(c, write=False) + spec.buffer_pj_per_bit(c, write=True))
                   for c in (256 << 20, 64 << 20))
    staging_j = e1.by_component_j()["staging"]
    assert staging_j == pytest.approx(runs[1].result.offchip_bytes * per_byte * 1e-12, rel=1e-9)
    assert "staging" not in e0.by_component_j()
    assert movement_pj_per_byte(staged) == movement_pj_per_byte(base)
    areas = {r.component: r.area_mm2 for r in component_areas(staged)}
    assert areas["staging level l2"] == pytest.approx(areas["on-chip buffer"] * 64 / 50, rel=1e-12)
    assert areas["staging level l3"] == pytest.approx(areas["on-chip buffer"] * 256 / 50, rel=1e-12)
    extra_mib = 256 + 64
    assert leakage_w(staged) - leakage_w(base) == pytest.approx(staged.technology.sram_leakage_w_per_mib * extra_mib,
                                                                rel=1e-9)


@pytest.mark.parametrize("layer", ["mamba1", "mamba2-chunked"])
def test_closed_form_picks_charge_the_levels_as_the_general_model_does(layer: str, monkeypatch) -> None:
    arch = _two_levels(l2_bw=512.0, l3_bw=384.0)
    fast = _mapping_summary(_BUILDERS[layer](), "optimal", arch)
    monkeypatch.setattr(group_choice, "CLOSED_FORM_COSTS", False)
    assert _mapping_summary(_BUILDERS[layer](), "optimal", arch) == fast


def test_a_slower_level_never_makes_a_layer_faster() -> None:
    cfg = PRESETS["mamba-370m"]
    latencies = [evaluate(_two_levels(l2_bw=bw, l3_bw=bw), "mamba-370m", cfg, phase="prefill", seq_len=1024,
                          batch=4).result.latency_s for bw in (65536.0, 1024.0, 16.0)]
    assert latencies == sorted(latencies)
    assert latencies[2] > latencies[0]


def test_a_pointwise_chain_s_register_carried_tiles_take_no_buffer_space() -> None:
    from mambalaya.fusion.mapping import FusionGroup, Loop, footprint_bytes, register_resident
    from mambalaya.search.candidates import _footprint_at, cost_model
    from mambalaya.workloads import build_layer

    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)
    group = FusionGroup("g", ("Z", "G", "YD", "YG", "O"), (Loop("I", 32),))
    assert register_resident(c, group) == {"G", "YD"}
    # only the tiles of Z and YG (read by G and by the GEMM O, neither at a pointwise element of its own) stay
    tile = {t: 2 * 32 * c.size("E") * c.tensors[t].bits / 8 for t in ("Z", "YG")}
    assert footprint_bytes(c, group) == sum(tile.values())
    model = cost_model(c, list(group.einsums), ["I"])  # the closed form the search bounds footprints with
    assert _footprint_at(model.fp_terms, [32], [c.size("I")]) == pytest.approx(footprint_bytes(c, group), rel=1e-12)
