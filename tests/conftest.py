"""Shared fixtures: one AccelForge worker process per test process, and the slow tests first."""

from __future__ import annotations

import pytest

from mambalaya.interop.accelforge import AccelForgeWorker, find_python312


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
