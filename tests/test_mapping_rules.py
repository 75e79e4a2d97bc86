"""Mapping legality: every rule rejects with the group, the edge and the rule named."""

from __future__ import annotations

import pytest

from mambalaya.errors import SpecError
from mambalaya.fusion.mapping import (
    FusionGroup,
    Loop,
    Mapping,
    MappingError,
    check_group_rules,
    check_mapping,
    footprint_bytes,
    unfused_mapping,
)
from mambalaya.fusion.mapping_file import dump_mapping, load_mapping, mapping_from_dict, parse_bytes
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer

CFG = Mamba1Config(d_model=16, d_state=4)


def cascade(phase="prefill", **kw):
    return mamba1_layer(CFG, batch=2, seq_len=8 if phase == "prefill" else 1, phase=phase, **kw)


def with_group(c, group: FusionGroup, buffer=None) -> Mapping:
    rest = tuple(FusionGroup(e.name, (e.name,)) for e in c.einsums if e.name not in group.einsums)
    return Mapping("m", (group,) + rest, buffer)


def rejected(c, m, rule, *, group=None, edge=None):
    with pytest.raises(MappingError) as info:
        check_mapping(c, m)
    err = info.value
    assert err.rule == rule, str(err)
    if group:
        assert err.group == group and f"group {group}" in str(err)
    if edge:
        assert err.edge == edge and edge in str(err)
    assert f"[rule: {rule}]" in str(err)
    return err


def test_cover_rules() -> None:
    c = cascade()
    m = unfused_mapping(c)
    rejected(c, Mapping("m", m.groups[:-1]), "cover")
    dup = m.groups + (FusionGroup("again", ("SS",)),)
    rejected(c, Mapping("m", dup), "cover", group="again")
    rejected(c, Mapping("m", m.groups + (FusionGroup("x", ("NOPE",)),)), "cover", group="x")


def test_order_rule_cycle_between_groups() -> None:
    c = cascade()
    a = FusionGroup("A", ("SS", "XN"))  # XN needs RS, which needs SS: A -> B -> A
    b = FusionGroup("B", ("RS",))
    rest = tuple(FusionGroup(e.name, (e.name,)) for e in c.einsums if e.name not in {"SS", "XN", "RS"})
    rejected(c, Mapping("m", (a, b) + rest), "order")


def test_groups_are_reordered_into_an_executable_order() -> None:
    c = cascade()
    groups = tuple(reversed(unfused_mapping(c).groups))
    m = check_mapping(c, Mapping("m", groups))
    done: set[str] = set()
    for g in m.groups:  # every group runs after the producers of what it reads
        for e in g.einsums:
            assert all(c.producer(t) is None or t in done or t == e for t in c.einsum(e).input_tensors)
        done |= set(g.einsums)
    assert len(m.groups) == len(c.einsums)


def test_reduction_rule() -> None:
    c = cascade()
    g = FusionGroup("F1", ("SS", "RS", "XN"), (Loop("D", 4),))
    rejected(c, with_group(c, g), "reduction", group="F1", edge="SS")


def test_alignment_rule_select_inside_group() -> None:
    c = cascade(state_io=True)
    g = FusionGroup("F1", ("H", "HN"), (Loop("E", 8),))  # fine: E is aligned
    check_mapping(c, with_group(c, g))
    g = FusionGroup("F1", ("XI", "XC", "CSN"), (Loop("B", 1),))
    check_mapping(c, with_group(c, g))


def test_future_and_halo_rules() -> None:
    c = cascade()
    g = FusionGroup("F1", ("XI", "XC"), (Loop("I", 4),), halo="recompute")
    rejected(c, with_group(c, g), "halo", group="F1", edge="XI->XC")
    check_mapping(c, with_group(c, FusionGroup("F1", ("XI", "XC"), (Loop("I", 4),))))


def test_a_mapping_files_recompute_that_no_window_reads_is_refused(tmp_path) -> None:
    """halo: recompute on a group whose fused ranks cross no window read no halo: retain gives the
    same numbers, so a file asking for it was evaluated as if it had not. Refused, naming the
    file and the group; on XC read from off chip with I tiled (a window of 3 rows) it is read."""
    from mambalaya.fusion.mapping_file import check_mapping_file

    c = cascade()
    for group, read in ((FusionGroup("F1", ("U",), (Loop("B", 1),), halo="recompute"), False),
                        (FusionGroup("F1", ("XC",), (Loop("I", 4),), halo="recompute"), True)):
        path = tmp_path / "m.yaml"
        path.write_text(dump_mapping(with_group(c, group)))
        if read:
            checked = check_mapping_file(c, load_mapping(path), str(path))
            assert {g.name: g.halo for g in checked.groups}["F1"] == "recompute"
            continue
        with pytest.raises(SpecError) as err:
            check_mapping_file(c, load_mapping(path), str(path))
        assert str(path) in str(err.value) and "group F1: halo: recompute" in str(err.value)


def test_loops_rule() -> None:
    c = cascade()
    rejected(c, with_group(c, FusionGroup("F1", ("U",), (Loop("Q", 2),))), "loops", group="F1")
    rejected(c, with_group(c, FusionGroup("F1", ("U",), (Loop("I", 99),))), "loops", group="F1")
    rejected(c, with_group(c, FusionGroup("F1", ("U",), (Loop("I", 2), Loop("I", 4)))), "loops", group="F1")
    # a rank none of the group's Einsums iterates: each would run again per tile of it (XO written 16
    # times over N once, without a word)
    rejected(c, with_group(c, FusionGroup("F1", ("RS",), (Loop("N", 1),))), "loops", group="F1")


def test_buffer_rule_and_footprint_by_hand() -> None:
    c = cascade()
    g = FusionGroup("F1", ("AD", "BX", "H", "YS"), (Loop("B", 1), Loop("E", 8), Loop("I", 2)))
    # intermediates AD, BX, H (1x2x8x4 each) go from lane to reader in registers (H read in place
    # by YS, AD and BX by H at its step): only H's carried state 1 x (1x8x4) holds the buffer; 16-bit
    assert footprint_bytes(c, g) == (1 * 8 * 4) * 2
    m = with_group(c, g, buffer=int(footprint_bytes(c, g)))
    check_mapping(c, m)
    rejected(c, with_group(c, g, buffer=int(footprint_bytes(c, g)) - 1), "buffer", group="F1")
    # a loop inside the generational rank's loop makes the state cover that rank in full
    g2 = FusionGroup("F1", ("AD", "BX", "H", "YS"), (Loop("B", 1), Loop("I", 2), Loop("E", 8)))
    assert footprint_bytes(c, g2) == (1 * 32 * 4) * 2  # AD, BX, H again in registers


def test_yaml_round_trip_and_errors(tmp_path) -> None:
    c = cascade()
    g = FusionGroup("F1", ("AD", "BX", "H", "YS"), (Loop("B", 1), Loop("E", 8), Loop("I", 2)))
    m = check_mapping(c, with_group(c, g, buffer=parse_bytes("1MiB")))
    path = tmp_path / "m.yaml"
    path.write_text(dump_mapping(m))
    assert check_mapping(c, load_mapping(path)) == m
    with pytest.raises(SpecError, match="tile"):
        mapping_from_dict({"groups": [{"einsums": ["SS"], "loops": [{"rank": "I"}]}]})
    with pytest.raises(SpecError, match="unknown mapping field"):
        mapping_from_dict({"groups": [], "buffr": 3})
    with pytest.raises(SpecError, match="not a size"):
        parse_bytes("32 parsecs")
    for megabit in ("1Mb", "1mb", "1mib"):  # read as an architecture spec reads a size: 1Mb was once 1 MB
        with pytest.raises(SpecError, match="unknown unit"):
            parse_bytes(megabit)
    assert parse_bytes("32MiB") == 32 * 2**20 and parse_bytes("24MB") == 24_000_000 and parse_bytes(4096) == 4096


def _rule_outcome(c, group: FusionGroup):
    try:
        check_group_rules(c, group)
    except MappingError as err:
        return str(err), err.rule, err.group, err.edge
    return None


def test_rules_memoised_per_einsum_give_each_group_its_own_verdict() -> None:
    """check_group_rules memoises each Einsum's verdict on the cascade (per tensors made in its
    group, tiled ranks and halo policy): every group of contiguous Einsums, tiled over every
    set of its ranks, with either halo policy, gets on a cascade that has checked all the
    others the verdict it gets on a fresh one, and a verdict names its own group."""
    warm = cascade()
    names = [e.name for e in warm.einsums]
    ranks = [r for r in warm.ranks if warm.size(r) > 1]
    cases = []
    for b in range(1, len(names) + 1):
        for a in range(max(0, b - 4), b):
            for k in range(1 << len(ranks)):
                loops = tuple(Loop(r, 1) for i, r in enumerate(ranks) if k >> i & 1)
                for halo in ("retain", "recompute"):
                    cases.append(FusionGroup(f"G{a}_{b}_{k}_{halo}", tuple(names[a:b]), loops, halo=halo))
    warm_outcomes = [_rule_outcome(warm, g) for g in cases]
    assert any(o is None for o in warm_outcomes) and {o[1] for o in warm_outcomes if o} >= {"reduction", "halo"}
    for g, got in zip(cases[::7], warm_outcomes[::7]):
        assert got == _rule_outcome(cascade(), g), g
    renamed = [FusionGroup("other", g.einsums, g.loops, g.halo) for g in cases[:60]]
    for g, got, again in zip(cases, warm_outcomes, [_rule_outcome(warm, g) for g in renamed]):
        assert (got is None) == (again is None)
        if got is not None:
            assert again == (got[0].replace(f"group {g.name}", "group other"), got[1], "other", got[3])


def test_a_mapping_file_is_named_by_its_path_not_by_the_name_written_in_it(tmp_path) -> None:
    """A file saved from the optimal search at one point, run at another, was printed as
    'mapping optimal: least ...', beside a different number than the search gives there."""
    import json

    from typer.testing import CliRunner

    from mambalaya.cli import app

    runner = CliRunner()
    path = tmp_path / "opt.yaml"
    saved = runner.invoke(app, ["fusion", "map", "-m", "mamba-130m", "-L", "2048", "-B", "4", "--mapping", "optimal",
                                "--buffer", "50MiB", "--save", str(path)])
    assert saved.exit_code == 0, saved.output
    out = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "8192", "-B", "16", "--mapping", str(path), "-f", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["mapping"]["name"] == str(path)
    assert "written as 'optimal'" in doc["mapping"]["description"]
    text = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "8192", "-B", "16", "--mapping", str(path)])
    said = " ".join(text.output.split())
    assert f"mapping {path}: a mapping file, its groups and tiles as written" in said
    assert "mapping searched for" not in said
