"""The shape of the code the CLI issue asks for: no source file over 600 lines (the direction
of imports between stages is checked in ``test_module_direction.py``)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "mambalaya"
MAX_LINES = 600


def long_files(root: Path, most: int = MAX_LINES) -> dict[str, int]:
    """Python files under ``root`` over ``most`` lines, with their line counts."""
    counts = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(root.rglob("*.py"))}
    return {name: n for name, n in counts.items() if n > most}


def test_no_source_file_is_over_600_lines() -> None:
    assert not long_files(SRC), f"over {MAX_LINES} lines: {long_files(SRC)}"


def test_the_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    assert long_files(tmp_path) == {"long.py": MAX_LINES + 1}
