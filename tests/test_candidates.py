"""The candidate tables the search keeps (search/candidates.py) are built for many groups at
once (:func:`build_candidates`); each must be the table the group built alone
(:meth:`GroupCostModel.full_table`) and pruned the plain way gives, to the bit. (That the
closed forms themselves are right, the general model checks: tests/test_closed_forms.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.einsum import cascade as cascade_module
from mambalaya.fusion.mapping import FusionGroup
from mambalaya.search import candidates
from mambalaya.cost import traffic
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.families.bamba import hybrid_layer

from test_hybrid_eval import SMALL as SMALL_HYBRID

LAYERS = {
    "mamba1-prefill": lambda: build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2),
    "mamba1-decode": lambda: build_layer(PRESETS["mamba-130m"], phase="decode", seq_len=1, batch=4),
    "mamba2-chunked": lambda: build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2, scan="chunked"),
    "hybrid-attention": lambda: hybrid_layer(SMALL_HYBRID, "attention", phase="prefill", seq_len=64, batch=2),
}


def _segment_models(cascade) -> list[candidates.GroupCostModel]:
    names = [e.name for e in cascade.einsums]
    segments = [names[a:b] for b in range(1, len(names) + 1) for a in range(b)]
    return [candidates.GroupCostModel(cascade, s, candidates.tileable_ranks(cascade, s)) for s in segments]


def _kept_by_sorting(traffic: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """The kept candidates (flat indices, ascending) the plain way: per tiling, sort the options
    by traffic, then footprint (then option); keep each whose footprint is below every earlier
    one's."""
    order = np.lexsort((fp, traffic), axis=0)
    fp_sorted = np.take_along_axis(fp, order, axis=0)
    before = np.vstack([np.full((1, fp.shape[1]), np.inf), np.minimum.accumulate(fp_sorted, axis=0)[:-1]])
    rows, cols = np.nonzero(fp_sorted < before)
    kept = np.sort(order[rows, cols] * traffic.shape[1] + cols)
    return kept.astype(np.int32) if traffic.size < 2**31 else kept


def _reference(model: candidates.GroupCostModel) -> tuple:
    """The group's table built alone (:meth:`GroupCostModel.full_table`), pruned the plain way."""
    _, trips, options, traffic, fp = model.full_table()
    kept = _kept_by_sorting(traffic, fp)
    steps = np.prod(np.stack(trips), axis=0) if trips else np.ones(1)
    kept_fp = fp.ravel()[kept]
    return (options, traffic.shape[1], steps, traffic.size, kept, traffic.ravel()[kept], kept_fp,
            (kept % traffic.shape[1]).astype(np.int32), float(kept_fp.min()))


def _fields(c: candidates.Candidates) -> tuple:
    return (c.options, c.n_tilings, c.steps, c.size, c.kept, c.kept_traffic, c.kept_fp, c.kept_tiling, c.least_fp)


def _assert_same(got: tuple, want: tuple, where: str) -> None:
    for name, x, y in zip(("options", "n_tilings", "steps", "size", "kept", "kept_traffic", "kept_fp", "kept_tiling",
                           "least_fp"), got, want):
        if isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), (where, name)
        else:
            assert x == y, (where, name)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("cells", [candidates.BUILD_BATCH_CELLS, 4096])
def test_tables_built_together_equal_each_group_built_alone(layer: str, cells: int, monkeypatch) -> None:
    """Every contiguous segment of the layer, built together (in passes of ``cells``: the
    default, and small enough that most passes hold one or two groups)."""
    monkeypatch.setattr(candidates, "BUILD_BATCH_CELLS", cells)
    models = _segment_models(LAYERS[layer]())
    candidates.build_candidates(models)
    for m in models:
        _assert_same(_fields(m.candidates()), _reference(m), f"{layer}: {m.probe.einsums}")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_least_footprint_is_the_tables_least_without_building_it(layer: str) -> None:
    """:meth:`GroupCostModel.least_footprint` evaluates a few corner tilings; it is the least
    footprint bound of the whole table (retained halos included: the Mamba layers' conv
    window), alone or with every segment of the layer in one call (:func:`least_footprints`,
    corners of the union of their halo ranks), and it builds no table; neither does
    :attr:`GroupCostModel.size`."""
    models = _segment_models(LAYERS[layer]())
    least = [m.least_footprint() for m in models]
    together = _segment_models(LAYERS[layer]())  # another cascade: its own models, found in one call
    candidates.least_footprints(together)
    sizes = [m.size for m in models]  # the search counts the candidates of a segment too large, unbuilt
    assert all(m._candidates is None for m in models + together)
    assert least == [float(_reference(m)[6].min()) for m in models]
    assert [m.least_footprint() for m in together] == least
    assert sizes == [_reference(m)[3] for m in models]
    if layer in ("mamba1-prefill", "mamba2-chunked"):  # the conv window's retained halo is among them
        assert any(when is not None for m in models for _, _, when in m.fp_terms)


def _undominated_by_definition(traffic, fp, steps, cycles, model, buffer) -> np.ndarray:
    """Every candidate that no other of the same model, steps, cycles and on-chip Einsum bytes
    beats or equals in both traffic and footprint, an equal one of lower position excepted (pairwise)."""
    n = len(traffic)
    keep = []
    for i in range(n):
        same = (steps == steps[i]) & (cycles == cycles[i]) & (model == model[i]) & (buffer == buffer[i])
        no_worse = same & (traffic <= traffic[i]) & (fp <= fp[i])
        better = (traffic < traffic[i]) | (fp < fp[i]) | (np.arange(n) < i)
        no_worse[i] = False
        if not (no_worse & better).any():
            keep.append(i)
    return np.array(keep, dtype=np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_the_pick_tables_dominance_filter_keeps_exactly_the_undominated(seed: int) -> None:
    """search/picks.py drops, per segment, candidates another of the same steps, cycles and
    on-chip Einsum bytes beats or equals; checked pairwise on random tables of several segments (filtered in one
    pass) full of ties (small integers), some with footprints too large for its float shortcut
    (then 64-bit integers, or integer ranks), some with class numbers beyond 16 bits."""
    from mambalaya.search import picks

    rng = np.random.default_rng(seed)
    tilings = int(rng.integers(1, 30))
    steps_t = rng.integers(1, 4, tilings).astype(float)
    cycles_t = rng.integers(1, 4, tilings).astype(float)
    model_t = rng.integers(0, 3, tilings)
    buffer_t = rng.integers(0, 3, tilings).astype(float)
    rows = int(rng.integers(1, 200))
    tiling = rng.integers(0, tilings, rows)
    traffic = rng.integers(0, 6, rows).astype(float)
    # footprints the float shortcut holds exactly; too large for it (whole: 64-bit integers);
    # too large for those; fractional and too large for floats (both: integer ranks)
    fp = rng.integers(0, 6, rows).astype(float) + {9: 2.0**52, 8: 2.0**61, 7: 2.0**50 + 0.5}.get(seed % 10, 0.0)
    classes = picks._classes(steps_t, cycles_t, model_t, buffer_t)[tiling]
    if seed % 4 == 3:  # class numbers beyond 16 bits (no radix sort): the same classes, the same answer
        classes = classes + (1 << 16)
    got = picks._undominated(traffic, fp, classes)
    assert np.array_equal(got, _undominated_by_definition(traffic, fp, steps_t[tiling], cycles_t[tiling], model_t[tiling],
                                                          buffer_t[tiling]))


def test_only_small_tiling_grids_are_kept(monkeypatch) -> None:
    """Grids are shared by the groups tiling the same ranks, but one above
    KEPT_GRID_TILINGS (at L = 2^40, hundreds of thousands of tilings) is rebuilt, not kept:
    kept, it cost bamba-9b's evaluate 44 MB at L = 2^40."""
    monkeypatch.setattr(candidates, "KEPT_GRID_TILINGS", 50)
    models = _segment_models(LAYERS["mamba1-prefill"]())
    candidates.build_candidates(models)
    kept = models[0].cascade.__dict__["_tiling_grid_memo"]
    assert kept and all(len(tiles[0]) <= 50 for tiles, _ in kept.values() if tiles)
    assert any(m.n_tilings > 50 for m in models)
    big = next(m for m in models if m.n_tilings > 50)
    assert big.grid()[0][0].size == big.n_tilings and tuple(big.ranks) not in kept


@pytest.mark.parametrize("seed", range(30))
def test_kept_candidates_equal_the_plain_sort_on_tables_full_of_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 12)), int(rng.integers(1, 40)))
    traffic = rng.integers(0, 5, shape).astype(float)
    fp = rng.integers(0, 5, shape).astype(float)
    assert np.array_equal(candidates.kept_candidates(traffic, fp), _kept_by_sorting(traffic, fp))


def _closed_form_facts(m: candidates.GroupCostModel) -> tuple:
    return (m.terms, m.fp_terms, m._reads, m.exact_traffic, m.orders, m.keepable, m.options(),
            [o.tolist() for o in m._tile_options])


@pytest.fixture
def fresh_structure_memos(monkeypatch):
    """Cascades made while it is active share no structure memo with those made before."""
    def clear() -> None:
        monkeypatch.setattr(cascade_module, "_STRUCTURE_MEMOS", {})

    clear()
    return clear


@pytest.mark.parametrize("layer", list(LAYERS))
def test_closed_forms_made_beside_other_groups_equal_those_made_alone(layer: str, fresh_structure_memos) -> None:
    """A group's closed forms share facts memoised on the cascade and its structure with the
    other groups of a search (what each group reads and writes, the ranks its reads mention
    and whether they are aligned; each rank's tile options): made after every other
    segment's, they equal those made first on a fresh cascade of a fresh structure."""
    warm = _segment_models(LAYERS[layer]())
    for m in warm[::5]:
        fresh_structure_memos()
        fresh = candidates.GroupCostModel(LAYERS[layer](), list(m.probe.einsums), list(m.ranks))
        assert _closed_form_facts(m) == _closed_form_facts(fresh), m.probe.einsums


OTHER_SIZES = {
    "mamba1-prefill": lambda: build_layer(PRESETS["mamba-370m"], phase="prefill", seq_len=64, batch=3),
    "mamba1-decode": lambda: build_layer(PRESETS["mamba-370m"], phase="decode", seq_len=1, batch=1),
    "mamba2-chunked": lambda: build_layer(PRESETS["mamba2-370m"], phase="prefill", seq_len=256, batch=1, scan="chunked"),
    "hybrid-attention": lambda: hybrid_layer(SMALL_HYBRID, "attention", phase="prefill", seq_len=16, batch=1),
}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_closed_forms_after_a_layer_of_other_sizes_equal_those_made_alone(layer: str, fresh_structure_memos) -> None:
    """A layer of the same Einsums at other sizes (model width, length, batch) shares the
    structure memos (:attr:`Cascade.structure_memo`), never a number: every segment's closed
    forms and untiled traffic, made after the other layer's, equal those made on a fresh
    structure, and the untiled traffic equals the general model's for the untiled group."""
    other = OTHER_SIZES[layer]()
    cascade = LAYERS[layer]()
    assert other.structure_memo is cascade.structure_memo
    assert [other.size(r) for r in other.ranks] != [cascade.size(r) for r in cascade.ranks]
    _segment_models(other)
    warm = _segment_models(cascade)
    fresh_structure_memos()
    alone = LAYERS[layer]()
    for m in warm:
        einsums = m.probe.einsums
        fresh = candidates.GroupCostModel(alone, list(einsums), list(m.ranks))
        assert _closed_form_facts(m) == _closed_form_facts(fresh), einsums
        group = FusionGroup("untiled", einsums, ())
        want = (traffic._group_reads(alone, group), traffic._group_writes(alone, group))
        assert traffic.untiled_traffic(cascade, einsums) == want, einsums


def test_layers_of_one_family_share_a_structure_and_other_phases_do_not() -> None:
    a = build_layer(PRESETS["mamba-370m"], phase="prefill", seq_len=2048, batch=16)
    b = build_layer(PRESETS["mamba-1.4b"], phase="prefill", seq_len=4096, batch=64)
    decode = build_layer(PRESETS["mamba-1.4b"], phase="decode", seq_len=1, batch=64)
    mamba2 = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2)
    assert a.structure_key == b.structure_key and a.structure_memo is b.structure_memo
    assert decode.structure_memo is not a.structure_memo and mamba2.structure_memo is not a.structure_memo


@pytest.mark.parametrize("arch_name", ["mambalaya", "marca-ideal"])
@pytest.mark.parametrize("layer", ["mamba1-prefill", "mamba2-chunked"])
def test_compute_cycles_made_together_equal_each_made_alone(layer: str, arch_name: str) -> None:
    """:func:`cycles_together` starts a group's per-unit sums from those of the group one
    Einsum shorter: every segment's cycles equal those made alone on a fresh cascade, to the bit."""
    compute = load_arch(arch_name).compute
    together = candidates.cycles_together(_segment_models(LAYERS[layer]()), compute)
    alone = _segment_models(LAYERS[layer]())
    for m, got in zip(alone, together):
        want = m.cycles(compute)
        assert got.dtype == want.dtype and np.array_equal(got, want), m.probe.einsums


@pytest.mark.parametrize("layer", list(LAYERS))
def test_candidates_of_one_rule_key_share_their_verdict(layer: str) -> None:
    """A pick's legality is decided once per :meth:`GroupCostModel.rule_key` (option and the
    ranks its tiling tiles): every candidate of a key gets the verdict its own group gets from
    check_group_rules, and its key is the same as that of every candidate with the same
    option, tiled ranks and resident tensors."""
    from mambalaya.fusion.mapping import MappingError, check_group_rules

    rng = np.random.default_rng(7)
    for m in _segment_models(LAYERS[layer]())[::3]:
        verdicts: dict = {}
        for flat in rng.choice(m.size, size=min(m.size, 40), replace=False).tolist():
            group = m.group_at(flat)
            try:
                check_group_rules(m.cascade, group)
                legal = True
            except MappingError:
                legal = False
            facts = (frozenset(group.fused_ranks), group.resident, [lp.rank for lp in group.loops])
            key = m.rule_key(flat)
            assert verdicts.setdefault(key, (legal, facts)) == (legal, facts), (m.probe.einsums, flat)
            # the key is the option and a bit per tiled rank (the first rank the highest bit)
            n = len(m.ranks)
            assert key >> n == flat // m.n_tilings
            assert {r for i, r in enumerate(m.ranks) if key >> (n - 1 - i) & 1} == set(group.fused_ranks)
        flats = rng.choice(m.size, size=min(m.size, 200), replace=False)
        assert m.rule_keys(flats).tolist() == [m.rule_key(int(f)) for f in flats]


@pytest.mark.parametrize("seed", range(40))
def test_sums_of_products_are_the_term_by_term_floats(seed: int, monkeypatch) -> None:
    """:func:`sum_of_products` takes a block of terms' products together: each model's row is
    still, bit for bit, its terms' products (coefficient times its factors in index order) added
    in its order, whatever the block size and whichever models share the pass."""
    rng = np.random.default_rng(seed)
    n, n_factors = int(rng.integers(1, 60)), int(rng.integers(0, 5))
    kinds = [lambda: rng.random(n) * 10.0 ** rng.integers(-4, 12), lambda: rng.integers(1, 99, n),
             lambda: rng.random(n) < 0.5]
    factors = [kinds[int(rng.integers(0, 3))]() for _ in range(n_factors)]
    n = n if factors else 1  # no factor: one value per model
    terms = [[(float(rng.random() * 10.0 ** rng.integers(-3, 15)),
               sorted(rng.choice(n_factors, int(rng.integers(0, n_factors + 1)), replace=False).tolist()))
              for _ in range(int(rng.integers(0, 25)))] for _ in range(int(rng.integers(1, 12)))]
    monkeypatch.setattr(candidates, "PRODUCT_BLOCK_CELLS", int(rng.integers(1, 4 * n * len(terms) * 25 + 2)))
    got = candidates.sum_of_products(terms, factors)
    for row, model_terms in zip(got, terms):
        want = np.zeros(n)
        for coefficient, idxs in model_terms:
            product = np.full(n, coefficient)
            for i in idxs:
                product = product * factors[i]
            want = want + product
        assert np.array_equal(row.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("layer", ["mamba2-chunked", "hybrid-attention"])
def test_full_tables_made_together_equal_each_made_alone(layer: str, monkeypatch) -> None:
    """:func:`prepare_full_tables` makes many groups' full tables in shared passes (here in
    passes of a few hundred cells, so that they split); each group's next full table is that
    one, to the bit, and the one after is made alone again."""
    monkeypatch.setattr(candidates, "BUILD_BATCH_CELLS", 600)
    models = _segment_models(LAYERS[layer]())[::3]
    candidates.prepare_full_tables(models)
    for m in models:
        *_, options, traffic, fp = m.full_table()
        *_, options_alone, traffic_alone, fp_alone = m.full_table()  # not prepared: made alone
        assert options == options_alone and traffic.shape == traffic_alone.shape == (len(options), m.n_tilings)
        assert np.array_equal(traffic.view(np.int64), traffic_alone.view(np.int64))
        assert np.array_equal(fp.view(np.int64), fp_alone.view(np.int64))


def test_the_least_footprint_from_held_layouts_equals_the_cost_models_to_the_bit() -> None:
    from mambalaya.search.candidates import cost_model, tileable_ranks
    """The lazy search rules a group out by its least footprint before building its cost model
    (least_footprint_bound): the two must agree to the bit, or a group the model would keep is
    dropped (or the reverse). Every contiguous segment of up to 6 Einsums of one form per family
    (the search's own, on 20,085 segments of every form, was checked once when it came in)."""
    from mambalaya.search.candidates import least_footprint_bound
    from mambalaya.workloads.shipped import shipped_layers

    seen, checked = set(), 0
    for layer in shipped_layers():
        key = layer.preset.split("-")[0]
        if key in seen or layer.phase != "prefill":
            continue
        seen.add(key)
        c = layer.cascade
        names = [e.name for e in c.einsums]
        for i in range(len(names)):
            for j in range(i + 1, min(len(names), i + 6) + 1):
                ranks = tileable_ranks(c, names[i:j])
                assert least_footprint_bound(c, names[i:j], ranks) == cost_model(c, names[i:j], ranks).least_footprint()
                checked += 1
    assert checked > 1000
