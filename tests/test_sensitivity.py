"""The sensitivity study: spec validation, settings, the tornado rows, what-would-it-take, and
the headline ratios computed from a latency table."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from mambalaya.arch import load_arch
from mambalaya.cli import app
from mambalaya.errors import SpecError
from mambalaya.experiments import sensitivity as S
from mambalaya.experiments.claims import headline_ratios
from mambalaya.experiments.evaluate import evaluate
from mambalaya.workloads import PRESETS

runner = CliRunner()


def test_shipped_spec_names_every_documented_assumption() -> None:
    spec = S.load_sensitivity_spec("h100-like")
    keys = {a.key for a in spec.assumptions}
    for key in ("precision", "compute.mfu_units", "compute.unary_cost_cycles", "compute.one_d_lanes",
                "compute.one_d_ops_per_lane_per_cycle", "memory.onchip_buffer_bytes",
                "compute.pipeline_wind_up_cycles", "compute.overlap_compute_units",
                "memory.overlap_compute_and_memory", "batch", "scan", "compute.dataflows", "compute.dataflow_switch_cycles",
                "compute.stationary_double_buffered", "memory.onchip_bandwidth_bytes_per_cycle"):
        assert key in keys, key
    for a in spec.assumptions:
        assert len(a.reason.split()) >= 5, a.key  # every range has a reason
    # the designs' own values lie within the stated ranges
    mb = load_arch("mambalaya")
    run = S.RunSetup(models=("mamba-130m",), configs={"mamba-130m": PRESETS["mamba-130m"]}, seq_lens=(2048,))
    for a in spec.assumptions:
        if a.numeric and not a.factor:
            lo, hi, b = (S.numeric_value(a, v) for v in (a.low, a.high, S.base_value(a, mb, run)))
            assert lo <= b <= hi, a.key


def test_with_setting_changes_one_field_on_a_copy() -> None:
    spec = S.load_sensitivity_spec("h100-like")
    mfu = next(a for a in spec.assumptions if a.key == "compute.mfu_units")
    cost = next(a for a in spec.assumptions if a.key == "compute.unary_cost_cycles")
    mb = load_arch("mambalaya")
    assert S.with_setting(mb, mfu, 256).compute.mfu_units == 256 and mb.compute.mfu_units == 1024
    scaled = S.with_setting(mb, cost, 4)
    assert scaled.compute.unary_cost_cycles["exp"] == 4 * mb.compute.unary_cost_cycles["exp"]
    assert scaled.compute.unary_cost_cycles["neg"] == 0  # a plain elementwise op stays one


@pytest.mark.parametrize("text, field", [
    ("name: x\ndesigns: [mambalaya]\nassumptions:\n - {key: compute.nope, low: 1, high: 2, reason: because}\n", "key"),
    ("name: x\ndesigns: [mambalaya]\nassumptions:\n - {key: compute.mfu_units, low: -1, high: 2, reason: because}\n",
     "compute.mfu_units"),
    ("name: x\ndesigns: [mambalaya]\nassumptions:\n - {key: compute.mfu_units, low: 1, high: 2}\n", "reason"),
    ("name: x\ndesigns: [mambalaya]\nassumptions: [\n", "YAML"),
    # each assumption once (its tornado rows printed twice), each design once
    ("name: x\ndesigns: [mambalaya]\nassumptions:\n - {key: compute.mfu_units, low: 1, high: 2, reason: r}\n"
     " - {key: compute.mfu_units, low: 1, high: 2, reason: r, label: again}\n", "assumptions.1"),
    ("name: x\ndesigns: [mambalaya]\nassumptions:\n - {key: compute.mfu_units, low: 1, high: 2, reason: r}\n"
     " - {key: compute.mfu_units, low: 1, high: 4, reason: r}\n", "row name"),
    ("name: x\ndesigns: [mambalaya, mambalaya]\nassumptions:\n - {key: compute.mfu_units, low: 1, high: 2, reason: r}\n",
     "designs"),
])
def test_bad_specs_name_the_field(tmp_path, text: str, field: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        S.load_sensitivity_spec(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_closest_bisects_to_the_needed_value() -> None:
    """A ratio that grows like sqrt(MFUs): the value that reaches a target is found by bisection."""
    a = S.Assumption(key="compute.mfu_units", low=256, high=4096, reason="a test range of MFU counts")

    def at(_a, value):
        return {"r": math.sqrt(float(value)) / 10}

    got = S._closest(a, (True, 1024), "r", 5.0, at(a, 1024)["r"], at)  # needs 2500 MFUs
    assert got["reaches"] and abs(float(got["value"]) - 2500) / 2500 < 0.05
    out = S._closest(a, (True, 1024), "r", 9.0, at(a, 1024)["r"], at)  # 8100 is out of range
    assert not out["reaches"] and out["value"] == 4096


def _latency(rows):
    return pd.DataFrame(rows, columns=["model", "phase", "seq_len", "arch", "layer_latency_s", "model_latency_s"])


def test_headline_ratios_by_hand() -> None:
    rows = []
    for L, (m, g, c) in {2048: (1.0, 2.0, 3.0), 4096: (2.0, 3.0, 8.0)}.items():
        for arch, t in (("mambalaya", m), ("geens-ideal", g), ("marca-ideal", c)):
            rows.append(("m", "prefill", L, arch, t, 10 * t))
    for arch, t in (("mambalaya", 0.1), ("geens-ideal", 0.15), ("marca-ideal", 0.2)):
        rows.append(("m", "generation", 1, arch, t, 10 * t))
    r = headline_ratios(_latency(rows), "m", generated_tokens=10)
    assert r["prefill vs marca-ideal"][0] == pytest.approx((3 / 1 + 8 / 2) / 2)
    assert r["prefill vs geens-ideal (max)"][0] == pytest.approx(2.0)
    assert r["generation vs marca-ideal"][0] == pytest.approx(2.0)
    # end to end at L=2048: (30 + 10*2) / (10 + 10*1) = 2.5; at 4096: (80 + 20) / (20 + 10) = 10/3
    assert r["end-to-end vs marca-ideal"][0] == pytest.approx((2.5 + 10 / 3) / 2)


def test_run_sensitivity_rows_match_direct_evaluations() -> None:
    """Each row's ratio is the ratio of two direct evaluations with the setting applied."""
    spec = S.SensitivitySpec(name="t", designs=["mambalaya", "marca-ideal"], assumptions=[
        S.Assumption(key="compute.mfu_units", low=256, high=4096, reason="a test range of MFU counts"),
        S.Assumption(key="batch", low=2, high=16, reason="a test range of batch sizes"),
    ])
    model = "mamba-130m"
    run = S.RunSetup(models=(model,), configs={model: PRESETS[model]}, seq_lens=(512,), batch=4,
                     phases=("prefill",))
    result = S.run_sensitivity(spec, run, S.pair_ratio("mambalaya", "marca-ideal"))
    label = S.pair_label(model, "prefill", "mambalaya", "marca-ideal")
    row = next(r for r in result.rows if r["key"] == "compute.mfu_units" and r["end"] == "low")
    arch = {d: S.with_setting(load_arch(d), spec.assumptions[0], 256) for d in spec.designs}
    direct = [evaluate(arch[d], model, PRESETS[model], phase="prefill", seq_len=512, batch=4).result.latency_s
              for d in ("marca-ideal", "mambalaya")]
    assert row["ours"] == pytest.approx(direct[0] / direct[1], rel=1e-12)
    row = next(r for r in result.rows if r["key"] == "batch" and r["end"] == "high")
    direct = [evaluate(d, model, PRESETS[model], phase="prefill", seq_len=512, batch=16).result.latency_s
              for d in ("marca-ideal", "mambalaya")]
    assert row["ours"] == pytest.approx(direct[0] / direct[1], rel=1e-12)
    assert result.base[label] == pytest.approx(next(r["base"] for r in result.rows))


def test_a_setting_is_the_base_run_only_where_every_design_takes_it(tmp_path) -> None:
    """Two designs equal but for their MFU count (256 and the shipped 1024): a setting of 256 moves
    the second, making the designs equal (ratio 1), and 4096 on both is equal too. The base run was
    taken for any setting equal to the first design's value, printing the base ratio at 256."""
    import yaml

    from mambalaya.arch import arch_to_dict

    mine = arch_to_dict(load_arch("mambalaya"))
    mine["name"], mine["compute"]["mfu_units"] = "my256", 256
    path = tmp_path / "my256.yaml"
    path.write_text(yaml.safe_dump(mine), encoding="utf-8")
    spec = S.SensitivitySpec(name="t", designs=[str(path), "mambalaya"], assumptions=[
        S.Assumption(key="compute.mfu_units", low=256, high=4096, reason="a test range of MFU counts")])
    model = "mamba-130m"
    run = S.RunSetup(models=(model,), configs={model: PRESETS[model]}, seq_lens=(1024,), batch=8, phases=("prefill",))
    result = S.run_sensitivity(spec, run, S.pair_ratio(str(path), "mambalaya"))
    rows = {r["end"]: r for r in result.rows}
    assert result.base[next(iter(result.base))] != pytest.approx(1.0)
    assert rows["low"]["ours"] == pytest.approx(1.0, rel=1e-12) and rows["high"]["ours"] == pytest.approx(1.0, rel=1e-12)
    assert rows["low"]["base_value"] == f"{path} 256, mambalaya 1024"


def test_sensitivity_cli_writes_tornado_and_csv(tmp_path) -> None:
    r = runner.invoke(app, ["sensitivity", "--model", "mamba-130m", "--seq-lens", "512", "--batch", "4",
                            "--published", "4.9", "--out", str(tmp_path), "--format", "csv"])
    assert r.exit_code == 0, r.output
    rows = pd.read_csv(tmp_path / "sensitivity.csv")
    assert {"assumption", "end", "value", "ours", "base", "reason"} <= set(rows.columns)
    for ext in ("png", "svg"):
        assert (tmp_path / f"tornado.{ext}").stat().st_size > 1000
    assert (tmp_path / "what_would_it_take.csv").exists()
    bad = runner.invoke(app, ["sensitivity", "--design", "mambalaya", "--baseline", "mambalaya"])
    assert bad.exit_code == 1 and "same design" in bad.stderr
    # --published with the CSV on stdout alone: accepted, and the CSV was the same without it
    lost = runner.invoke(app, ["sensitivity", "--model", "mamba-130m", "--seq-lens", "512", "--batch", "4",
                               "--published", "4.9", "--format", "csv"])
    assert lost.exit_code == 1 and "what_would_it_take.csv" in lost.stderr


def test_what_would_it_take_in_two_processes_matches_one() -> None:
    """With an executor, the searches run two at a time (one here, one in the executor's
    process); every row is the same as when one process runs them in turn."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spec = S.SensitivitySpec(name="t", designs=["mambalaya", "marca-ideal"], assumptions=[
        S.Assumption(key="compute.mfu_units", low=256, high=4096, reason="a test range of MFU counts"),
        S.Assumption(key="compute.one_d_lanes", low=256, high=4096, reason="a test range of 1D lanes"),
        S.Assumption(key="memory.onchip_bandwidth_bytes_per_cycle", low=1024, high=65536, reason="a test range"),
    ])
    model = "mamba-130m"
    run = S.RunSetup(models=(model,), configs={model: PRESETS[model]}, seq_lens=(512,), batch=4, phases=("prefill",))
    ratios = S.pair_ratio("mambalaya", "marca-ideal")
    label = S.pair_label(model, "prefill", "mambalaya", "marca-ideal")
    base = S.run_sensitivity(spec, run, ratios).base[label]
    published = {label: base * 1.3}
    alone = S.run_sensitivity(spec, run, ratios, published=published, far=0.0)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        prefetched = S.prefetch_settings(spec, run, pool)
        together = S.run_sensitivity(spec, run, ratios, published=published, far=0.0, prefetched=prefetched,
                                     executor=pool)
    assert alone.take and together.take == alone.take
    assert together.rows == alone.rows
    assert S._run_searches([1, 2, 3], lambda job, at: at(job), (lambda x: 10 * x, lambda x: 10 * x)) == [10, 20, 30]


def test_a_sensitivity_spec_that_cannot_move_its_ratio_is_refused_before_any_run(tmp_path) -> None:
    """Each once ended in a traceback after the base run, a flat tornado or an empty table: a factor
    on a single value, a kernels field on designs without a kernels section (the sensitivity
    command runs --design and --baseline, not the file's designs), inverted or equal ends, a
    spec whose assumptions the latency ratio never reads, one that applies to no assumption of
    the run, and reproduce with a spec that lacks a design its headline ratios compare."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.errors import SpecError
    from mambalaya.experiments.sensitivity import load_sensitivity_spec

    def spec(assumption: str, designs: str = "[mambalaya, marca-ideal]"):
        path = tmp_path / "s.yaml"
        path.write_text(f"name: s\ndesigns: {designs}\nassumptions:\n  - {assumption}\n", encoding="utf-8")
        return path

    for assumption, words in (
            ("{key: compute.mfu_units, low: 0.5, high: 2, factor: true, reason: r}", "a single value"),
            ("{key: compute.mfu_units, low: 4096, high: 256, reason: r}", "above high"),
            ("{key: compute.mfu_units, low: 512, high: 512, reason: r}", "no range"),
            ("{key: kernels.compute_fraction, low: 0.3, high: 0.7, reason: r}", "has no kernels section")):
        with pytest.raises(SpecError, match=words):
            load_sensitivity_spec(spec(assumption))
    run = CliRunner().invoke
    gpu = spec("{key: kernels.compute_fraction, low: 0.3, high: 0.7, reason: r}", "[gpu-h100]")
    r = run(app, ["sensitivity", "-m", "mamba-130m", "--seq-lens", "256", "-B", "1", "--spec", str(gpu)])
    assert r.exit_code == 1 and "mambalaya has no kernels section" in r.output
    power = spec("{key: power_budget_w, low: 50, high: 700, reason: r}")
    r = run(app, ["sensitivity", "-m", "mamba-130m", "--seq-lens", "256", "-B", "1", "--spec", str(power)])
    assert r.exit_code == 1 and "not moved" in r.output and "moves a latency" in r.output
    scan = spec("{key: scan, low: chunked, high: recurrent, reason: r}")
    r = run(app, ["sensitivity", "-m", "mamba-130m", "--seq-lens", "256", "-B", "1", "--spec", str(scan)])
    assert r.exit_code == 1 and "applies to mamba-130m prefill" in r.output
    two = spec("{key: compute.mfu_units, low: 256, high: 4096, reason: r}")
    r = run(app, ["reproduce", "--models", "mamba-130m", "--seq-lens", "256", "-B", "1", "--sensitivity", str(two),
                  "--out", str(tmp_path / "r")])
    assert r.exit_code == 1 and "lack geens-ideal" in r.output


def test_a_specs_designs_and_policy_files_are_read_beside_it(tmp_path, monkeypatch) -> None:
    """A sensitivity spec's design files and a precision end given as a file are its neighbours,
    whichever folder the command runs in (one spec gave two tornadoes from two folders)."""
    import yaml
    from importlib import resources

    shipped = resources.files("mambalaya").joinpath("arch/specs/mambalaya.yaml").read_text(encoding="utf-8")
    (tmp_path / "mine.yaml").write_text(shipped, encoding="utf-8")
    (tmp_path / "pol.yaml").write_text(yaml.safe_dump({"name": "pol", "default": 32, "sources": {"default": "test"}}))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "t", "designs": ["mine.yaml", "marca-ideal"],
        "assumptions": [{"key": "precision", "low": "uniform", "high": "pol.yaml", "reason": "test"}]}))
    monkeypatch.chdir(tmp_path.parent)
    spec = S.load_sensitivity_spec(tmp_path / "spec.yaml")
    assert spec.designs[0] == str(tmp_path / "mine.yaml") and spec.designs[1] == "marca-ideal"
    assert spec.assumptions[0].high == str(tmp_path / "pol.yaml") and spec.assumptions[0].low == "uniform"


def test_an_assumption_no_evaluation_reads_is_refused(tmp_path) -> None:
    """A sensitivity row for a field no evaluation reads drew a zero-width bar, read as "no
    sensitivity"; --set refused the same field."""
    import yaml

    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "t", "designs": ["mambalaya", "marca-ideal"],
        "assumptions": [{"key": "memory.pe_local_bytes_per_cycle", "low": 12, "high": 48, "reason": "test"}]}))
    with pytest.raises(SpecError, match="pe_local_bytes_per_cycle") as info:
        S.load_sensitivity_spec(tmp_path / "spec.yaml")
    assert "same numbers" in str(info.value) and "spec.yaml" in str(info.value)


def test_one_design_file_named_two_ways_is_refused(tmp_path) -> None:
    """``mine.yaml`` and ``./mine.yaml`` are one design once read beside the spec: the spec's own
    rule (each design once) holds on the paths it names (it ran the design twice)."""
    import yaml
    from importlib import resources

    shipped = resources.files("mambalaya").joinpath("arch/specs/mambalaya.yaml").read_text(encoding="utf-8")
    (tmp_path / "mine.yaml").write_text(shipped, encoding="utf-8")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "t", "designs": ["mine.yaml", "./mine.yaml", "marca-ideal"],
        "assumptions": [{"key": "batch", "low": 1, "high": 8, "reason": "test"}]}))
    with pytest.raises(SpecError, match="twice") as info:
        S.load_sensitivity_spec(tmp_path / "spec.yaml")
    assert "spec.yaml" in str(info.value) and "designs" in str(info.value)
