"""`mambalaya reproduce` on a reduced grid writes every table, figure and the report; plus the
evaluate and compare commands."""

from __future__ import annotations

import json
from importlib import resources

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from mambalaya.cli import app

runner = CliRunner()

PER_MODEL = [
    "roofline",
    "utilisation_prefill_marca-ideal",
    "utilisation_prefill_mambalaya",
    "utilisation_generation_marca-ideal",
    "utilisation_generation_mambalaya",
    "speedup_vs_seq_len",
    "traffic_by_tensor",
    "latency_breakdown",
    "cascade",
]
MODELS = ("mamba-130m", "mamba2-130m")
FIGURES = ["end_to_end"] + [f"{name}_{m}" for m in MODELS for name in PER_MODEL]


#: The assumptions of the shipped sensitivity spec the reduced reproduction varies: the precision
#: policy (its setting reads the comparison pass's tables) and the scan form, one an architecture
#: field (the whole spec is tests/test_sensitivity.py's; three more here cost 6 s of the suite's CPU).
SENSITIVITY_KEYS = {"precision", "compute.mfu_units", "scan"}


def reduced_sensitivity_spec(tmp_path) -> str:
    shipped = resources.files("mambalaya") / "data" / "sensitivity" / "h100-like.yaml"
    spec = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    spec["assumptions"] = [a for a in spec["assumptions"] if a["key"] in SENSITIVITY_KEYS]
    path = tmp_path / "sensitivity.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_reproduce_reduced_grid(tmp_path) -> None:
    out = tmp_path / "results"
    r = runner.invoke(app, ["reproduce", "--out", str(out), "--models", ",".join(MODELS), "--seq-lens", "2048,8192", "--batch", "8",
                            "--sensitivity", reduced_sensitivity_spec(tmp_path), "--sensitivity-seq-lens", "2048"])
    assert r.exit_code == 0, r.output
    report = (out / "report.md").read_text()
    for name in FIGURES:
        for ext in ("png", "svg"):
            path = out / "figures" / f"{name}.{ext}"
            assert path.exists() and path.stat().st_size > 1000, path
        assert f"figures/{name}.png" in report
    # report.html: the same report with every figure inline (tests/test_report_html.py checks the page)
    page = (out / "report.html").read_text()
    assert page.count("<svg") == len(list((out / "figures").glob("*.svg")))
    assert all(f'id="fig-{name}"' in page for name in FIGURES) and "No parameter was tuned" in page
    for table in ("latency", "speedups", "end_to_end", "einsums", "traffic_by_tensor", "timeline", "roofline",
                  "fusion_classes", "architectures", "geens_claims", "scan_forms", "headlines", "precision",
                  "latency_uniform", "sensitivity", "what_would_it_take", "energy", "residency", "validation", "multicore"):
        assert (out / f"{table}.csv").exists(), table
    # MARCA on 32 cores beside one array: the chip moves each tensor once, within 1% of one array's bytes
    multicore = pd.read_csv(out / "multicore.csv")
    assert set(multicore.mapping) == {"unfused", "ssm-ri"} and set(multicore.cores) == {32}
    traffic = multicore.multicore_chip_layer_offchip_bytes / multicore.one_array_layer_offchip_bytes
    assert traffic.between(0.99, 1.01).all(), traffic.tolist()
    assert "**MARCA on 32 cores**" in report
    # the report opens with the headline table (ours, published, gap, why), every claim of every model
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Headline ratios: ours beside the published ones"
    head = report.split("## Setup")[0]
    assert "| model | claim | published |" in head and "| why |" in head
    assert head.count("speedup over MARCA") == 3 * len(MODELS)  # prefill, generation and end to end, per model
    # the published GPU kernels and the units each design runs
    assert "## Published GPU kernel timings against the model" in report
    assert "## Which unit and which dataflow runs each Einsum" in report
    # energy of the three designs, prefill and generation, by action; MARCA's gain over itself is 1
    en = pd.read_csv(out / "energy.csv")
    assert {"mambalaya", "marca-ideal", "geens-ideal"} <= set(en.design) and set(en.phase) == {"prefill", "generation"}
    parts = en[["dram_j", "buffer_j", "register_j", "mac_j", "elementwise_j", "mfu_j", "leakage_j"]].sum(axis=1)
    assert ((parts - en.layer_energy_j).abs() <= 1e-9 * en.layer_energy_j).all()
    assert (en[en.design == "marca-ideal"].energy_gain_vs_marca == 1.0).all()
    assert "## Energy and power of the designs" in report and "### Area per design" in report
    ea = pd.read_csv(out / "geens_equal_area.csv")  # Geens et al.'s equal-area setup: every split at each length
    assert set(ea.seq_len) == {64, 1024} and len(ea) == 2 * 2 * 19 and ea.ms_per_token.notna().all()
    marca = ea[ea.memory_share == 0.8]
    assert (marca.array == "64x128").all() and (marca.speedup_over_marca_point == 1.0).all()
    assert "over MARCA at equal area" in report and "not modelled" not in report.split("## Geens")[1][:4000]
    # residency never adds weight bytes; the spatial utilisation of the timelines is a fraction
    res = pd.read_csv(out / "residency.csv")
    assert (res.weight_read_bytes <= res.weight_read_bytes_streamed).all()
    tl = pd.read_csv(out / "timeline.csv")
    assert tl.spatial_util.between(0, 1).all()
    ein = pd.read_csv(out / "einsums.csv")
    assert {"spatial_mapping", "spatial_util", "group_bound", "buffer_read_write_bytes"} <= set(ein.columns)
    # both precision policies, the main one with a source
    heads = pd.read_csv(out / "headlines.csv")
    assert set(heads.precision) == {"reference-kernels"} and set(heads.alt_precision) == {"uniform"}
    assert len(heads) == 5 * len(MODELS)
    prec = pd.read_csv(out / "precision.csv")
    h = prec[(prec.model == "mamba-130m") & (prec.tensor == "H")].iloc[0]
    assert h.bits == 32 and "selective_scan" in h.source
    assert "## Precision" in report and "reference-kernels" in report
    # the sensitivity study: a tornado per headline ratio, a row per assumption end
    sens = pd.read_csv(out / "sensitivity.csv")
    assert set(sens.key) == SENSITIVITY_KEYS
    for ratio in set(sens.ratio):
        stem = "tornado_" + "".join(ch if ch.isalnum() or ch == "." else "_" for ch in ratio)
        stem = "_".join(part for part in stem.split("_") if part)
        assert (out / "figures" / f"{stem}.png").exists(), stem
        assert f"figures/{stem}.png" in report
    assert "What would it take" in report
    # Geens et al.'s claim on its own workload: d_state 64, batch 1, 32-bit, at each of their L
    geens = pd.read_csv(out / "geens_claims.csv")
    assert set(geens.seq_len) == {1, 64, 512, 1024, 2048} and set(geens.bits) == {32}
    assert "Mamba1-2.7B" in report and "RobinGeens/PACT-AE" in report
    lat = pd.read_csv(out / "latency.csv")
    assert set(lat.arch) == {"mambalaya", "marca-ideal", "geens-ideal", "mambalaya-greedy"}
    assert set(lat.model) == set(MODELS)
    assert set(lat[lat.model == "mamba2-130m"].scan) <= {"chunked", "recurrent"}
    assert set(lat[lat.phase == "prefill"].seq_len) == {2048, 8192}
    sp = pd.read_csv(out / "speedups.csv")
    assert (sp.speedup > 0).all()
    # the report sets every published ratio beside ours, with a gap
    for published in ("4.9×", "1.9×", "1.5×", "3×", "1.3×", "4.8×", "1.78×"):
        assert published in report
    assert "No parameter was tuned" in report and "mamba-130m" in report
    assert "How the chunked (SSD) form changes the fusion picture" in report
    mappings = json.loads((out / "mappings.json").read_text())
    assert any(k.endswith("/prefill/mambalaya") for k in mappings)
    # energy.csv's energy-objective rows are traceable: their scan form and their mappings
    assert {"chunked", "recurrent"} >= set(en.scan) and any(k.endswith("/mambalaya (energy objective)") for k in mappings)


def test_evaluate_json_totals() -> None:
    r = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-1.4b", "--phase", "prefill",
                            "--seq-len", "2048", "--batch", "64", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    for key in ("latency_s", "offchip_bytes", "compute_util", "mem_util"):
        assert key in doc["totals"]
    assert doc["arch"]["name"] == "mambalaya" and doc["mapping"]["name"] == "optimal"
    assert abs(sum(e["final_latency"] for e in doc["einsums"]) - doc["totals"]["latency_s"]) < 1e-9


def test_compare_speedups_against_baseline() -> None:
    r = runner.invoke(app, ["compare", "--archs", "mambalaya,marca-ideal,geens-ideal", "--model", "mamba-370m",
                            "--phase", "prefill", "--seq-lens", "2048,16384", "--baseline", "marca-ideal", "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert len(rows) == 6
    for row in rows:
        if row["arch"] == "marca-ideal":
            assert row["speedup_vs_marca-ideal"] == 1.0
        else:
            assert row["speedup_vs_marca-ideal"] > 1.0


def test_compare_reads_what_evaluate_reads_at_every_length() -> None:
    """compare's rows: the speedup of the model's latency (as a hybrid model's); a decode row per
    context length (a Mamba step does not depend on it, but the memory check of a KV cache does:
    the olmo-hybrid preset passed or failed by the order of --seq-lens); energy and power where a
    design has them, so a power budget moves what it prints (it was accepted and dropped); and a
    note where a Mamba-2 prefill runs the only form that maps."""
    r = runner.invoke(app, ["compare", "--archs", "mambalaya,gpu-h100", "--model", "mamba-130m", "--phase", "decode",
                            "--seq-lens", "1,4096", "-B", "1", "--baseline", "gpu-h100", "--set", "power_budget_w=1",
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert sorted((row["seq_len"], row["arch"]) for row in rows) == [(1, "gpu-h100"), (1, "mambalaya"), (4096, "gpu-h100"),
                                                               (4096, "mambalaya")]
    base = {row["seq_len"]: row["model_latency_s"] for row in rows if row["arch"] == "gpu-h100"}
    for row in rows:
        assert row["speedup_vs_gpu-h100"] == base[row["seq_len"]] / row["model_latency_s"]
        assert set(row) == set(rows[0])  # one set of columns, empty where a design lacks energy
        if row["arch"] == "mambalaya":
            assert row["power_budget_w"] == 1 and row["over_power_budget"] is True
            # the model held to the budget, beside the model's latency (it once was the layer's:
            # ten times below the unthrottled model on mamba-130m): 24 layers each held
            assert row["throttled_model_latency_s"] > row["model_latency_s"]
            layer = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "--phase", "decode",
                                        "-L", str(row["seq_len"]), "-B", "1", "--set", "power_budget_w=1",
                                        "--format", "json"])
            held = json.loads(layer.stdout)["totals"]
            assert row["throttled_model_latency_s"] == pytest.approx(24 * held["throttled_latency_s"], rel=1e-12)
            assert held["throttled_model_latency_s"] == row["throttled_model_latency_s"]
        else:
            assert row["model_energy_j"] is None
    for order in ("2048,1000000", "1000000,2048"):  # its KV cache at 10^6 positions is over 80 GB either way
        r = runner.invoke(app, ["compare", "--model", "olmo-hybrid", "--phase", "decode", "--seq-lens", order, "-B", "1"])
        assert r.exit_code == 1 and "does not fit" in r.stderr
    r = runner.invoke(app, ["compare", "--model", "mamba2-130m", "--seq-lens", "1000", "-B", "1"])
    assert r.exit_code == 0 and "run the recurrent scan, the only form that runs there" in r.output


def test_bad_arch_and_inputs_are_one_paragraph(tmp_path) -> None:
    r = runner.invoke(app, ["evaluate", "--arch", "tpu-v9"])
    assert r.exit_code == 1 and "tpu-v9" in r.stderr and "mambalaya" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nclock_hz: -1\n")
    r = runner.invoke(app, ["arch", "show", str(bad)])
    assert r.exit_code == 1 and "clock_hz" in r.stderr and "Traceback" not in r.output
    r = runner.invoke(app, ["compare", "--seq-lens", "2048,abc"])
    assert r.exit_code == 1 and "--seq-lens" in r.stderr
    r = runner.invoke(app, ["reproduce", "--models", "mamba-9b", "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "mamba-9b" in r.stderr


def test_arch_show_table() -> None:
    r = runner.invoke(app, ["arch", "show", "marca-original", "-f", "csv"])
    assert r.exit_code == 0, r.output
    assert "memory.offchip_bandwidth_bytes_per_s" in r.stdout and "256" in r.stdout


def test_reproduce_refuses_study_lengths_it_would_replace_or_ignore(tmp_path) -> None:
    """--sensitivity-seq-lens outside --seq-lens was replaced by the grid's first length, and
    beside --sensitivity none it was ignored; both without a word."""
    r = runner.invoke(app, ["reproduce", "--models", "mamba-130m", "--seq-lens", "2048", "--no-figures",
                            "--sensitivity-seq-lens", "4096", "--out", str(tmp_path / "a")])
    assert r.exit_code == 1 and "--sensitivity-seq-lens 4096: not in --seq-lens (2048)" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["reproduce", "--models", "mamba-130m", "--seq-lens", "2048", "--no-figures",
                            "--sensitivity", "none", "--sensitivity-seq-lens", "2048", "--out", str(tmp_path / "b")])
    assert r.exit_code == 1 and "--sensitivity none does not run" in " ".join(r.stderr.split())


@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_a_reproduce_report_names_the_models_policy_and_files_of_its_run(tmp_path) -> None:
    """The Setup called any --models the paper's 48- and 64-layer models, the architecture table
    showed each design's own policy under --precision uniform, and the headline section pointed to
    the sensitivity files a --sensitivity none run does not write."""
    out = tmp_path / "r"
    r = runner.invoke(app, ["reproduce", "--models", "mamba-130m", "--seq-lens", "2048", "--batch", "4", "--no-figures",
                            "--sensitivity", "none", "--precision", "uniform", "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = (out / "report.md").read_text()
    assert "mamba-130m (24 layers) — chosen with --models; the paper's are mamba-1.4b and mamba2-2.7b" in report
    assert "| precision | uniform (--precision) |" in report
    assert "no sensitivity study in this run" in report and not (out / "sensitivity.csv").exists()
