"""Scale: the model's cost does not grow with the problem, memoisation changes no number, and
sizes beyond what the model represents exactly are refused with a clear message."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mambalaya.search import group_choice
from mambalaya.cli import app
from mambalaya.errors import SpecError
from mambalaya.experiments import sweep
from mambalaya.experiments.sweep import evaluate_chunk, evaluate_point, load_sweep_spec
from mambalaya.fusion.mapping import FusionGroup, Loop
from mambalaya.cost import traffic
from mambalaya.cost.traffic import group_traffic
from mambalaya.workloads import PRESETS, build_layer

runner = CliRunner()

#: The realistic grid of issue 13, its designs, bandwidths and buffers; smaller models,
#: lengths and batches keep the test short.
REALISTIC = """
name: realistic
chunk_size: 32
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.offchip_bandwidth_bytes_per_s: [1e12, 2.039e12, 4e12]
  memory.onchip_buffer_bytes: [8MiB, 16MiB, 32MiB, 64MiB]
  model: [mamba-130m, mamba2-130m]
  seq_len: [1024, 2048]
  batch: [8, 16]
  phase: [prefill]
"""


@pytest.mark.slow
def test_memoised_sweep_points_equal_the_unmemoised_path(tmp_path: Path, monkeypatch) -> None:
    """A sample of the realistic grid evaluated as a sweep chunk (shared cascades, candidate
    tables, cycles and choices; dominated candidates dropped; segments picked together and
    costed by the closed forms) equals, field by field, each point evaluated alone on fresh
    cascades with every memo and the pruning off, one search per segment and every pick
    re-costed by the general model."""
    spec_path = tmp_path / "grid.yaml"
    spec_path.write_text(REALISTIC)
    points = load_sweep_spec(spec_path).points()
    sample = random.Random(13).sample(points, 16)
    sample.sort(key=lambda p: (p["model"], p["seq_len"], p["batch"], p["arch"]))
    memoised = evaluate_chunk(sample)
    monkeypatch.setattr(group_choice, "MEMOISE_GROUPS", False)
    monkeypatch.setattr(group_choice, "PRUNE_DOMINATED", False)
    monkeypatch.setattr(group_choice, "CLOSED_FORM_COSTS", False)  # every pick re-costed by the general model
    monkeypatch.setattr(group_choice, "BATCH_PICKS", False)  # one search per segment
    assert sum(not r.error for r in memoised) >= 10
    for point, fast in zip(sample, memoised):
        sweep._CASCADES.clear()  # a fresh cascade: no memo of any stage survives
        try:
            alone, error = evaluate_point(point), None
        except SpecError as err:  # an impossible point (a buffer too small) fails alike
            alone, error = None, str(err)
        assert (fast.outputs, fast.error) == (alone, error), point


def test_two_rank_sums_at_a_huge_length_follow_the_closed_form() -> None:
    """Mamba-2's chunked scan at L = 2^40 (2^32 chunks): a group's traffic is evaluated from a
    bounded number of representative tiles, and equals the linear growth measured exactly
    (every tile evaluated) at small lengths: T(L) = a + b*L for L a multiple of the chunk."""
    def traffic_at(seq_len: int, compress: bool) -> dict[str, float]:
        traffic.COMPRESS_REGULAR_TILES = compress
        try:
            c = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=seq_len, batch=1, scan="chunked")
            names = [e.name for e in c.einsums]
            group = FusionGroup("g", tuple(names[names.index("CB"):names.index("YD") + 1]),
                                (Loop("C", 4), Loop("Q", 16)))
            return dict(traffic._group_traffic(c, group).read_bytes)
        finally:
            traffic.COMPRESS_REGULAR_TILES = True

    q = PRESETS["mamba2-130m"].chunk_size
    small, double = traffic_at(64 * q, False), traffic_at(128 * q, False)
    huge = traffic_at(2**40, True)
    assert set(huge) == set(small)
    for t in small:
        per_chunk = (double[t] - small[t]) / 64
        assert huge[t] == small[t] + per_chunk * (2**40 // q - 64), t


def test_a_length_beyond_exact_arithmetic_is_refused_clearly() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "mamba-130m", "-L", str(2**62)])
    assert r.exit_code == 1
    assert "rank I has size 4,611,686,018,427,387,904, above 2^53" in r.stderr
    assert "Traceback" not in r.output + r.stderr
    r = runner.invoke(app, ["evaluate", "--model", "mamba-130m", "-L", "2**62"])
    assert r.exit_code == 2 and "Invalid value for '--seq-len'" in r.stderr


def test_huge_model_gives_a_result_with_no_false_digits(tmp_path: Path) -> None:
    """d_model = 10^12 is evaluated in about a second; counts beyond 2^53 print with the digits
    a float holds, and 1e12 (text in YAML) is a clear field error."""
    big = tmp_path / "big.yaml"
    big.write_text("d_model: 1000000000000\nn_layers: 2\n")
    r = runner.invoke(app, ["evaluate", "--model", str(big), "-a", "marca-ideal",
                            "--set", "memory.offchip_capacity_bytes=null"])  # its weights are ~10^25 bytes
    assert r.exit_code == 0, r.output
    assert "off-chip 1.25" in r.output and "e+25 B" in r.output
    text = tmp_path / "text.yaml"
    text.write_text("d_model: 1e12\n")
    r = runner.invoke(app, ["evaluate", "--model", str(text)])
    assert r.exit_code == 1 and "d_model" in r.stderr and "must be an integer" in r.stderr


def test_a_ten_million_point_grid_is_refused_before_it_is_built(tmp_path: Path) -> None:
    spec = tmp_path / "huge.yaml"
    axes = {f"memory.a{k}": list(range(10)) for k in range(7)}
    spec.write_text("grid:\n" + "".join(f"  {k}: {v}\n" for k, v in axes.items()))
    with pytest.raises(SpecError, match="10,000,000 points"):
        load_sweep_spec(spec)


def test_huge_groups_keep_exact_integer_element_counts() -> None:
    """Element counts pass int64's range exactly (Python integers): at L = 2^50, batch 2^10
    and tile 1, an unfused read of the input equals its size."""
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=2**50, batch=2**10)
    g = FusionGroup("g", ("SS",), (Loop("I", 1),))
    expected = c.elements("X") * c.tensors["X"].bits / 8
    assert group_traffic(c, g).read_bytes["X"] == expected
