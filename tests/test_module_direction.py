"""Data flows one way between the reproduction and its drawings: every import of a module is
read from its source (function-local ones too), so a late import cannot hide a cycle."""

from __future__ import annotations

import ast
import importlib
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


@pytest.mark.parametrize("writer", ["mambalaya.experiments.report", "mambalaya.experiments.report_figures"])
def test_report_writers_never_import_reproduce(writer: str) -> None:
    back = sorted(m for m in _imports(writer) if m.startswith("mambalaya.experiments.reproduce"))
    assert back == [], f"{writer} must take the tables from its caller, not import reproduce"


#: Each package and the later stages it must not import. The pipeline: spec (einsum, arch) ->
#: cascade (workloads) -> mapping (fusion) -> cost -> search -> experiments (tables) -> report
#: (figures) -> cli. The cost model never searches and knows no workload; the search calls the
#: cost model, never the reverse; the executors (execute) run cascades beside the cost model,
#: which never runs them; interop exports and cross-checks, and only the CLI calls it. The
#: foundation modules (errors, specio, outputs, formatting) import no stage at all.
_AFTER_SPEC = ("workloads", "fusion", "cost", "search", "execute", "experiments", "report", "interop", "cli")
LATER_STAGES = {
    "einsum": _AFTER_SPEC,
    "arch": _AFTER_SPEC,
    "workloads": ("fusion", "cost", "search", "execute", "experiments", "report", "interop", "cli"),
    "fusion": ("workloads", "cost", "search", "execute", "experiments", "report", "interop", "cli"),
    "cost": ("workloads", "search", "execute", "experiments", "report", "interop", "cli"),
    "search": ("workloads", "execute", "experiments", "report", "interop", "cli"),
    "execute": ("cost", "search", "experiments", "report", "interop", "cli"),
    "report": ("workloads", "search", "execute", "experiments", "interop", "cli"),
    "interop": ("experiments", "report", "cli"),
    "experiments": ("cli",),
    "errors": ("einsum", "arch", *_AFTER_SPEC),
    "specio": ("einsum", "arch", *_AFTER_SPEC),
    "outputs": ("einsum", "arch", *_AFTER_SPEC),
    "formatting": ("einsum", "arch", *_AFTER_SPEC),
}


def test_every_package_has_its_stages() -> None:
    """A package added later gets its row here too (its stage decides what it may import)."""
    root = Path(mambalaya.report.__file__).parents[1]
    packages = {p.stem if p.suffix == ".py" else p.name for p in root.iterdir()
                if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").exists()}
    assert packages - set(LATER_STAGES) == {"cli"}


def _package_modules(package: str) -> list[str]:
    pkg = importlib.import_module(f"mambalaya.{package}")
    if not hasattr(pkg, "__path__"):  # a single-module stage (specio, outputs, ...)
        return [pkg.__name__]
    return [pkg.__name__] + [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.")]


def _later_imports(package: str, later: tuple[str, ...]) -> dict[str, list[str]]:
    """Per module of ``mambalaya.<package>``, what it imports from ``mambalaya.<later...>``."""
    found = {}
    for module in _package_modules(package):
        hits = sorted(i for i in _imports(module) if i.split(".")[0] == "mambalaya" and i.split(".")[1:2] and i.split(".")[1] in later)
        if hits:
            found[module] = hits
    return found


@pytest.mark.parametrize("package", sorted(LATER_STAGES))
def test_a_stage_never_imports_a_later_one(package: str) -> None:
    wrong = _later_imports(package, LATER_STAGES[package])
    assert not wrong, f"{package} imports from later stages: {wrong}"


def test_the_stage_check_sees_imports() -> None:
    assert _later_imports("cli", ("experiments",))  # the CLI calls the experiments: the check can fail


@pytest.mark.parametrize("module", _report_modules())
def test_drawings_never_import_the_experiments(module: str) -> None:
    later = sorted(m for m in _imports(module) if m.startswith(("mambalaya.experiments", "mambalaya.cli")))
    assert later == [], f"{module} draws tables; it must not import {later}"


@pytest.mark.parametrize("module", [m for m in _report_modules() if m.startswith("mambalaya.report.figures")])
def test_figures_share_only_the_common_style_with_the_diagram(module: str) -> None:
    diagram = sorted(m for m in _imports(module) if m.startswith("mambalaya.report.diagram"))
    assert diagram == [], f"{module} imports {diagram}; what figures and diagram share is in mambalaya.report.style"
