"""Sweep stores are recognised by the marker the tool writes: anything else is refused
untouched before any point is computed; a damaged store is one error naming it; a row is never
stored with a column left empty that its point should fill."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.errors import MambalayaError
from mambalaya.experiments import sweep
from mambalaya.experiments.store import (STORE_APPLICATION_ID, STORE_FORMAT, PointResult, ResultStore,
                                         check_point_outputs, model_fingerprint)
from mambalaya.experiments.sweep import load_sweep_spec, run_sweep

runner = CliRunner()

ONE_POINT = """
name: one
grid:
  arch: [marca-ideal]
  model: [mamba-130m]
  phase: [decode]
  seq_len: [1]
  batch: [1]
"""


def _spec(tmp_path: Path, store: Path):
    path = tmp_path / "one.yaml"
    path.write_text(ONE_POINT)
    return load_sweep_spec(path, store=store)


def _snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    """A file's bytes, modification time and the files beside it."""
    return path.read_bytes(), os.stat(path).st_mtime_ns, sorted(os.listdir(path.parent))


def _no_point_may_run(monkeypatch) -> None:
    def refuse(points):
        raise AssertionError("a point was computed before the store was refused")
    monkeypatch.setattr(sweep, "evaluate_chunk", refuse)
    monkeypatch.setattr(sweep, "_chunk_task", lambda points, own_worker=False: refuse(points))


def _header(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:100]
    return int.from_bytes(header[68:72], "big"), int.from_bytes(header[60:64], "big")


def _foreign_database(path: Path, *, wal: bool = False) -> None:
    db = sqlite3.connect(path)
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE points (id TEXT PRIMARY KEY, owner TEXT)")
    db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    db.execute("INSERT INTO points VALUES ('a', 'someone else')")
    db.commit()
    db.close()


@pytest.mark.parametrize("kind", ["sqlite-with-points", "sqlite-wal", "text", "empty", "newer-store", "other-app-id"])
def test_a_file_that_is_not_a_store_is_refused_untouched_before_any_point(tmp_path, monkeypatch, kind) -> None:
    store = tmp_path / "data" / "theirs.db"
    store.parent.mkdir()
    if kind in ("sqlite-with-points", "sqlite-wal"):
        _foreign_database(store, wal=kind == "sqlite-wal")
    elif kind == "text":
        store.write_text("id,owner\na,someone else\n" * 20)
    elif kind == "empty":
        store.write_bytes(b"")
    else:
        with ResultStore(store, fingerprint=model_fingerprint()):
            pass
        db = sqlite3.connect(store)
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute(f"PRAGMA user_version = {STORE_FORMAT + 1}" if kind == "newer-store" else "PRAGMA application_id = 7")
        db.close()
    before = _snapshot(store)
    _no_point_may_run(monkeypatch)
    with pytest.raises(MambalayaError) as err:
        run_sweep(_spec(tmp_path, store), workers=1)
    message = str(err.value)
    assert str(store) in message and "\n" not in message
    assert ("newer mambalaya" if kind == "newer-store" else "not a mambalaya sweep store") in message
    assert _snapshot(store) == before  # not a byte, not the time, no file beside it


def test_the_cli_refuses_a_foreign_database_with_one_error_and_no_progress(tmp_path) -> None:
    store = tmp_path / "app.db"
    _foreign_database(store)
    spec = tmp_path / "one.yaml"
    spec.write_text(ONE_POINT)
    before = _snapshot(store)
    r = runner.invoke(app, ["sweep", str(spec), "--store", str(store), "--workers", "1"])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.output
    assert "without the sweep store's marker (its tables: meta, points)" in " ".join(r.stderr.split())
    assert "points/s" not in r.stderr  # refused before the sweep started
    assert _snapshot(store) == before


@pytest.mark.parametrize("where", ["directory", "under-a-file"])
def test_a_store_path_that_cannot_be_a_file_is_refused(tmp_path, where) -> None:
    if where == "directory":
        store = tmp_path / "dir"
        store.mkdir()
    else:
        (tmp_path / "plain").write_text("x")
        store = tmp_path / "plain" / "s.sqlite"
    with pytest.raises(MambalayaError, match="sweep store"):
        ResultStore(store, fingerprint="f")


def test_a_new_store_is_marked_and_a_store_written_before_the_marker_is_recognised(tmp_path) -> None:
    """A new store has the marker in its header (application id and format). A store of the
    schema the tool wrote before the marker existed is the tool's: read as it is (export
    writes nothing to it), and marked the first time a sweep writes to it."""
    spec = _spec(tmp_path, tmp_path / "s.sqlite")
    run_sweep(spec, workers=1)
    assert _header(spec.store) == (STORE_APPLICATION_ID, STORE_FORMAT)

    db = sqlite3.connect(spec.store)  # as the code before the marker left it
    db.execute("PRAGMA application_id = 0")
    db.execute("PRAGMA user_version = 0")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    assert _header(spec.store) == (0, 0)
    before = _snapshot(spec.store)
    r = runner.invoke(app, ["sweep", "export", str(spec.store)])
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 2
    assert _snapshot(spec.store) == before
    again = run_sweep(spec, workers=1)
    assert again.already_done == 1 and again.computed == 0
    assert _header(spec.store) == (STORE_APPLICATION_ID, STORE_FORMAT)


def test_a_damaged_store_is_one_error_naming_it(tmp_path) -> None:
    """A page of the store overwritten (a disk error, a copy cut short): resuming the sweep, or
    exporting the store, is one paragraph naming the store, not a traceback."""
    spec_path = tmp_path / "grid.yaml"
    spec_path.write_text(ONE_POINT.replace("arch: [marca-ideal]", "arch: [marca-ideal]\n  "
                                           "memory.offchip_bandwidth_bytes_per_s: [1e12, 2e12, 3e12, 4e12, 5e12, 6e12]")
                         .replace("name: one", "name: grid\nchunk_size: 1"))
    spec = load_sweep_spec(spec_path)
    run_sweep(spec, workers=1)
    db = sqlite3.connect(spec.store)  # rows long enough to span pages, all in the file (the log folded in)
    db.execute("UPDATE points SET worker = ?", ("w" * 3000,))
    db.commit()
    db.close()
    pages = spec.store.stat().st_size // 4096
    assert pages >= 4
    with open(spec.store, "r+b") as f:
        f.seek((pages // 2) * 4096)
        f.write(bytes(range(256)) * 16)  # one whole page in the middle
    with pytest.raises(MambalayaError) as err:
        run_sweep(spec, workers=1)
    assert str(spec.store) in str(err.value) and "damaged" in str(err.value) and "\n" not in str(err.value)
    for args in (["sweep", str(spec_path), "--workers", "1"], ["sweep", "export", str(spec.store)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1 and r.stderr.startswith("error: ") and "damaged" in r.stderr, r.output
        assert "Traceback" not in r.output


def _outputs(**changes):
    base = {"latency_s": 1.0, "model_latency_s": 2.0, "offchip_bytes": 3.0, "compute_util": 0.5, "mem_util": 0.5,
            "tokens_per_s": 4.0, "groups": 2, "peak_footprint_bytes": 5.0, "buffer_bytes": 6, "pes": 7,
            "bandwidth_bytes_per_s": 8.0, "mapping_used": "optimal"}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def test_a_row_with_a_column_left_empty_is_refused(tmp_path) -> None:
    """A hybrid point's outputs (each layer type's share) without attention_share; energy
    figures only in part; a required figure missing or not finite: refused by the store, and
    nothing of the batch written. A pure Mamba point without energy, and a hybrid one whose
    attention is inside another layer type (attention_share null), are complete."""
    check_point_outputs(_outputs())
    check_point_outputs(_outputs(**{"parallel_share": 1.0, "attention_share": None}))
    bad = {"attention_share": _outputs(**{"mamba-moe_share": 0.9, "attention-moe_share": 0.1}),
           "layer_energy_j, average_power_w": _outputs(energy_per_token_j=1.0, power_budget_w=None,
                                                       over_power_budget=False, throttled_latency_s=1.0),
           "latency_s": _outputs(latency_s=...), "tokens_per_s is inf": _outputs(tokens_per_s=float("inf")),
           "mapping_used": _outputs(mapping_used=...)}
    with ResultStore(tmp_path / "s.sqlite", fingerprint="f") as store:
        for needle, outputs in bad.items():
            with pytest.raises(MambalayaError, match=needle.split(",")[0]):
                check_point_outputs(outputs)
            ok = PointResult("good", {"model": "m"}, _outputs(), None, 0.1, "w")
            with pytest.raises(MambalayaError, match="refused"):
                store.write([ok, PointResult("bad", {"model": "m"}, outputs, None, 0.1, "w")])
            assert store.done_ids() == set()
        assert store.write([PointResult("failed", {"model": "m"}, None, "no fit", 0.1, "w")]) == 1


@pytest.mark.parametrize("edit", [
    "UPDATE points SET latency_s = 9e999",  # a column typed over by hand
    "UPDATE points SET seq_len = 2",  # an input column no longer the point's
    "UPDATE points SET inputs = replace(inputs, '\"seq_len\": 1', '\"seq_len\": 64')",  # the record itself
    "UPDATE points SET outputs = replace(outputs, '\"mapping_used\": ', '\"mapping_used\": 5, \"x\": ')",
])
def test_a_row_changed_by_hand_is_refused_when_read(tmp_path, edit: str) -> None:
    """`sweep export` and `sweep plot` read a row only as the sweep wrote it: one error naming the
    store and the row, never a plot of 9e999 or a traceback."""
    store = tmp_path / "s.sqlite"
    run_sweep(_spec(tmp_path, store), workers=1)
    db = sqlite3.connect(store)
    with db:
        assert db.execute(edit).rowcount == 1
    db.close()
    for command in (["sweep", "export", str(store), "-f", "csv", "-o", str(tmp_path / "rows.csv")],
                    ["sweep", "plot", str(store), "-o", str(tmp_path / "plot.png")]):
        result = runner.invoke(app, command)
        assert result.exit_code != 0 and result.exception is None or isinstance(result.exception, SystemExit)
        assert "changed after mambalaya wrote it" in result.output and str(store) in result.output, result.output
    assert not (tmp_path / "rows.csv").exists() and not (tmp_path / "plot.png").exists()
