"""AccelForge's recorded answers (tests/data/accelforge-records): replayed only for the same
inputs and version, and equal to what AccelForge answers now (run live here, on one request of
each kind the suite records)."""

from __future__ import annotations

import json

import pytest

from conftest import ACCELFORGE_RECORDS
from mambalaya.arch import load_arch
from mambalaya.errors import MambalayaError
from mambalaya.interop import accelforge_worker
from mambalaya.interop.accelforge import traffic_inputs
from mambalaya.interop.accelforge_spatial import gemm_cycles_inputs
from mambalaya.interop.accelforge_worker import AccelForgeRecords, request_key
from mambalaya.einsum import loads_cascade
from mambalaya.workloads import PRESETS, build_layer
from test_accelforge import RMSNORM_GEMM


def recorded_requests():
    """One small request of each kind (AccelForge's minutes are in the suite's larger ones, which
    replay): an RMSNorm feeding a GEMM, unfused (tests/test_accelforge.py), and one decode GEMM
    of mamba-2.8b, weight-stationary (tests/test_accelforge_latency.py)."""
    big = build_layer(PRESETS["mamba-2.8b"], phase="decode", seq_len=1, batch=1)
    return [("traffic", traffic_inputs(loads_cascade(RMSNORM_GEMM))),
            ("gemm_cycles", gemm_cycles_inputs(big, ["DL"], load_arch("mambalaya")))]


def test_every_record_names_its_kind_and_version_and_is_named_by_its_inputs_kind():
    files = sorted(ACCELFORGE_RECORDS.glob("*.json"))
    assert files, "the suite's AccelForge records are missing"
    for path in files:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert set(record) == {"kind", "accelforge_version", "result"}, path
        assert path.name.startswith(record["kind"] + "-") and record["accelforge_version"], path


def test_recorded_answers_are_what_accelforge_answers_now(live_accelforge):
    """The records replay AccelForge faithfully: run live on the same inputs (one request of each
    kind, in one AccelForge process), it gives the recorded numbers (its own timings apart). A
    record of these two requests is written with ``MAMBALAYA_ACCELFORGE_RECORD=1``."""
    for kind, inputs in recorded_requests():
        now = live_accelforge.call(kind, inputs)
        path = ACCELFORGE_RECORDS / f"{request_key(kind, inputs)}.json"
        assert path.exists(), f"no record of the {kind} request: record it (see this test's doc)"
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["accelforge_version"] == live_accelforge.version
        if kind == "traffic":
            assert now["bits"] == record["result"]["bits"] and now["latency_s"] == record["result"]["latency_s"]
            continue
        assert set(now) == set(record["result"])
        for name, answer in now.items():
            assert answer["cycles"] == pytest.approx(record["result"][name]["cycles"], rel=1e-12), name
            assert answer["spatial"] == record["result"][name]["spatial"], name


def test_records_replay_the_same_inputs_only_and_never_another_version(tmp_path, monkeypatch):
    inputs = {"workload": "w", "arch": "a"}
    key = request_key("traffic", inputs)
    assert key != request_key("traffic", {**inputs, "arch": "b"}) and key != request_key("gemm_cycles", inputs)
    (tmp_path / f"{key}.json").write_text(json.dumps({"kind": "traffic", "accelforge_version": "1.0",
                                                      "result": {"bits": {"X": 8.0}}}), encoding="utf-8")
    offline = AccelForgeRecords(tmp_path, None)
    assert offline.call("traffic", inputs) == {"bits": {"X": 8.0}} and offline.replayed == 1
    with pytest.raises(MambalayaError, match="no recorded AccelForge answer for this traffic request"):
        offline.call("traffic", {**inputs, "arch": "b"})
    monkeypatch.setattr(accelforge_worker, "accelforge_version", lambda python: "2.0")
    newer = AccelForgeRecords(tmp_path, "/no/python")
    assert newer.recorded("traffic", inputs) is None  # another version: AccelForge runs again
    monkeypatch.setattr(accelforge_worker, "accelforge_version", lambda python: "1.0")
    assert AccelForgeRecords(tmp_path, "/no/python").recorded("traffic", inputs) == {"bits": {"X": 8.0}}
    assert AccelForgeRecords(tmp_path, "/no/python", live=True).recorded("traffic", inputs) is None
