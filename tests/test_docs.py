"""The documentation builds without a broken link, and the tutorial notebook runs top to bottom.

``mkdocs build --strict`` fails on a missing page, a broken link or anchor, and a docstring
mkdocstrings cannot render. The notebook runs in a kernel on this interpreter (so on the same
virtualenv and the same mambalaya as the tests), in a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"
KERNEL_NAME = "mambalaya-test-python"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """Every page in the nav exists, every link and anchor resolves, the API pages render."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "api" / "search" / "index.html").is_file()
    assert (tmp_path / "site" / "tutorial.ipynb").is_file()


def test_the_api_reference_follows_the_source_tree() -> None:
    """Every module of the package except the command line (documented in docs/cli.md) and the
    data folders is on one
    API page, and no page names a module that is gone (``scripts/api_pages.py`` writes them)."""
    src = ROOT / "src"
    modules = set()
    for path in (src / "mambalaya").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__" and parts[1:2] not in (["cli"], ["data"]) and parts != ["mambalaya"]:  # data: files
            modules.add(".".join(parts))
    listed = [line.split()[1] for page in sorted((ROOT / "docs" / "api").glob("*.md"))
              for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("::: ")]
    assert len(listed) == len(set(listed)), "a module is on two API pages"
    assert set(listed) == modules


def kernel_manager(kernel_dir: Path) -> KernelManager:
    """A kernel on this very interpreter: a kernelspec of our own whose argv is sys.executable,
    so neither PATH nor a user-installed ``python3`` kernelspec can pick another Python."""
    spec_dir = kernel_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (tests)",
        "language": "python",
    }))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def run_notebook(path: Path, workdir: Path) -> nbformat.NotebookNode:
    """Execute the notebook in ``workdir``; raises CellExecutionError on the first failing cell."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, km=kernel_manager(workdir / "kernels"), timeout=120, record_timing=False,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return notebook


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")


@pytest.mark.slow
def test_tutorial_notebook_runs(tmp_path):
    notebook = run_notebook(NOTEBOOK, tmp_path)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells
    for cell in code_cells:
        assert cell.execution_count is not None, cell.source
        assert not [out for out in cell.outputs if out.output_type == "error"], cell.source
    rejected = [cell for cell in code_cells if "rejected-mapping" in cell.metadata.get("tags", [])]
    assert len(rejected) == 1
    assert "rejected:" in _text(rejected[0]) and "[rule: reduction]" in _text(rejected[0])
    shown = [out for cell in code_cells for out in cell.outputs if out.output_type in ("display_data", "execute_result")]
    assert any("image/svg+xml" in out.data for out in shown), "the cascade diagram is not shown"
    figure = next(cell for cell in code_cells if "plt.subplots" in cell.source)
    assert any("image/png" in out.data for out in figure.outputs if "data" in out), "the figure cell draws no figure"
    hybrid = code_cells[-1]  # a hybrid layer run step by step, its config read as transformers reads it
    assert "rotated channels 6" in _text(hybrid) and "layer 1 (attention): outputs" in _text(hybrid)


if __name__ == "__main__":
    # Refresh the committed notebook's outputs: python tests/test_docs.py
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        executed = run_notebook(NOTEBOOK, Path(work))
    nbformat.write(executed, NOTEBOOK)
    print(f"wrote {NOTEBOOK}")
