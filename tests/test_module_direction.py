"""Data flows one way between the reproduction and its drawings: every import of a module is
read from its source (function-local ones too), so a late import cannot hide a cycle."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import mambalaya.report


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, anywhere in its source, as absolute dotted names."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def _report_modules() -> list[str]:
    return ["mambalaya.report"] + [
        m.name for m in pkgutil.walk_packages(mambalaya.report.__path__, prefix="mambalaya.report.")
    ]


def test_report_writers_never_import_reproduce() -> None:
    back = sorted(m for m in _imports("mambalaya.experiments.report") if m.startswith("mambalaya.experiments.reproduce"))
    assert back == [], "experiments/report.py must take the tables from its caller, not import reproduce"


@pytest.mark.parametrize("module", _report_modules())
def test_drawings_never_import_the_experiments(module: str) -> None:
    later = sorted(m for m in _imports(module) if m.startswith(("mambalaya.experiments", "mambalaya.cli")))
    assert later == [], f"{module} draws tables; it must not import {later}"


@pytest.mark.parametrize("module", [m for m in _report_modules() if m.startswith("mambalaya.report.figures")])
def test_figures_share_only_the_common_style_with_the_diagram(module: str) -> None:
    diagram = sorted(m for m in _imports(module) if m.startswith("mambalaya.report.diagram"))
    assert diagram == [], f"{module} imports {diagram}; what figures and diagram share is in mambalaya.report.style"
