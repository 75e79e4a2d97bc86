"""The cascade diagram: files written, every tensor shown, producers above consumers, labels."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from mambalaya.einsum.ir import Role
from mambalaya.errors import MambalayaError
from mambalaya.report.diagram import (
    CATEGORY_STYLE,
    draw_cascade,
    graph_edges,
    layout_cascade,
    tensor_category,
)
from mambalaya.workloads.blocks.mamba1 import PRESETS, mamba1_layer


@pytest.fixture(scope="module")
def prefill():
    return mamba1_layer(PRESETS["mamba-130m"], batch=64, seq_len=2048, phase="prefill")


@pytest.fixture(scope="module")
def decode():
    return mamba1_layer(PRESETS["mamba-130m"], batch=1, seq_len=1, phase="decode")


@pytest.fixture(scope="module")
def chunked():
    """Prefill with state in and out: 23 Einsums, both kinds of initial-value read."""
    return mamba1_layer(PRESETS["mamba-130m"], batch=64, seq_len=2048, phase="prefill", state_io=True)


@pytest.fixture(params=["prefill", "decode", "chunked"])
def cascade(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("ext", ["svg", "png", "pdf"])
def test_files_written(cascade, tmp_path, ext):
    path = tmp_path / f"cascade.{ext}"
    fig = draw_cascade(cascade, path)
    assert isinstance(fig, Figure)
    assert path.stat().st_size > 1000


def test_svg_has_every_tensor_as_text(cascade, tmp_path):
    path = tmp_path / "cascade.svg"
    draw_cascade(cascade, path)
    svg = path.read_text(encoding="utf-8")
    for name, spec in cascade.tensors.items():
        shown = f">{name} [" if spec.role == Role.WEIGHT else f">{name}<"  # weights read "WX [D,E]"
        assert shown in svg, name
    for e in cascade.einsums:
        assert f">{cascade.position(e.name)} · {cascade.kind(e)}<" in svg


def test_shapes_are_shown(prefill, tmp_path):
    path = tmp_path / "cascade.svg"
    draw_cascade(prefill, path)
    svg = path.read_text(encoding="utf-8")
    assert ">64×2048×1536<" in svg and ">[B,I,E]<" in svg


def test_hidden_weights(prefill, tmp_path):
    path = tmp_path / "cascade.svg"
    draw_cascade(prefill, path, show_weights=False)
    svg = path.read_text(encoding="utf-8")
    assert ">WX [" not in svg and ">XI<" in svg


def test_producers_above_consumers(cascade):
    pos = layout_cascade(cascade)
    drawn = {t for t, spec in cascade.tensors.items() if spec.role != Role.WEIGHT}
    assert set(pos) == drawn
    for e in cascade.einsums:
        for t in set(e.input_tensors) | set(cascade.initial_reads(e)):
            if t != e.name and t in drawn:
                assert pos[t][1] > pos[e.name][1], (t, e.name)


def test_boxes_do_not_overlap(cascade):
    pos = layout_cascade(cascade)
    rows: dict[float, list[float]] = {}
    for x, y in pos.values():
        rows.setdefault(round(y, 6), []).append(x)
    for xs in rows.values():
        xs.sort()
        assert all(b - a > 0.9 for a, b in zip(xs, xs[1:]))  # boxes are at least 0.9 in wide


def test_edge_labels_and_groups_in_svg(chunked, tmp_path):
    labels = {}
    for i, edge in enumerate(graph_edges(chunked)):
        producer = chunked.producer(edge.tensor)
        labels[(producer.name if producer else None, edge.consumer, edge.tensor)] = f"L{i}x"
    groups = {e.name: chunked.position(e.name) // 6 for e in chunked.einsums}
    path = tmp_path / "cascade.svg"
    draw_cascade(chunked, path, edge_labels=labels, groups=groups, title="fusion")
    svg = path.read_text(encoding="utf-8")
    for text in labels.values():
        assert f">{text}<" in svg
    assert ">fusion group 0<" in svg and ">fusion<" in svg


def test_unknown_edge_label_rejected(prefill):
    with pytest.raises(MambalayaError, match="no edge"):
        draw_cascade(prefill, edge_labels={("XI", "U", "XI"): "RI"})


def test_unknown_group_member_rejected(prefill):
    with pytest.raises(MambalayaError, match="NOPE"):
        draw_cascade(prefill, groups={"NOPE": 1})


@pytest.mark.parametrize("name", ["cascade.jpg", "cascade", "cascade.svg.txt"])
def test_bad_extension(prefill, tmp_path, name):
    with pytest.raises(MambalayaError, match="supported"):
        draw_cascade(prefill, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_categories(prefill, decode):
    assert tensor_category(prefill, "X") == "input"
    assert tensor_category(decode, "H0") == "input"
    assert tensor_category(prefill, "WX") == "weight"
    assert tensor_category(prefill, "XI") == "gemm"
    assert tensor_category(prefill, "H") == "recurrent"
    assert tensor_category(prefill, "U") == "unary"
    assert tensor_category(prefill, "XC") == "window"
    assert tensor_category(prefill, "YG") == "elementwise"
    assert tensor_category(decode, "CSN") == "elementwise"  # a copy
    for t in prefill.tensors:
        assert tensor_category(prefill, t) in CATEGORY_STYLE


def test_no_pyplot_state(prefill):
    import sys

    draw_cascade(prefill)
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []


def test_a_cascade_file_is_drawn_as_it_is_and_layer_options_beside_it_are_refused(tmp_path) -> None:
    """cascade diagram --cascade FILE with --unroll, -L or --precision drew the file unchanged
    without a word; those options name a model's layer."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.einsum import dump_cascade
    from mambalaya.workloads import PRESETS, build_layer

    path = tmp_path / "c.yaml"
    path.write_text(dump_cascade(build_layer(PRESETS["mamba-130m"], phase="decode", seq_len=1, batch=1)), encoding="utf-8")
    run = CliRunner().invoke
    r = run(app, ["cascade", "diagram", "--cascade", str(path), "--unroll", "-L", "99", "-o", str(tmp_path / "d.svg")])
    assert r.exit_code == 1 and "--seq-len, --unroll apply to a model's layer" in r.output
    assert run(app, ["cascade", "diagram", "--cascade", str(path), "-o", str(tmp_path / "d.svg")]).exit_code == 0
