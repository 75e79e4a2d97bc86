"""One analysis per group shape (mambalaya.fusion.group_analysis): asked by the legality rules,
the traffic model, the search and the tiled executor alike, computed once per cascade structure."""

from __future__ import annotations

from mambalaya.fusion.group_analysis import analyse
from mambalaya.fusion.mapping import FusionGroup, intermediates, register_resident, tensors_read, tensors_written
from mambalaya.search.candidates import tileable_ranks, widened_ranks
from mambalaya.workloads import PRESETS, build_layer


def test_one_analysis_per_group_shape_shared_by_every_length() -> None:
    short = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)
    long = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=4096, batch=2)
    einsums = ("Z", "G", "YD", "YG", "O")
    assert analyse(short, einsums) is analyse(long, einsums)


def test_the_analysis_is_what_every_question_about_the_group_answers() -> None:
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)
    group = FusionGroup("g", ("Z", "G", "YD", "YG", "O"))
    a = analyse(c, group.einsums)
    assert tensors_read(c, group) == list(a.reads) == ["XN", "WZ", "YS", "U", "DS", "WO"]
    assert tensors_written(c, group) == list(a.writes) == ["O"]
    assert intermediates(c, group) == list(a.intermediates) == ["Z", "G", "YD", "YG"]
    assert register_resident(c, group) == a.in_registers == {"G", "YD"}
    # O reduces E, so only B and I are written by all and reduced by none
    assert tileable_ranks(c, list(group.einsums)) == ["B", "I"] == list(a.tileable)
    assert widened_ranks(c, list(group.einsums)) == ["B", "I"]
    scan = ("AD", "BX", "H", "YS")
    assert "N" not in analyse(c, scan).tileable  # YS reduces the state rank
    assert analyse(c, scan).tileable[-1] == "I"  # the generational rank last


def test_registers_hold_what_one_lane_makes_and_every_reader_reads_in_place() -> None:
    """Registers as a level (fusion.group_analysis): an intermediate made one element per lane
    (pointwise, or an elementwise recurrence) and read in place by every reader of its group
    (pointwise at its own element, a reduction over its ranks, a recurrence's step input) is
    carried in the lanes. Not: a tensor another group reads, one read at offsets (a window),
    one reused across a rank it lacks (a matrix product's operand), one a reduction of it must
    finish before another reader reads it (the blocked softmax's score tile), nor one made by a
    reduction."""
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2)
    assert analyse(c, ("AD", "BX", "H", "YS")).in_registers == {"AD", "BX", "H"}  # H read by YS over N
    assert analyse(c, ("DELTA", "AD", "BX", "H")).in_registers == {"AD", "BX"}  # H leaves: YS is elsewhere
    assert analyse(c, ("XI", "XC", "U")).in_registers == frozenset()  # XI read at offsets; XC a reduction (the window)
    assert analyse(c, ("YS", "YD", "YG", "O")).in_registers == {"YD"}  # YS is made by a reduction; YG is O's operand
    states = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2, state_io=True)
    # HN takes H's last position from the lane holding it (a select-runner of the recurrence)
    assert analyse(states, ("AD", "BX", "H", "YS", "HN")).in_registers == {"AD", "BX", "H"}
    assert analyse(states, ("AD", "BX", "H", "HN")).in_registers == {"AD", "BX"}  # YS, elsewhere, reads H
    hybrid = PRESETS["bamba-9b"]
    attn = build_layer(hybrid, phase="prefill", seq_len=256, batch=1, layer_type="attention", softmax="blocked")
    names = tuple(e.name for e in attn.einsums)
    core = names[names.index("SC"):names.index("OR") + 1]
    held = analyse(attn, core).in_registers
    assert "SC" not in held  # KBX reduces it over the key block before PE reads it
    assert "PE" not in held  # the P.V product reuses it across the value channels
