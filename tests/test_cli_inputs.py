"""The command line's own readers: output paths that are the command's inputs, sizes and lists,
ratios, empty text, messages printed as given (no markup, no emoji), empty tables, sweep plot
axes, Parquet export of mixed columns, and one "wrote" line per file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.cli.common import rows_csv, rows_table, text_console
from mambalaya.cli.readers import MAX_SIZE, read_int_list, read_list, read_size
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.outputs import check_output_path, check_outputs_differ

runner = CliRunner()

MINE = "mine: not a spec\n"

TINY_MODEL = "d_model: 64\nn_layers: 2\nd_state: 8\n"

MIXED_SWEEP = """
name: mixed
grid:
  arch: [mambalaya, marca-ideal]
  memory.onchip_buffer_bytes: [32MiB, 16777216]
  model: [mamba-130m]
  phase: [decode]
  seq_len: [64]
  batch: [1]
"""


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _refused(result, *needles: str, exit_code: int = 1) -> str:
    """The one-line message of a refusal, checked for ``needles``."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    said = " ".join(result.stderr.replace("│", " ").split())
    for needle in needles:
        assert needle in said, said
    return said


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory) -> Path:
    """A store of a 4-point sweep whose grid spells its buffers as text (32MiB) and a number (16777216)."""
    folder = tmp_path_factory.mktemp("mixed")
    spec = folder / "mixed.yaml"
    spec.write_text(MIXED_SWEEP, encoding="utf-8")
    r = runner.invoke(app, ["sweep", str(spec), "--workers", "1"])
    assert r.exit_code == 0, r.output
    return folder / "mixed.sqlite"


# ------------------------------------------------------------------------------------------
# 1. An output that is one of the command's inputs is refused, naming both options
# ------------------------------------------------------------------------------------------

#: (command line with IN for the input and OUT for the output, input option, output option,
#: the input's name relative to the work folder, the output's). A folder output's input is a
#: file the command writes in it.
SAME_FILE = {
    "evaluate --model": (["evaluate", "-L", "16", "--model", "IN", "-o", "OUT"], "--model", "--output", "m.yaml", "m.yaml"),
    "evaluate --arch": (["evaluate", "-L", "16", "--arch", "IN", "-o", "OUT"], "--arch", "--output", "a.yaml", "a.yaml"),
    "evaluate --mapping": (["evaluate", "-L", "16", "--mapping", "IN", "-o", "OUT"], "--mapping", "--output", "p.yaml", "p.yaml"),
    "evaluate --routing": (["evaluate", "-L", "16", "--routing", "IN", "-o", "OUT"], "--routing", "--output", "r.yaml", "r.yaml"),
    "evaluate --precision": (["evaluate", "-L", "16", "--precision", "IN", "-o", "OUT"], "--precision", "--output", "q.yaml", "q.yaml"),
    "compare --archs": (["compare", "--seq-lens", "16", "--archs", "mambalaya,IN", "-o", "OUT"], "--archs", "--output", "a.yaml", "a.yaml"),
    "cascade show": (["cascade", "show", "-L", "16", "--model", "IN", "-o", "OUT"], "--model", "--output", "m.yaml", "m.yaml"),
    "cascade dump": (["cascade", "dump", "-L", "16", "--precision", "IN", "-o", "OUT"], "--precision", "--output", "q.yaml", "q.yaml"),
    "cascade check": (["cascade", "check", "IN", "-o", "OUT"], "PATH", "--output", "c.yaml", "c.yaml"),
    "cascade diagram": (["cascade", "diagram", "--cascade", "IN", "-o", "OUT"], "--cascade", "--output", "c.svg", "c.svg"),
    "fusion classes": (["fusion", "classes", "-L", "16", "--model", "IN", "-o", "OUT"], "--model", "--output", "m.yaml", "m.yaml"),
    "fusion map --save": (["fusion", "map", "-L", "16", "--mapping", "IN", "--save", "OUT"], "--mapping", "--save", "p.yaml", "p.yaml"),
    "fusion map -o": (["fusion", "map", "-L", "16", "--model", "IN", "-o", "OUT"], "--model", "--output", "m.yaml", "m.yaml"),
    "fusion pareto": (["fusion", "pareto", "-L", "16", "--model", "IN", "-o", "OUT"], "--model", "--output", "m.yaml", "m.yaml"),
    "arch show": (["arch", "show", "IN", "-o", "OUT"], "NAME", "--output", "a.yaml", "a.yaml"),
    "sweep export": (["sweep", "export", "IN", "-f", "csv", "-o", "OUT"], "STORE", "--output", "s.sqlite", "s.sqlite"),
    "sweep run": (["sweep", "IN", "--store", "OUT"], "SPEC", "--store", "s.yaml", "s.yaml"),
    "validate": (["validate", "--cases", "IN", "--out", "OUT"], "--cases", "--out", "out/validation.csv", "out"),
    "sensitivity": (["sensitivity", "--spec", "IN", "--out", "OUT"], "--spec", "--out", "out/sensitivity.csv", "out"),
    "reproduce": (["reproduce", "--sensitivity", "IN", "--out", "OUT"], "--sensitivity", "--out", "out/report.md", "out"),
    "reproduce hybrid": (["reproduce", "--suite", "hybrid", "--precision", "IN", "--out", "OUT"], "--precision", "--out",
                         "out/hybrid/bamba.csv", "out"),
    "export accelforge": (["export", "accelforge", "--arch", "IN", "-o", "OUT"], "--arch", "--output", "out/arch.yaml", "out"),
    "sweep plot": (["sweep", "plot", "IN", "-o", "OUT"], "STORE", "--output", "out/pareto.png", "out"),
}



def _same_file_case(case: str, tmp_path: Path, monkeypatch) -> tuple[list[str], str, str, Path]:
    args, input_option, output_option, input_name, output_name = SAME_FILE[case]
    monkeypatch.chdir(tmp_path)
    source = tmp_path / input_name
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(MINE, encoding="utf-8")
    args = [a.replace("IN", input_name) if "IN" in a else output_name if a == "OUT" else a for a in args]
    return args, input_option, output_option, source


@pytest.mark.parametrize("case", list(SAME_FILE))
def test_an_output_that_is_an_input_is_refused_before_any_work(case, tmp_path, monkeypatch, work_started) -> None:
    args, input_option, output_option, source = _same_file_case(case, tmp_path, monkeypatch)
    start = time.perf_counter()
    result = invoke(*args)
    _refused(result, "error:", input_option, output_option, "an input of this command")
    assert time.perf_counter() - start < 5
    assert source.read_text(encoding="utf-8") == MINE, "the input was changed"
    assert work_started == []
    assert set(tmp_path.rglob("*")) == {source, *(p for p in source.parents if tmp_path in p.parents)}, "a file was written"


@pytest.mark.parametrize("spelling", ["./m.yaml", "sub/../m.yaml", "link.yaml", "hard.yaml"])
def test_another_spelling_or_a_link_of_the_input_is_the_input(spelling, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.yaml").write_text(TINY_MODEL, encoding="utf-8")
    Path("sub").mkdir()
    os.symlink("m.yaml", "link.yaml")
    os.link("m.yaml", "hard.yaml")
    result = invoke("cascade", "show", "-L", "16", "-m", "m.yaml", "-f", "csv", "-o", spelling)
    _refused(result, f"--output {Path(spelling)}", "--model m.yaml", "an input of this command")
    assert Path("m.yaml").read_text(encoding="utf-8") == TINY_MODEL


def test_evaluate_no_longer_overwrites_its_model_file(tmp_path) -> None:
    model = tmp_path / "self.yaml"
    model.write_text(TINY_MODEL, encoding="utf-8")
    result = invoke("evaluate", "--model", str(model), "-L", "64", "-B", "1", "--format", "csv", "-o", str(model))
    _refused(result, "--output", "--model")
    assert model.read_text(encoding="utf-8") == TINY_MODEL


def test_sweep_export_no_longer_replaces_its_store(mixed_store, tmp_path) -> None:
    store = tmp_path / "self.sqlite"
    store.write_bytes(mixed_store.read_bytes())
    before = store.read_bytes()
    result = invoke("sweep", "export", str(store), "--format", "csv", "-o", str(store))
    _refused(result, "--output", "STORE")
    assert store.read_bytes() == before
    assert invoke("sweep", "export", str(store), "-f", "csv").exit_code == 0


def test_a_preset_name_is_not_an_input_and_other_outputs_pass(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("cascade", "show", "-L", "16", "-m", "mamba-130m", "-f", "csv", "-o", "mamba-130m")
    assert result.exit_code == 0, result.output
    model = tmp_path / "m.yaml"
    model.write_text(TINY_MODEL, encoding="utf-8")
    result = invoke("cascade", "show", "-L", "16", "-m", str(model), "-f", "csv", "-o", "out.csv")
    assert result.exit_code == 0, result.output
    assert model.read_text(encoding="utf-8") == TINY_MODEL


def test_check_output_path_compares_files_not_names(tmp_path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("x\n")
    check_output_path(tmp_path / "b.yaml", kind="file", option="-o", inputs={"--model": a})
    check_output_path(a, kind="file", option="-o", inputs={"--model": "mamba-130m", "--arch": None, "--x": tmp_path})
    with pytest.raises(SpecError, match=r"-o .*a\.yaml: that is --archs .*a\.yaml"):
        check_output_path(a, kind="file", option="-o", inputs={"--archs": ["mambalaya", str(a)]})
    # a folder output: only the files the command writes in it count
    check_output_path(tmp_path, kind="directory", option="--out", inputs={"--spec": a}, writes=("b.yaml", "*.csv"))
    with pytest.raises(SpecError, match="writes a.yaml in it"):
        check_output_path(tmp_path, kind="directory", option="--out", inputs={"--spec": a}, writes=("*.yaml",))


def test_two_outputs_naming_one_file_are_refused(tmp_path) -> None:
    check_outputs_differ({"--save": tmp_path / "a.yaml", "--output": tmp_path / "b.txt", "-x": None})
    with pytest.raises(SpecError, match="--save and --output both name"):
        check_outputs_differ({"--save": tmp_path / "a.yaml", "--output": tmp_path / "a.yaml"})
    with pytest.raises(SpecError, match="name one file"):
        check_outputs_differ({"--save": tmp_path / "a.yaml", "--output": tmp_path / "sub" / ".." / "a.yaml"})


# ------------------------------------------------------------------------------------------
# 2. Messages, titles and progress print user text as given: no emoji codes, no markup
# ------------------------------------------------------------------------------------------


def test_an_emoji_code_in_a_file_name_prints_as_given(tmp_path) -> None:
    model = tmp_path / ":x:.yaml"
    model.write_text("d_model: 64\n", encoding="utf-8")
    said = _refused(invoke("cascade", "show", "-m", str(model)), ":x:.yaml")
    assert "❌" not in said


def test_an_emoji_code_in_a_set_field_prints_as_given() -> None:
    said = _refused(invoke("arch", "show", "mambalaya", "--set", ":x:=5"), "':x:'")
    assert "❌" not in said


def test_markup_in_a_path_prints_as_given(tmp_path) -> None:
    model = tmp_path / "[bold]tiny :x:.yaml"
    model.write_text(TINY_MODEL, encoding="utf-8")
    result = invoke("cascade", "show", "-L", "16", "-m", str(model))
    assert result.exit_code == 0, result.output
    assert "[bold]tiny :x:.yaml" in result.stdout and "❌" not in result.stdout
    out = tmp_path / "[red]out.txt"
    result = invoke("fusion", "classes", "-L", "16", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in " ".join(result.stderr.split()) and out.exists()


def test_a_sweep_name_with_codes_prints_as_given_in_its_progress(tmp_path) -> None:
    spec = tmp_path / "emoji.yaml"
    spec.write_text(MIXED_SWEEP.replace("name: mixed", 'name: ":x: [bold]mixed"'), encoding="utf-8")
    result = invoke("sweep", str(spec), "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "sweep :x: [bold]mixed" in result.stderr and "❌" not in result.stderr


def test_the_text_console_reads_no_markup_and_no_emoji() -> None:
    console = text_console(file=__import__("io").StringIO(), width=80)
    console.print(":x: [red]a[/red] \\[b]")
    assert console.file.getvalue() == ":x: [red]a[/red] \\[b]\n"


# ------------------------------------------------------------------------------------------
# 3. sweep plot: axes checked before any figure, no folder left by a refusal
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axes, needle", [
    (("memory.onchip_buffer_bytes", "memory.onchip_buffer_bytes"), "--x and --y both name"),
    (("nope", "memory.onchip_buffer_bytes"), "--x 'nope' is not an input field"),
    (("memory.onchip_buffer_bytes", "latency_s"), "--y 'latency_s' is not an input field"),
    (("arch", "memory.onchip_buffer_bytes"), "--x 'arch': the designs are what the speedup compares"),
])
def test_sweep_plot_refuses_bad_axes_and_writes_nothing(axes, needle, mixed_store, tmp_path) -> None:
    out = tmp_path / "plots"
    result = invoke("sweep", "plot", str(mixed_store), "-o", str(out), "--x", axes[0], "--y", axes[1])
    _refused(result, needle)
    assert not out.exists()


def test_a_failed_sweep_plot_leaves_no_folder(mixed_store, tmp_path) -> None:
    out = tmp_path / "deep" / "plots"
    result = invoke("sweep", "plot", str(mixed_store), "-o", str(out), "--x", "seq_len", "--y",
                    "memory.onchip_buffer_bytes", "--baseline", "gpu-h100")
    _refused(result, "gpu-h100")
    assert list(tmp_path.iterdir()) == []
    result = invoke("sweep", "plot", str(mixed_store), "-o", str(out), "--x", "seq_len", "--y",
                    "memory.onchip_buffer_bytes")
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"pareto.png", "pareto.svg", "speedup_heatmap.png", "speedup_heatmap.svg",
                                               "speedup_heatmap.csv"}


# ------------------------------------------------------------------------------------------
# 4. Parquet export of a column mixing numbers and text
# ------------------------------------------------------------------------------------------


def test_parquet_export_writes_a_mixed_column_as_text(mixed_store, tmp_path) -> None:
    out = tmp_path / "f.parquet"
    result = invoke("sweep", "export", str(mixed_store), "--format", "parquet", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "memory.onchip_buffer_bytes mixes numbers and text, written as text" in " ".join(result.stderr.split())
    df = pd.read_parquet(out)
    assert len(df) == 4
    assert sorted(df["memory.onchip_buffer_bytes"]) == ["16777216", "16777216", "32MiB", "32MiB"]
    assert df["latency_s"].dtype.kind == "f" and df["seq_len"].dtype.kind == "i"


# ------------------------------------------------------------------------------------------
# 5. An empty table prints
# ------------------------------------------------------------------------------------------


def test_no_rows_is_an_empty_csv_and_a_table_saying_so() -> None:
    assert rows_csv([]) == ""
    console = Console(file=__import__("io").StringIO(), width=80)
    console.print(rows_table([], "cases"))
    text = console.file.getvalue()
    assert "cases" in text and "(no rows)" in text


# ------------------------------------------------------------------------------------------
# 6. --published: a positive finite ratio, refused before any work
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "1e-400", "nan", "inf", "-1", "-inf", "1e400", "4,9", "4_9", " 4.9", "abc"])
def test_published_refuses_what_is_not_a_positive_finite_ratio(value, monkeypatch) -> None:
    from mambalaya.experiments import sensitivity

    def no_work(*args, **kwargs):
        raise AssertionError("the study ran")

    monkeypatch.setattr(sensitivity, "run_sensitivity", no_work)
    start = time.perf_counter()
    result = invoke("sensitivity", "--model", "mamba-130m", "--seq-lens", "64", f"--published={value}")
    _refused(result, "--published", exit_code=2)
    assert time.perf_counter() - start < 3


# ------------------------------------------------------------------------------------------
# 7. Sizes, lists and empty text: one reader each
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, option", [
    (["cascade", "show", "-L", "64.0"], "--seq-len"),
    (["cascade", "show", "-L", "1_000"], "--seq-len"),
    (["cascade", "show", "-L", " 64"], "--seq-len"),
    (["cascade", "show", "-L", "+64"], "--seq-len"),
    (["cascade", "show", "-L", "6\u0664"], "--seq-len"),
    (["cascade", "show", "-L", "0"], "--seq-len"),
    (["cascade", "show", "-B", "1.0"], "--batch"),
    (["cascade", "show", "--bits", "16.0"], "--bits"),
    (["evaluate", "-L", "64", "-B", "1e0"], "--batch"),
    (["export", "accelforge", "-o", "OUT", "--unroll-scan", "2.0"], "--unroll-scan"),
    (["cascade", "check", "none.yaml", "--n-layers", "2.0"], "--n-layers"),
    (["sweep", "none.yaml", "--workers", "1.0"], "--workers"),
    (["reproduce", "--out", "FILE", "--generated-tokens", "1.0"], "--generated-tokens"),
])
def test_every_size_option_takes_digits_only(args, option, tmp_path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    args = [str(tmp_path / "out") if a == "OUT" else str(a_file) if a == "FILE" else a for a in args]
    _refused(invoke(*args), option, exit_code=2)


def test_sizes_in_digits_still_read() -> None:
    result = invoke("cascade", "show", "-L", "064", "-B", "2", "--bits", "8", "-f", "json")
    assert result.exit_code == 0, result.output
    assert '"seq_len": 64' in result.stdout and '"batch": 2' in result.stdout and '"bits": 8' in result.stdout


@pytest.mark.parametrize("args, needle", [
    (["compare", "-m", "mamba-130m", "--seq-lens", "16", "--archs", "mambalaya,mambalaya"], "--archs gives mambalaya more than once"),
    (["compare", "-m", "mamba-130m", "--seq-lens", "16", "--archs", "mambalaya,,"], "has an empty entry"),
    (["compare", "-m", "mamba-130m", "--seq-lens", "16", "--archs", ","], "has an empty entry"),
    (["compare", "-m", "mamba-130m", "--seq-lens", "16,16.0"], "entry '16.0' must be a positive integer"),
    (["compare", "-m", "mamba-130m", "--seq-lens", "16,016"], "gives 16 more than once"),
    (["reproduce", "--out", "FILE", "--models", "mamba-130m,mamba-130m"], "--models gives mamba-130m more than once"),
    (["reproduce", "--out", "FILE", "--suite", "hybrid", "--models", "bamba-9b,"], "--models 'bamba-9b,' has an empty entry"),
    (["reproduce", "--out", "FILE", "--sensitivity-seq-lens", "64,,128"], "has an empty entry"),
])
def test_every_list_option_refuses_empty_entries_and_repeats(args, needle, tmp_path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _refused(invoke(*[str(a_file) if a == "FILE" else a for a in args]), needle)


@pytest.mark.parametrize("args, option", [
    (["fusion", "map", "-L", "16", "--buffer", ""], "--buffer"),
    (["cascade", "diagram", "-L", "16", "--mapping", "stitched", "--buffer", " "], "--buffer"),
    (["cascade", "show", "-L", "16", "--precision", ""], "--precision"),
    (["cascade", "show", "-L", "16", "--scan", ""], "--scan"),
    (["evaluate", "-L", "16", "--arch", ""], "--arch"),
    (["sweep", "plot", "s.sqlite", "--x", ""], "--x"),
])
def test_empty_text_is_not_the_default(args, option) -> None:
    _refused(invoke(*args), f"{option} is given as empty text")


def test_read_size_is_digits_from_one_to_the_bound() -> None:
    assert read_size("064", "-L") == 64 and read_size(7, "-L") == 7 and read_size(str(MAX_SIZE), "-L") == MAX_SIZE
    for bad in ("64.0", "1e3", "1_000", "+64", " 64", "64 ", "", "0", "-1", "\u0666\u0664", "9" * 5000,
                str(MAX_SIZE + 1), True, 64.0, None):
        with pytest.raises(MambalayaError, match="^-L must be"):
            read_size(bad, "-L")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_a_size_is_exactly_a_run_of_ascii_digits(text: str) -> None:
    valid = text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_SIZE
    try:
        value = read_size(text, "--seq-len")
    except MambalayaError as err:
        assert not valid and str(err).startswith("--seq-len must be") and "\n" not in str(err)
    else:
        assert valid and value == int(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "", " ", "a "]), min_size=1, max_size=6))
def test_a_list_has_no_empty_entry_and_no_repeat(entries: list[str]) -> None:
    text = ",".join(entries)
    stripped = [e.strip() for e in entries]
    try:
        got = read_list(text, "--archs")
    except MambalayaError as err:
        assert "" in stripped or len(set(stripped)) < len(stripped)
        assert str(err).startswith("--archs")
    else:
        assert got == stripped and "" not in got and len(set(got)) == len(got)


def test_read_int_list_reads_each_entry_as_a_size() -> None:
    assert read_int_list("2048, 16384", "--seq-lens") == [2048, 16384]
    for bad in ("64.0", "64,,128", "64,064", "1e3", "+64", ""):
        with pytest.raises(MambalayaError, match="^--seq-lens"):
            read_int_list(bad, "--seq-lens")


# ------------------------------------------------------------------------------------------
# 8. One "wrote" line per file written
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["fusion", "map", "-L", "16"],
    ["arch", "show", "mambalaya"],
    ["evaluate", "-m", "bamba-9b", "-L", "16", "-B", "1"],
])
def test_a_file_of_several_tables_is_written_once(args, tmp_path) -> None:
    out = tmp_path / "tables.txt"
    result = invoke(*args, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stderr.count("wrote ") == 1, result.stderr
    text = out.read_text(encoding="utf-8")
    assert text.count("┏") >= 2, "every table is in the file"


def test_a_functions_cost_on_the_pes_is_refused_where_it_is_never_asked() -> None:
    """compute.unary_cost_pe_ops is what a function costs on the elementwise units of a design
    without MFUs: on a design with MFUs (every shipped one but marca-original), or for a function
    whose cycle cost is 0, it was accepted and moved nothing. Refused, naming why; on
    marca-original (no MFUs) exp's entry is read and moves the prefill's latency."""
    import json

    from typer.testing import CliRunner

    from mambalaya.arch import load_arch, with_settings
    from mambalaya.cli import app
    from mambalaya.errors import SpecError
    from mambalaya.experiments.evaluate import check_settings_read

    run = CliRunner().invoke
    base = ["evaluate", "-m", "mamba-130m", "-B", "1", "-L", "64", "-f", "json"]
    r = run(app, [*base, "-a", "mambalaya", "--set", "compute.unary_cost_pe_ops.exp=5"])
    assert r.exit_code == 1 and "the design has MFUs" in r.output
    check_settings_read([load_arch("mambalaya")], ["compute.unary_cost_pe_ops.exp", "compute.mfu_units"])  # MFUs gone
    latency = {}
    for exp in (4, 400):
        r = run(app, ["evaluate", "-m", "mamba-130m", "-B", "8", "-L", "2048", "-f", "json", "-a", "marca-original",
                      "--mapping", "unfused", "--set", f"compute.unary_cost_pe_ops.exp={exp}"])  # compute-bound enough
        assert r.exit_code == 0, r.output
        latency[exp] = json.loads(r.stdout)["totals"]["latency_s"]
    assert latency[400] > latency[4]
    spec = with_settings(load_arch("marca-original"), ["compute.unary_cost_pe_ops.neg=3"])
    with pytest.raises(SpecError, match="unary_cost_cycles.neg is 0"):
        check_settings_read([spec], ["compute.unary_cost_pe_ops.neg"])
    check_settings_read([spec], ["compute.unary_cost_pe_ops.neg", "compute.unary_cost_cycles.neg"])
    # without MFUs a non-zero cycle cost only marks a function as one of pe_ops operations: exp at 2
    # cycles instead of 1 moved nothing there; refused, while 0 (one operation) and MFU designs read it
    r = run(app, [*base, "-a", "marca-original", "--set", "compute.unary_cost_cycles.exp=2"])
    assert r.exit_code == 1 and "marca-original has no MFUs" in " ".join(r.stderr.split())
    for design, value in (("marca-original", 0), ("mambalaya", 2)):
        assert run(app, [*base, "-a", design, "--set", f"compute.unary_cost_cycles.exp={value}"]).exit_code == 0
    assert run(app, ["compare", "--archs", "marca-original,mambalaya", "--baseline", "mambalaya", "-m", "mamba-130m",
                     "--seq-lens", "64", "-B", "1", "--set", "compute.unary_cost_cycles.exp=2"]).exit_code == 0


def test_an_mfus_energy_and_a_levels_capacity_are_refused_where_no_evaluation_asks_them() -> None:
    """An MFU's energy per result on a design without MFUs, and a staging level's capacity on a
    GPU spec (no energy or area section: the capacity sets neither; every off-chip byte is DRAM's),
    were accepted and moved no number; refused naming why, in --set and sweeps alike, and read
    where the design has what reads them (mambalaya's MFUs; an energy section)."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.errors import SpecError
    from mambalaya.experiments.sweep_spec import check_sweep_fields

    run = CliRunner().invoke
    base = ["evaluate", "-m", "mamba-130m", "-B", "1", "-L", "64"]
    for design, setting, words in (("marca-original", "energy.mfu_pj.exp=3", "has no MFUs"),
                                   ("gpu-h100", "memory.levels.l2.capacity_bytes=40MiB", "no energy or area section")):
        r = run(app, [*base, "-a", design, "--set", setting])
        assert r.exit_code == 1 and words in " ".join(r.stderr.split()), (design, r.output)
        with pytest.raises(SpecError, match=words):
            key, value = setting.split("=")
            check_sweep_fields({key: [value, value + "0" if key.startswith("energy") else "30MiB"]},
                               {"model": "mamba-130m", "arch": design})
    assert run(app, [*base, "-a", "mambalaya", "--set", "energy.mfu_pj.exp=3"]).exit_code == 0


def test_a_collective_field_is_refused_under_a_strategy_that_runs_no_such_collective() -> None:
    """Sequence parallelism hands states on over the links (no collective), expert parallelism's
    all-to-all has no in-network reduction, and --parallel places a multi-core chip's cores over
    cores.placement: each setting was accepted and moved nothing there. Refused, naming the
    strategies that read it; tensor parallelism reads both."""
    from typer.testing import CliRunner

    from mambalaya.cli import app

    run = CliRunner().invoke
    base = ["evaluate", "-a", "gpu-h100", "-m", "jamba-v0.1", "-L", "256", "-B", "4", "--devices", "2"]
    for strategy, setting in (("sequence", "system.collective_latency_s=1e-5"), ("sequence", "system.in_network_reduction=false"),
                              ("expert", "system.in_network_reduction=false")):
        r = run(app, [*base, "--parallel", strategy, "--set", setting])
        assert r.exit_code == 1 and f"--parallel {strategy} does not read it" in " ".join(r.stderr.split()), (strategy, setting)
    for setting in ("system.collective_latency_s=1e-5", "system.in_network_reduction=false"):
        assert run(app, [*base, "--parallel", "tensor", "--set", setting]).exit_code == 0, setting
    assert run(app, [*base, "--parallel", "expert", "--set", "system.collective_latency_s=1e-5"]).exit_code == 0
    r = run(app, ["evaluate", "-a", "marca-multicore", "-m", "mamba-370m", "-L", "256", "-B", "4", "--parallel", "pipeline",
                  "--set", "cores.placement=sequence"])
    assert r.exit_code == 1 and "--parallel pipeline places the cores" in " ".join(r.stderr.split())


def test_a_setting_no_evaluation_reads_is_refused() -> None:
    """--set of a field only validate's kernels read (an SM's bandwidth, the mma.sync share), or of
    a power budget on designs without an energy section, left every number as it was; refused,
    in evaluate, compare and sweeps alike. A budget one of the compared designs reads is kept."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.errors import SpecError
    from mambalaya.experiments.sweep_spec import check_sweep_fields

    run = CliRunner().invoke
    base = ["-m", "mamba-130m", "-B", "1"]
    for setting, words in (("kernels.sync_mma_fraction=0.01", "mma.sync"), ("kernels.sm_offchip_bytes_per_s=1", "launch grid"),
                           ("power_budget_w=1", "no energy section")):
        r = run(app, ["evaluate", "-a", "gpu-h100", "--set", setting, "-L", "64", *base])
        assert r.exit_code == 1 and words in r.output, setting
    assert run(app, ["compare", "--archs", "gpu-h100,mambalaya", "--set", "power_budget_w=300", "--seq-lens", "64",
                     *base]).exit_code == 0
    # a link setting on one device (no link crossed), in evaluate and compare; read over two
    link = "system.link_bandwidth_bytes_per_s=1GB/s"
    for command in (["evaluate", "-a", "gpu-h100", "-L", "64"], ["compare", "--archs", "gpu-h100", "--baseline", "gpu-h100", "--seq-lens", "64"]):
        r = run(app, [*command, "--set", link, *base])
        assert r.exit_code == 1 and "the run has one device" in r.output, command
        assert run(app, [*command, "--set", link, "--devices", "2", *base]).exit_code == 0, command
    with pytest.raises(SpecError, match="mma.sync"):
        check_sweep_fields({"kernels.sync_mma_fraction": [0.5, 0.6]}, {"model": "mamba-130m", "arch": "gpu-h100"})
    with pytest.raises(SpecError, match="no energy section"):
        check_sweep_fields({"power_budget_w": [100, 700]}, {"model": "mamba-130m", "arch": "gpu-h100"})
    # fields the design's dataflow never reads: a switch on one dataflow, a stationary operand's
    # buffering on a roofline, the 1D rate without a 1D mode; read where another design has them
    for setting, words in (("compute.dataflow_switch_cycles=500", "one dataflow"),
                           ("compute.stationary_double_buffered=false", "roofline design"),
                           ("compute.one_d_ops_per_lane_per_cycle=0.5", "no 1D mode")):
        r = run(app, ["evaluate", "-a", "gpu-h100", "--set", setting, "-L", "64", *base])
        assert r.exit_code == 1 and words in r.output, setting
    assert run(app, ["evaluate", "-a", "geens-ideal", "--set", "compute.dataflow_switch_cycles=500", "-L", "64",
                     *base]).exit_code == 1
    assert run(app, ["compare", "--archs", "marca-ideal,gpu-h100", "--baseline", "gpu-h100", "--set",
                     "compute.dataflow_switch_cycles=500", "--seq-lens", "64", *base]).exit_code == 0  # MARCA switches
    with pytest.raises(SpecError, match="one dataflow"):
        check_sweep_fields({"compute.dataflow_switch_cycles": [0, 500]}, {"model": "mamba-130m", "arch": "geens-ideal"})
    # options the chosen mapping or command has nothing to do with: an objective with a fixed mapping,
    # a buffer with the ideal (unbounded) one, widths where no fusion class depends on one
    for args, words in ((["evaluate", "--mapping", "ideal", "--objective", "energy", "-L", "64"], "--mapping ideal fixes both"),
                        (["fusion", "map", "--mapping", "ideal", "--buffer", "64KiB", "-L", "64"], "unbounded"),
                        (["cascade", "diagram", "--mapping", "ideal", "--buffer", "64KiB", "-L", "64", "-o",
                          "/tmp/never-written.svg"], "unbounded"),
                        (["fusion", "classes", "--bits", "8", "-L", "64"], "no fusion class depends on a width"),
                        (["fusion", "classes", "--precision", "reference-kernels", "-L", "64"], "no fusion class")):
        r = run(app, [*args, "-m", "mamba-130m"])
        assert r.exit_code == 1 and words in " ".join(r.output.split()), args
    # a collective's fields where the run is a pipeline (no collective runs); read under tensor parallelism
    for command in (["evaluate", "-a", "gpu-h100", "-L", "64"], ["compare", "--archs", "gpu-h100", "--baseline", "gpu-h100",
                                                                "--seq-lens", "64"]):
        for setting in ("system.collective_latency_s=1e-5", "system.in_network_reduction=false"):
            r = run(app, [*command, "--devices", "2", "--set", setting, *base])
            assert r.exit_code == 1 and "a pipeline runs no collective" in " ".join(r.output.split()), (command, setting)
            assert run(app, [*command, "--devices", "2", "--parallel", "tensor", "--set", setting, *base]).exit_code == 0
    # the PE registers' ports: checked against one operation's operands, never read by the cost model
    r = run(app, ["evaluate", "--set", "memory.pe_local_bytes_per_cycle=64", "-L", "64", *base])
    assert r.exit_code == 1 and "registers' ports" in r.output
    with pytest.raises(SpecError, match="registers' ports"):
        check_sweep_fields({"memory.pe_local_bytes_per_cycle": [16, 64]}, {"model": "mamba-130m"})
    with pytest.raises(SpecError, match="buffer is unbounded"):
        check_sweep_fields({"memory.onchip_buffer_bytes": ["1MiB", "32MiB"]}, {"model": "mamba-130m", "mapping": "ideal"})
    r = run(app, ["cascade", "diagram", "-L", "64", "--buffer", "1KiB", "-o", "/tmp/never-written.svg"])
    assert r.exit_code == 1 and "--buffer sizes the groups of --mapping" in r.output
    for widths in (["--bits", "8"], ["--precision", "reference-kernels"]):  # (the drawing was the same without a word)
        r = run(app, ["cascade", "diagram", "-L", "64", *widths, "-o", "/tmp/never-written.svg"])
        assert r.exit_code == 1 and "only the groups of --mapping depend on" in " ".join(r.output.split()), widths
    # --set precision beside --precision: the option won and the --set was dropped without a word
    for command in (["evaluate", "-L", "64"], ["compare", "--seq-lens", "64"]):
        r = run(app, [*command, "--set", "precision=uniform", "--precision", "reference-kernels", *base])
        assert r.exit_code == 1 and "both set the precision policy" in r.output, command
    # the node alone is a label: the scales carry what it does (it changed the printed node only)
    r = run(app, ["evaluate", "-a", "mambalaya", "--set", "technology.node_nm=45", "-L", "64", *base])
    assert r.exit_code == 1 and "the node is a label" in r.output
    with pytest.raises(SpecError, match="the node is a label"):
        check_sweep_fields({"technology.node_nm": [7, 45]}, {"model": "mamba-130m"})
    assert run(app, ["evaluate", "-a", "mambalaya", "--set", "technology.node_nm=45", "--set", "technology.energy_scale=2",
                     "--set", "technology.area_scale=3", "-L", "64", *base]).exit_code == 0
