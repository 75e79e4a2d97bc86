"""Shared fixtures: one AccelForge worker process per test process, and the slow tests first."""

from __future__ import annotations

import importlib

import pytest

from mambalaya.interop.accelforge_worker import AccelForgeWorker, find_python312


@pytest.fixture(scope="session")
def accelforge_worker():
    """A long-lived Python >= 3.12 process with accelforge imported, shared by every AccelForge
    cross-check of this test process (its start-up is paid once); skipped, with the reason
    printed, when no such Python exists."""
    found = find_python312()
    if found is None:
        reason = ("no Python >= 3.12 with accelforge and mambalaya importable "
                  "($MAMBALAYA_ACCELFORGE_PYTHON, .venv-af, /tmp/af312/bin/python, python3.12 on PATH)")
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    # one AccelForge process per test process: the test processes already keep every core busy
    worker = AccelForgeWorker(found, jobs=1)
    yield worker
    worker.close()


def pytest_collection_modifyitems(config, items):
    """Run the long tests first (marked ``slow``, or an AccelForge cross-check), so the test
    processes share them instead of one finishing last with a long test."""
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or "accelforge_worker" in item.fixturenames))


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
