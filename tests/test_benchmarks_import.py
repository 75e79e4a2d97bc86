"""Every benchmark script still imports against the library (they run outside the test
command, so an API change would otherwise leave one broken until someone runs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 8


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_imports(script: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines main(); runs nothing at import
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
