"""The command line: outputs, formats and one-paragraph errors."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from mambalaya.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_show_json_has_the_documented_fields() -> None:
    r = invoke("cascade", "show", "--model", "mamba-2.8b", "--phase", "prefill", "--seq-len", "2048", "--batch", "64", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    e = doc["einsums"][3]
    for key in ("name", "expression", "kind", "output", "output_ranks", "iteration_ranks", "inputs", "ops", "read_bytes", "write_bytes"):
        assert key in e
    assert e["name"] == "XI" and e["kind"] == "gemm" and e["inputs"][1] == {"tensor": "WX", "indices": ["d", "e"]}
    B, L, D, E = 64, 2048, 2560, 5120
    assert e["ops"] == {"mac": B * L * D * E}
    assert e["write_bytes"] == B * L * E * 2
    assert doc["totals"]["parameters"] == 41_244_160
    assert doc["totals"]["macs"] == sum(x["ops"].get("mac", 0) for x in doc["einsums"])
    assert doc["provenance"]["config"]["d_model"] == 2560


def test_show_csv_and_table() -> None:
    r = invoke("cascade", "show", "-m", "mamba-130m", "--phase", "decode", "--batch", "2", "-f", "csv")
    assert r.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert rows[-1]["einsum"] == "total" and rows[0]["einsum"] == "SS"
    assert {row["einsum"] for row in rows} >= {"H", "CSN", "XO"}
    r = invoke("cascade", "show", "-m", "mamba-130m", "-L", "64")
    assert r.exit_code == 0 and "XC[b,i,e] = XI[b,i+k-3,e]*WC[e,k] + BC[e]" in r.stdout
    assert "d_model=768" in r.stdout


def test_custom_model_file(tmp_path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("d_model: 64\nn_layers: 3\nd_state: 8\n")
    r = invoke("cascade", "show", "-m", str(cfg), "-L", "16", "-f", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["tensors"]["A"]["shape"] == [128, 8] and doc["totals"]["n_layers"] == 3
    cfg.write_text("d_model: -4\n")
    r = invoke("cascade", "show", "-m", str(cfg))
    assert r.exit_code == 1 and "d_model" in r.stderr and "Traceback" not in r.output


def test_dump_then_check_round_trips(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    assert invoke("cascade", "dump", "-m", "mamba-130m", "-L", "8", "-o", str(path)).exit_code == 0
    r = invoke("cascade", "check", str(path), "-f", "json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["einsums"]) == 21


def test_unrolled_dump_checks_and_draws(tmp_path) -> None:
    path = tmp_path / "u.yaml"
    r = invoke("cascade", "dump", "-m", "mamba-130m", "-L", "4", "--state-io", "--unroll", "-o", str(path))
    assert r.exit_code == 0, r.output
    r = invoke("cascade", "check", str(path), "-f", "json")
    assert r.exit_code == 0, r.output
    names = [e["name"] for e in json.loads(r.stdout)["einsums"]]
    assert [n for n in names if n.startswith("H_")] == ["H_0", "H_1", "H_2", "H_3"] and "H" not in names
    r = invoke("cascade", "show", "-m", "mamba2-130m", "-L", "512", "--unroll", "-f", "csv")
    assert r.exit_code == 0, r.output
    assert "HC_0" in r.stdout and "ACS_255" in r.stdout and "HC_1" not in r.stdout  # 2 chunks of 256
    assert invoke("cascade", "diagram", "-L", "3", "--unroll", "-o", str(tmp_path / "u.svg")).exit_code == 0
    # a form that cannot be unrolled is one clear error
    r = invoke("cascade", "show", "-m", "mamba2-130m", "-L", "256", "--state-io", "--unroll")
    assert r.exit_code == 1 and "initial value" in r.stderr and "Traceback" not in r.output


def test_check_reports_errors_with_location(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "ranks: {I: 4, D: 2}\ntensors:\n  X: {ranks: [I, D], role: input}\n  Y: {ranks: [I], role: output}\n"
        "einsums:\n  - Y[i] = X[i*i,d]\n"
    )
    r = invoke("cascade", "check", str(path))
    assert r.exit_code == 1
    assert f"{path}, line 6, column 14: non-affine index" in r.stderr
    assert "Traceback" not in r.output
    r = invoke("cascade", "check", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 1 and "cannot read" in r.stderr


def test_unknown_model_is_one_paragraph() -> None:
    r = invoke("cascade", "show", "--model", "mamba-9b")
    assert r.exit_code == 1
    assert "unknown model 'mamba-9b'" in r.stderr and "mamba-130m" in r.stderr


def test_models_lists_presets() -> None:
    r = invoke("models", "-f", "json")
    rows = {row["model"]: row for row in json.loads(r.stdout)}
    assert rows["mamba-2.8b"]["parameters"] == 2_768_345_600


def test_every_model_command_takes_mamba2_presets(tmp_path) -> None:
    for args in (
        ["cascade", "show", "-m", "mamba2-130m", "-L", "512"],
        ["cascade", "show", "-m", "mamba2-130m", "--phase", "decode", "-f", "json"],
        ["cascade", "show", "-m", "mamba2-130m", "-L", "512", "--scan", "recurrent", "-f", "csv"],
        ["cascade", "dump", "-m", "mamba2-130m", "-L", "512", "-o", str(tmp_path / "m2.yaml")],
        ["cascade", "diagram", "-m", "mamba2-130m", "-L", "512", "--classes", "-o", str(tmp_path / "m2.svg")],
        ["fusion", "classes", "-m", "mamba2-130m", "-L", "512", "-f", "json"],
        ["fusion", "map", "-m", "mamba2-130m", "-L", "512", "--mapping", "ssm-ri", "-f", "json"],
        ["evaluate", "-m", "mamba2-130m", "-L", "512", "-B", "4", "-f", "json"],
        ["compare", "-m", "mamba2-130m", "--seq-lens", "512", "-B", "4", "-f", "json"],
    ):
        r = invoke(*args)
        assert r.exit_code == 0, (args, r.output)
    r = invoke("cascade", "check", str(tmp_path / "m2.yaml"))
    assert r.exit_code == 0, r.output
    r = invoke("cascade", "show", "-m", "mamba2-130m", "--phase", "decode", "--scan", "chunked")
    assert r.exit_code == 1 and "recurrent" in r.stderr


def test_a_model_file_with_bad_yaml_is_one_located_message(tmp_path) -> None:
    """Model config files go through the same YAML reader as every spec: a syntax error, an
    escape beyond Unicode (PyYAML's OverflowError) and a bad date (its ValueError) each end in
    one message naming the file, not a traceback."""
    cases = {"syntax.yaml": ("d_model: [1\n", "line 2"),
             "escape.yaml": ('d_model: 64\nnote: "\\Ue0010000"\n', "line 2, column 8: not valid YAML: an escape"),
             "date.yaml": ("d_model: 2001-13-01\n", "not valid YAML: month must be in 1..12")}
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        r = runner.invoke(app, ["cascade", "show", "--model", str(path)])
        assert r.exit_code == 1, (name, r.output)
        assert str(path) in r.stderr and expected in r.stderr, (name, r.stderr)
        assert "Traceback" not in r.output + r.stderr


def test_no_file_read_blocks_or_runs_without_end(tmp_path) -> None:
    """A device, a FIFO or an oversized file given as a model config, an architecture, a mapping
    or a cascade file is one error naming it, before anything is read (``--model /dev/urandom``
    used to run until killed)."""
    import os

    from mambalaya.specio import MAX_SPEC_BYTES

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_SPEC_BYTES + 1)
    cases = [
        (["evaluate", "--model", "/dev/urandom"], "/dev/urandom: cannot read model config: it is a device"),
        (["evaluate", "--model", str(fifo)], "cannot read model config: it is a FIFO"),
        (["evaluate", "--arch", str(fifo)], "cannot read architecture file: it is a FIFO"),
        (["evaluate", "--arch", str(big)], f"cannot read architecture file: it is {MAX_SPEC_BYTES + 1:,} bytes, over"),
        (["fusion", "map", "--model", "mamba-130m", "--mapping", str(fifo)], "cannot read mapping file: it is a FIFO"),
        (["cascade", "check", str(tmp_path)], "cannot read cascade file: it is a directory"),
    ]
    for args, needle in cases:
        out = invoke(*args)
        assert out.exit_code == 1, (args, out.output)
        assert needle in out.output.replace("\n", " "), (args, out.output)


def test_rates_and_latencies_keep_their_significant_digits() -> None:
    """A slow rate or a short latency prints with significant digits, never rounded away to 0
    (an attention decode step at a long context used to print "1 tokens/s" or "0 tokens/s")."""
    from mambalaya.formatting import milliseconds, rate

    assert rate(1.4567) == "1.46" and rate(0.000412345) == "0.000412" and rate(123456.7) == "123,457"
    assert rate(0) == "0" and rate(999.94) == "1,000" and rate(12.345) == "12.3" and rate(0.5) == "0.500"
    assert milliseconds(1e-8) == "1e-05" and milliseconds(2.5e-5) == "0.025" and milliseconds(0.0995e-3) == "0.0995"
    assert milliseconds(1.23456) == "1234.5600" and milliseconds(0) == "0.0000"
    out = invoke("evaluate", "--arch", "mambalaya", "--model", "bamba-9b", "--phase", "decode", "-L", "100000000",
                 "-B", "1", "--set", "memory.offchip_capacity_bytes=2TB")  # its KV cache at 10^8 positions: 1.25 TB
    assert out.exit_code == 0, out.output
    assert "1.46 tokens/s" in out.output
    assert "energy: model " in out.output and "uJ/token" in out.output and "average power" in out.output


def test_a_state_spaces_mamba1_config_json_is_read_as_mamba_ssm_reads_it(tmp_path) -> None:
    """state-spaces/mamba-130m's config.json gives the preset's cascade (it used to be taken for
    mambalaya's own fields and refused), and a field it cannot honour is refused by name."""
    from mambalaya.workloads import PRESETS, load_model_config

    published = {"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": True,
                 "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(published))
    config = load_model_config(path)
    assert config.dt_rank_value == PRESETS["mamba-130m"].dt_rank_value == 48  # "auto" read as ceil(768/16)
    assert config.model_copy(update={"dt_rank": "auto"}) == PRESETS["mamba-130m"]
    path.write_text(json.dumps({**published, "rms_norm": False}))
    out = invoke("cascade", "show", "--model", str(path))
    assert out.exit_code == 1 and "field rms_norm is False" in out.output


def test_set_changes_a_field_of_the_design_on_every_arch_command(tmp_path) -> None:
    """--set FIELD=VALUE (repeatable, the sweep's dotted names and units) on evaluate, compare,
    arch show and the AccelForge export; the printed source says where the value came from."""
    out = runner.invoke(app, ["evaluate", "--arch", "geens-ideal", "--model", "mamba2-1.3b", "-B", "8",
                              "--set", "memory.onchip_buffer_bytes=16MiB", "--set", "compute.mfu_units=512"])
    assert out.exit_code == 0, out.output
    assert "buffer 16,777,216 B" in out.output
    shown = runner.invoke(app, ["arch", "show", "mambalaya", "--set", "compute.dataflows=[weight-stationary]", "--format", "csv"])
    row = next(line for line in shown.output.splitlines() if line.startswith("compute.dataflows,"))
    assert "weight-stationary," in row and "set on the command line (--set compute.dataflows=" in row
    both = runner.invoke(app, ["compare", "--archs", "mambalaya,marca-ideal", "--model", "mamba-130m", "--seq-lens", "256",
                               "-B", "1", "--set", "clock_hz=1 GHz", "--format", "json"])
    assert both.exit_code == 0, both.output
    plain = runner.invoke(app, ["compare", "--archs", "mambalaya,marca-ideal", "--model", "mamba-130m", "--seq-lens", "256",
                                "-B", "1", "--format", "json"])
    slow, fast = (json.loads(r.output) for r in (both, plain))
    assert all(s["layer_latency_s"] > f["layer_latency_s"] for s, f in zip(slow, fast))  # every design at 1 GHz
    exported = runner.invoke(app, ["export", "accelforge", "--model", "mamba-130m", "--phase", "decode", "-o", str(tmp_path),
                                   "--set", "compute.array_rows=128"])
    assert exported.exit_code == 0, exported.output
    assert "throughput: 5.7344e+13" in (tmp_path / "arch.yaml").read_text()  # 128 x 256 MACs at 1.75 GHz


@pytest.mark.parametrize("setting, needle", [
    ("memory.onchip_buffer=16MiB", "--set: architecture field 'memory.onchip_buffer' does not exist (fields here: "),
    ("kernels.compute_fraction=0.5", "has no 'kernels' section"),
    ("memory.onchip_buffer_bytes", "expected FIELD=VALUE"),
    ("memory.onchip_buffer_bytes=-3", "memory.onchip_buffer_bytes: must be > 0 (got -3)"),
])
def test_a_bad_set_is_one_error_naming_the_field(setting, needle) -> None:
    out = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--set", setting])
    assert out.exit_code == 1 and needle in out.output, out.output
    assert "Traceback" not in out.output


def test_a_buffer_too_small_names_options_that_exist() -> None:
    out = runner.invoke(app, ["evaluate", "--arch", "geens-ideal", "--model", "mamba-130m", "--set", "memory.onchip_buffer_bytes=64"])
    assert out.exit_code == 1
    assert "--set memory.onchip_buffer_bytes=" in out.output


def test_set_reads_numbers_yaml_reads_as_text_and_adds_table_entries() -> None:
    from mambalaya.arch import load_arch, parse_setting, with_settings

    assert parse_setting("kernels.min_kernel_s=2e-6") == ("kernels.min_kernel_s", 2e-6)
    assert parse_setting("name=my-design") == ("name", "my-design")
    spec = with_settings(load_arch("gpu-h100"), ["kernels.min_kernel_s=2e-6", "compute.unary_cost_cycles.exp=3"])
    assert spec.kernels.min_kernel_s == 2e-6 and spec.compute.unary_cost_cycles["exp"] == 3
    energy = with_settings(load_arch("mambalaya"), ["energy.mfu_pj.exp=1.0"])
    assert energy.energy.mfu_pj["exp"] == 1.0


def test_a_gpu_kernel_held_at_its_floor_reports_a_launch_bound() -> None:
    out = runner.invoke(app, ["evaluate", "--arch", "gpu-h100", "--model", "mamba-130m", "--phase", "decode", "-B", "1",
                              "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert {"launch"} <= {r["group_bound"] for r in rows}


def test_evaluate_reports_average_power_against_the_design_budget() -> None:
    """Average power is the layer's energy over its latency; the H100-like designs take the
    H100's 700 W, and a result above it is flagged (with the factor), in the table and the JSON."""
    out = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "-L", "2048", "-B", "64"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("average power"))
    doc = json.loads(runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "-L", "2048", "-B", "64",
                                         "--format", "json"]).output)
    t = doc["totals"]
    assert t["average_power_w"] == pytest.approx(t["layer_energy_j"] / t["latency_s"])
    assert t["power_budget_w"] == 700 and t["over_power_budget"] == (t["average_power_w"] > 700)
    assert ("OVER the 700 W budget" in line) == t["over_power_budget"]
    lifted = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "-L", "2048", "-B", "64",
                                 "--set", "power_budget_w=1e6"])
    assert "within the 1e+06 W budget" in lifted.output


def test_evaluate_says_when_the_buffer_bandwidth_is_unbounded() -> None:
    """A spec without a buffer organisation gets an unbounded buffer: evaluate says so, never silently."""
    args = ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "-L", "256", "-B", "2"]
    bounded = runner.invoke(app, args)
    unbounded = runner.invoke(app, args + ["--set", "memory.onchip_banks=null", "--set", "memory.onchip_bank_port_bytes=null"])
    assert bounded.exit_code == 0 and unbounded.exit_code == 0
    assert "bandwidth is unbounded" not in bounded.output
    assert "bandwidth is unbounded" in " ".join(unbounded.output.split())
