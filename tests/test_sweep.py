"""Sweeps: every point exactly once, resumable after a real kill, robust to a lost worker (local or Dask)."""

from __future__ import annotations

import gc
import re
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.store import ResultStore, point_id
from mambalaya.experiments.sweep import evaluate_chunk, load_sweep_spec, run_sweep

runner = CliRunner()

SMALL = """
name: small
chunk_size: 3
grid:
  arch: [mambalaya, marca-ideal]
  memory.offchip_bandwidth_bytes_per_s: [1e12, 4e12]
  memory.onchip_buffer_bytes: [8MiB, 64]
  model: [mamba-130m]
  phase: [prefill, decode]
  seq_len: [1024]
  batch: [4]
"""


def write_spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def stored(path: Path) -> pd.DataFrame:
    with ResultStore(path, create=False) as st:
        return st.dataframe()


def assert_exactly_once(store: Path, spec) -> None:
    db = sqlite3.connect(store)
    n, distinct = db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM points").fetchone()
    ids = {r[0] for r in db.execute("SELECT id FROM points")}
    db.close()
    assert n == distinct == len(spec.points())
    assert ids == {point_id(p) for p in spec.points()}


def test_spec_errors(tmp_path) -> None:
    with pytest.raises(SpecError, match="grid"):
        load_sweep_spec(write_spec(tmp_path, "name: x\n"))
    with pytest.raises(SpecError, match="grid.seq_len must be a non-empty list"):
        load_sweep_spec(write_spec(tmp_path, "grid: {seq_len: 5}\n"))
    with pytest.raises(SpecError, match="neither a point field"):
        load_sweep_spec(write_spec(tmp_path, "grid: {bandwidth: [1]}\n"))
    with pytest.raises(SpecError, match="line"):
        load_sweep_spec(write_spec(tmp_path, "grid: [1, 2\n"))
    with pytest.raises(SpecError, match="no model"):
        load_sweep_spec(write_spec(tmp_path, "grid: {seq_len: [1, 2]}\n"))


def test_points_failures_and_a_growing_grid(tmp_path) -> None:
    spec = load_sweep_spec(write_spec(tmp_path, SMALL))
    points = spec.points()
    assert len(points) == 2 * 2 * 2 * 2  # decode collapses L to 1: still 2 phases x 8
    # the work of a chunk, in process: an impossible buffer is a recorded failure, not a crash
    results = evaluate_chunk(points)
    failed = [r for r in results if r.error]
    assert len(failed) == 8 and all("memory.onchip_buffer_bytes" in r.error for r in failed)
    assert all(r.outputs["latency_s"] > 0 for r in results if not r.error)

    summary = run_sweep(spec, workers=1)
    assert summary.computed == 16 and summary.failed == 8
    assert_exactly_once(spec.store, spec)
    again = run_sweep(spec, workers=1)
    assert again.computed == 0 and again.already_done == 16
    grown = load_sweep_spec(write_spec(tmp_path, SMALL.replace("seq_len: [1024]", "seq_len: [1024, 2048]")))
    more = run_sweep(grown, workers=1)
    assert more.computed == 8 and more.already_done == 16  # only the new prefill points
    assert_exactly_once(grown.store, grown)
    df = stored(grown.store)
    assert {"memory.offchip_bandwidth_bytes_per_s", "latency_s", "error", "status"} <= set(df.columns)


def test_store_from_another_model_is_refused(tmp_path) -> None:
    spec = load_sweep_spec(write_spec(tmp_path, SMALL))
    with ResultStore(spec.store, fingerprint="0.0.0+old") as st:
        st.write([])
    with pytest.raises(MambalayaError, match="not mixed"):
        run_sweep(spec, workers=1)


def assert_equals_an_uninterrupted_run(tmp_path: Path, spec) -> None:
    """Every point of ``spec``'s store once, with the latencies of the KILLABLE grid run whole."""
    assert_exactly_once(spec.store, spec)
    reference = load_sweep_spec(write_spec(tmp_path, KILLABLE, "ref.yaml"), store=tmp_path / "ref.sqlite")
    run_sweep(reference, workers=1)
    a = stored(spec.store).set_index("id")["latency_s"].sort_index()
    b = stored(reference.store).set_index("id")["latency_s"].sort_index()
    pd.testing.assert_series_equal(a, b)


KILLABLE = """
name: killable
chunk_size: 4
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.offchip_bandwidth_bytes_per_s: [1e12, 2e12, 4e12]
  memory.onchip_buffer_bytes: [8MiB, 16MiB, 32MiB, 64MiB]
  compute.array_rows: [128, 256]
  model: [mamba-130m]
  seq_len: [2048]
  batch: [8]
"""


@pytest.mark.slow
def test_killed_sweep_resumes_to_the_uninterrupted_result(tmp_path) -> None:
    spec_path = write_spec(tmp_path, KILLABLE)
    spec = load_sweep_spec(spec_path)
    cmd = [sys.executable, "-m", "mambalaya.cli", "sweep", str(spec_path), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    rows = 0
    while time.time() < deadline:
        time.sleep(0.2)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        if spec.store.exists():
            try:
                rows = sqlite3.connect(spec.store).execute("SELECT COUNT(*) FROM points").fetchone()[0]
            except sqlite3.OperationalError:
                rows = 0
            if rows >= 20:
                break
    os.killpg(proc.pid, signal.SIGKILL)  # the coordinator and its workers, mid-sweep
    proc.wait()
    partial = sqlite3.connect(spec.store).execute("SELECT COUNT(*) FROM points").fetchone()[0]
    assert 0 < partial < len(spec.points()), partial

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert_exactly_once(spec.store, spec)

    reference = load_sweep_spec(spec_path, store=tmp_path / "reference.sqlite")
    run_sweep(reference, workers=1)
    a = stored(spec.store).set_index("id")["latency_s"].sort_index()
    b = stored(reference.store).set_index("id")["latency_s"].sort_index()
    pd.testing.assert_series_equal(a, b)


@pytest.mark.slow
def test_lost_dask_worker_does_not_lose_or_duplicate_points(tmp_path) -> None:
    from distributed import Client, LocalCluster

    spec = load_sweep_spec(write_spec(tmp_path, KILLABLE.replace("chunk_size: 4", "chunk_size: 2")))
    killed = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        pids = client.run(os.getpid)

        def progress(done, total, summary):
            if not killed and summary.computed >= 10:
                victim = next(iter(pids.values()))
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        summary = run_sweep(spec, client=client, on_progress=progress)
    assert killed and summary.computed == len(spec.points())
    assert_equals_an_uninterrupted_run(tmp_path, spec)


def test_cli_run_plot_export(tmp_path) -> None:
    spec_path = write_spec(tmp_path, SMALL.replace("[8MiB, 64]", "[8MiB, 32MiB]"))
    r = runner.invoke(app, ["sweep", str(spec_path), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "16 points" in r.stderr and "0 failed" in r.stderr
    said = " ".join(r.stderr.split())  # before the first point: the count; after the first chunk: an estimate
    assert "sweep small: 16 points, 0 already in" in said and "16 to compute in" in said
    assert "estimated time: about" in said and "s a point on one worker" in said
    store = tmp_path / "spec.sqlite"
    r = runner.invoke(app, ["sweep", "plot", str(store), "-o", str(tmp_path / "plots"),
                            "--x", "memory.offchip_bandwidth_bytes_per_s", "--y", "memory.onchip_buffer_bytes"])
    assert r.exit_code == 0, r.output
    for name in ("pareto.png", "pareto.svg", "speedup_heatmap.png", "speedup_heatmap.csv"):
        assert (tmp_path / "plots" / name).exists()
    r = runner.invoke(app, ["sweep", "export", str(store), "--format", "parquet", "-o", str(tmp_path / "s.parquet")])
    assert r.exit_code == 0, r.output
    assert len(pd.read_parquet(tmp_path / "s.parquet")) == 16
    r = runner.invoke(app, ["sweep", "export", str(tmp_path / "none.sqlite")])
    assert r.exit_code == 1 and "no such sweep store" in r.stderr


def test_precision_is_a_sweep_axis() -> None:
    """A point's precision policy reaches its cascade: reference-kernels moves more bytes
    unfused than uniform (the float32 scan tensors), and a bad policy is that point's error."""
    base = {"arch": "marca-ideal", "model": "mamba-130m", "phase": "prefill", "seq_len": 256, "batch": 2,
            "mapping": "default"}
    uniform, reference, bad = evaluate_chunk([dict(base, precision="uniform"), dict(base, precision="reference-kernels"),
                                              dict(base, precision="fp3")])
    assert not uniform.error and not reference.error
    assert reference.outputs["offchip_bytes"] > uniform.outputs["offchip_bytes"]
    assert bad.error and "fp3" in bad.error and "precision" in bad.error


def test_local_workers_are_forked_on_linux_unless_the_environment_says_otherwise(monkeypatch) -> None:
    from mambalaya.experiments import sweep

    monkeypatch.delenv("MAMBALAYA_SWEEP_START_METHOD", raising=False)
    monkeypatch.setattr(sweep.sys, "platform", "linux")
    assert sweep._worker_start_method() == "fork"
    monkeypatch.setattr(sweep.sys, "platform", "darwin")
    assert sweep._worker_start_method() == "spawn"
    monkeypatch.setattr(sweep.sys, "platform", "linux")
    monkeypatch.setenv("MAMBALAYA_SWEEP_START_METHOD", "spawn")
    assert sweep._worker_start_method() == "spawn"
    monkeypatch.setenv("MAMBALAYA_SWEEP_START_METHOD", "teleport")
    with pytest.raises(MambalayaError, match="MAMBALAYA_SWEEP_START_METHOD"):
        sweep._worker_start_method()


def _worker_facts() -> tuple[int, int]:
    time.sleep(0.2)  # (both workers take one)
    return os.getpid(), gc.get_freeze_count()


def test_local_workers_are_processes_started_with_the_coordinators_objects_frozen() -> None:
    """The local pool's workers are processes of their own, forked with this process's
    objects frozen (their collections need not traverse them), which are thawed here again."""
    from mambalaya.experiments import sweep

    with sweep._local_pool(2) as pool:
        facts = [f.result() for f in [pool.submit(_worker_facts) for _ in range(2)]]
    assert len({pid for pid, _ in facts}) == 2 and os.getpid() not in {pid for pid, _ in facts}
    assert all(frozen > 0 for _, frozen in facts)
    assert gc.get_freeze_count() == 0


def _chunk_task_killing_one_worker(points, *, own_worker=False):
    """The sweep's chunk task, but the worker that takes the first chunk with a geens-ideal
    point (marked by the file KILL_MARKER names) is killed before it runs it."""
    from mambalaya.experiments.sweep import evaluate_chunk

    marker = Path(os.environ["KILL_MARKER"])
    if any(p["arch"] == "geens-ideal" for p in points) and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)  # this worker, mid-sweep
    return evaluate_chunk(points)


@pytest.mark.slow
def test_lost_local_worker_does_not_lose_or_duplicate_points(tmp_path, monkeypatch) -> None:
    """A local worker killed mid-sweep breaks the pool; a new one runs the chunks not yet
    stored: every point once, equal to an uninterrupted run."""
    from mambalaya.experiments import sweep

    spec = load_sweep_spec(write_spec(tmp_path, KILLABLE.replace("chunk_size: 4", "chunk_size: 2")))
    marker = tmp_path / "killed"  # (seen by every worker process: the first geens chunk is killed once)
    monkeypatch.setenv("KILL_MARKER", str(marker))
    monkeypatch.setattr(sweep, "_chunk_task", _chunk_task_killing_one_worker)  # (the forked workers inherit it)
    summary = run_sweep(spec, workers=2)
    assert marker.exists() and summary.computed == len(spec.points())
    assert_equals_an_uninterrupted_run(tmp_path, spec)


def test_a_worker_chunk_freezes_what_it_leaves_only_when_asked(monkeypatch) -> None:
    """On the sweep's own worker processes a chunk tunes the allocator first and ends by
    moving what it leaves (its layers' memos) out of the cyclic collector's reach
    (gc.freeze); the results are the same either way, and neither happens unless asked (a
    caller's own client, a thread worker)."""
    from mambalaya.experiments import sweep, sweep_workers

    points = [{"arch": "mambalaya", "model": "mamba-130m", "phase": "prefill", "seq_len": 256, "batch": 2,
               "mapping": "default", "memory.onchip_buffer_bytes": b} for b in ("4MiB", "8MiB")]
    tuned: list[str] = []
    monkeypatch.setattr(sweep_workers, "tune_allocator", lambda: tuned.append("allocator"))  # (run_tuned's)
    monkeypatch.setattr(sweep_workers, "tune_collector", lambda: tuned.append("collector"))
    assert gc.get_freeze_count() == 0
    plain = sweep._chunk_task(points)
    assert gc.get_freeze_count() == 0 and not tuned
    try:
        frozen = sweep._chunk_task(points, own_worker=True)
        assert gc.get_freeze_count() > 0 and tuned == ["allocator", "collector"]
    finally:
        gc.unfreeze()
    assert [r.outputs for r in frozen] == [r.outputs for r in plain]
    assert all(r.error is None for r in plain)


def test_a_worker_frees_the_memos_of_the_cascades_it_drops(monkeypatch) -> None:
    """Past KEPT_CASCADES layers a worker drops its cascades. Their memos (cost models,
    candidate tables) refer back to them, and a worker's chunk freezes what it leaves
    (gc.freeze), where the collector never looks: they must be freed when the cascade is
    dropped, not left frozen for the worker's life."""
    import weakref

    from mambalaya.experiments import sweep, sweep_workers

    monkeypatch.setattr(sweep_workers, "tune_allocator", lambda: None)
    monkeypatch.setattr(sweep_workers, "tune_collector", lambda: None)
    monkeypatch.setattr(sweep, "KEPT_CASCADES", 0)
    monkeypatch.setattr(sweep, "_CASCADES", {})
    point = {"arch": "mambalaya", "model": "mamba-130m", "phase": "prefill", "seq_len": 256, "batch": 2,
             "mapping": "default", "memory.onchip_buffer_bytes": "8MiB"}
    try:
        assert sweep._chunk_task([point], own_worker=True)[0].error is None
        (cascade,) = sweep._CASCADES.values()
        models = list(cascade.__dict__["_group_cost_model_memo"].values())
        assert models and models[0].cascade is cascade  # a cycle: the cascade holds them, they hold it
        alive = [weakref.ref(m) for m in models] + [weakref.ref(cascade)]
        del cascade, models
        assert sweep._chunk_task([{**point, "seq_len": 512}], own_worker=True)[0].error is None
        assert len(sweep._CASCADES) == 1
        assert not [ref for ref in alive if ref() is not None]
    finally:
        gc.unfreeze()


def test_the_collector_tuning_raises_only_the_young_threshold() -> None:
    from mambalaya.experiments import sweep_workers

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])  # Python's default (a command run in this process may have raised it)
        assert sweep_workers.tune_collector.__wrapped__() == (sweep_workers.COLLECTOR_YOUNG_THRESHOLD, *before[1:])
        assert sweep_workers.COLLECTOR_YOUNG_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)


_MMAPPED_BY_A_MIB = """
import ctypes, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
if sys.argv[1] == "tuned":
    from mambalaya.experiments import sweep_workers
    print(sweep_workers.tune_allocator())
else:  # glibc's default, set: what a process freed before may have raised the dynamic threshold
    print(libc.mallopt(-3, 128 << 10) == 1)
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_allocator_tuning_takes_on_linux() -> None:
    """With the sweep workers' thresholds, a 1 MiB block comes from the heap; with glibc's
    default mmap threshold (128 KiB) it is mapped on its own (mallinfo2's mmapped bytes). In
    child processes: the thresholds stay with the process that sets them."""
    def mapped(mode: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", _MMAPPED_BY_A_MIB, mode], capture_output=True, text=True,
                              check=True).stdout.split()

    tuned, plain = mapped("tuned"), mapped("plain")
    assert tuned == ["True", "0"]
    assert plain[0] == "True" and int(plain[1]) >= 1 << 20


def test_points_share_their_architecture_across_layers_but_not_across_field_types() -> None:
    """A point's architecture is built once per design and field values (the points of every
    layer repeat them); 1 and 1.0 are different values to a strict spec, and a value that is
    not a scalar still gets the spec's own error."""
    from mambalaya.experiments import sweep

    base = {"arch": "mambalaya", "phase": "prefill", "seq_len": 256, "batch": 2, "mapping": "default",
            "memory.offchip_bandwidth_bytes_per_s": 2e12}
    a = sweep._arch_for(dict(base, model="mamba-130m"))
    assert sweep._arch_for(dict(base, model="mamba-370m", seq_len=512)) is a
    assert a.memory.offchip_bandwidth_bytes_per_s == 2e12
    other = sweep._arch_for(dict(base, **{"memory.offchip_bandwidth_bytes_per_s": 3e12}))
    assert other is not a and other.memory.offchip_bandwidth_bytes_per_s == 3e12
    int_key = sweep._arch_for(dict(base, **{"memory.onchip_buffer_bytes": 1 << 20}))
    float_key = sweep._arch_for(dict(base, **{"memory.onchip_buffer_bytes": float(1 << 20)}))
    assert int_key is not float_key
    with pytest.raises(MambalayaError, match="must be an integer"):
        sweep._arch_for(dict(base, **{"memory.onchip_buffer_bytes": [1, 2]}))


def test_cli_sweep_exits_non_zero_only_when_every_point_failed(tmp_path) -> None:
    """Some points failing: exit 0 with the summary and the commonest errors. Every point failing:
    exit 1 saying so, after the same summary."""
    partly = write_spec(tmp_path, SMALL.replace("phase: [prefill, decode]", "phase: [decode]"), "partly.yaml")
    r = runner.invoke(app, ["sweep", str(partly), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "4 failed" in r.stderr and "commonest errors:" in r.stderr
    assert "4 points: " in r.stderr and "memory.onchip_buffer_bytes" in r.stderr
    every = write_spec(tmp_path, SMALL.replace("[8MiB, 64]", "[64]").replace("phase: [prefill, decode]",
                                                                         "phase: [decode]"), "every.yaml")
    r = runner.invoke(app, ["sweep", str(every), "--workers", "1"])
    assert r.exit_code == 1, r.output
    assert "4 failed" in r.stderr and "commonest errors:" in r.stderr
    assert "every one of the 4 points this sweep computed failed" in r.stderr.replace("\n", " ")


def test_a_point_over_its_power_budget_is_flagged_with_its_throttled_latency() -> None:
    """Points on a design with an energy section carry its power against its budget; a budget
    set below the point's power flags it and gives the latency held to the budget."""
    base = {"arch": "mambalaya", "model": "mamba-130m", "phase": "prefill", "seq_len": 256, "batch": 2,
            "mapping": "default"}
    within, tight = evaluate_chunk([base, dict(base, power_budget_w=1.0)])  # above its 0.3 W leakage
    assert not within.error and not tight.error
    assert within.outputs["power_budget_w"] == 700 and not within.outputs["over_power_budget"]
    assert within.outputs["throttled_latency_s"] == within.outputs["latency_s"]
    assert tight.outputs["over_power_budget"]
    assert tight.outputs["throttled_latency_s"] > 100 * tight.outputs["latency_s"]


def test_a_local_sweep_submits_the_chunks_expected_to_take_longest_first() -> None:
    """Local chunks go out a few at a time (sweep_workers.Costliest): first one chunk of each model not
    yet submitted, in order, so each is measured early; then the chunk whose points' models
    were measured slowest (one submitted but not yet measured counting as the slowest
    measured), so short chunks run last."""
    from mambalaya.experiments.store import PointResult
    from mambalaya.experiments.sweep_workers import Costliest

    def chunk(model: str, n: int) -> list[dict]:
        return [{"model": model, "phase": "prefill", "seq_len": k} for k in range(n)]

    chunks = [chunk("fast", 4), chunk("fast", 5), chunk("slow", 4), chunk("fast", 6), chunk("slow", 2), chunk("new", 3),
              chunk("new", 1)]
    order = Costliest(chunks)
    assert [order.take(), order.take(), order.take()] == [0, 2, 5]  # one of each model, in order
    assert order.take() == 1  # nothing measured yet: the chunks' order
    order.learn([PointResult("a", p, {}, None, 0.01, "w") for p in chunks[0]])
    assert order.take() == 3  # every model counts as "fast" (the slowest measured): the most points
    order.learn([PointResult("b", p, {}, None, 1.0, "w") for p in chunks[2][:1]])
    assert order.take() == 4  # "slow" measured at 1 s a point: its 2 points (2 s) before "new"'s 1 (1 s)
    assert order.take() == 6
    assert not order.pending


def _load_error(tmp_path: Path, text: str) -> str:
    """The one-paragraph SpecError loading the sweep spec ``text`` raises."""
    with pytest.raises(SpecError) as err:
        load_sweep_spec(write_spec(tmp_path, text, "bad.yaml"))
    message = str(err.value)
    assert "\n" not in message and "bad.yaml" in message
    return message


@pytest.mark.parametrize("value", ["64.9", "64.0", "'64'", "true", "0", "-3", str(2**53 + 1), ".nan", ".inf", "1e3",
                                   "64 tokens", "null"])
@pytest.mark.parametrize("field", ["seq_len", "batch"])
def test_a_size_that_is_not_an_integer_is_refused_when_the_spec_is_read(tmp_path, field, value) -> None:
    """seq_len: [64.9] once stored a row at 64.9 with the numbers of L = 64. A size is an integer
    from 1 to 2^53, in the grid and in fixed alike; 64.0 is not an integer either."""
    grid = f"grid:\n  model: [mamba-130m]\n  {field}: [{value}]\n"
    if value != "null":  # (null is no grid value at all)
        assert f"grid.{field}: " in _load_error(tmp_path, grid)
    message = _load_error(tmp_path, f"grid:\n  model: [mamba-130m]\nfixed:\n  {field}: {value}\n")
    assert f"fixed.{field}: " in message and "integer from 1 to 2^53" in message


def test_a_point_built_by_hand_never_has_its_size_truncated() -> None:
    point = {"arch": "marca-ideal", "model": "mamba-130m", "phase": "prefill", "seq_len": 64.9, "batch": 2,
             "mapping": "default"}
    (result,) = evaluate_chunk([point])
    assert result.outputs is None and "seq_len: 64.9 is not a sequence length" in result.error
    with pytest.raises(SpecError, match="seq_len"):
        sweep_spec_of(seq_len=[64.9])


def sweep_spec_of(**grid):
    from mambalaya.experiments.sweep import SweepSpec

    return SweepSpec("by-hand", Path("unused.sqlite"), {"model": ["mamba-130m"], **grid})


def test_a_text_where_a_number_is_is_one_error_when_the_spec_is_read(tmp_path) -> None:
    """grid: {clock_hz: [fast]} once failed every point, one by one; it is refused when the spec
    is read, naming the field, by the command too (no store made, no progress shown)."""
    text = "grid:\n  model: [mamba-130m]\n  clock_hz: [1GHz, fast]\n"
    assert "grid.clock_hz: invalid architecture field: clock_hz: cannot read 'fast' as a frequency" in _load_error(
        tmp_path, text)
    path = write_spec(tmp_path, text, "fast.yaml")
    r = runner.invoke(app, ["sweep", str(path), "--workers", "1"])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "grid.clock_hz" in r.stderr
    assert "Traceback" not in r.output and "points/s" not in r.output
    assert not (tmp_path / "fast.sqlite").exists()


@pytest.mark.parametrize("setting, needle", [
    ("grid:\n  memory.onchip_buffer_bytes: [8MiB, -1]", "grid.memory.onchip_buffer_bytes: invalid architecture field: "
     "memory.onchip_buffer_bytes: must be > 0 (got -1)"),
    ("grid:\n  compute.array_rows: [128.0]", "grid.compute.array_rows: invalid architecture field: compute.array_rows: "
     "must be an integer (got 128.0)"),
    ("grid:\n  compute.one_d_mode: ['no']", "compute.one_d_mode: must be true or false (got 'no')"),
    ("grid:\n  memory.offchip_bandwidth_bytes_per_s: [.inf]", "must be a finite number"),
    ("grid:\n  compute.unary_cost_cycles: [5]", "'compute.unary_cost_cycles' is a table"),
    ("grid:\n  sources.clock_hz: [x]", "'sources.clock_hz' cannot be set"),
    ("grid:\n  memory.onchip_buffer: [8MiB]", "'memory.onchip_buffer' does not exist"),
    ("grid:\n  arch: [gpu-h100]\n  energy.dram_pj_per_bit: [3]", "gpu-h100 has no 'energy' section (on gpu-h100)"),
    ("grid:\n  phase: [warmup]", "grid.phase: 'warmup' is not a phase: one of prefill, decode"),
    ("grid:\n  mapping: [fastest]", "grid.mapping: 'fastest' is not a mapping: one of default, unfused"),
    ("grid:\n  arch: [5]", "grid.arch: 5 is not the name of an arch"),
    ("grid:\n  arch: [no-such-design]", "grid.arch: design 'no-such-design': unknown architecture"),
    ("fixed:\n  model: no-such-model", "fixed.model: model 'no-such-model': unknown model"),
    ("grid:\n  seq_len: [1024]\nfixed:\n  seq_len: 2048", "'seq_len' is set both in 'grid' ([1024]) and in 'fixed' (2048)"),
    ("grid:\n  compute.unary_cost_cycles.exp: [1, 2]\nfixed:\n  compute.unary_cost_cycles: {exp: 3}",
     "fixed.compute.unary_cost_cycles and grid.compute.unary_cost_cycles.exp both set"),
    # fields no point reads: every value would repeat one result
    ("grid:\n  arch: [gpu-h100]\n  system.link_bandwidth_bytes_per_s: [100GB/s, 450GB/s]",
     "grid.system.link_bandwidth_bytes_per_s: the system section joins several devices"),
    ("fixed:\n  model: mamba-130m\n  kernels.sm_offchip_bytes_per_s: 1e11",
     "fixed.kernels.sm_offchip_bytes_per_s: an SM's bandwidth matters only"),
])
def test_every_field_of_a_sweep_is_checked_when_the_spec_is_read(tmp_path, setting, needle) -> None:
    head = "grid:\n  model: [mamba-130m]\n" if "model" not in setting else "grid:\n  seq_len: [64]\n"
    text = head + setting.replace("grid:\n", "") if setting.startswith("grid:") else head + setting
    assert needle in _load_error(tmp_path, text)


def test_a_combination_that_is_impossible_is_left_to_its_points(tmp_path) -> None:
    """A value some design takes (an energy field: mambalaya has the section, gpu-h100 not; a
    buffer smaller than the PE-local level) loads; the points that cannot run fail alone."""
    spec = load_sweep_spec(write_spec(tmp_path, "grid:\n  model: [mamba-130m]\n  arch: [mambalaya, gpu-h100]\n"
                                      "  energy.dram_pj_per_bit: [3]\n  memory.onchip_buffer_bytes: [64]\n"))
    assert len(spec.points()) == 2


def test_a_hybrid_moe_points_stored_attention_share_equals_what_compare_reports(tmp_path) -> None:
    """Granite 4.0-H's attention layers are 'attention-moe': the store's attention_share (once
    left empty) holds their share of the time, equal to the one compare reports."""
    from mambalaya.experiments.hybrid import hybrid_compare_rows
    from mambalaya.workloads import resolve_model

    spec = load_sweep_spec(write_spec(tmp_path, "grid:\n  model: [granite-4.0-h-tiny]\n  arch: [marca-ideal]\n"
                                      "  phase: [decode]\n  seq_len: [256]\n  batch: [1]\n"))
    summary = run_sweep(spec, workers=1)
    assert summary.failed == 0
    (stored_share,) = stored(spec.store)["attention_share"]
    (row,) = hybrid_compare_rows(["marca-ideal"], "granite-4.0-h-tiny", resolve_model("granite-4.0-h-tiny"),
                                 phase="decode", seq_lens=[256], batch=1, baseline="marca-ideal")
    attention = [k for k in row if k.startswith("attention") and k.endswith("_share")]
    assert attention == ["attention_share", "attention-moe_share"]  # all attention layers together, then by type
    assert row["attention_share"] == row["attention-moe_share"]
    assert 0 < stored_share < 1 and stored_share == pytest.approx(row["attention-moe_share"], rel=1e-12)


DEVICES_SWEEP = """
name: devices
chunk_size: 4
grid:
  devices: [1, 2, 4]
  parallel: [pipeline, tensor, sequence]
  system.link_bandwidth_bytes_per_s: [450e9, 50e9]
fixed:
  arch: gpu-h100
  model: mamba2-130m
  phase: prefill
  seq_len: 4096
  batch: 4
"""


@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_devices_and_the_parallel_strategy_are_sweep_axes(tmp_path) -> None:
    """A point over several devices is the evaluation over them (its latency includes the
    collectives, its strategy and interconnect time are outputs); the system's links are read
    once a point runs on several devices; a device count or strategy that is not one is refused
    before any point runs."""
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.workloads import PRESETS

    spec = load_sweep_spec(write_spec(tmp_path, DEVICES_SWEEP))
    results = {(r.point["devices"], r.point["parallel"], r.point["system.link_bandwidth_bytes_per_s"]): r
               for r in evaluate_chunk(spec.points())}
    assert not [k for k, r in results.items() if r.error]
    tensor = results[(4, "tensor", 450e9)].outputs
    ev = evaluate("gpu-h100", "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill", seq_len=4096, batch=4, devices=4,
                  parallel="tensor")
    assert tensor["model_latency_s"] == ev.model_latency_s and tensor["parallel_used"] == "tensor"
    assert tensor["interconnect_s"] == ev.layer_split.interconnect_s > 0
    assert results[(4, "tensor", 50e9)].outputs["interconnect_s"] > tensor["interconnect_s"]  # slower links
    one = results[(1, "pipeline", 450e9)].outputs
    assert one["model_latency_s"] == evaluate("gpu-h100", "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill",
                                              seq_len=4096, batch=4).model_latency_s
    assert results[(2, "sequence", 450e9)].outputs["model_latency_s"] < one["model_latency_s"]
    summary = run_sweep(spec, workers=1)
    assert summary.computed == len(spec.points()) and summary.failed == 0
    df = stored(spec.store)
    assert {"devices", "parallel", "system.link_bandwidth_bytes_per_s"} <= set(df.columns)
    for bad, needle in (("devices: [0]", "is not a device count"), ("parallel: [data]", "is not a parallel strategy")):
        text = DEVICES_SWEEP.replace("devices: [1, 2, 4]", bad) if "devices" in bad else \
            DEVICES_SWEEP.replace("parallel: [pipeline, tensor, sequence]", bad)
        with pytest.raises(SpecError, match=needle):
            load_sweep_spec(write_spec(tmp_path, text, "bad.yaml"))
    one_device = DEVICES_SWEEP.replace("devices: [1, 2, 4]\n  parallel: [pipeline, tensor, sequence]\n", "")
    with pytest.raises(SpecError, match="system section joins several devices"):
        load_sweep_spec(write_spec(tmp_path, one_device, "one.yaml"))


def test_a_file_edited_since_its_points_were_stored_makes_new_points(tmp_path, monkeypatch) -> None:
    """A design or model file named by a sweep is read beside the spec, and its bytes are part of
    each point's id: edited, its points run again (the stored result of the old file was reused
    under the same name before), and the files' digest is stored with the inputs."""
    from mambalaya.arch import arch_to_yaml, load_arch
    from mambalaya.experiments.sweep_spec import FILES_KEY

    folder = tmp_path / "study"
    folder.mkdir()
    design = folder / "mine.yaml"
    design.write_text(arch_to_yaml(load_arch("mambalaya")), encoding="utf-8")
    (folder / "tiny.yaml").write_text("family: mamba1\nd_model: 128\nn_layers: 2\n", encoding="utf-8")
    spec_path = write_spec(folder, "grid: {arch: [mine.yaml, mambalaya], model: [tiny.yaml, mamba-130m]}\n"
                                   "fixed: {seq_len: 64, batch: 1}\n")
    monkeypatch.chdir(tmp_path)  # not the spec's folder: its files are still found beside it
    spec = load_sweep_spec(spec_path)
    assert run_sweep(spec, workers=1).computed == 4
    assert {FILES_KEY in p for p in spec.points()} == {True, False}  # the shipped pair names no file
    design.write_text(arch_to_yaml(load_arch("mambalaya")).replace("clock_hz: 1750000000.0", "clock_hz: 500000000.0"),
                      encoding="utf-8")
    again = run_sweep(load_sweep_spec(spec_path), workers=1)
    assert again.computed == 2 and again.already_done == 2  # the edited design's two points
    df = stored(spec.store)
    mine = df[(df["arch"] == str(design.resolve())) & (df["model"] == "mamba-130m")].sort_values("latency_s")
    assert len(mine) == 2 and mine["latency_s"].iloc[1] > 2 * mine["latency_s"].iloc[0]  # the slower clock's
    with pytest.raises(SpecError, match=FILES_KEY):
        load_sweep_spec(write_spec(folder, f"grid: {{model: [mamba-130m]}}\nfixed: {{{FILES_KEY}: x}}\n", "bad.yaml"))


def test_a_chunk_the_cluster_loses_is_submitted_again_and_recorded_once() -> None:
    """A chunk whose task fails on the cluster (a worker killed mid-task; distributed's executor
    once raised a ValueError of its own for it, failing the whole sweep) is submitted again, and
    recorded once; past CLUSTER_TRIES the failure is the sweep's."""
    from concurrent.futures import Future

    from mambalaya.experiments import sweep as sweep_module

    class Flaky:
        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, []

        def submit(self, fn, chunk, own_worker=False):
            self.calls.append(chunk[0])
            fut: Future = Future()
            if chunk[0] == "lost" and self.failures > 0:
                self.failures -= 1
                fut.set_exception(ValueError("not enough values to unpack (expected 3, got 2)"))
            else:
                fut.set_result([chunk[0]])
            return fut

    recorded = []
    executor = Flaky(failures=1)
    sweep_module._submit_chunks(executor, [["kept"], ["lost"]], False, lambda k, r: recorded.append((k, r)))
    assert sorted(recorded) == [(0, ["kept"]), (1, ["lost"])] and executor.calls.count("lost") == 2
    with pytest.raises(ValueError):
        sweep_module._submit_chunks(Flaky(failures=sweep_module.CLUSTER_TRIES), [["lost"]], False, lambda k, r: None)


@pytest.mark.parametrize("text, needle", [
    ("grid: {model: [mamba-130m, mamba-130m]}\n", "grid.model: 'mamba-130m' is given twice"),
    ("grid: {model: [mamba-130m], seq_len: [512, 512]}\n", "grid.seq_len: 512 is given twice"),
    ("grid: {model: [mamba-130m], memory.onchip_buffer_bytes: [16MiB, 16777216]}\n",
     "'16MiB' and 16777216 read as one value"),
    ("grid: {model: [mamba-130m], memory.offchip_bandwidth_bytes_per_s: [1e12, 1 TB/s]}\n", "read as one value"),
    ("grid: {model: [mamba-130m], area.sram_um2_per_bit: [0.03, 0.3]}\n", "the SRAM's area moves the chip's area alone"),
])
def test_a_sweep_axis_repeating_a_point_or_reading_nothing_is_refused(tmp_path, text, needle) -> None:
    """A repeated value was one point without a word; two spellings of one value (16MiB and
    16777216) were two rows of one design, counted twice by a plot's mean; the SRAM's area on
    designs without an overhead on it moves only the area, which no point stores."""
    with pytest.raises(SpecError, match=re.escape(needle)):
        load_sweep_spec(write_spec(tmp_path, text + "fixed: {batch: 2}\n"))


PER_LAYER_SWEEP = """
name: per-layer
chunk_size: 4
grid:
  model: [mamba-130m, bamba-9b]
fixed:
  devices: 2
  arch: linked.yaml
  parallel: tensor
  phase: prefill
  seq_len: 256
  batch: 2
"""


def test_a_points_per_layer_figures_mean_one_thing_for_every_family(tmp_path) -> None:
    """Over several devices, a Mamba point's per-layer latency, energy and throttled latency are
    the model's over its layers (collectives, every device's energy and links), as a hybrid
    point's are; they were one device's part of a layer for Mamba and the model's mean for a
    hybrid, two meanings in one column. Every point carries layer_power_w, what its
    over_power_budget judges."""
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.workloads import PRESETS

    from importlib import resources

    shipped = resources.files("mambalaya.arch.specs").joinpath("mambalaya.yaml").read_text()
    linked = shipped + "\nsystem:\n  link_bandwidth_bytes_per_s: 450 GB/s\n  link_latency_s: 3.0e-6\n"
    (tmp_path / "linked.yaml").write_text(linked)
    spec = load_sweep_spec(write_spec(tmp_path, PER_LAYER_SWEEP))
    results = {(r.point["model"], r.point["devices"]): r for r in evaluate_chunk(spec.points())}
    assert not [k for k, r in results.items() if r.error], [r.error for r in results.values()]
    for (model, devices), r in results.items():
        out, n = r.outputs, PRESETS[model].n_layers
        assert out["latency_s"] * n == pytest.approx(out["model_latency_s"], rel=1e-12), (model, devices)
        assert out["over_power_budget"] == (out["layer_power_w"] > out["power_budget_w"])
    from mambalaya.arch import load_arch

    ev = evaluate(load_arch(str(tmp_path / "linked.yaml")), "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=2, devices=2,
                  parallel="tensor")
    t = ev.totals()
    two = results[("mamba-130m", 2)].outputs
    assert two["layer_energy_j"] * 24 == pytest.approx(t["model_energy_j"], rel=1e-12)
    assert two["throttled_latency_s"] * 24 == pytest.approx(t["throttled_model_latency_s"], rel=1e-12)
    assert two["layer_energy_j"] > t["layer_energy_j"]  # every device's, not one device's part


def test_an_option_of_another_sweep_mode_is_refused(tmp_path) -> None:
    """sweep ran a spec with -o and --format and wrote nothing; sweep export STORE --store OTHER read
    the first store: an option is refused in a mode that does not take it, naming its mode."""
    spec = write_spec(tmp_path, PER_LAYER_SWEEP)
    ran = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "out.csv"), "--format", "parquet"])
    assert ran.exit_code == 1 and "--format (for export)" in ran.output and "--output (for export and plot)" in ran.output
    assert not (tmp_path / "out.csv").exists()
    exported = runner.invoke(app, ["sweep", "export", str(tmp_path / "a.sqlite"), "-o", str(tmp_path / "e.csv"),
                                   "--store", str(tmp_path / "b.sqlite")])
    assert exported.exit_code == 1 and "does not take --store (for run)" in exported.output
    plotted = runner.invoke(app, ["sweep", "plot", str(tmp_path / "a.sqlite"), "--workers", "2"])
    assert plotted.exit_code == 1 and "--workers (for run)" in plotted.output
