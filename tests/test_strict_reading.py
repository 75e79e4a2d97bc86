"""Inputs that once became another number without a word, each now refused or read as written.

Found by an audit of every reader (2026-12-07): YAML's merge key and explicit number tags went
around the strict reading, a mapping file's own buffer stood in for the design's, a key in a
mapping file's loop was ignored, a validation file's design path was read from the folder the
command ran in, and a case's model family was overwritten by its own. Beside them, the values
that were tracebacks (numbers past a float's range) and messages that misled.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.einsum.parse import exact_text
from mambalaya.errors import SpecError
from mambalaya.specio import parse_yaml_text

runner = CliRunner()


def _text(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("text", [
    "n_layers: 24\n<<: {d_model: 768, d_model: 2048}\n",  # twice inside a merged mapping
    "n_layers: 24\n<<: {d_model: 768}\n<<: {d_model: 2048}\n",  # once in each of two merged mappings
    "n_layers: 24\n<<: [{d_model: 768}, {d_model: 2048}]\n",  # once in each of a merged list's mappings
])
def test_a_key_twice_through_merge_keys_is_refused(text) -> None:
    with pytest.raises(SpecError, match="'d_model' is given twice"):
        parse_yaml_text(text, source="m.yaml")


def test_a_mappings_own_key_still_overrides_a_merged_one() -> None:
    """YAML's merge key lets the mapping's own keys override the merged ones: that stays."""
    assert parse_yaml_text("base: &b {d_model: 2048, n_layers: 2}\nmodel: {<<: *b, d_model: 768}\n",
                           source="m.yaml")["model"] == {"d_model": 768, "n_layers": 2}


@pytest.mark.parametrize("text, read", [
    ("d: !!int 01024", None), ("d: !!int 0:24", None), ("d: !!float 1:00:00", None),
    ("d: !!int 1024", 1024), ("d: !!int 0x10", 16), ("d: !!float 1", 1.0), ("d: !!float 1e-5", 1e-5),
])
def test_an_explicit_number_tag_reads_yaml_1_2_numbers_only(text, read) -> None:
    """``!!int 01024`` read as octal 532 and ``!!float 1:00:00`` as 3600: the tag brought back
    YAML 1.1's spellings that the untagged reading refuses."""
    if read is None:
        with pytest.raises(SpecError, match="is not a YAML 1.2"):
            parse_yaml_text(text, source="t.yaml")
    else:
        assert parse_yaml_text(text, source="t.yaml")["d"] == read


def test_a_field_written_into_a_mapping_files_loop_is_refused(tmp_path) -> None:
    """``loops: [{rank: I, tile: 16, resident: [...]}]`` was read as no residency at all."""
    f = tmp_path / "m.yaml"
    f.write_text(f"name: m\ngroups:\n  - einsums: {_ALL}\n    loops: [{{rank: I, tile: 16, resident: [WX]}}]\n")
    r = runner.invoke(app, ["fusion", "map", "-L", "64", "-B", "1", "--mapping", str(f), "--buffer", "1GiB"])
    assert r.exit_code == 1 and "loops[0] has unknown field(s) resident" in _text(r)


def test_a_mapping_files_buffer_above_the_designs_is_refused(tmp_path) -> None:
    """A file's ``buffer_bytes: 1GiB`` let evaluate cost a group six times the design's buffer
    (the same file without the field was refused by the buffer rule)."""
    f = tmp_path / "m.yaml"
    f.write_text(f"name: m\nbuffer_bytes: 1GiB\ngroups:\n  - einsums: {_ALL}\n    loops: [{{rank: B, tile: 48}}]\n")
    r = runner.invoke(app, ["evaluate", "-L", "64", "-B", "64", "--mapping", str(f)])
    assert r.exit_code == 1 and "more than mambalaya's on-chip buffer of 52,428,800 bytes" in _text(r)


#: Every Einsum of a Mamba-1 layer (mamba-1.4b, the default model), in one group.
_ALL = "[SS, RS, XN, XI, Z, XC, U, DL, BM, CM, DT, DELTA, AD, BX, H, YS, YD, G, YG, O, XO]"


_CASE = ("sources:\n  s1: test source\ncases:\n  - {{id: c1, source: s1, read: text, uncertainty: 0, arch: {arch}, "
         "family: mamba1,\n     model: {{d_model: 512, d_state: 16{extra}}}, batch: 1, seq_len: 512, measured_ms: 0.0395}}\n")


def test_a_validation_files_design_path_is_read_beside_it(tmp_path, monkeypatch) -> None:
    """``arch: g.yaml`` in a case file was read from the folder the command ran in: the same
    file gave two speeds of light from two folders."""
    from mambalaya.arch import arch_to_yaml, load_arch, with_settings
    from mambalaya.experiments.validate import validate

    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "g.yaml").write_text(arch_to_yaml(load_arch("gpu-a100-pcie")))
    (tmp_path / "g.yaml").write_text(arch_to_yaml(with_settings(load_arch("gpu-a100-pcie"),
                                                                ["memory.offchip_bandwidth_bytes_per_s=3e11"])))
    (sub / "cases.yaml").write_text(_CASE.format(arch="g.yaml", extra=""))
    sols = []
    for folder, path in ((tmp_path, "sub/cases.yaml"), (sub, "cases.yaml")):
        monkeypatch.chdir(folder)
        sols.append(validate(path).results[0].speed_of_light_s)
    shipped = (tmp_path / "shipped.yaml")
    shipped.write_text(_CASE.format(arch="gpu-a100-pcie", extra=""))
    assert sols[0] == sols[1] == validate(shipped).results[0].speed_of_light_s


def test_a_cases_model_family_against_its_own_is_refused(tmp_path) -> None:
    f = tmp_path / "cases.yaml"
    f.write_text(_CASE.format(arch="gpu-a100-pcie", extra=", family: mamba2"))
    r = runner.invoke(app, ["validate", "--cases", str(f)])
    assert r.exit_code == 1 and "model.family 'mamba2' contradicts the case's family 'mamba1'" in _text(r)


@pytest.mark.parametrize("args, body, needle", [
    (["evaluate", "--model", "jamba-v0.1", "-L", "64", "-B", "1", "--routing"],
     "fractions: [" + "1" + "0" * 400 + ", " + ", ".join(["0"] * 15) + "]\n", "a number of 401 digits"),
    (["cascade", "check"],
     "name: t\nparams: {d: 1.0e308}\nranks: {B: 1, D: d*100/7}\ntensors:\n  X: {ranks: [B, D], role: input}\n"
     "  Y: {ranks: [B, D], role: output}\neinsums:\n  - Y[b,d] = X[b,d]\n", "evaluates to 1.4285714285714285871e+309"),
])
def test_a_number_past_a_floats_range_is_refused_in_one_paragraph(tmp_path, args, body, needle) -> None:
    """Each was an OverflowError traceback."""
    f = tmp_path / "in.yaml"
    f.write_text(body)
    r = runner.invoke(app, [*args, str(f)])
    assert r.exit_code == 1 and needle in _text(r) and "Traceback" not in r.output


def test_a_size_that_is_not_whole_shows_its_fraction() -> None:
    """``30*d`` with ``d: 0.1`` was refused as "evaluates to 3, not a positive integer"."""
    assert exact_text(Fraction(30) * Fraction(0.1)) == "3.0000000000000001665"
    assert exact_text(Fraction(10**400, 3)).endswith("e+399")


def test_a_unions_member_names_stay_out_of_a_fields_path(tmp_path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("n_layers: 2\nd_model: 64\ndt_rank: Auto\n")
    r = runner.invoke(app, ["cascade", "show", "--model", str(f), "-L", "8"])
    text = _text(r)
    assert r.exit_code == 1 and "dt_rank: must be an integer (got 'Auto')" in text
    assert "constrained-int" not in text and "literal[" not in text


def test_the_published_search_keeps_an_integer_field_whole(tmp_path) -> None:
    """``--published`` bisected compute.array_rows to 128.0, which the spec refuses as not an
    integer, blaming a value nobody wrote."""
    from mambalaya.experiments.sensitivity import Assumption, bisect_assumption

    a = Assumption(key="compute.array_rows", low=64, high=256, reason="test")
    asked = []
    bisect_assumption(a, 64, 1.0, 256, 4.0, "latency", 2.5, lambda _a, v: asked.append(v) or {"latency": 2.0})
    assert asked and all(type(v) is int for v in asked)
