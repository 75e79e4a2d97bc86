"""The tiled executor: same numbers as the untiled one, and byte counts checked by brute force."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from mambalaya.execute import execute
from mambalaya.execute.tiled import OffChipStore, TiledRun, run_tiled
from mambalaya.fusion.mapping import (
    FusionGroup,
    Loop,
    Mapping,
    MappingError,
    register_resident,
    check_mapping,
    footprint_bytes,
    unfused_mapping,
)
from mambalaya.workloads.blocks.mamba1 import WEIGHTS, Mamba1Config, mamba1_layer

CFG = Mamba1Config(d_model=16, d_state=4)  # E = 32, N = 4, R = 1, K = 4


def prefill(**kw):
    return mamba1_layer(CFG, batch=2, seq_len=10, **kw)


def decode():
    return mamba1_layer(CFG, batch=2, seq_len=10, phase="decode")


CASCADES = {"prefill": prefill, "prefill_state": lambda: prefill(state_io=True), "decode": decode}


def arrays_for(c, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {t: rng.standard_normal(c.shape(t)) * 0.2 for t in WEIGHTS}
    out["A"] = -rng.uniform(1, 16, c.shape("A"))
    for t in c.external_tensors():
        if t not in out:
            out[t] = rng.standard_normal(c.shape(t))
    return out


def with_group(c, name, einsums, loops, halo="retain") -> Mapping:
    """``einsums`` fused in one group with ``loops``; every other Einsum alone."""
    groups = []
    for e in c.einsums:
        if e.name in einsums:
            if not any(g.name == name for g in groups):
                groups.append(FusionGroup(name, tuple(einsums), tuple(Loop(r, t) for r, t in loops), halo))
        else:
            groups.append(FusionGroup(e.name, (e.name,)))
    return check_mapping(c, Mapping(name, tuple(groups)))


def whole(c, loops) -> Mapping:
    g = FusionGroup("all", tuple(e.name for e in c.einsums), tuple(Loop(r, t) for r, t in loops))
    return check_mapping(c, Mapping("all", (g,)))


MID = ["U", "DL", "BM", "CM", "DT", "DELTA", "AD", "BX", "H", "YS", "YD"]
MAPPINGS = {
    "unfused": lambda c: check_mapping(c, unfused_mapping(c)),
    "whole_B1": lambda c: whole(c, [("B", 1)]),
    "whole_B1_I3": lambda c: whole(c, [("B", 1), ("I", 3)]),
    "ssm_B1_E8_I4": lambda c: with_group(c, "ssm", ["AD", "BX", "H", "YS"], [("B", 1), ("E", 8), ("I", 4)]),
    "conv_I3": lambda c: with_group(c, "conv", ["XI", "XC", "U"], [("I", 3)]),
    "conv_I1": lambda c: with_group(c, "conv", ["XI", "XC", "U"], [("I", 1)]),
    "xc_I3_recompute": lambda c: with_group(c, "xc", ["XC"], [("I", 3)], "recompute"),
    "mid_I4_B1": lambda c: with_group(c, "mid", MID, [("I", 4), ("B", 1)]),
    "xn_xi_E8": lambda c: with_group(c, "xnxi", ["XN", "XI"], [("E", 8)]),
}
CASES = [
    (cn, mn)
    for cn in CASCADES
    for mn in MAPPINGS
    if not (cn == "decode" and mn not in ("unfused", "whole_B1", "xn_xi_E8"))
    and not (cn == "prefill_state" and mn == "whole_B1_I3")
]


@pytest.fixture(scope="module")
def runs() -> dict:
    out = {}
    for cn, mn in CASES:
        c = CASCADES[cn]()
        m = MAPPINGS[mn](c)
        a = arrays_for(c)
        out[cn, mn] = (c, m, a, run_tiled(c, m, a), execute(c, a))
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{c}-{m}" for c, m in CASES])
def test_outputs_equal_untiled_execute(runs, case) -> None:
    c, m, _, r, ref = runs[case]
    assert set(r.outputs) == set(c.output_tensors()) == set(ref)
    for t, want in ref.items():
        got = r.outputs[t]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("case", CASES, ids=[f"{c}-{m}" for c, m in CASES])
def test_onchip_peak_within_footprint(runs, case) -> None:
    c, m, _, r, _ = runs[case]
    for g in m.groups:
        assert 0 <= r.onchip_peak_bytes[g.name] <= footprint_bytes(c, g) + 1e-9, g.name
        assert r.steps[g.name] == int(np.prod([lp.trips(c.size(lp.rank)) for lp in g.loops]))


def test_whole_cascade_tiling_is_legal_only_without_state_out() -> None:
    c = prefill(state_io=True)
    with pytest.raises(MappingError) as err:
        whole(c, [("B", 1), ("I", 3)])
    assert err.value.rule == "alignment"  # CSN reads XI at j+L-3 along I (HN, one position of H, may run once along I)
    whole(prefill(), [("B", 1), ("I", 3)])


# ----------------------------------------------------------------------------------------------
# byte facts that do not depend on any traffic formula
# ----------------------------------------------------------------------------------------------


def _initial_axis(c, t):
    spec = c.tensors[t]
    init = c.tensors[spec.initial]
    if len(init.ranks) == len(spec.ranks) - 1:
        p = next(p for p in range(len(spec.ranks)) if spec.ranks[:p] + spec.ranks[p + 1 :] == init.ranks)
        return p, 1, init
    p = next(p for p, (a, b) in enumerate(zip(spec.ranks, init.ranks)) if a != b)
    return p, c.size(init.ranks[p]), init


def brute_force_unfused_bytes(c) -> float:
    """Each Einsum alone reads every distinct element it touches once and writes its output."""
    total = 0.0
    for e in c.einsums:
        vs = e.iteration_variables
        grids = np.meshgrid(*[np.arange(c.variable_sizes[v]) for v in vs], indexing="ij")
        env = {v: g.ravel() for v, g in zip(vs, grids)}
        n = grids[0].size
        touched: dict[str, set] = {}
        for acc in e.inputs:
            idx = np.stack(
                [np.broadcast_to(ix.const + sum(k * env[v] for v, k in ix.terms), (n,)) for ix in acc.indices], axis=1
            )
            shape = np.array(c.shape(acc.tensor))
            ok = np.all((idx >= 0) & (idx < shape), axis=1)
            if acc.tensor != e.name:  # a recurrence reads its own earlier positions on chip
                touched.setdefault(acc.tensor, set()).update(map(tuple, idx[ok]))
            if c.tensors[acc.tensor].initial:
                p, depth, init = _initial_axis(c, acc.tensor)
                others = np.all(np.delete((idx >= 0) & (idx < shape), p, axis=1), axis=1)
                below = others & (idx[:, p] < 0) & (idx[:, p] >= -depth)
                rows = idx[below].copy()
                if depth == 1:
                    rows = np.delete(rows, p, axis=1)
                else:
                    rows[:, p] += depth
                touched.setdefault(init.name, set()).update(map(tuple, rows))
        total += sum(len(s) * c.tensors[t].bits / 8 for t, s in touched.items())
        total += c.elements(e.name) * c.tensors[e.name].bits / 8
    return total


@pytest.mark.parametrize("cn", list(CASCADES))
def test_unfused_bytes_equal_brute_force(runs, cn) -> None:
    c, _, _, r, _ = runs[cn, "unfused"]
    assert c.tensors["X"].bits == 16  # bytes use declared bits, not float64's 8-byte itemsize
    assert r.offchip_bytes == brute_force_unfused_bytes(c)
    assert r.offchip_bytes == r.total_read_bytes + r.total_write_bytes


def test_weights_and_inputs_in_a_tiled_whole_cascade(runs) -> None:
    c, _, _, r, _ = runs["prefill", "whole_B1_I3"]
    trips = c.size("B") * -(-c.size("I") // 3)  # 2 x 4 steps
    assert r.steps == {"all": trips}
    for w in WEIGHTS:
        assert r.read_bytes["all", w] == trips * c.nbytes(w), w
    assert r.read_bytes["all", "X"] == c.nbytes("X")  # the tiles partition X
    assert r.write_bytes == {("all", "XO"): c.nbytes("XO")}
    assert set(t for _, t in r.read_bytes) == {"X", *WEIGHTS}  # no intermediate goes off chip


def _xc_alone(c, tile, halo):
    return with_group(c, "xc", ["XC"], [("I", tile)], halo)


@pytest.mark.parametrize("tile", [1, 3, 4])
def test_halo_retain_reads_each_row_once_and_recompute_rereads(tile) -> None:
    K = CFG.d_conv
    for state in (False, True):
        c = prefill(state_io=state)
        a = arrays_for(c, 3)
        ref = execute(c, a)
        trips = -(-c.size("I") // tile)
        row = c.size("B") * c.size("E") * c.tensors["XI"].bits / 8
        keep = run_tiled(c, _xc_alone(c, tile, "retain"), a)
        again = run_tiled(c, _xc_alone(c, tile, "recompute"), a)
        for r in (keep, again):
            np.testing.assert_allclose(r.outputs["XO"], ref["XO"], rtol=1e-12, atol=1e-13)
        assert keep.read_bytes["xc", "XI"] == c.nbytes("XI")
        # recompute: each tile after the first re-reads the K-1 rows before it that exist
        extra = sum(min(K - 1, a0) for a0 in range(tile, c.size("I"), tile))
        assert again.read_bytes["xc", "XI"] == c.nbytes("XI") + extra * row
        assert trips > 1
        if state:
            assert keep.read_bytes["xc", "CS0"] == c.nbytes("CS0")  # incoming conv state once
            below = sum(max(0, K - 1 - a0) for a0 in range(0, c.size("I"), tile))
            assert again.read_bytes["xc", "CS0"] == below * row
        else:
            assert ("xc", "CS0") not in keep.read_bytes


def test_recomputed_producer_reads_and_writes_once_per_tile(runs) -> None:
    c, m, _, r, _ = runs["prefill", "xn_xi_E8"]
    g = next(g for g in m.groups if g.name == "xnxi")
    assert g.einsums == ("XN", "XI") and g.loops == (Loop("E", 8),)
    trips = c.size("E") // 8
    assert r.steps["xnxi"] == trips
    assert r.read_bytes["xnxi", "X"] == trips * c.nbytes("X")  # XN runs again for every E tile
    assert r.read_bytes["xnxi", "RS"] == trips * c.nbytes("RS")
    assert r.read_bytes["xnxi", "WN"] == trips * c.nbytes("WN")
    assert r.read_bytes["xnxi", "WX"] == c.nbytes("WX")
    assert r.write_bytes["xnxi", "XN"] == trips * c.nbytes("XN")  # Z (another group) reads XN
    assert r.write_bytes["xnxi", "XI"] == c.nbytes("XI")
    # XN lacks E: its tile is the full tensor, and it is the whole footprint
    assert r.onchip_peak_bytes["xnxi"] == footprint_bytes(c, g) == c.nbytes("XN")


def test_fused_ssm_region_keeps_intermediates_and_state_on_chip(runs) -> None:
    c, m, _, r, _ = runs["prefill_state", "ssm_B1_E8_I4"]
    g = next(g for g in m.groups if g.name == "ssm")
    reads = {t for (gn, t) in r.read_bytes if gn == "ssm"}
    writes = {t for (gn, t) in r.write_bytes if gn == "ssm"}
    assert reads == {"DELTA", "A", "U", "BM", "CM", "H0"}
    assert writes == {"H", "YS"}  # HN (another group) reads H
    assert r.read_bytes["ssm", "H0"] == c.nbytes("H0")  # the incoming state once, at I tile 0
    assert r.read_bytes["ssm", "A"] == c.size("B") * 3 * c.nbytes("A")  # per (B, I) tile
    # the H tile (1 x 4 x 8 x N, written off chip: HN reads it) and one carried state (1 x 8 x N),
    # as the footprint says; AD and BX go from the lanes that make them to the recurrence in registers
    tile = 4 * 8 * c.size("N") * 2
    assert register_resident(c, g) == {"AD", "BX"}
    assert r.onchip_peak_bytes["ssm"] == footprint_bytes(c, g) == tile + tile / 4


def test_carried_state_kept_for_every_inner_tile(runs) -> None:
    c, m, _, r, _ = runs["prefill", "mid_I4_B1"]
    g = next(g for g in m.groups if g.name == "mid")
    assert r.onchip_peak_bytes["mid"] == footprint_bytes(c, g)  # B inside I: both states live
    assert r.read_bytes["mid", "XC"] == c.nbytes("XC") and ("mid", "H") not in r.write_bytes


def test_decode_reads_states_and_writes_new_ones(runs) -> None:
    c, _, _, r, _ = runs["decode", "whole_B1"]
    assert r.read_bytes["all", "H0"] == c.nbytes("H0")
    assert r.read_bytes["all", "CS0"] == c.nbytes("CS0")
    assert r.write_bytes["all", "H"] == c.nbytes("H") and r.write_bytes["all", "CSN"] == c.nbytes("CSN")


def test_store_counts_declared_bits() -> None:
    c = mamba1_layer(CFG, batch=1, seq_len=4, bits=8)
    store = OffChipStore(c, {"X": np.ones(c.shape("X"))})
    assert store.read("g", "X", ((0, 1), (1, 3), (0, 16))).shape == (1, 2, 16)
    store.write("g", "XO", ((0, 1), (0, 4), (0, 2)), np.ones((1, 4, 2)))
    assert store.read_bytes == {("g", "X"): 32.0} and store.write_bytes == {("g", "XO"): 8.0}
    run = TiledRun({}, store.read_bytes, store.write_bytes, {}, {})
    assert run.offchip_bytes == 40.0


def test_tiled_run_holds_no_full_intermediates() -> None:
    """Python memory of a run fused over I is far below the untiled run's."""
    c = mamba1_layer(Mamba1Config(d_model=32, d_state=16), batch=1, seq_len=512)
    a = arrays_for(c, 5)
    m = whole(c, [("I", 32)])
    tracemalloc.start()
    try:
        execute(c, a)
        untiled = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        tiled = run_tiled(c, m, a)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < untiled / 4
    assert tiled.steps == {"all": 16}


def test_a_retained_window_beside_reads_that_do_not_move_with_its_tiles_is_refused() -> None:
    """Mamba-2's conv CC reads CI through a window along I; its conv-state output CSCN reads CI's
    last rows, which do not move with the I tiles. With halo: retain the traffic counted each row
    once, as if the box between them stayed on chip, while the footprint held the window's rows
    (768 B for an on-chip peak of 115 KB at L 512): the buffer check passed a group that does not
    fit. Refused, naming both; with halo: recompute (or CSCN alone) the group is legal."""
    from mambalaya.workloads import PRESETS, build_layer
    from mambalaya.fusion.mapping import check_group_rules

    c = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=1, scan="chunked", state_io=True)
    with pytest.raises(MappingError, match="CSCN reads CI along I at positions that do not move") as err:
        check_group_rules(c, FusionGroup("CONV", ("CC", "CSCN"), (Loop("I", 64),), "retain"))
    assert err.value.rule == "halo"
    check_group_rules(c, FusionGroup("CONV", ("CC", "CSCN"), (Loop("I", 64),), "recompute"))
    check_group_rules(c, FusionGroup("CONV", ("CC",), (Loop("I", 64),), "retain"))
