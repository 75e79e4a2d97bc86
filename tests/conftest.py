"""Shared fixtures: AccelForge's recorded answers (else one AccelForge process per test process), and the slow
tests first."""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path

import pytest

# Bytecode caches on, for this process and every process it starts (test workers, worker pools,
# command-line runs): an environment that sets PYTHONDONTWRITEBYTECODE (this project's machines
# do) makes each of the suite's many Python processes compile every module it imports from
# source again. Speed only; the caches go to __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from mambalaya.interop.accelforge_worker import AccelForgeRecords, find_python312, request_key


#: AccelForge's answers to the suite's cross-check requests, recorded per input and version
#: (mambalaya.interop.accelforge_worker.AccelForgeRecords): replayed, so the suite pays
#: AccelForge's minutes once, not on every run. A request whose inputs changed runs AccelForge.
ACCELFORGE_RECORDS = Path(__file__).parent / "data" / "accelforge-records"


class SuiteAccelForge(AccelForgeRecords):
    """The suite's AccelForge: recorded answers, else a live run; without a Python >= 3.12 with
    accelforge, a request with no record skips its test, saying why."""

    def call(self, kind, inputs):
        if self.python312 is None and self.recorded(kind, inputs) is None:
            pytest.skip(f"no recorded AccelForge answer for this {kind} request and {NO_ACCELFORGE}")
        answer = super().call(kind, inputs)
        if self.ran and self.ran[-1] == request_key(kind, inputs) and not (self.live or self.write):
            warnings.warn(f"AccelForge ran for {self.ran[-1]} (no record of these inputs): record it with "
                          "MAMBALAYA_ACCELFORGE_RECORD=1 python -m pytest tests/test_accelforge*.py", stacklevel=2)
        return answer


NO_ACCELFORGE = ("no Python >= 3.12 with accelforge and mambalaya importable "
                 "($MAMBALAYA_ACCELFORGE_PYTHON, .venv-af, /tmp/af312/bin/python, python3.12 on PATH)")


@pytest.fixture(scope="session")
def accelforge_worker():
    """AccelForge for the cross-checks of this test process: recorded answers
    (``tests/data/accelforge-records``), else one long-lived AccelForge process (its start-up paid
    once, on the first request without a record). ``MAMBALAYA_ACCELFORGE_LIVE=1`` runs every
    request; ``MAMBALAYA_ACCELFORGE_RECORD=1`` writes the answers of the requests that ran."""
    found = find_python312()
    if found is None:
        print(f"note: {NO_ACCELFORGE}; the AccelForge cross-checks replay recorded answers only")
    # one AccelForge process per test process: the test processes already keep every core busy
    records = SuiteAccelForge(ACCELFORGE_RECORDS, found, live=os.environ.get("MAMBALAYA_ACCELFORGE_LIVE") == "1",
                              write=os.environ.get("MAMBALAYA_ACCELFORGE_RECORD") == "1", jobs=1)
    yield records
    records.close()


@pytest.fixture(scope="session")
def live_accelforge():
    """AccelForge run live on every request (no records; ``MAMBALAYA_ACCELFORGE_RECORD=1`` writes
    its answers): skipped, saying why, without a Python >= 3.12 with accelforge."""
    found = find_python312()
    if found is None:
        print(f"SKIP: {NO_ACCELFORGE}")
        pytest.skip(NO_ACCELFORGE)
    records = AccelForgeRecords(ACCELFORGE_RECORDS, found, live=True,
                                write=os.environ.get("MAMBALAYA_ACCELFORGE_RECORD") == "1", jobs=1)
    yield records
    records.close()


def pytest_collection_modifyitems(config, items):
    """Run the long tests first (marked ``slow``, or AccelForge run live), so the test
    processes share them instead of one finishing last with a long test."""
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or "live_accelforge" in item.fixturenames))


#: Where the commands' work starts: each replaced by a function that fails the test if called.
WORK = [
    ("mambalaya.cli.layer_options", "LayerArgs.build"),
    ("mambalaya.cli.layer_options", "DesignArgs.config"),
    ("mambalaya.experiments.reproduce", "run_reproduce"),
    ("mambalaya.experiments.hybrid_suite", "run_hybrid_suite"),
    ("mambalaya.experiments.sensitivity", "load_sensitivity_spec"),
    ("mambalaya.experiments.sweep", "run_sweep"),
    ("mambalaya.cli.interop", "model_layer"),
    ("mambalaya.cli.cascade", "load_cascade"),
    ("mambalaya.cli.arch", "design_with_settings"),
    ("mambalaya.experiments.validate", "validate"),
    ("mambalaya.experiments.store", "ResultStore"),
]


@pytest.fixture
def work_started(monkeypatch) -> list[str]:
    started: list[str] = []

    def sentinel(name: str):
        def started_work(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} ran before the output path was checked")
        return started_work

    for module_name, attribute in WORK:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, name, sentinel(attribute))
    return started
