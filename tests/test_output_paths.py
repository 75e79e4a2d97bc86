"""Output paths are checked once, before any work (mambalaya.outputs), files are written
whole, and ``--unroll`` refuses a cascade too large to read back before building it.

What is real and what is simulated here:

* an existing file, a folder, a path under a file: real, in ``tmp_path``;
* a folder that cannot be written: the tests run as root in CI, where permission bits stop
  nothing, so ``unwritable`` simulates the operating system refusing to create a file there
  (``tempfile.mkstemp`` in the checking module raises ``PermissionError``); a real read-only
  mount (``unshare -m`` + ``mount --bind -o ro``, root only) and a real ``chmod 555`` folder
  (non-root only) are tried where the machine allows, and skipped, saying why, where it does not.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mambalaya import specio
from mambalaya.cli import app
from mambalaya import outputs
from mambalaya.outputs import atomic_output, check_output_path, write_text_output
from mambalaya.einsum.cascade_file import dump_cascade
from mambalaya.einsum.unroll import MAX_UNROLLED_TEXT_BYTES, check_unroll_size, unroll_recurrences, unrolled_size
from mambalaya.errors import SpecError
from mambalaya.workloads import build_layer, resolve_model

runner = CliRunner()

#: Every command that writes, the option naming where, and what it names ("file" or "directory").
#: The layer commands get a small layer so that a missed check would not take long either.
SMALL = ("-L", "16")
WRITERS = {
    "reproduce": (["reproduce"], "--out", "directory"),
    "reproduce-hybrid": (["reproduce", "--suite", "hybrid"], "--out", "directory"),
    "sensitivity": (["sensitivity"], "--out", "directory"),
    "export-accelforge": (["export", "accelforge"], "--output", "directory"),
    "cascade-diagram": (["cascade", "diagram", *SMALL], "--output", "file"),
    "cascade-dump": (["cascade", "dump", *SMALL], "--output", "file"),
    "cascade-show": (["cascade", "show", *SMALL], "--output", "file"),
    "cascade-check": (["cascade", "check", "CASCADE"], "--output", "file"),
    "fusion-classes": (["fusion", "classes", *SMALL], "--output", "file"),
    "fusion-map": (["fusion", "map", *SMALL], "--output", "file"),
    "fusion-map-save": (["fusion", "map", *SMALL], "--save", "file"),
    "fusion-pareto": (["fusion", "pareto", *SMALL], "--output", "file"),
    "arch-show": (["arch", "show", "mambalaya"], "--output", "file"),
    "validate": (["validate"], "--out", "directory"),
    "evaluate": (["evaluate", "-L", "16"], "--output", "file"),
    "compare": (["compare", "--seq-lens", "16"], "--output", "file"),
}

#: Commands whose work starts in a store: checked for the two target classes a store path allows.
STORE_COMMANDS = {
    "sweep-export": (["sweep", "export", "no-such-store.sqlite"], "--output", "file"),
    "sweep-plot": (["sweep", "plot", "no-such-store.sqlite"], "--output", "directory"),
}



@pytest.fixture
def unwritable(monkeypatch) -> None:
    """Simulate a folder the operating system will not create files in (as a non-root user in a
    chmod 555 folder, or on a read-only mount): the checker's write test is refused."""
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)


def _tree(root: Path) -> dict[str, int | None]:
    """Every path under ``root`` with its size (None for folders): what a command changed."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.stat().st_size) for p in sorted(root.rglob("*"))}


def _bad_targets(tmp_path: Path, kind: str) -> dict[str, Path]:
    """One target per class a ``kind`` output refuses (the unwritable one needs ``unwritable``)."""
    a_file = tmp_path / "a_file.svg"
    a_file.write_text("mine\n")
    a_folder = tmp_path / "a_folder"
    a_folder.mkdir()
    return {
        "wrong kind": a_file if kind == "directory" else a_folder,
        "under a file": a_file / "inside" / ("out" if kind == "directory" else "out.svg"),
        "unwritable": tmp_path / "new" / ("out" if kind == "directory" else "out.svg"),
    }


def _run(args: list[str], option: str, target: Path, cascade_file: Path | None = None):
    args = [str(cascade_file) if a == "CASCADE" else a for a in args]
    start = time.perf_counter()
    result = runner.invoke(app, [*args, option, str(target)])
    return result, time.perf_counter() - start


@pytest.fixture(scope="module")
def cascade_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cascade") / "layer.yaml"
    path.write_text(dump_cascade(build_layer(resolve_model("mamba-130m"), phase="prefill", seq_len=16, batch=1, bits=16,
                                             state_io=None, name="small")), encoding="utf-8")
    return path


def _assert_refused_before_work(result, seconds: float, option: str, target: Path, started: list[str]) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.stderr.startswith("error:"), result.stderr
    assert option in result.stderr and str(target) in result.stderr.replace("\n", "")
    assert "Traceback" not in result.output
    assert started == [], f"work started before the refusal: {started}"
    assert seconds < 5, f"refused after {seconds:.1f} s"


@pytest.mark.parametrize("case", ["wrong kind", "under a file", "unwritable"])
@pytest.mark.parametrize("command", list(WRITERS))
def test_every_writer_refuses_a_bad_output_path_before_any_work(command, case, tmp_path, work_started, cascade_file,
                                                                  request) -> None:
    args, option, kind = WRITERS[command]
    target = _bad_targets(tmp_path, kind)[case]
    if case == "unwritable":
        request.getfixturevalue("unwritable")
    before = _tree(tmp_path)
    result, seconds = _run(args, option, target, cascade_file)
    _assert_refused_before_work(result, seconds, option, target, work_started)
    assert _tree(tmp_path) == before, "the refused command changed the folder"
    expected = {"wrong kind": "existing", "under a file": "is a file, not a folder", "unwritable": "cannot create files"}
    assert expected[case] in result.stderr


@pytest.mark.parametrize("case", ["wrong kind", "under a file"])
@pytest.mark.parametrize("command", list(STORE_COMMANDS))
def test_sweep_export_and_plot_refuse_too(command, case, tmp_path, work_started) -> None:
    args, option, kind = STORE_COMMANDS[command]
    target = _bad_targets(tmp_path, kind)[case]
    before = _tree(tmp_path)
    result, seconds = _run(args, option, target)
    _assert_refused_before_work(result, seconds, option, target, work_started)
    assert _tree(tmp_path) == before


def test_diagram_refuses_an_unknown_image_format_before_building(tmp_path, work_started) -> None:
    result, seconds = _run(["cascade", "diagram"], "-o", tmp_path / "graph.txt")
    _assert_refused_before_work(result, seconds, "-o", tmp_path / "graph.txt", work_started)
    assert "'.txt'" in result.stderr and ".svg" in result.stderr and list(tmp_path.iterdir()) == []


def test_map_refuses_save_and_output_naming_one_file(tmp_path, work_started) -> None:
    same = tmp_path / "m.yaml"
    result = runner.invoke(app, ["fusion", "map", "-L", "16", "--save", str(same), "-o", str(same)])
    assert result.exit_code == 1 and "--save and --output" in result.stderr and work_started == []


# ------------------------------------------------------------------------------------------
# check_output_path itself
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_good_targets_pass_and_nothing_is_created(tmp_path, kind) -> None:
    (tmp_path / "existing_dir").mkdir()
    (tmp_path / "existing.txt").write_text("x")
    targets = [tmp_path / "new", tmp_path / "a" / "b" / "c", tmp_path / "existing_dir" if kind == "directory"
               else tmp_path / "existing.txt", None]
    before = _tree(tmp_path)
    for target in targets:
        check_output_path(target, kind=kind, option="--out")
    assert _tree(tmp_path) == before


def test_a_device_can_be_a_file_target() -> None:
    check_output_path(Path(os.devnull), kind="file", option="-o")
    with pytest.raises(SpecError, match="existing file, not a folder"):
        check_output_path(Path(os.devnull), kind="directory", option="--out")


def test_each_refusal_is_one_paragraph_naming_option_path_and_culprit(tmp_path) -> None:
    blocker = tmp_path / "results.csv"
    blocker.write_text("x")
    cases = [
        (blocker, "directory", "it is an existing file, not a folder"),
        (tmp_path, "file", "it is an existing folder, not a file"),
        (blocker / "deeper" / "out.json", "file", f"{blocker} is a file, not a folder"),
        (blocker / "figures", "directory", f"{blocker} is a file, not a folder"),
    ]
    for target, kind, expected in cases:
        with pytest.raises(SpecError) as caught:
            check_output_path(target, kind=kind, option="--out")
        text = str(caught.value)
        assert text.startswith(f"--out {target}: ") and expected in text and "\n" not in text


def test_unusable_names_are_refused_not_raised(tmp_path) -> None:
    for target, expected in ((tmp_path / ("x" * 300) / "out.csv", "cannot look at"), ("bad\0name.csv", "not a usable path")):
        with pytest.raises(SpecError, match=expected):
            check_output_path(target, kind="file", option="-o")


def test_an_unwritable_folder_is_refused_when_the_write_test_fails(tmp_path, unwritable) -> None:
    with pytest.raises(SpecError, match=r"cannot create files in .* \(Permission denied\)"):
        check_output_path(tmp_path / "new" / "out.csv", kind="file", option="-o")


def test_permission_bits_are_read_where_they_bind(tmp_path, monkeypatch) -> None:
    """os.access saying no (a non-root user in a chmod 555 folder) is enough, whatever the write test says."""
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: False)
    with pytest.raises(SpecError, match="permission denied"):
        check_output_path(tmp_path / "out", kind="directory", option="--out")


def test_a_read_only_file_system_flag_is_refused(tmp_path, monkeypatch) -> None:
    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(outputs.os, "statvfs", lambda path: ReadOnly())
    with pytest.raises(SpecError, match="read-only file system"):
        check_output_path(tmp_path / "x.yaml", kind="file", option="-o")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root, chmod 555 does not stop writes (the mount test covers root)")
def test_a_real_chmod_555_folder_is_refused(tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(SpecError, match="permission denied"):
            check_output_path(locked / "out", kind="directory", option="--out")
    finally:
        locked.chmod(0o755)


def test_a_real_read_only_mount_is_refused_by_the_command(tmp_path) -> None:
    """A real read-only bind mount in a private mount namespace (root with unshare only)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (f"mount --bind -o ro {ro} {ro} || exit 77; "
              f"exec {sys.executable} -m mambalaya cascade dump -L 16 -o {ro / 'layer.yaml'}")
    done = subprocess.run([unshare, "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if done.returncode == 77:
        pytest.skip(f"mount --bind -o ro is not permitted here: {done.stderr.strip()}")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: --output") and "read-only file system" in done.stderr
    assert list(ro.iterdir()) == []


# ------------------------------------------------------------------------------------------
# Files written whole
# ------------------------------------------------------------------------------------------


def test_a_failed_write_keeps_the_old_file_and_leaves_no_partial_one(tmp_path) -> None:
    target = tmp_path / "table.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as partial:
            assert partial.parent == tmp_path and partial.suffix == ".csv" and partial != target
            partial.write_text("half of the new")
            raise RuntimeError("the renderer failed")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_write_text_output_replaces_whole_keeps_the_mode_and_creates_folders(tmp_path) -> None:
    target = tmp_path / "table.csv"
    target.write_text("old\n")
    target.chmod(0o640)
    write_text_output(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o640
    write_text_output(tmp_path / "a" / "b.json", "{}")
    assert (tmp_path / "a" / "b.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "table.csv"]


def test_a_symlinked_output_keeps_its_link(tmp_path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    write_text_output(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_device_is_written_in_place() -> None:
    write_text_output(os.devnull, "discarded")
    assert Path(os.devnull).exists()


def test_a_failed_diagram_leaves_no_file(tmp_path, monkeypatch) -> None:
    """The diagram is drawn to a temporary file: an error while drawing leaves nothing."""
    import mambalaya.report.diagram as diagram

    drawn = diagram.draw_cascade

    def fails_half_way(cascade, path, **kwargs):
        Path(path).write_text("<svg half")
        raise SpecError("the drawing failed half way")

    target = tmp_path / "graph.svg"
    monkeypatch.setattr(diagram, "draw_cascade", fails_half_way)
    result = runner.invoke(app, ["cascade", "diagram", "-L", "16", "-o", str(target)])
    assert result.exit_code == 1 and "half way" in result.stderr and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(diagram, "draw_cascade", drawn)
    result = runner.invoke(app, ["cascade", "diagram", "-L", "16", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("<?xml") and [p.name for p in tmp_path.iterdir()] == ["graph.svg"]


# ------------------------------------------------------------------------------------------
# --unroll: refused above a stated size, before anything is built
# ------------------------------------------------------------------------------------------


def test_the_unroll_bound_is_what_mambalaya_reads_back() -> None:
    # the bound is on an estimate, so it keeps a margin below the read limit: what is built is read back
    assert specio.MAX_SPEC_BYTES * 0.8 <= MAX_UNROLLED_TEXT_BYTES <= specio.MAX_SPEC_BYTES


def test_dump_unroll_at_a_million_positions_is_refused_before_anything_is_unrolled(tmp_path, monkeypatch) -> None:
    """Refused from its size estimate: the unrolling itself never runs (not a timing: the
    guide keeps speed goals in benchmarks)."""
    from mambalaya.einsum import unroll

    def never(*args, **kwargs):
        raise AssertionError("a step of the million-step cascade was built")

    monkeypatch.setattr(unroll, "_step_tensors", never)  # the first step-building call after the size check
    out = tmp_path / "layer.yaml"
    result = runner.invoke(app, ["cascade", "dump", "-m", "mamba-130m", "-L", "1000000", "--unroll", "-o", str(out)])
    assert result.exit_code == 1 and result.stderr.startswith("error: --unroll at L = 1,000,000"), result.output
    message = " ".join(result.stderr.split())
    assert f"{MAX_UNROLLED_TEXT_BYTES:,} bytes" in message and "1,000,020 Einsums" in message
    assert "H over I = 1,000,000 steps" in message and "at most about" in message
    assert list(tmp_path.iterdir()) == []


def test_export_unroll_scan_at_a_million_is_refused_before_the_folder_is_made(tmp_path) -> None:
    out = tmp_path / "af"
    start = time.perf_counter()
    result = runner.invoke(app, ["export", "accelforge", "--phase", "prefill", "--unroll-scan", "1000000", "-o", str(out)])
    assert result.exit_code == 1 and "--unroll-scan 1,000,000" in result.stderr, result.output
    assert time.perf_counter() - start < 1.0 and not out.exists()


def _layer(model: str, seq_len: int, **kwargs):
    return build_layer(resolve_model(model), phase=kwargs.pop("phase", "prefill"), seq_len=seq_len, batch=1, bits=16,
                       state_io=None, name=f"{model}-{seq_len}", **kwargs)


@pytest.mark.parametrize("model, seq_len, kwargs", [
    ("mamba-130m", 16, {}), ("mamba-130m", 1500, {}), ("mamba2-130m", 300, {"scan": "recurrent"}),
    ("mamba2-130m", 1024, {}), ("mamba-130m", 64, {"phase": "decode"}),
])
def test_the_estimate_is_within_ten_percent_of_the_dump(model, seq_len, kwargs) -> None:
    cascade = _layer(model, seq_len, **kwargs)
    size = unrolled_size(cascade)
    unrolled = unroll_recurrences(cascade)
    actual = len(dump_cascade(unrolled).encode("utf-8"))
    assert 0.9 * actual <= size.text_bytes <= 1.1 * actual, (size.text_bytes, actual)
    assert len(unrolled.einsums) <= size.einsums <= len(unrolled.einsums) + len(size.recurrences)


def test_unroll_refuses_above_a_given_bound_and_builds_below_it() -> None:
    cascade = _layer("mamba-130m", 64)
    size = unrolled_size(cascade)
    with pytest.raises(SpecError, match=rf"I = 64 steps.*about {size.text_bytes:,} bytes, over the bound of 1,000 bytes"):
        unroll_recurrences(cascade, max_text_bytes=1000)
    assert check_unroll_size(cascade, max_text_bytes=size.text_bytes) == size
    assert len(unroll_recurrences(cascade, max_text_bytes=size.text_bytes).einsums) == size.einsums


def test_the_estimate_takes_no_longer_at_a_billion_steps() -> None:
    cascade = _layer("mamba-130m", 10**9)
    start = time.perf_counter()
    size = unrolled_size(cascade)
    assert time.perf_counter() - start < 0.5 and size.einsums > 10**9 and size.text_bytes > 200 * 10**9
