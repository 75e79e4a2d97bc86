"""The evaluation figures: each builds a Figure from a small table, saves as PNG and SVG with
its labels as text, uses log axes where the data spans decades, and rejects bad tables with a
MambalayaError."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from mambalaya.errors import MambalayaError
from mambalaya.report.figures import (
    end_to_end_figure,
    latency_breakdown_figure,
    roofline_figure,
    save_figure,
    speedup_figure,
    traffic_by_tensor_figure,
    utilisation_timeline_figure,
)

MAMBA1 = dict(
    zip(
        "SS RS XN XI Z XC U DL BM CM DT DELTA AD BX H YS YD G YG O XO".split(),
        (
            "reduction unary broadcast gemm gemm window unary gemm gemm gemm gemm unary unary broadcast "
            "recurrent reduction broadcast unary elementwise gemm elementwise"
        ).split(),
    )
)
PEAK, PEAK_1D, BW = 2.29e14, 1.147e14, 2.039e12


def roofline_points(names=MAMBA1, seed=0) -> pd.DataFrame:
    """Unfused and ideally fused points: GEMMs near the 2D roof, the rest memory bound."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, kind in names.items():
        base = rng.uniform(150, 1000) if kind == "gemm" else rng.uniform(0.2, 3.0)
        for series, intensity in (("unfused", base), ("ideal fusion", base * (1.5 if kind == "gemm" else 40))):
            peak = PEAK if kind == "gemm" else PEAK_1D
            perf = min(BW * intensity, peak) * rng.uniform(0.6, 0.95)
            rows.append((name, kind, series, intensity, perf))
    return pd.DataFrame(rows, columns=["einsum", "kind", "series", "intensity_ops_per_byte", "performance_ops_per_s"])


def timeline_rows(fused: bool) -> pd.DataFrame:
    """One layer: each Einsum alone, or in fused groups sharing an interval."""
    rng = np.random.default_rng(1)
    groups = (
        [["SS", "RS", "XN"], ["XI", "Z"], ["XC", "U"], ["DL", "BM", "CM"], ["DT", "DELTA", "AD", "BX", "H", "YS", "YD"],
         ["G", "YG"], ["O", "XO"]]
        if fused
        else [[n] for n in MAMBA1]
    )  # fmt: skip
    rows, t = [], 0.0
    for k, members in enumerate(groups):
        gemm = any(MAMBA1[m] == "gemm" for m in members)
        dur = rng.uniform(30e-6, 90e-6) if gemm else rng.uniform(3e-6, 25e-6)
        for m in members:
            cu = rng.uniform(0.5, 0.9) if MAMBA1[m] == "gemm" else rng.uniform(0.02, 0.15)
            mu = rng.uniform(0.05, 0.3) if MAMBA1[m] == "gemm" else rng.uniform(0.6, 0.95)
            share = 1 / len(members)
            rows.append((m, MAMBA1[m], f"g{k}" if fused else None, t, t + dur, cu * share, mu * share))
        t += dur
    return pd.DataFrame(rows, columns=["einsum", "kind", "group", "start_s", "end_s", "compute_util", "mem_util"])


def speedup_rows() -> pd.DataFrame:
    rows = []
    for k in range(11, 21):
        for phase, base in (("prefill", 1.0), ("generation", 3.0)):
            rows.append((2**k, "marca-ideal", phase, base * (1.5 + 0.35 * (k - 11))))
            rows.append((2**k, "geens-ideal", phase, base * (1.1 + 0.08 * (k - 11))))
    return pd.DataFrame(rows, columns=["seq_len", "baseline", "phase", "speedup"])


PUBLISHED = {"prefill vs marca-ideal": 4.9, "prefill vs geens-ideal": 1.9, "generation vs marca-ideal": 11.2}


def end_to_end_rows() -> pd.DataFrame:
    return pd.DataFrame(
        [("Mamba-1", "marca-ideal", 4.1), ("Mamba-1", "geens-ideal", 1.7), ("Mamba-2", "marca-ideal", 3.6),
         ("Mamba-2", "geens-ideal", 1.5)],
        columns=["model", "baseline", "speedup"],
    )  # fmt: skip


E2E_PUBLISHED = {"Mamba-1 vs marca-ideal": 4.4, "Mamba-2 vs geens-ideal": 1.6}


def traffic_rows() -> pd.DataFrame:
    rng = np.random.default_rng(2)
    rows = []
    factor = {"unfused": 1.0, "ssm-ri": 0.55, "stitched": 0.3, "optimal": 0.25, "ideal": 0.12}
    sizes = {n: rng.uniform(0.05, 3.0) * 1e9 for n in MAMBA1}
    for mapping, f in factor.items():
        for n in MAMBA1:
            keep = f if MAMBA1[n] != "gemm" else max(f, 0.5)
            rows.append((mapping, n, "intermediate", sizes[n] * keep, sizes[n] * keep * 0.5))
        rows.append((mapping, "WX", "weight", 0.4e9, 0.0))
        rows.append((mapping, "X", "input", 0.8e9, 0.0))
    return pd.DataFrame(rows, columns=["mapping", "tensor", "role", "read_bytes", "write_bytes"])


def latency_rows() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for design, scale in (("marca-ideal", 1.0), ("geens-ideal", 0.6), ("mambalaya", 0.3)):
        for n, kind in MAMBA1.items():
            lat = rng.uniform(60e-6, 120e-6) if kind == "gemm" else rng.uniform(2e-6, 20e-6) * scale * 3
            if design == "mambalaya" and kind != "gemm" and n not in ("H", "SS"):
                lat = 0.0  # fused into a neighbour
            rows.append((design, n, kind, lat))
    return pd.DataFrame(rows, columns=["design", "einsum", "kind", "final_latency_s"])


def build_all() -> dict[str, Figure]:
    return {
        "roofline": roofline_figure(
            roofline_points(), peak_ops_per_s=PEAK, peak_elementwise_ops_per_s=PEAK_1D, bandwidth_bytes_per_s=BW,
            title="Mamba-1 prefill, L=2^14: roofline",
        ),
        "timeline_unfused": utilisation_timeline_figure(timeline_rows(False), title="Unfused: utilisation, one layer"),
        "timeline_fused": utilisation_timeline_figure(timeline_rows(True), title="Mambalaya: utilisation, one layer"),
        "speedup": speedup_figure(speedup_rows(), title="Speedup of mambalaya vs sequence length", published=PUBLISHED),
        "end_to_end": end_to_end_figure(end_to_end_rows(), published=E2E_PUBLISHED, title="End-to-end speedup"),
        "traffic": traffic_by_tensor_figure(traffic_rows(), title="Off-chip traffic by tensor"),
        "latency": latency_breakdown_figure(latency_rows(), title="Latency breakdown per design"),
    }  # fmt: skip


@pytest.fixture(scope="module")
def figures() -> dict[str, Figure]:
    return build_all()


@pytest.fixture(scope="module")
def saved(figures, tmp_path_factory) -> dict[str, str]:
    """The SVG text of every figure, after checking both files were written."""
    out = tmp_path_factory.mktemp("figs")
    svgs = {}
    for name, fig in figures.items():
        paths = save_figure(fig, out / "sub" / name)
        assert [p.name for p in paths] == [f"{name}.png", f"{name}.svg"]
        png, svg = paths
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
        assert svg.stat().st_size > 2000
        svgs[name] = svg.read_text(encoding="utf-8")
    return svgs


def test_every_function_returns_a_figure(figures):
    assert len(figures) == 7
    assert all(isinstance(f, Figure) for f in figures.values())


def test_save_writes_png_and_svg(saved):
    assert all("<svg" in s for s in saved.values())


def test_save_drops_an_image_suffix_and_keeps_other_dots(figures, tmp_path):
    assert [p.name for p in save_figure(figures["end_to_end"], tmp_path / "a.png")] == ["a.png", "a.svg"]
    assert [p.name for p in save_figure(figures["end_to_end"], tmp_path / "x" / "L2.14")] == ["L2.14.png", "L2.14.svg"]


def test_save_rejects_non_figures(tmp_path):
    with pytest.raises(MambalayaError, match="Figure"):
        save_figure("not a figure", tmp_path / "x")  # type: ignore[arg-type]


def test_roofline_labels_and_scales(figures, saved):
    svg = saved["roofline"]
    for name in MAMBA1:
        assert f">{name}<" in svg, name
    assert "2D array peak" in svg and "1D array peak" in svg and "memory" in svg
    assert "unfused" in svg and "ideal fusion" in svg
    ax = figures["roofline"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    # one arrow per Einsum from its unfused point to its fused point
    assert sum(type(p).__name__ == "FancyArrowPatch" for p in ax.patches) == len(MAMBA1)


def test_roofline_labels_do_not_overlap(figures):
    fig = figures["roofline"]
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if t.get_text() in MAMBA1]
    for t in labels:
        t.update_positions(renderer)
    # the text itself, without the leader line an Annotation's extent includes
    boxes = [Text.get_window_extent(t, renderer) for t in labels]
    assert len(boxes) == len(MAMBA1)
    overlaps = sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert overlaps <= 1


def test_timeline(figures, saved):
    fig = figures["timeline_fused"]
    compute, memory = fig.axes[:2]
    assert compute.get_ylim()[0] == 0 and 100 <= compute.get_ylim()[1] <= 130
    assert memory.get_xlabel() == "time (µs)"
    assert "fused group" in saved["timeline_fused"]
    assert ">XI+Z<" in saved["timeline_fused"]  # a wide group is named
    assert ">XI<" in saved["timeline_unfused"]


def test_timeline_unit_follows_span():
    rows = timeline_rows(False)
    rows[["start_s", "end_s"]] *= 1000  # ms-scale layer
    fig = utilisation_timeline_figure(rows, title="")
    assert fig.axes[1].get_xlabel() == "time (ms)"


def test_speedup(figures, saved):
    svg = saved["speedup"]
    assert "published 4.9×" in svg and "published 11.2×" in svg and "published 1.9×" in svg
    axes = figures["speedup"].axes
    assert [ax.get_title(loc="left") for ax in axes[:2]] == ["prefill", "generation"]
    assert axes[0].get_xscale() == "log" and axes[0].xaxis.get_transform().base == 2
    assert axes[0].get_ylabel() == "speedup (×)"
    assert any(np.allclose(line.get_ydata(), 1.0) for line in axes[0].lines)


def test_speedup_bad_published_key():
    with pytest.raises(MambalayaError, match="vs"):
        speedup_figure(speedup_rows(), title="", published={"prefill marca": 4.9})
    with pytest.raises(MambalayaError, match="phase 'decode'"):
        speedup_figure(speedup_rows(), title="", published={"decode vs marca-ideal": 4.9})


def test_end_to_end(figures, saved):
    svg = saved["end_to_end"]
    assert "published" in svg and "Mamba-1" in svg and "Mamba-2" in svg
    assert "vs marca-ideal" in svg and "4.1×" in svg


def test_traffic(figures, saved):
    svg = saved["traffic"]
    assert "GB" in svg and "other (11 tensors)" in svg  # 23 tensors, 12 shown
    ticks = [t.get_text() for t in figures["traffic"].axes[0].get_xticklabels()]
    assert ticks == ["unfused", "ssm-ri", "stitched", "optimal", "ideal"]


def test_traffic_orders_known_mappings_first():
    rows = traffic_rows()
    rows = rows[rows["mapping"].isin(["ideal", "unfused"])].copy()
    rows.loc[rows["mapping"] == "ideal", "mapping"] = "custom"
    custom_first = pd.concat([rows[rows["mapping"] == "custom"], rows[rows["mapping"] != "custom"]])
    fig = traffic_by_tensor_figure(custom_first, title="t", top=3)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["unfused", "custom"]


def test_latency_breakdown(figures, saved):
    svg = saved["latency"]
    assert "mambalaya" in svg and "marca-ideal" in svg and "GEMM" in svg
    assert figures["latency"].axes[0].get_xlabel() == "latency (ms)"  # 1.02 ms at most


CALLS = {
    "roofline": (
        lambda df: roofline_figure(
            df, peak_ops_per_s=PEAK, peak_elementwise_ops_per_s=PEAK_1D, bandwidth_bytes_per_s=BW, title="t"
        ),
        roofline_points,
    ),
    "timeline": (lambda df: utilisation_timeline_figure(df, title="t"), lambda: timeline_rows(True)),
    "speedup": (lambda df: speedup_figure(df, title="t", published=PUBLISHED), speedup_rows),
    "end_to_end": (lambda df: end_to_end_figure(df, published=None, title="t"), end_to_end_rows),
    "traffic": (lambda df: traffic_by_tensor_figure(df, title="t"), traffic_rows),
    "latency": (lambda df: latency_breakdown_figure(df, title="t"), latency_rows),
}


@pytest.mark.parametrize("name", CALLS)
def test_empty_and_malformed_tables(name):
    call, build = CALLS[name]
    columns = build().columns
    with pytest.raises(MambalayaError, match="empty"):
        call(pd.DataFrame(columns=columns))
    with pytest.raises(MambalayaError, match=f"no column '{columns[-1]}'"):
        call(build().drop(columns=[columns[-1]]))
    with pytest.raises(MambalayaError, match="DataFrame"):
        call([1, 2, 3])


def test_values_that_cannot_be_drawn():
    pts = roofline_points()
    pts.loc[(pts["einsum"] == "XI") & (pts["series"] == "unfused"), "performance_ops_per_s"] = 0.0
    with pytest.raises(MambalayaError, match=r"performance_ops_per_s.*positive.*'XI'.*=0\.0\)"):
        roofline_figure(
            pts, peak_ops_per_s=PEAK, peak_elementwise_ops_per_s=PEAK_1D, bandwidth_bytes_per_s=BW, title=""
        )
    with pytest.raises(MambalayaError, match="bandwidth_bytes_per_s"):
        roofline_figure(roofline_points(), peak_ops_per_s=PEAK, peak_elementwise_ops_per_s=PEAK_1D,
                        bandwidth_bytes_per_s=0, title="")  # fmt: skip
    rows = timeline_rows(False)
    rows.loc[0, "compute_util"] = 85.0
    with pytest.raises(MambalayaError, match="percentages"):
        utilisation_timeline_figure(rows, title="")
    rows = timeline_rows(True)
    rows.loc[0, "end_s"] += 1e-6
    with pytest.raises(MambalayaError, match="share start_s and end_s"):
        utilisation_timeline_figure(rows, title="")
    rows = timeline_rows(True)
    rows["compute_util"] = 0.9
    with pytest.raises(MambalayaError, match="add up"):
        utilisation_timeline_figure(rows, title="")
    with pytest.raises(MambalayaError, match="more than one row"):
        end_to_end_figure(pd.concat([end_to_end_rows()] * 2), published=None, title="")
    with pytest.raises(MambalayaError, match="model 'Mamba-3'"):
        end_to_end_figure(end_to_end_rows(), published={"Mamba-3 vs marca-ideal": 2.0}, title="")
    zero = latency_rows().assign(final_latency_s=0.0)
    with pytest.raises(MambalayaError, match="zero"):
        latency_breakdown_figure(zero, title="")


def test_log_y_when_speedups_span_decades():
    rows = speedup_rows()
    rows.loc[rows["baseline"] == "marca-ideal", "speedup"] *= 40
    fig = speedup_figure(rows, title="")
    assert fig.axes[0].get_yscale() == "log"
    assert speedup_figure(speedup_rows(), title="").axes[0].get_yscale() == "linear"
