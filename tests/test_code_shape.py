"""The shape of the code (issue 43): no module is part of an import circle, no module imports
another module's private name (a name another module needs is part of its owner's interface),
and no folder holds more than 15 modules directly. Every import is read from the source with
``ast``: function-local ones and those under ``if TYPE_CHECKING:`` too, so a late import cannot
hide a circle. (The direction between stages is checked in ``test_module_direction.py``.)"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "mambalaya"
MAX_MODULES_PER_FOLDER = 15


@dataclass(frozen=True)
class Import:
    """One import in ``module``: of ``target`` (a module of the package), taking ``name`` from it
    (None: the module itself), at ``line``."""

    module: str
    target: str
    name: str | None
    line: int


def modules(src: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``src``, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def imports(src: Path, package: str = PACKAGE) -> list[Import]:
    """Every import of a package module by a package module, read with ast, and every access
    ``alias._name`` to a module imported as ``alias``."""
    known = modules(src, package)
    found: list[Import] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in known:  # a module, imported by name
                        found.append(Import(module, f"{base}.{alias.name}", None, node.lineno))
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                    elif base in known:
                        found.append(Import(module, base, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known:
                        found.append(Import(module, alias.name, None, node.lineno))
                        if alias.asname:
                            aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                found.append(Import(module, aliases[node.value.id], node.attr, node.lineno))
    return found


def circles(src: Path, package: str = PACKAGE) -> list[list[str]]:
    """The import circles between modules (strongly connected components of more than one
    module), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports(src, package):
        if imp.target != imp.module:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(modules(src, package)):
        if node not in index:
            visit(node)
    return found


def private_imports(src: Path, package: str = PACKAGE) -> list[str]:
    """Each use of another module's private name (``_x``, not a dunder), as "module:line takes
    target._x"."""
    return sorted(f"{i.module}:{i.line} takes {i.target}.{i.name}" for i in imports(src, package)
                  if i.name and i.name.startswith("_") and not i.name.startswith("__") and i.target != i.module)


def crowded_folders(src: Path, package: str = PACKAGE, most: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    """Folders holding more than ``most`` modules directly (``__init__.py`` not counted)."""
    counts: dict[str, int] = defaultdict(int)
    for path in (src / package).rglob("*.py"):
        if path.name != "__init__.py":
            counts[str(path.parent.relative_to(src))] += 1
    return {folder: n for folder, n in sorted(counts.items()) if n > most}


def test_no_module_is_in_an_import_circle() -> None:
    assert circles(SRC) == []


def test_no_module_takes_another_modules_private_name() -> None:
    assert private_imports(SRC) == []


def test_no_folder_holds_more_than_15_modules() -> None:
    assert crowded_folders(SRC) == {}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Each check finds what it looks for in a small package made to break it: a circle through
    a function-local import and one under TYPE_CHECKING, a private name taken by ``from``
    and one reached through a module alias, and a crowded folder."""
    src = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import helper\n_hidden = 1\n",
        "pkg/b.py": "def helper():\n    from pkg import a\n    return a._hidden\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import D\n",
        "pkg/d.py": "from pkg.c import _private_c\nclass D: ...\n",
        **{f"pkg/many/m{i}.py": "" for i in range(MAX_MODULES_PER_FOLDER + 1)},
    })
    assert circles(src, "pkg") == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert private_imports(src, "pkg") == ["pkg.b:3 takes pkg.a._hidden", "pkg.d:1 takes pkg.c._private_c"]
    assert crowded_folders(src, "pkg") == {"pkg/many": MAX_MODULES_PER_FOLDER + 1}
    assert crowded_folders(src, "pkg", most=MAX_MODULES_PER_FOLDER + 1) == {}
