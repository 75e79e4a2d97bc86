"""A layer at another length shares its structure memos (:attr:`Cascade.structure_memo`, keyed by
:attr:`Cascade.position_free_key`) and never a number.

Layers of one family at two lengths differ in a few constants: the final state's last position
(``HN = H[b,2047,e,n]``), the conv state's offset (``XI[b,j+2045,e]``), a decode step's cached-key
offset (``K[b,t-2048,g,e]``), the last key block the online and blocked softmax read. The shared
memos hold what a group's analysis, shape and reads are: the analysis refers to a position by
where it is read, not by its value, and a group's reads, which hold its accesses, are keyed by
their constants too (:meth:`Cascade.index_constants_of`).
What is checked, on every shipped layer form (every family, phase, scan and softmax form): which
forms share their memos across lengths, and that every fact a group's closed forms are made of,
made after the other length's, equals the fact made on a fresh structure.
"""

from __future__ import annotations

import pytest

from mambalaya.cost.traffic import read_steps, untiled_traffic
from mambalaya.einsum import cascade as cascade_module
from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import FusionGroup
from mambalaya.search.candidates import tileable_ranks
from mambalaya.search.convex import search_order
from mambalaya.search.group_shape import shape_of_group
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.shipped import shipped_layers


def _forms(seq_len: int) -> dict[tuple, object]:
    return {(x.preset, x.layer_type, x.phase, x.scan, x.softmax, x.state_io): x.cascade
            for x in shipped_layers(seq_len=seq_len)}


def _groups(cascade) -> list[tuple[str, ...]]:
    """Segments of the search order: every one holding an Einsum with an index constant (up to
    eight Einsums long), every single Einsum, and every seventh segment of up to 16."""
    names = search_order(cascade)
    constants = set(cascade.index_constants)
    out = []
    for b in range(1, len(names) + 1):
        for a in range(max(0, b - 16), b):
            segment = names[a:b]
            if len(segment) == 1 or (constants & set(segment) and len(segment) <= 8) or (a + b) % 7 == 0:
                out.append(segment)
    return out


def _facts(cascade, groups) -> list[tuple]:
    """What the closed forms of each group are made of, read from the structure memos."""
    out = []
    for g in groups:
        steps = read_steps(cascade, FusionGroup("probe", g, ()))
        shape = shape_of_group(cascade, g, tuple(tileable_ranks(cascade, list(g))))
        out.append((analyse(cascade, g), shape._replace(keep_under=None),  # (filled on use: a cache)
                    [(t, list(accs), own, key, to, init) for t, accs, own, key, to, init in steps],
                    untiled_traffic(cascade, g)))
    return out


SHORT, LONG = 256, 512


@pytest.fixture(scope="module")
def both_lengths():
    return _forms(SHORT), _forms(LONG)


def test_every_form_but_the_blocked_decode_shares_its_structure_across_lengths(both_lengths) -> None:
    """Only the blocked softmax's decode step keeps one structure per length: its key mask's
    declaration names the cache length (a tensor, not an index)."""
    short, long = both_lengths
    assert short.keys() == long.keys() and {k[0] for k in short} == set(FAMILY_PRESETS)
    apart = {k for k in short if short[k].position_free_key != long[k].position_free_key}
    assert apart == {k for k in short if k[2] == "decode" and k[4] == "blocked"}
    assert all(short[k].structure_memo is long[k].structure_memo for k in short if k not in apart)
    differing = {k for k in short if k not in apart and short[k].structure_key != long[k].structure_key}
    assert len(differing) >= 20  # final states, conv states, cached keys: the forms the sharing is for


FAMILY_PRESETS = list(dict.fromkeys({cfg.family: name for name, cfg in reversed(PRESETS.items())}.values()))


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_every_fact_made_after_another_length_equals_the_fact_made_alone(preset, both_lengths, monkeypatch) -> None:
    short, long = both_lengths
    for key, cascade in long.items():
        if key[0] != preset or short[key].position_free_key != cascade.position_free_key:
            continue
        groups = _groups(cascade)
        monkeypatch.setattr(cascade_module, "_STRUCTURE_MEMOS", {})
        _facts(short[key], groups)  # the other length first: the memos are warm
        warm = _facts(cascade, groups)
        monkeypatch.setattr(cascade_module, "_STRUCTURE_MEMOS", {})
        alone = _facts(build_layer_again(cascade), groups)
        for g, w, a in zip(groups, warm, alone):
            assert w == a, (key, g)


def build_layer_again(cascade):
    """The same cascade, not the same object: its own cached properties, no memo of its own."""
    return cascade_module.build_cascade(name=cascade.name, params=dict(cascade.params), ranks=cascade.ranks.values(),
                                        tensors=cascade.tensors.values(), einsums=cascade.einsums,
                                        description=cascade.description, regions=dict(cascade.regions))


def test_a_kept_recurrence_is_decided_at_the_layers_own_sizes() -> None:
    """The analysis is size-free; which positions of a kept recurrence the buffer receives is
    decided at the cascade's sizes (:meth:`GroupAnalysis.kept_at`): a block count of one keeps
    every position, so nothing is kept apart."""
    config = PRESETS["bamba-9b"]
    layers = {L: build_layer(config, phase="prefill", seq_len=L, batch=1, layer_type="attention", softmax="online")
              for L in (SHORT, LONG)}
    layers[1] = build_layer(config, phase="prefill", seq_len=1, batch=1, layer_type="attention", softmax="online")
    for L, c in layers.items():
        names = search_order(c)
        group = names[names.index("OR"):names.index("AO") + 1]
        facts = analyse(c, group)
        assert facts.kept_at(c, "OR") == (("T", frozenset({L - 1})) if L > 1 else None)
    assert analyse(layers[SHORT], group) is analyse(layers[LONG], group)  # one analysis for every length


FORWARD_SUBSTITUTION = """
name: forward-substitution
ranks: {{C: 3, Q: {q}, T: {q}, S: {q}}}
tensors:
  EYE: {{ranks: [Q, S], role: input, mask: {{row: Q, col: S, lower: 0, upper: 0, dead: 0}}}}
  A:   {{ranks: [C, Q, T], role: input, mask: {{row: Q, col: T, upper: -1, dead: 0}}}}
  X:   {{ranks: [C, Q, S], role: input}}
  TI:  {{ranks: [C, Q, S], role: intermediate}}
  Y:   {{ranks: [C, Q, S], role: output}}
einsums:
  - TI[c,q,s] = EYE[q,s] - A[c,q,t]*TI[c,t,s]
  - Y[c,q,s] = TI[c,q,s]*X[c,q,s]
"""


def test_a_history_recurrence_holds_its_rows_at_the_layers_own_size(monkeypatch) -> None:
    """A forward substitution carries every earlier row of its rank (its distance is the rank's
    size): two cascades that differ in that size alone share their structure, and each group's
    footprint counts its own size's rows."""
    from mambalaya.einsum.cascade_file import loads_cascade
    from mambalaya.search.candidates import GroupCostModel

    monkeypatch.setattr(cascade_module, "_STRUCTURE_MEMOS", {})
    small, large = (loads_cascade(FORWARD_SUBSTITUTION.format(q=q)) for q in (4, 8))
    assert small.structure_memo is large.structure_memo
    group = ["TI", "Y"]
    warm = [GroupCostModel(c, group, tileable_ranks(c, group)).fp_terms for c in (small, large)]
    monkeypatch.setattr(cascade_module, "_STRUCTURE_MEMOS", {})
    alone = GroupCostModel(build_layer_again(large), group, tileable_ranks(large, group)).fp_terms
    assert warm[1] == alone and warm[0] != warm[1]
