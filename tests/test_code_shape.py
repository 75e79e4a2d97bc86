"""The shape of the code the README promises: no source file over 600 lines, and data flowing
one way, spec -> cascade -> mapping -> cost -> table -> figure (a package never imports from
a later stage's)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mambalaya"
MAX_LINES = 600

#: Each pipeline package and the later stages it must not import.
LATER = {
    "einsum": {"fusion", "model", "experiments", "report", "cli"},
    "arch": {"fusion", "model", "experiments", "report", "cli"},
    "fusion": {"model", "experiments", "report", "cli"},
    "model": {"experiments", "report", "cli"},
    "report": {"experiments", "cli"},
    "experiments": {"cli"},
}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_is_over_600_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in _sources() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "mambalaya" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(LATER))
def test_a_stage_never_imports_a_later_one(package: str) -> None:
    wrong = {str(p.relative_to(SRC)): sorted(_imported_packages(p) & LATER[package])
             for p in sorted((SRC / package).rglob("*.py"))}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"{package} imports from later stages: {wrong}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from mambalaya.experiments.reproduce import run_reproduce\n" + "x = 1\n" * MAX_LINES, encoding="utf-8")
    assert "experiments" in _imported_packages(bad)
    assert len(bad.read_text(encoding="utf-8").splitlines()) > MAX_LINES
