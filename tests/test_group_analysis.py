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
