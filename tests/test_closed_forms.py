"""The search takes each picked group's traffic and latency from its closed forms
(search/candidates.py) instead of re-costing it with the general model. These tests check that
the two agree on candidates of every shipped layer kind, and that a disagreement makes the
search fall back to re-costing every pick rather than return a mis-costed mapping."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalaya.search import group_choice
from mambalaya.search.picking import legal_rules
from mambalaya.arch import load_arch
from mambalaya.fusion.mapping import FusionGroup, Loop, MappingError, check_group, footprint_bytes, tensors_read
from mambalaya.search import candidates, picks, mappings as search
from mambalaya.cost.latency import combine, group_cycles, group_seconds, onchip_seconds
from mambalaya.search.mappings import named_mapping
from mambalaya.cost.buffer import group_buffer_accesses
from mambalaya.cost.traffic import group_traffic
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.blocks.mamba2 import mamba2_layer
from mambalaya.workloads.families.bamba import hybrid_layer

from test_hybrid_eval import SMALL as SMALL_HYBRID

BUFFER = 8 << 20
SMALL_BUFFER = 64 << 10  # small enough that some picks need small tiles


def _layers():
    yield "mamba1-prefill", build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)
    yield "mamba1-decode", build_layer(PRESETS["mamba-130m"], phase="decode", seq_len=1, batch=4)
    yield "mamba2-chunked", build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2, scan="chunked")
    yield "mamba2-recurrent", build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=128, batch=2, scan="recurrent")
    yield "hybrid-attention", hybrid_layer(SMALL_HYBRID, "attention", phase="prefill", seq_len=64, batch=2)
    yield "hybrid-attention-online-decode", hybrid_layer(SMALL_HYBRID, "attention", phase="decode", seq_len=64, batch=2,
                                                         softmax="online")
    yield "hybrid-mamba", hybrid_layer(SMALL_HYBRID, "mamba", phase="prefill", seq_len=128, batch=2)
    # incoming states: the conv states before the first positions, the scan's initial state
    yield "mamba1-state", build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2, state_io=True)
    yield "mamba2-chunked-state", build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2,
                                              scan="chunked", state_io=True)
    yield "hybrid-attention-decode", hybrid_layer(SMALL_HYBRID, "attention", phase="decode", seq_len=64, batch=2)


#: The layers whose groups read a tensor with an initial value from off chip (its incoming rows
#: held resident with it): the residency closed form counts those rows' bytes as saved too.
WITH_INITIAL = {"hybrid-attention-online-decode", "hybrid-mamba", "mamba1-state", "mamba2-chunked-state",
                "hybrid-attention-decode"}


@pytest.mark.parametrize("name,cascade", list(_layers()), ids=lambda x: x if isinstance(x, str) else "")
def test_closed_forms_equal_the_general_model_on_sampled_candidates(name: str, cascade) -> None:
    """For contiguous segments of the layer whose traffic closed form claims exactness, and a
    sample of each one's kept candidates: the closed-form traffic equals the general model's to the
    bit; the on-chip bytes (window halos and rotated boxes read again per tile included) and the
    latency equal ``group_buffer_accesses`` and ``group_seconds`` (to 1e-12: summed in another
    order); the footprint bound is at least the footprint; and a candidate that keeps the
    tile-size-independent rules and whose bound fits is legal."""
    names = [e.name for e in cascade.einsums]
    rng = random.Random(7)
    segments = [(a, b) for b in range(1, len(names) + 1) for a in range(b)]
    checked = with_initial = 0
    for a, b in rng.sample(segments, len(segments)):
        if checked >= 150 and (with_initial >= 30 or name not in WITH_INITIAL):
            break
        reads_initial = any(cascade.tensors[t].initial for t in tensors_read(cascade, FusionGroup("g", tuple(names[a:b]), ())))
        if checked >= 150 and not reads_initial:
            continue
        done = _check_sampled_candidates(name, cascade, names[a:b], rng, 6)
        checked += done
        with_initial += done if reads_initial else 0
    assert checked >= 150
    assert (with_initial >= 30) == (name in WITH_INITIAL), with_initial


def _check_sampled_candidates(name: str, cascade, einsums: list[str], rng: random.Random, samples: int,
                              wanted=None) -> int:
    """The checks of :func:`test_closed_forms_equal_the_general_model_on_sampled_candidates` on
    ``samples`` kept candidates of the group of ``einsums`` (of those whose group ``wanted``
    accepts, if given; none if its closed form is not exact); how many were checked."""
    arch = load_arch("mambalaya")
    checked = 0
    model = candidates.cost_model(cascade, einsums, candidates.tileable_ranks(cascade, einsums))
    if not model.exact_traffic:
        return 0
    cand = model.candidates()
    cycles = model.cycles(arch.compute)
    pool = [p for p in range(cand.kept.size) if wanted is None or wanted(model.group_at(int(cand.kept[p])))]
    for pos in rng.sample(pool, min(samples, len(pool))):
        group = model.group_at(int(cand.kept[pos]))
        exact = group_traffic(cascade, group)
        assert exact.total_bytes == cand.kept_traffic[pos], (name, group)
        assert footprint_bytes(cascade, group) <= cand.kept_fp[pos], (name, group)
        tiling = int(cand.kept_tiling[pos])
        comp = cycles[tiling:tiling + 1] / arch.clock_hz
        mem = cand.kept_traffic[pos:pos + 1] / arch.memory.offchip_bandwidth_bytes_per_s
        onchip = model.onchip_bytes(cand.kept[pos:pos + 1], cand.kept_traffic[pos:pos + 1])
        latency, _ = combine(arch, comp, mem, onchip_seconds(arch, onchip), cand.steps[tiling:tiling + 1],
                                    len(einsums))
        buffer = group_buffer_accesses(cascade, group, exact).total_bytes
        assert float(onchip[0]) == pytest.approx(buffer, rel=1e-12), (name, group)  # halos and rotations included
        assert float(latency[0]) == pytest.approx(group_seconds(arch, cascade, group, exact), rel=1e-12), (name, group)
        if legal_rules(cascade, group) and cand.kept_fp[pos] <= BUFFER:
            check_group(cascade, group, BUFFER)
        else:
            with pytest.raises(MappingError):
                check_group(cascade, group, BUFFER if legal_rules(cascade, group) else None)
        checked += 1
    return checked


def _select_runner_groups():
    """Groups holding a select-runner (an Einsum that reads one position of what the group
    makes, and so runs once along that rank): the final state beside its scan, and the chunked
    scan's chunk decay ``CD`` beside the cumulative sum it reads the last position of."""
    mamba1 = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2, state_io=True)
    yield "mamba1-state", mamba1, ["DELTA", "AD", "BX", "H", "YS", "HN"], "HN"
    yield "mamba1-state-scan", mamba1, ["AD", "BX", "H", "HN"], "HN"
    recurrent = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=128, batch=2, scan="recurrent", state_io=True)
    scan = [e.name for e in recurrent.einsums if e.name in ("AD", "BX", "H", "YS", "HN")]
    yield "mamba2-recurrent-state", recurrent, scan, "HN"
    chunked = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2, scan="chunked", state_io=True)
    yield "mamba2-chunked-state", chunked, ["ST", "CD", "HC", "HN"], "HN"
    yield "mamba2-chunked-cd", chunked, ["ACS", "CD"], "CD"
    gdn = build_layer(PRESETS["olmo-hybrid-7b"], phase="prefill", seq_len=128, batch=1, layer_type="gdn",
                      scan="recurrent", state_io=True)
    yield "gdn-recurrent-state", gdn, [gdn.producer("HN").inputs[0].tensor, "HN"], "HN"


@pytest.mark.parametrize("name,cascade,einsums,runner", list(_select_runner_groups()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_closed_forms_hold_for_groups_with_a_select_runner(name: str, cascade, einsums, runner) -> None:
    """The same checks on groups in which ``runner`` runs once along a rank the group tiles
    (its step shapes, buffer accesses and writes leave that rank's loop out)."""
    from mambalaya.fusion.mapping import select_ranks

    ranks = candidates.tileable_ranks(cascade, einsums)
    model = candidates.cost_model(cascade, einsums, ranks)
    assert model.select_ranks(runner), (name, ranks)  # it would run once along a rank the group may tile
    rng = random.Random(11)
    assert _check_sampled_candidates(name, cascade, einsums, rng, 30,
                                     wanted=lambda g: bool(select_ranks(cascade, g, runner))) >= 5
    assert _check_sampled_candidates(name, cascade, einsums, rng, 10) >= 1
    # the group's cycles with its units in series, so that no unit hides the runner's
    arch = load_arch("mambalaya")
    serial = arch.model_copy(update={"compute": arch.compute.model_copy(update={"overlap_compute_units": False})})
    cand = model.candidates()
    cycles = model.cycles(serial.compute)
    for flat, tiling in list(zip(cand.kept.tolist(), cand.kept_tiling.tolist()))[::7]:
        group = model.group_at(flat)
        assert float(cycles[tiling]) == pytest.approx(group_cycles(serial, cascade, group)[0].total(False), rel=1e-12), group


def _mapping_summary(cascade, name: str, arch, buffer: int = BUFFER) -> tuple:
    m = named_mapping(name, cascade, buffer, arch=arch)
    return tuple((g.einsums, g.loops, g.resident) for g in m.groups)


_BUILDERS = {
    "mamba1": lambda: build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4),
    "mamba2-chunked": lambda: build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2, scan="chunked"),
    "hybrid-attention": lambda: hybrid_layer(SMALL_HYBRID, "attention", phase="prefill", seq_len=64, batch=2),
}


@pytest.mark.parametrize("layer,mapping,arch_name",
                         [("mamba1", m, "mambalaya") for m in ("optimal", "stitched", "ssm-ri", "unfused")]
                         + [("mamba1", "optimal", None), ("mamba2-chunked", "optimal", "mambalaya"),
                            ("hybrid-attention", "optimal", "mambalaya")])
def test_closed_form_picks_give_the_mappings_of_re_costing_every_pick(layer: str, mapping: str, arch_name,
                                                                     monkeypatch) -> None:
    """On an architecture (latency) and without one (traffic), fresh cascades."""
    arch = load_arch(arch_name) if arch_name else None
    fast = _mapping_summary(_BUILDERS[layer](), mapping, arch)
    monkeypatch.setattr(group_choice, "CLOSED_FORM_COSTS", False)
    assert _mapping_summary(_BUILDERS[layer](), mapping, arch) == fast


def test_a_closed_form_that_disagrees_makes_the_search_re_cost_every_pick(monkeypatch) -> None:
    """A closed form made wrong on purpose (one byte too few per candidate) would choose other
    groups; the search notices on the groups it chose and runs again re-costing every pick, so
    the mapping equals the re-costed one."""
    arch = load_arch("mambalaya")
    layer = lambda: build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4)  # noqa: E731
    monkeypatch.setattr(group_choice, "CLOSED_FORM_COSTS", False)
    exact = _mapping_summary(layer(), "optimal", arch)
    monkeypatch.setattr(group_choice, "CLOSED_FORM_COSTS", True)
    evaluate = candidates._evaluate_together  # how the candidate tables are built

    def wrong(models, tiles, trips):
        traffic, fp = evaluate(models, tiles, trips)
        return traffic - np.where(traffic > 1, 1.0, 0.0), fp

    monkeypatch.setattr(candidates, "_evaluate_together", wrong)
    recosts = _count_mismatches(monkeypatch)
    assert _mapping_summary(layer(), "optimal", arch) == exact
    assert recosts


def _count_mismatches(monkeypatch) -> list[int]:
    """A list that grows by one each time the closed forms disagree on a chosen group."""
    mismatches: list[int] = []
    verify = search._verify_closed_forms

    def counted(*args):
        try:
            verify(*args)
        except search._ClosedFormMismatch:
            mismatches.append(1)
            raise

    monkeypatch.setattr(search, "_verify_closed_forms", counted)
    return mismatches


def test_a_footprint_the_closed_forms_underestimate_is_searched_again(monkeypatch) -> None:
    """The one disagreement seen on a shipped cascade: the chunked Mamba-2 output group tiled
    over B, C and Q keeps its halo of the chunk states HC once per Q tile in the general model
    and once in the closed form. The group the closed forms choose does not fit by the general
    model; the search runs again with every pick re-costed, and its mapping fits and equals
    that of a search re-costing every pick from the start."""
    from mambalaya.arch import with_settings

    arch = with_settings(load_arch("mambalaya"), ["memory.onchip_buffer_bytes=24MiB",
                                                  "memory.offchip_bandwidth_bytes_per_s=1e12"])
    buffer = arch.memory.onchip_buffer_bytes

    def layer():  # as a sweep point builds it: the design's precision policy
        from mambalaya.experiments.evaluate import resolve_policy

        from mambalaya.workloads.precision import apply_policy

        # (the block at an odd length: a model's layer refuses it, its post-scan Einsums counting the padded rows)
        block = mamba2_layer(PRESETS["mamba2-1.3b"], phase="prefill", seq_len=1000, batch=8, scan="chunked",
                             bits=arch.bits_per_element)
        return apply_policy(block, resolve_policy(arch, None), arch.bits_per_element, "mamba2")

    mismatches = _count_mismatches(monkeypatch)
    cascade = layer()
    found = named_mapping("optimal", cascade, buffer, arch=arch)
    assert mismatches == [1]
    assert all(footprint_bytes(cascade, g) <= buffer for g in found.groups)
    token = group_choice.RECOST_EVERY_PICK.set(True)
    try:
        recosted = _mapping_summary(layer(), "optimal", arch, buffer)
    finally:
        group_choice.RECOST_EVERY_PICK.reset(token)
    assert tuple((g.einsums, g.loops, g.resident) for g in found.groups) == recosted


@pytest.mark.parametrize("layer,arch_name,buffer",
                         [(layer, arch, buffer) for layer in _BUILDERS for arch, buffer in (("mambalaya", 1 << 20),
                                                                                              (None, 2 << 20))]
                         + [("mamba1", "mambalaya", 64 << 20), ("mamba1", "geens-ideal", 8 << 20)])
def test_segments_picked_together_give_the_mapping_of_one_search_per_segment(layer: str, arch_name, buffer: int,
                                                                            monkeypatch) -> None:
    """The optimal search picks its segments together (search/picks.py); with its pick table
    filtered from its first row, in many small passes, never, or as it grows, and with one
    search per segment, it gives the same mapping and the same count of candidates searched."""
    arch = load_arch(arch_name) if arch_name else None

    def run():
        stats = search.SearchStats()
        try:
            m = search.optimal(_BUILDERS[layer](), buffer, stats, arch=arch)
        except search.SpecError as err:  # a buffer too small fails alike
            return str(err), None
        return tuple((g.einsums, g.loops, g.resident) for g in m.groups), (stats.evaluations, stats.groups_costed)

    together = run()
    monkeypatch.setattr(picks, "UNFILTERED_ROWS", 0)  # the pick table filtered from its first row
    assert run() == together
    monkeypatch.setattr(picks, "PICK_PASS_ROWS", 50)  # in many small passes
    assert run() == together
    monkeypatch.setattr(picks, "UNFILTERED_ROWS", 10**12)  # never filtered
    assert run() == together
    monkeypatch.setattr(picks, "UNFILTERED_ROWS", 100)  # filtered as it grows past 100 rows
    assert run() == together
    monkeypatch.setattr(group_choice, "BATCH_PICKS", False)
    assert run() == together


@pytest.mark.parametrize("overlap", [True, False])
def test_batched_latencies_are_combines_floats(overlap: bool) -> None:
    """search/picks.py computes the latency of many rows at once; its latencies are the very
    floats ``combine`` gives."""
    from mambalaya.search import picks
    from mambalaya.cost.latency import combine

    arch = load_arch("mambalaya")
    arch = arch.model_copy(update={"memory": arch.memory.model_copy(update={"overlap_compute_and_memory": overlap})})
    cascade = _BUILDERS["mamba1"]()
    names = [e.name for e in cascade.einsums]
    models = [candidates.cost_model(cascade, names[a:a + 3], candidates.tileable_ranks(cascade, names[a:a + 3]))
              for a in range(0, len(names) - 3, 2)]
    table = picks._table(models, arch.compute)
    _, _, traffic, _, steps, cycles, n_einsums, buffer, _ = table.rows(list(range(len(table.parts))))
    got = picks.row_latencies(arch, traffic, steps, cycles, n_einsums, buffer)
    want, _ = combine(arch, cycles / arch.clock_hz, traffic / arch.memory.offchip_bandwidth_bytes_per_s,
                      onchip_seconds(arch, traffic + buffer), steps, n_einsums)
    assert np.array_equal(got, want)


def test_contenders_pick_what_every_fitting_row_picks(monkeypatch) -> None:
    """A pick table hands a pick only each tiling's least-traffic fitting row, kept per buffer
    for the last few buffers (picks._Table.contenders); the picks equal those over every fitting
    row, at more buffers than it keeps (some met again), at two bandwidths, filtered or not."""
    cascade = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=1000, batch=4)
    names = [e.name for e in cascade.einsums]
    models = [candidates.cost_model(cascade, names[a:b], candidates.tileable_ranks(cascade, names[a:b]))
              for a in range(len(names)) for b in range(a + 1, min(a + 4, len(names)) + 1)]
    candidates.build_candidates(models)
    base = load_arch("mambalaya")
    archs = [base, base.model_copy(update={"memory": base.memory.model_copy(
        update={"offchip_bandwidth_bytes_per_s": base.memory.offchip_bandwidth_bytes_per_s / 8})})]
    buffers = [1 << 20, 4 << 20, 256 << 10, 16 << 20, 64 << 20, 4 << 20, 1 << 20, None]
    assert len(set(buffers)) > picks.FITTED_BUFFERS

    def every_fitting(self, segments, buffer_bytes):
        position, *cols = self.rows(segments)
        fit = np.ones(len(position), bool) if buffer_bytes is None else cols[2] <= buffer_bytes
        return tuple(c[fit] for c in (position, *cols))

    def all_picks():
        out = []
        for unfiltered_rows in (10**12, 0):  # never filtered, filtered from the first row
            monkeypatch.setattr(picks, "UNFILTERED_ROWS", unfiltered_rows)
            cascade.__dict__.pop("_pick_tables_memo", None)
            for buffer in buffers:
                for arch in archs:
                    out.append(picks.segment_picks(models, buffer, arch, 0.005))
        return out

    fewer = all_picks()
    assert sum(p is not None for row in fewer for p in row) > len(models)  # most segments fit somewhere
    monkeypatch.setattr(picks._Table, "contenders", every_fitting)
    assert all_picks() == fewer


@pytest.mark.parametrize("mapping", ["unfused", "ssm-ri"])
@pytest.mark.parametrize("arch_name,buffer", [("marca-ideal", 8 << 20), ("geens-ideal", 1 << 20), (None, 4 << 20)])
def test_unfused_and_ssm_ri_picked_together_equal_one_search_per_group(mapping: str, arch_name, buffer: int,
                                                                       monkeypatch) -> None:
    arch = load_arch(arch_name) if arch_name else None
    together = _mapping_summary(_BUILDERS["mamba1"](), mapping, arch, buffer)
    monkeypatch.setattr(group_choice, "BATCH_PICKS", False)
    assert _mapping_summary(_BUILDERS["mamba1"](), mapping, arch, buffer) == together


def test_beyond_exact_floats_picks_are_re_costed_and_the_search_runs_once(monkeypatch) -> None:
    """At L = 2^40 a group's bytes pass 2^53, where floats summed in another order may differ:
    such groups do not claim exact closed forms, so no chosen group disagrees with the general
    model and the search does not run twice."""
    mismatches = _count_mismatches(monkeypatch)
    cascade = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=2**40, batch=64)
    named_mapping("optimal", cascade, 64 << 20, arch=load_arch("mambalaya"))
    assert not mismatches
    names = [e.name for e in cascade.einsums]
    assert not candidates.cost_model(cascade, names, candidates.tileable_ranks(cascade, names)).exact_traffic


def test_a_pick_the_general_model_cannot_count_gives_way_to_the_next(monkeypatch) -> None:
    """Attention's reads of V need every tile enumerated for some tilings; past the model's
    enumeration limit (here made tiny, as a length of 2^40 makes it) the search takes the next
    candidate instead of failing, and the mapping it returns is costed by the general model."""
    from mambalaya.cost import traffic
    from mambalaya.cost.latency import layer_latency

    monkeypatch.setattr(traffic, "MAX_ENUMERATED_TILES", 8)
    arch = load_arch("mambalaya")
    cascade = _BUILDERS["hybrid-attention"]()
    names = [e.name for e in cascade.einsums]
    uncountable = FusionGroup("g", tuple(names[names.index("QB"):names.index("KNA") + 1]), (Loop("I", 1),))
    with pytest.raises(traffic.TrafficSizeError):  # such tilings exist in this layer
        group_traffic(cascade, uncountable)
    mapping = named_mapping("optimal", cascade, SMALL_BUFFER, arch=arch)
    assert layer_latency(arch, cascade, mapping).latency_s > 0


def test_an_uncountable_tiling_of_a_tensor_with_an_initial_value_costs_infinity_not_nan() -> None:
    """A KV cache of 10^8 rows (an initial value) has tilings whose boxes cannot be counted: their
    on-chip bytes are infinite. They used to come out as inf - inf = NaN, which numpy's minima
    propagate through a pick table; now no NaN is computed on the way (warnings are errors)."""
    import warnings

    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.workloads import PRESETS as ALL_PRESETS

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hv = evaluate_hybrid(load_arch("mambalaya"), "bamba-9b", ALL_PRESETS["bamba-9b"], phase="decode",
                             seq_len=100_000_000, batch=1, over_capacity="report")  # 1.25 TB of KV cache
    assert all(np.isfinite(ev.result.latency_s) for ev in hv.layers.values())


@pytest.mark.parametrize("name,cascade", [
    # (the block itself: a model's layer refuses a length the chunked scan pads, as its post-scan Einsums
    # would count the padded rows; the reads' closed forms are what is tested here)
    ("mamba2-chunked-odd-length", mamba2_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=700, batch=2,
                                               scan="chunked", state_io=True)),
    ("hybrid-attention", hybrid_layer(SMALL_HYBRID, "attention", phase="prefill", seq_len=64, batch=2)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_overlapping_reads_have_exact_closed_forms(name: str, cascade) -> None:
    """Reads whose tile boxes overlap (the chunked scan's position-view tensors read as
    ``U[Q*c+q]``, a length that is no multiple of the chunk; rotary's mirrored index) are counted
    per combination of the tiles of the ranks they depend on (mambalaya.search.irregular_reads):
    the closed-form traffic of such segments equals the general model's to the bit, residency
    options included, and most of them are picked in the batched pass."""
    from mambalaya.search.irregular_reads import irregular_ranks

    names = [e.name for e in cascade.einsums]
    rng = random.Random(3)
    irregular = exact = checked = 0
    for b in range(1, len(names) + 1):
        for a in range(b):
            einsums = names[a:b]
            model = candidates.cost_model(cascade, einsums, candidates.tileable_ranks(cascade, einsums))
            if not model.irregular:
                continue
            irregular += 1
            if not model.exact_traffic:
                continue
            exact += 1
            cand = model.candidates()
            for pos in rng.sample(range(cand.kept.size), min(3, cand.kept.size)):
                group = model.group_at(int(cand.kept[pos]))
                assert group_traffic(cascade, group).total_bytes == cand.kept_traffic[pos], (name, group)
                checked += 1
    assert irregular > 50 and exact >= 0.8 * irregular and checked > 150
    if name.startswith("mamba2"):
        xdt = cascade.einsum("XDT")
        accesses = [a for a in xdt.inputs if a.tensor == "U"]
        assert irregular_ranks(cascade, accesses, "U", ("B", "C", "Q", "H")) == ("C", "Q")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([1, 2, 4, 8, 64, 1000, 1 << 40]), min_size=1, max_size=40), min_size=1,
                max_size=4).filter(lambda cols: len({len(c) for c in cols}) == 1))
def test_distinct_rows_are_numpys_unique_rows(columns) -> None:
    """The buffer closed forms count each distinct combination of tiles once
    (model.buffer.distinct_rows): the same rows, order and inverse as ``np.unique(axis=0)``."""
    from mambalaya.cost.buffer import distinct_rows

    cols = [np.array(c, dtype=np.int64) for c in columns]
    rows, where = distinct_rows(cols)
    want, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    assert rows == [tuple(r) for r in want.tolist()]
    assert np.array_equal(where, inverse.reshape(-1))
