"""The optimal search over groups that are not contiguous in the cascade's order: connected
convex groups (mambalaya.search.convex), exact against every set partition of small branched
cascades, each group tiled by exhaustive enumeration."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch
from mambalaya.einsum import loads_cascade
from mambalaya.fusion.mapping import FusionGroup, Mapping, MappingError, check_mapping, group_order
from mambalaya.search import convex, mappings as search
from mambalaya.search.convex import convex_space
from mambalaya.cost.latency import layer_latency
from mambalaya.search.mappings import named_mapping, optimal
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads import PRESETS, build_layer

from test_search import brute_force_group

# Two branches from X (P1 -> S1, and P2) meet in M; R reduces P2 over the positions, so a
# group holding R cannot tile them. In cascade order R sits between P2 and S1: the group
# {P1, P2, S1, M, O} that leaves R out is not contiguous.
BRANCHED = """
ranks: {B: 2, I: 16, D: 4, E: 8}
tensors:
  X:  {ranks: [B, I, D], role: input}
  W1: {ranks: [D, E], role: weight}
  W2: {ranks: [D, E], role: weight}
  W3: {ranks: [E, D], role: weight}
  P1: {ranks: [B, I, E], role: intermediate}
  P2: {ranks: [B, I, E], role: intermediate}
  R:  {ranks: [B, E], role: output}
  S1: {ranks: [B, I, E], role: intermediate}
  M:  {ranks: [B, I, E], role: intermediate}
  O:  {ranks: [B, I, D], role: output}
einsums:
  - P1[b,i,e] = X[b,i,d]*W1[d,e]
  - P2[b,i,e] = X[b,i,d]*W2[d,e]
  - R[b,e] = P2[b,i,e]
  - S1[b,i,e] = silu(P1[b,i,e])
  - M[b,i,e] = S1[b,i,e]*P2[b,i,e]
  - O[b,i,d] = M[b,i,e]*W3[e,d]
"""


def _partitions(items: list[str]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def _legal_grouping(c, groups: list[list[str]]) -> bool:
    space = convex_space(c)
    bit = {n: 1 << i for i, n in enumerate(space.names)}
    if any(sum(bit[n] for n in g) not in space.groups for g in groups):  # connected and convex
        return False
    try:
        group_order(c, [FusionGroup(f"G{k}", tuple(g)) for k, g in enumerate(groups)])
    except MappingError:
        return False
    return True


def brute_force_partitions(c, buffer):
    """Least traffic over every set partition of the Einsums into connected convex groups that
    can run in some order, each group at its best tiling (exhaustive, general model)."""
    names = [e.name for e in c.einsums]
    best = None
    for groups in _partitions(names):
        groups = [[n for n in names if n in g] for g in groups]
        if not _legal_grouping(c, groups):
            continue
        costs = [brute_force_group(c, g, buffer) for g in groups]
        if any(x is None for x in costs):
            continue
        total = sum(costs)
        best = total if best is None else min(best, total)
    return best


def test_the_space_is_every_connected_convex_set() -> None:
    c = loads_cascade(BRANCHED)
    space = convex_space(c)
    bit = {n: 1 << i for i, n in enumerate(space.names)}
    mask = lambda *ns: sum(bit[n] for n in ns)  # noqa: E731
    assert mask("P1", "S1") in space.groups  # not contiguous, convex, connected
    assert mask("P1", "M") not in space.groups  # not convex: M reads S1, which reads P1
    assert mask("S1", "P2") not in space.groups  # convex, but they share no tensor
    assert mask("P1", "P2") in space.groups  # both read X: fused, X is read once
    assert mask("S1", "R") not in space.groups  # convex, but they share no tensor
    assert mask("P1", "P2", "S1", "M", "O") in space.groups
    assert space.downsets[0] == 0 and space.downsets[-1] == mask(*space.names)


@pytest.mark.parametrize("buffer", [64, 128, 256, 1024, None])
def test_optimal_equals_every_partition_enumerated(buffer) -> None:
    c = loads_cascade(BRANCHED)
    expected = brute_force_partitions(c, buffer)
    if expected is None:
        with pytest.raises(Exception):
            optimal(c, buffer)
        return
    m = optimal(c, buffer)
    assert "connected convex groups" in m.description
    assert mapping_traffic(c, m).offchip_bytes == pytest.approx(expected, rel=0, abs=1e-9)


def test_a_non_contiguous_group_beats_the_contiguous_optimum_and_runs() -> None:
    c = loads_cascade(BRANCHED)
    m = optimal(c, 256)
    search.CONVEX_GROUPS = False
    try:
        contiguous = optimal(c, 256)
    finally:
        search.CONVEX_GROUPS = True
    assert mapping_traffic(c, m).offchip_bytes < mapping_traffic(c, contiguous).offchip_bytes
    names = [e.name for e in c.einsums]
    assert any(names.index(g.einsums[-1]) - names.index(g.einsums[0]) + 1 > len(g.einsums) for g in m.groups)
    assert [g.einsums for g in m.groups] == [("P1", "P2", "S1", "M", "O"), ("R",)]
    check_mapping(c, Mapping("again", m.groups, 256, ""))  # legal as a mapping file would be


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_on_a_mamba_1_layer_the_convex_search_is_never_slower_than_the_contiguous_one(phase: str,
                                                                                         monkeypatch) -> None:
    arch = load_arch("mambalaya")
    layer = lambda: build_layer(PRESETS["mamba-130m"], phase=phase, seq_len=512 if phase == "prefill" else 1,  # noqa: E731
                                batch=8)
    c = layer()
    m = named_mapping("optimal", c, arch.memory.onchip_buffer_bytes, arch=arch)
    assert "connected convex groups" in m.description
    monkeypatch.setattr(search, "CONVEX_GROUPS", False)
    c2 = layer()
    m2 = named_mapping("optimal", c2, arch.memory.onchip_buffer_bytes, arch=arch)
    tol = 1 + search.LATENCY_TIE_TOLERANCE
    assert layer_latency(arch, c, m).latency_s <= layer_latency(arch, c2, m2).latency_s * tol


def test_beyond_the_limits_the_search_is_contiguous_and_says_so(monkeypatch) -> None:
    monkeypatch.setattr(convex, "CONVEX_GROUP_LIMIT", 5)
    c = loads_cascade(BRANCHED)
    assert convex_space(c) is None
    m = optimal(c, 256)
    assert "contiguous groups" in m.description and "limits" in m.description


def test_every_grouping_the_partitions_allow_is_a_path_over_downsets() -> None:
    """Each legal partition of the branched cascade is a chain of downsets of the space."""
    c = loads_cascade(BRANCHED)
    space = convex_space(c)
    names = [e.name for e in c.einsums]
    bit = {n: 1 << i for i, n in enumerate(space.names)}
    count = 0
    for groups in _partitions(names):
        groups = [[n for n in names if n in g] for g in groups]
        if not _legal_grouping(c, groups):
            continue
        order = group_order(c, [FusionGroup(f"G{k}", tuple(g)) for k, g in enumerate(groups)])
        done = 0
        for g in order:
            m = sum(bit[n] for n in g.einsums)
            assert (done, done | m) in space.groups[m]
            done |= m
        count += 1
    assert count > 20


def test_the_tiled_executor_runs_the_non_contiguous_grouping_and_moves_the_bytes_the_model_counts() -> None:
    import numpy as np

    from mambalaya.execute import execute, run_tiled
    from mambalaya.cost.buffer import group_buffer_accesses

    c = loads_cascade(BRANCHED)
    m = optimal(c, 256)
    rng = np.random.default_rng(0)
    arrays = {t: rng.standard_normal(c.shape(t)) for t in c.external_tensors()}
    ref = execute(c, arrays, dtype="float64")
    run = run_tiled(c, m, arrays)
    for t, want in ref.items():
        assert np.max(np.abs(run.outputs[t] - want)) <= 1e-12 * np.max(np.abs(want)), t
    model = mapping_traffic(c, m)
    assert run.offchip_bytes == model.offchip_bytes
    for g in model.groups:
        assert (run.group_read_bytes(g.group), run.group_write_bytes(g.group)) == (g.read_bytes, g.write_bytes)
    for group in m.groups:
        buf = group_buffer_accesses(c, group)
        assert run.group_buffer_bytes(group.name) == (buf.read_bytes, buf.write_bytes)


def test_the_chunked_ssd_s_best_grouping_is_not_contiguous(monkeypatch) -> None:
    """The SSD of Mamba-2's chunked scan alone (what a fused kernel runs): the search finds the
    scores CB apart from the rest, which no contiguous grouping can express, and is faster."""
    from mambalaya.einsum.select import sub_cascade

    arch = load_arch("mambalaya")
    ssd = ["XDT", "ACS", "LD", "CB", "YDG", "DC", "ST", "CD", "HC", "DO", "YO"]
    layer = lambda: sub_cascade(build_layer(PRESETS["mamba2-2.7b"], phase="prefill", seq_len=8192, batch=64,  # noqa: E731
                                            scan="chunked"), ssd)
    c = layer()
    m = named_mapping("optimal", c, 16 << 20, arch=arch)
    assert ("CB",) in [g.einsums for g in m.groups]
    monkeypatch.setattr(search, "CONVEX_GROUPS", False)
    c2 = layer()
    m2 = named_mapping("optimal", c2, 16 << 20, arch=arch)
    assert ("CB",) not in [g.einsums for g in m2.groups]
    assert layer_latency(arch, c, m).latency_s < layer_latency(arch, c2, m2).latency_s / 1.05


@pytest.mark.parametrize("objective", ["energy", "edp"])
def test_the_convex_search_is_never_worse_for_energy_or_edp(objective: str, monkeypatch) -> None:
    from mambalaya.cost.energy import layer_energy

    arch = load_arch("mambalaya")

    def cost(c, m) -> float:
        lat = layer_latency(arch, c, m)
        energy = layer_energy(arch, c, lat).layer_j
        return energy if objective == "energy" else energy * lat.latency_s

    layer = lambda: build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)  # noqa: E731
    c = layer()
    m = optimal(c, 1 << 20, arch=arch, objective=objective)
    assert "connected convex groups" in m.description
    monkeypatch.setattr(search, "CONVEX_GROUPS", False)
    c2 = layer()
    m2 = optimal(c2, 1 << 20, arch=arch, objective=objective)
    assert cost(c, m) <= cost(c2, m2) * (1 + 1e-9)


def _every_group_costed(c, space, buffer, arch, objective="latency"):
    import numpy as np

    from mambalaya.search import convex_search

    costed = convex_search._Costed(c, space, buffer, None, arch, objective)
    costed.add(np.arange(space.masks.size))
    return costed, convex_search.convex_grouping(space, costed, arch, objective)


def _lazy_and_every(arch, phase, objective):
    """A Mamba-1 layer's lazy convex search under ``objective`` and, on a fresh build of the
    layer, every group costed: (the lazy grouping, the every-group one, the costed groups, the
    second cascade, the space), after asserting the bounds ruled some groups out."""
    from mambalaya.search import convex_search

    buffer = 1 << 20
    layer = lambda: build_layer(PRESETS["mamba-130m"], phase=phase, seq_len=512 if phase == "prefill" else 1,  # noqa: E731
                                batch=8)
    c = layer()
    space = convex_space(c)
    stats = search.SearchStats()
    lazy = convex_search.convex_optimal(c, space, buffer, stats, arch, objective)
    assert 0 < stats.groups_costed < space.masks.size  # the bounds rule groups out
    c2 = layer()
    costed, every = _every_group_costed(c2, space, buffer, arch, objective)
    return lazy, every, costed, c2, space


@pytest.mark.parametrize("arch_name", ["mambalaya", "gpu-h100", None])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_the_lazy_search_equals_costing_every_group_and_its_bounds_hold(arch_name, phase) -> None:
    """Costing only the groups the lower bounds cannot rule out (mambalaya.search.convex_search)
    chooses exactly what costing every connected convex group chooses, on a Mamba-1 layer and
    on designs with and without kernel floors and staging levels; and every bound is at most
    the cost the search finds for its group."""
    import numpy as np

    from mambalaya.search.convex_bounds import cycles_lower_bounds, latency_lower_bounds, traffic_lower_bounds

    arch = None if arch_name is None else load_arch(arch_name)
    lazy, every, costed, c2, space = _lazy_and_every(arch, phase, "latency")
    assert [x.choice() for x in lazy] == [x.choice() for x in every]
    bound = traffic_lower_bounds(c2, space)
    if arch is not None:
        bound = latency_lower_bounds(arch, bound, cycles_lower_bounds(c2, space, arch.compute))
    finite = np.isfinite(costed.cost)
    assert finite.sum() > 100
    assert (bound[finite] <= costed.cost[finite] * (1 + 1e-12)).all()


@pytest.mark.parametrize("arch_name,buffer", [("mambalaya", 1 << 20), ("geens-ideal", 4 << 20), ("gpu-h100", 1 << 18)])
def test_the_tie_programme_reads_only_the_pairs_within_the_tie_and_chooses_the_same(arch_name, buffer,
                                                                                   monkeypatch) -> None:
    """convex_grouping hands the least-traffic-within-the-tie programme only the pairs on some
    path within the tie (convex_search._within_tie); with every costed group it chooses what it
    chooses when handed every pair, and the pairs it leaves out are most of them. (On geens-ideal and
    gpu-h100 here, keeping only the pairs of the shortest paths would choose otherwise.)"""
    import numpy as np

    from mambalaya.search import convex_search

    arch = load_arch(arch_name)
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=1000, batch=4)
    space = convex_space(c)
    costed, kept = _every_group_costed(c, space, buffer, arch)
    rows = np.flatnonzero(np.isfinite(costed.cost[space.group]))
    assert convex_search._within_tie(space, costed.cost, rows).sum() < rows.size / 2
    monkeypatch.setattr(convex_search, "_within_tie", lambda space, cost, rows: np.ones(rows.size, bool))
    every = convex_search.convex_grouping(space, costed, arch, "latency")
    assert [x.choice() for x in kept] == [x.choice() for x in every]


def test_a_bound_that_lies_would_change_the_choice(monkeypatch) -> None:
    """The exactness test can fail: bounds above the costs (every group's bound times 5) rule
    out groups the best grouping needs."""
    from mambalaya.search import convex_search

    arch = load_arch("mambalaya")
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=8)
    space = convex_space(c)
    right = convex_search.convex_optimal(c, space, 1 << 20, None, arch, "latency")
    real = convex_search.latency_lower_bounds
    monkeypatch.setattr(convex_search, "latency_lower_bounds", lambda *a: real(*a) * 5)
    wrong = convex_search.convex_optimal(c, space, 1 << 20, None, arch, "latency")
    assert sum(x.cost() for x in wrong) > sum(x.cost() for x in right)


def test_beyond_the_default_limits_optimal_convex_still_searches_every_group(monkeypatch) -> None:
    """Where a cascade has more connected convex groups than the default search takes on (the
    Mamba-2 layers: 10,584 recurrent, 103,636 chunked), ``optimal`` keeps to contiguous groups
    and names ``optimal-convex``, which searches them all and finds what the convex search
    finds within the limits. Here the limit is lowered below a Mamba-1 layer's 855 groups."""
    from mambalaya.search import convex_search

    arch = load_arch("mambalaya")
    layer = lambda: build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=8)  # noqa: E731
    within = named_mapping("optimal", layer(), 1 << 20, arch=arch)
    monkeypatch.setattr(convex, "CONVEX_GROUP_LIMIT", 50)
    c = layer()
    assert convex_space(c) is None and convex_space(c, widest=True).masks.size == 855
    m = named_mapping("optimal", c, 1 << 20, arch=arch)
    assert "contiguous" in m.description and "optimal-convex" in m.description
    c2 = layer()
    wide = named_mapping("optimal-convex", c2, 1 << 20, arch=arch)
    assert wide.name == "optimal-convex" and "connected convex groups" in wide.description
    assert wide.groups == within.groups
    check_mapping(c2, Mapping("again", wide.groups, wide.buffer_bytes, ""))
    tol = 1 + search.LATENCY_TIE_TOLERANCE
    assert layer_latency(arch, c2, wide).latency_s <= layer_latency(arch, c, m).latency_s * tol
    monkeypatch.setattr(convex_search, "EXHAUSTIVE_GROUP_LIMIT", 50)
    with pytest.raises(Exception, match="optimal-convex minimises energy-delay product"):
        named_mapping("optimal-convex", layer(), 1 << 20, arch=arch, objective="edp")
    assert named_mapping("optimal-convex", layer(), 1 << 20, arch=arch, objective="energy").name == "optimal-convex"


def _contiguous(preset: str, phase: str, arch, buffer: int, *, lazy: bool, monkeypatch, scan: str | None = None):
    """The contiguous search's mapping and the segments it costed, lazily or costing every one."""
    monkeypatch.setattr(search, "CONVEX_GROUPS", False)
    monkeypatch.setattr(search, "LAZY_SEGMENTS", lazy)
    c = build_layer(PRESETS[preset], phase=phase, seq_len=1024 if phase == "prefill" else 1, batch=4, scan=scan)
    stats = search.SearchStats()
    return optimal(c, buffer, stats, arch=arch), stats.groups_costed


@pytest.mark.parametrize("arch_name", ["mambalaya", "gpu-h100", None])
@pytest.mark.parametrize("preset,phase,scan", [("mamba2-130m", "prefill", "chunked"), ("mamba2-130m", "decode", None),
                                               ("mamba-130m", "prefill", None)])
def test_the_lazy_contiguous_search_equals_costing_every_segment(arch_name, preset, phase, scan, monkeypatch) -> None:
    """The contiguous search costs only the segments the lower bounds cannot rule out (the lazy
    search over the prefixes, convex_search.segment_choices) and chooses exactly the mapping
    costing every segment chooses: Mamba-2 chunked prefill and decode and a Mamba-1 layer, on
    designs with and without kernel floors and staging levels and without a design (traffic),
    at a roomy and a tight buffer."""
    arch = None if arch_name is None else load_arch(arch_name)
    for buffer in (32 << 20, 1 << 20):
        every, all_costed = _contiguous(preset, phase, arch, buffer, lazy=False, monkeypatch=monkeypatch, scan=scan)
        lazy, costed = _contiguous(preset, phase, arch, buffer, lazy=True, monkeypatch=monkeypatch, scan=scan)
        assert lazy.groups == every.groups and lazy.description == every.description
        assert costed <= all_costed


def test_the_lazy_contiguous_search_rules_segments_out_and_needs_true_bounds(monkeypatch) -> None:
    """On a chunked Mamba-2 prefill the bounds rule most segments out; a bound that lies (a
    hundred times the true one on the best grouping's own segments) keeps the search from
    costing them and changes the choice, so the test above can fail."""
    import numpy as np

    from mambalaya.search import convex_search
    from mambalaya.search.convex import contiguous_space

    arch = load_arch("mambalaya")
    every, all_costed = _contiguous("mamba2-130m", "prefill", arch, 32 << 20, lazy=False, monkeypatch=monkeypatch,
                                    scan="chunked")
    lazy, costed = _contiguous("mamba2-130m", "prefill", arch, 32 << 20, lazy=True, monkeypatch=monkeypatch,
                               scan="chunked")
    assert costed < all_costed / 2
    space = contiguous_space(build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=4, scan="chunked"))
    bit = {n: 1 << i for i, n in enumerate(space.names)}
    best_segments = np.flatnonzero(np.isin(space.masks, [sum(bit[e] for e in g.einsums) for g in lazy.groups]))
    assert best_segments.size == len(lazy.groups)
    real = convex_search.latency_lower_bounds

    def lying(*args):
        bound = real(*args).copy()
        bound[best_segments] *= 100
        return bound

    monkeypatch.setattr(convex_search, "latency_lower_bounds", lying)
    wrong, _ = _contiguous("mamba2-130m", "prefill", arch, 32 << 20, lazy=True, monkeypatch=monkeypatch, scan="chunked")
    assert wrong.groups != lazy.groups


@pytest.mark.parametrize("arch_name,phase", [("mambalaya", "decode"), ("marca-ideal", "prefill")])
def test_the_lazy_energy_search_equals_costing_every_group_and_its_bounds_hold(arch_name, phase) -> None:
    """The least-energy search costs only the groups energy's lower bounds cannot rule out (each
    member's arithmetic run once, the off-chip bytes' bound at the DRAM's energy, the leakage over
    the latency's bound) and chooses exactly what costing every connected convex group chooses;
    every bound is at most the energy the search finds for its group."""
    import numpy as np

    from mambalaya.search.convex_bounds import energy_lower_bounds

    arch = load_arch(arch_name)
    lazy, every, costed, c2, space = _lazy_and_every(arch, phase, "energy")
    assert [x.choice() for x in lazy] == [x.choice() for x in every]
    bound = energy_lower_bounds(arch, c2, space)
    finite = np.isfinite(costed.cost)
    assert finite.sum() > 100
    assert (bound[finite] <= costed.cost[finite] * (1 + 1e-12)).all()


def test_the_lazy_contiguous_search_minimises_energy_as_costing_every_segment(monkeypatch) -> None:
    """Beyond the convex limits (a chunked Mamba-2 prefill) the least-energy search over contiguous
    segments costs only those energy's bounds cannot rule out, and chooses what costing every
    segment chooses."""
    arch = load_arch("mambalaya")
    monkeypatch.setattr(search, "CONVEX_GROUPS", False)
    found = {}
    for lazy in (False, True):
        monkeypatch.setattr(search, "LAZY_SEGMENTS", lazy)
        c = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=4, scan="chunked")
        stats = search.SearchStats()
        found[lazy] = (optimal(c, 1 << 20, stats, arch=arch, objective="energy"), stats.groups_costed)
    assert found[True][0].groups == found[False][0].groups and found[True][0].description == found[False][0].description
    assert found[True][1] < found[False][1]


@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_the_lazy_contiguous_search_runs_beyond_63_einsums_as_costing_every_segment(monkeypatch) -> None:
    """Zamba2's hybrid layer (the shared attention block and a Mamba-2 mixer, 65 Einsums in its
    chunked prefill) is wider than a 63-bit mask: its contiguous space holds its masks as Python
    integers, and the lazy search over it chooses what costing every segment chooses, costing fewer."""
    from mambalaya.search.convex import contiguous_space
    from mambalaya.workloads import resolve_model

    arch = load_arch("mambalaya")
    found = {}
    for lazy in (False, True):
        monkeypatch.setattr(search, "LAZY_SEGMENTS", lazy)
        c = build_layer(resolve_model("zamba2-2.7b"), phase="prefill", seq_len=512, batch=2, scan="chunked",
                        layer_type="hybrid")
        assert len(c.einsums) > 63 and contiguous_space(c).masks.dtype == object
        stats = search.SearchStats()
        found[lazy] = (optimal(c, arch.memory.onchip_buffer_bytes, stats, arch=arch), stats.groups_costed)
    assert found[True][0].groups == found[False][0].groups and found[True][0].description == found[False][0].description
    assert found[True][1] < found[False][1]


def test_a_group_holding_one_over_the_buffer_may_still_fit_and_is_costed() -> None:
    """Adding an Einsum can shrink a group's footprint: ``HN = H[b,L-1]`` reads one position of a
    tensor, and holds that slice whole when it comes from off chip but only the tile holding the
    position when its producer is in the group (zamba2's chunked Mamba layer with its final
    state: HN .. YD needs 266 kB at least, the segment from HC to YD 58 kB). The searches once
    left every group holding an over-the-buffer one out with it: the lazy search costed the
    fitting superset infinite whenever a subset was costed in the same round (zamba2-2.7b's
    evaluate then chose a grouping 11 GB heavier and slower), and the exhaustive one stopped
    growing a segment at the first that did not fit. Each group's cost must be its own,
    whatever is costed beside it."""
    import numpy as np

    from mambalaya.search.candidates import cost_model, tileable_ranks
    from mambalaya.search.convex import contiguous_space
    from mambalaya.search.convex_search import _Costed

    arch = load_arch("mambalaya")
    layer = lambda: build_layer(PRESETS["zamba2-2.7b"], phase="prefill", seq_len=2048, batch=2, scan="chunked",  # noqa: E731
                                layer_type="mamba")
    cascade = layer()
    space = contiguous_space(cascade)
    names = list(space.names)
    small, large = names.index("HN"), names.index("YD") + 1
    index = {int(m): i for i, m in enumerate(space.masks)}
    mask = lambda a, b: sum(1 << k for k in range(a, b))  # noqa: E731
    inner, outer = index[mask(small, large)], index[mask(names.index("HC"), large)]
    footprint = {g: cost_model(cascade, space.einsums(int(space.masks[g])),
                               tileable_ranks(cascade, space.einsums(int(space.masks[g])))).least_footprint()
                 for g in (inner, outer)}
    assert footprint[outer] < footprint[inner]
    buffer = int((footprint[outer] + footprint[inner]) / 2)
    together = _Costed(cascade, space, buffer, None, arch, "latency")
    together.add(np.array([inner, outer]))
    assert together.cost[inner] == np.inf and np.isfinite(together.cost[outer])
    fresh = layer()
    alone = _Costed(fresh, contiguous_space(fresh), buffer, None, arch, "latency")
    alone.add(np.array([outer]))
    assert alone.cost[outer] == together.cost[outer]
