"""The fusion commands: map (named and file mappings, --save), pareto, and the diagram options."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mambalaya.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_map_json_totals_and_save(tmp_path) -> None:
    saved = tmp_path / "opt.yaml"
    r = invoke("fusion", "map", "-m", "mamba-130m", "-L", "256", "--mapping", "optimal", "--buffer", "4MiB", "-f", "json", "--save", str(saved))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    t = doc["totals"]
    assert t["offchip_bytes"] == t["read_bytes"] + t["write_bytes"] > 0
    assert t["peak_footprint_bytes"] <= 4 * 2**20
    assert sum(g["footprint_bytes"] <= 4 * 2**20 for g in doc["groups"]) == len(doc["groups"])
    assert doc["provenance"]["buffer_bytes"] == 4 * 2**20
    # the saved file reproduces the same traffic
    r2 = invoke("fusion", "map", "-m", "mamba-130m", "-L", "256", "--mapping", str(saved), "-f", "json")
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.stdout)["totals"]["offchip_bytes"] == t["offchip_bytes"]
    # a smaller buffer than the mapping needs is a one-paragraph error naming the group and rule
    r3 = invoke("fusion", "map", "-m", "mamba-130m", "-L", "256", "--mapping", str(saved), "--buffer", "1KiB")
    assert r3.exit_code == 1 and "[rule: buffer]" in r3.stderr and "group G" in r3.stderr


def test_map_table_orders_mappings() -> None:
    totals = {}
    for name in ("unfused", "ssm-ri", "stitched", "optimal", "ideal"):
        r = invoke("fusion", "map", "-m", "mamba-370m", "-L", "1024", "-B", "4", "--mapping", name, "-f", "json")
        assert r.exit_code == 0, r.output
        totals[name] = json.loads(r.stdout)["totals"]["offchip_bytes"]
    assert totals["ideal"] <= totals["optimal"] <= totals["stitched"] <= totals["unfused"]
    assert totals["optimal"] <= totals["ssm-ri"] <= totals["unfused"]
    r = invoke("fusion", "map", "-m", "mamba-370m", "--mapping", "stitched")
    assert r.exit_code == 0 and "off-chip traffic per tensor" in r.stdout and "total off-chip" in r.stdout


def test_bad_mapping_inputs() -> None:
    r = invoke("fusion", "map", "--mapping", "greedy")
    assert r.exit_code == 1 and "unknown mapping" in r.stderr and "stitched" in r.stderr
    r = invoke("evaluate", "-m", "mamba-130m", "--mapping", "optimal-convexx")  # evaluate says the same
    assert r.exit_code == 1 and "unknown mapping" in r.stderr and "optimal-convex," in r.stderr
    r = invoke("fusion", "map", "--mapping", "stitched", "--buffer", "lots")
    assert r.exit_code == 1 and "not a size" in r.stderr
    r = invoke("fusion", "map", "--mapping", "stitched", "--buffer", "1B")
    assert r.exit_code == 1 and "buffer" in r.stderr and "Traceback" not in r.output


def test_pareto_csv() -> None:
    r = invoke("fusion", "pareto", "-m", "mamba-130m", "-L", "128", "-f", "csv")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "buffer_bytes,peak_footprint_bytes,offchip_bytes,groups" and len(lines) >= 3


def test_diagram_with_classes_and_groups(tmp_path) -> None:
    out = tmp_path / "d.svg"
    r = invoke("cascade", "diagram", "-m", "mamba-130m", "-L", "64", "--classes", "--mapping", "stitched", "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "RSb" in text and "RD" in text and "fusion group" in text
