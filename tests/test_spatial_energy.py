"""The spatial mapping of Einsums on the array, the on-chip buffer bound and the energy model,
against hand-computed cases; their monotonicity; and their bad-input errors."""

from __future__ import annotations

import pytest

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch
from mambalaya.einsum import loads_cascade
from mambalaya.errors import SpecError
from mambalaya.fusion.mapping import FusionGroup, Loop, Mapping, check_mapping, unfused_mapping
from mambalaya.cost.energy import einsum_actions, layer_energy
from mambalaya.cost.latency import einsum_cycles, layer_latency
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads.blocks.mamba1 import PRESETS, mamba1_layer
from small_cascades import gemm

MAMBALAYA = load_arch("mambalaya")

#: Energies for the tests: round numbers, so that the hand sums below are easy to check.
TEST_ENERGY = {
    "dram_pj_per_bit": 4.0,
    "buffer_read_pj_per_bit": 0.5,
    "buffer_write_pj_per_bit": 0.75,
    "buffer_reference_bytes": 52428800,
    "buffer_size_exponent": 0.5,
    "register_pj_per_bit": 0.01,
    "mac_pj": {16: 1.0, 32: 3.0},
    "elementwise_pj": {16: 0.25, 32: 0.5},
    "mfu_pj": {"exp": 10.0, "silu": 12.0, "softplus": 20.0, "rsqrt": 8.0},
}


def arch(**changes):
    """The mambalaya spec with dotted fields replaced (``compute__array_rows=...``), validated again."""
    data = arch_to_dict(MAMBALAYA)
    data["energy"] = dict(TEST_ENERGY)  # round numbers instead of the shipped (sourced) ones
    data["memory"].update(onchip_banks=None, onchip_bank_port_bytes=None)  # unbounded unless a test sets a bandwidth
    data["technology"] = None  # the energies as given (45 nm), no leakage: tests/test_physical.py checks the node
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return arch_from_dict(data)


def test_a_256x256_gemm_tile_runs_at_full_utilisation() -> None:
    c = gemm(1024, 256, 256)
    cyc, spatial = einsum_cycles(arch().compute, c, c.einsum("Y"))
    # one fold holds all of W; the 1024 rows of A stream through it, one per cycle
    assert spatial.spatial_util == 1.0
    assert cyc.array_2d == 1024 == 1024 * 256 * 256 / (256 * 256)
    assert spatial.rows == ("K",) and spatial.cols == ("N",) and spatial.streamed == ("M",)


def test_an_output_rank_16_wide_caps_weight_stationary_utilisation_at_one_sixteenth() -> None:
    # BM[b,i,n] = U[b,i,e] * WB[e,n] with N = 16: weight-stationary, the weight's ranks E and N
    # span the array. Rows take E (1536 = 6 x 256) and columns N (16 of 256), or the other way
    # round (rows N: 16 of 256); either way at most 16 / 256 of the PEs hold a weight, so the
    # best mapping reaches 1/16 and the GEMM takes 16 times its ideal cycles.
    c = gemm(4096, 1536, 16)
    cyc, spatial = einsum_cycles(arch(compute__dataflows=["weight-stationary"]).compute, c, c.einsum("Y"))
    assert spatial.spatial_util == pytest.approx(16 / 256)
    folds = 6 * 1  # ceil(1536/256) x ceil(16/256)
    assert cyc.array_2d == folds * 4096
    assert cyc.array_2d == pytest.approx(16 * 4096 * 1536 * 16 / 256**2)
    # input-stationary holds U: E on the rows, the 4096 positions on the columns, N streams:
    # every PE busy, the ideal count
    is_cyc, is_spatial = einsum_cycles(arch(compute__dataflows=["input-stationary"]).compute, c, c.einsum("Y"))
    assert is_spatial.spatial_util == 1.0 and is_cyc.array_2d == 4096 * 1536 * 16 / 256**2
    # the shipped mambalaya array runs all three and picks input-stationary for this GEMM
    best_cyc, best = einsum_cycles(arch().compute, c, c.einsum("Y"))
    assert best.dataflow == "input-stationary" and best.stationary == ("A",) and best_cyc == is_cyc
    # roofline: no quantisation at all
    rf_cyc, rf_spatial = einsum_cycles(arch(compute__dataflows=["roofline"]).compute, c, c.einsum("Y"))
    assert rf_cyc.array_2d == 4096 * 1536 * 16 / 256**2 and rf_spatial.label == "2D roofline"


def test_scale_sim_folds_pay_load_fill_and_drain() -> None:
    c = gemm(100, 256, 512)
    compute = arch(compute__stationary_double_buffered=False, compute__dataflows=["weight-stationary"]).compute
    cyc, _ = einsum_cycles(compute, c, c.einsum("Y"))
    # two folds (N = 512 = 2 x 256), each 2r + c + T - 2 = 512 + 256 + 100 - 2 cycles
    assert cyc.array_2d == 2 * (2 * 256 + 256 + 100 - 2)


def test_an_elementwise_einsum_in_1d_mode_uses_the_lanes_the_spec_gives_it() -> None:
    c = loads_cascade("""
ranks: {M: 64, N: 64}
tensors:
  A: {ranks: [M, N], role: input}
  B: {ranks: [M, N], role: input}
  Y: {ranks: [M, N], role: output}
einsums:
  - Y[m,n] = A[m,n]*B[m,n]
""")
    cyc, spatial = einsum_cycles(arch(compute__one_d_lanes=1000).compute, c, c.einsum("Y"))
    # 4096 products on 1000 lanes: 5 passes, the last one 96 lanes full
    assert cyc.array_1d == 5 and spatial.unit == "array_1d"
    assert spatial.spatial_util == pytest.approx(4096 / 5000)
    cyc_all, _ = einsum_cycles(arch().compute, c, c.einsum("Y"))  # 65536 lanes: one pass
    assert cyc_all.array_1d == 1


def test_a_scan_spreads_its_independent_ranks_and_walks_its_sequence() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=1, seq_len=64)
    cyc, spatial = einsum_cycles(arch().compute, c, c.einsum("H"))
    assert "I" in spatial.streamed and "I" not in spatial.rows
    # B x E x N = 1 x 1536 x 16 = 24576 states on 65536 lanes: one pass per position, two
    # operations (multiply, add) per state
    assert cyc.array_1d == 64 * 2


def test_recomputed_tiles_cost_their_cycles_again() -> None:
    c = gemm(512, 256, 256)
    compute = arch().compute
    shapes_one = einsum_cycles(compute, c, c.einsum("Y"))[0].array_2d
    from mambalaya.cost.spatial import step_shapes

    tiled = step_shapes({r: c.size(r) for r in c.ranks}, [("M", 128)])
    assert einsum_cycles(compute, c, c.einsum("Y"), tiled)[0].array_2d == shapes_one  # 4 tiles of 128 rows


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_latency_never_rises_with_more_pes_bandwidth_or_buffer(phase) -> None:
    c = mamba1_layer(PRESETS["mamba-370m"], batch=8, seq_len=1024, phase=phase)
    base_arch = arch(memory__onchip_bandwidth_bytes_per_cycle=4096)
    for name in ("unfused", "optimal"):
        base = layer_latency(base_arch, c, named_mapping(name, c, base_arch.memory.onchip_buffer_bytes, arch=base_arch)).latency_s
        for changes in ({"compute__array_rows": 512}, {"compute__array_cols": 512},
                        {"memory__offchip_bandwidth_bytes_per_s": 4e12},
                        {"memory__onchip_bandwidth_bytes_per_cycle": 8192},
                        {"memory__onchip_buffer_bytes": 2 * base_arch.memory.onchip_buffer_bytes}):
            spec = arch(**{"memory__onchip_bandwidth_bytes_per_cycle": 4096, **changes})
            m = named_mapping(name, c, spec.memory.onchip_buffer_bytes, arch=spec)
            assert layer_latency(spec, c, m).latency_s <= base * (1 + 1e-9), (name, changes)


def test_a_slow_buffer_bounds_the_group_and_says_so() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=4, seq_len=512)
    slow = arch(memory__onchip_bandwidth_bytes_per_cycle=8)
    r = layer_latency(slow, c, check_mapping(c, unfused_mapping(c)))
    assert all(e.bound == "onchip" for e in r.einsums)
    g = r.groups[0]
    assert g.onchip_latency == pytest.approx(g.buffer.total_bytes / (8 * slow.clock_hz))
    assert g.latency >= g.onchip_latency
    fast = layer_latency(arch(), c, check_mapping(c, unfused_mapping(c)))  # unbounded buffer: never on-chip bound
    assert all(e.bound != "onchip" for e in fast.einsums)


TINY = """
ranks: {I: 4, D: 2, E: 3}
tensors:
  X: {ranks: [I, D], role: input}
  W: {ranks: [D, E], role: weight}
  T: {ranks: [I, E], role: intermediate}
  Y: {ranks: [I, E], role: output}
einsums:
  - T[i,e] = X[i,d]*W[d,e]
  - Y[i,e] = exp(T[i,e]) + T[i,e]
"""


def test_energy_of_an_unfused_tiny_cascade_is_the_hand_sum_of_its_actions() -> None:
    c = loads_cascade(TINY)  # 16-bit everything
    spec = arch()
    r = layer_latency(spec, c, check_mapping(c, unfused_mapping(c)))
    e = layer_energy(spec, c, r)
    buf_r, buf_w = 0.5, 0.75  # the arch's buffer is the reference size
    # T: reads X (8 el) and W (6 el) from DRAM, writes T (12 el); buffer: fill 14, drain 12,
    # operand reads 14, result write 12; 24 MACs at 16 bits; registers 3 x 16 bits per MAC
    t = (8 + 6 + 12) * 16 * 4.0 + ((14 + 12) * buf_r + (14 + 12) * buf_w) * 16 + 24 * 1.0 + 24 * 48 * 0.01
    # Y: reads T (12), writes Y (12); buffer: fill 12, drain 12, operand 12, result 12;
    # 12 exp on the MFUs, 12 adds
    y = (12 + 12) * 16 * 4.0 + ((12 + 12) * buf_r + (12 + 12) * buf_w) * 16 + 12 * 10.0 + 12 * 0.25 + 12 * 48 * 0.01
    got = {row.einsum: row.total_pj for row in e.einsums}
    assert got["T"] == pytest.approx(t) and got["Y"] == pytest.approx(y)
    assert e.layer_j == pytest.approx((t + y) * 1e-12)
    assert e.per_token_j == pytest.approx(e.model_j / 4)
    assert e.edp_js == pytest.approx(e.model_j * r.model_latency_s)


def test_energy_never_falls_when_a_tensors_traffic_grows() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=256)
    spec = arch()
    names = ("XI", "Z")
    rest = [FusionGroup(e.name, (e.name,)) for e in c.einsums if e.name not in names]
    energies = []
    for tile in (256, 64, 16, 4):  # smaller I tiles: the weights WX, WZ are re-read more often
        m = check_mapping(c, Mapping("m", (FusionGroup("F", names, (Loop("I", tile),)), *rest)))
        energies.append(layer_energy(spec, c, layer_latency(spec, c, m)).layer_j)
    assert energies == sorted(energies)
    assert energies[-1] > energies[0]


def test_the_search_can_minimise_energy_or_edp() -> None:
    c = mamba1_layer(PRESETS["mamba-130m"], batch=4, seq_len=512)
    spec = arch()
    buf = spec.memory.onchip_buffer_bytes
    results = {}
    for objective in ("latency", "energy", "edp"):
        m = named_mapping("optimal", c, buf, arch=spec, objective=objective)
        r = layer_latency(spec, c, m)
        results[objective] = (r.latency_s, layer_energy(spec, c, r).layer_j)
    assert results["energy"][1] <= results["latency"][1] * (1 + 1e-9)
    assert results["latency"][0] <= results["energy"][0] * (1 + 1e-9)
    edp = {k: lat * en for k, (lat, en) in results.items()}
    assert edp["edp"] <= min(edp.values()) * (1 + 1e-9)


def test_actions_count_every_run_of_a_recomputed_einsum() -> None:
    c = loads_cascade(TINY)
    spec = arch()
    # T lacks no rank of the loop; a loop over E recomputes nothing, so runs stay 1
    m = check_mapping(c, Mapping("m", (FusionGroup("F", ("T", "Y"), (Loop("E", 1),)),)))
    r = layer_latency(spec, c, m)
    acts = {row.einsum: einsum_actions(spec, c, row) for row in r.einsums}
    assert acts["T"].macs == 24 and acts["Y"].mfu_results == {"exp": 12.0}


def test_shipped_accelerators_carry_sourced_energies() -> None:
    for name in ("mambalaya", "marca-ideal", "geens-ideal", "marca-original"):
        spec = load_arch(name)
        assert spec.energy is not None, name
        for field in type(spec.energy).model_fields:
            assert f"energy.{field}" in spec.sources or "energy" in spec.sources, (name, field)
        c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=64)
        r = layer_latency(spec, c, named_mapping(spec.mappings.default, c, spec.memory.onchip_buffer_bytes, arch=spec))
        e = layer_energy(spec, c, r)  # every width and function the cascade needs has an energy
        assert e.layer_j > 0 and all(v >= 0 for v in e.by_component_j().values())


# -- bad input ---------------------------------------------------------------------------------


def test_a_dataflow_the_array_cannot_run_is_a_clear_error() -> None:
    data = arch_to_dict(MAMBALAYA)
    data["compute"]["dataflows"] = ["row-stationary"]
    with pytest.raises(SpecError, match=r"compute\.dataflows.*weight-stationary"):
        arch_from_dict(data, source="bad.yaml")
    data["compute"]["dataflows"] = ["roofline", "weight-stationary"]
    with pytest.raises(SpecError, match=r"compute\.dataflows.*roofline is an ideal array and cannot be combined"):
        arch_from_dict(data, source="bad.yaml")
    data["compute"]["dataflows"] = []
    with pytest.raises(SpecError, match=r"compute\.dataflows.*at least one"):
        arch_from_dict(data, source="bad.yaml")
    del data["compute"]["dataflows"]
    data["compute"]["dataflow"] = "output-stationary"  # the field's old name
    with pytest.raises(SpecError, match=r"compute\.dataflow: was renamed to compute\.dataflows.*\[output-stationary\]"):
        arch_from_dict(data, source="bad.yaml")


def test_a_negative_energy_is_a_clear_error() -> None:
    data = arch_to_dict(MAMBALAYA)
    data["energy"] = {**TEST_ENERGY, "mac_pj": {16: -1.0}}
    with pytest.raises(SpecError, match=r"energy\.mac_pj\[16\]: must be >= 0"):
        arch_from_dict(data, source="bad.yaml")


def test_a_missing_energy_for_an_action_the_cascade_needs_names_the_field() -> None:
    c = loads_cascade(TINY)
    no_exp = arch(energy__mfu_pj={"silu": 1.0})
    r = layer_latency(no_exp, c, check_mapping(c, unfused_mapping(c)))
    with pytest.raises(SpecError, match=r"energy\.mfu_pj\.exp is missing, and Einsum Y evaluates exp"):
        layer_energy(no_exp, c, r)
    no_16 = arch(energy__mac_pj={32: 3.0})
    r = layer_latency(no_16, c, check_mapping(c, unfused_mapping(c)))
    with pytest.raises(SpecError, match=r"energy\.mac_pj has no entry for 16-bit operations, which Einsum T performs"):
        layer_energy(no_16, c, r)


def test_energy_objective_without_an_energy_section_is_a_clear_error() -> None:
    c = loads_cascade(TINY)
    data = arch_to_dict(load_arch("gpu-h100"))
    data.pop("energy", None)
    data["sources"] = {k: v for k, v in data.get("sources", {}).items() if not k.startswith("energy")}
    bare = arch_from_dict(data)
    with pytest.raises(SpecError, match="has no energy section"):
        named_mapping("optimal", c, 1 << 20, arch=bare, objective="energy")


def test_energy_widths_survive_a_json_round_trip() -> None:
    import json

    spec = load_arch("mambalaya")
    again = arch_from_dict(json.loads(json.dumps(arch_to_dict(spec))))  # JSON turns the width keys into text
    assert again.energy == spec.energy and set(again.energy.mac_pj) == {16, 32}


@pytest.mark.parametrize("switch", [0.0, 64.0])
def test_designs_that_differ_in_dataflows_share_each_operands_array_cycles_exactly(switch: float) -> None:
    """Over a grid of tilings, an Einsum's array cycles are kept per stationary operand
    (cost/spatial.py), so designs that differ only in their dataflows share them. Each
    design's cycles equal those it gets on a cascade no other design has costed, with and
    without a dataflow switch charge; the designs' least cycles do differ."""
    import numpy as np

    from mambalaya.search.candidates import cost_model, tileable_ranks
    from mambalaya.search.candidates import einsum_grid_cycles

    computes = [MAMBALAYA.compute.model_copy(update={"dataflows": flows, "dataflow_switch_cycles": switch})
                for flows in (("weight-stationary", "output-stationary", "input-stationary"),
                              ("weight-stationary", "input-stationary"), ("input-stationary",),
                              ("output-stationary", "weight-stationary"))]

    def layer():
        return mamba1_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=1000, batch=4)

    shared = layer()
    names = ["XI", "DL", "O"]  # GEMMs against weights (in_proj, x_proj, out_proj)

    together, alone = [], []
    for compute in computes:
        for name in names:
            ranks = tileable_ranks(shared, [name])
            tiles = cost_model(shared, [name], ranks).grid()[0]
            together.append(einsum_grid_cycles(compute, shared, name, ranks, tiles)["array_2d"])
            fresh = layer()
            alone.append(einsum_grid_cycles(compute, fresh, name, ranks, cost_model(fresh, [name], ranks).grid()[0])["array_2d"])
    assert all(np.array_equal(a, b) for a, b in zip(together, alone))
    assert not all(np.array_equal(together[k], together[k + len(names)]) for k in range(len(names) * (len(computes) - 1)))
