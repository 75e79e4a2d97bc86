"""Write docs/api/: one API reference page per package of src/mambalaya, listing every module in
it (mkdocstrings renders each), and print the nav entries for mkdocs.yml. Run after adding,
moving or removing a module; ``tests/test_docs.py`` fails while a module has no page."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "mambalaya"
API = ROOT / "docs" / "api"

#: The pages, in pipeline order: page name -> (title, the packages whose modules it lists).
PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "foundation": ("Reading, errors and outputs", ("specio", "errors", "outputs", "formatting")),
    "einsum": ("mambalaya.einsum: the extended-Einsum IR and cascades", ("einsum",)),
    "arch": ("mambalaya.arch: architecture specs", ("arch",)),
    "workloads": ("mambalaya.workloads: models as cascades", ("workloads",)),
    "workloads-blocks": ("mambalaya.workloads.blocks: the layer blocks", ("workloads/blocks",)),
    "workloads-families": ("mambalaya.workloads.families: the hybrid families", ("workloads/families",)),
    "workloads-hf": ("mambalaya.workloads.hf: the transformers side", ("workloads/hf",)),
    "fusion": ("mambalaya.fusion: fusion classes and mappings", ("fusion",)),
    "cost": ("mambalaya.cost: what a mapping costs", ("cost",)),
    "search": ("mambalaya.search: which mapping", ("search",)),
    "execute": ("mambalaya.execute: the executors", ("execute",)),
    "experiments": ("mambalaya.experiments: evaluations, reproduction and sweeps", ("experiments",)),
    "report": ("mambalaya.report: tables and figures", ("report", "report/figures", "report/diagram")),
    "interop": ("mambalaya.interop: AccelForge and HWComponents", ("interop",)),
}


def page_modules(folders: tuple[str, ...]) -> list[str]:
    """The dotted modules a page lists: each folder's package (if it is one) and its modules."""
    out = []
    for folder in folders:
        path = SRC / folder
        if path.is_dir():
            out.append("mambalaya." + folder.replace("/", "."))
            out += ["mambalaya." + folder.replace("/", ".") + "." + p.stem
                    for p in sorted(path.glob("*.py")) if p.stem != "__init__"]
        else:
            out.append(f"mambalaya.{folder}")
    return out


def write_pages() -> list[str]:
    API.mkdir(exist_ok=True)
    for old in API.glob("*.md"):
        old.unlink()
    nav = []
    for name, (title, folders) in PAGES.items():
        lines = [f"# {title}", ""]
        for module in page_modules(folders):
            lines += [f"::: {module}", "    options:", "      heading_level: 2", ""]
        (API / f"{name}.md").write_text("\n".join(lines), encoding="utf-8")
        nav.append(f"      - {title.split(':')[0]}: api/{name}.md")
    return nav


if __name__ == "__main__":
    print("\n".join(write_pages()))
    sys.exit(0)
