"""Where commands write: every output path checked once, before any work, and files written whole.

Every command that writes a file or a folder calls :func:`check_output_path` on each output
option before it builds, searches or costs anything, so a path that cannot be written fails in
a second with one paragraph naming the option, not with ``FileExistsError``,
``NotADirectoryError`` or ``PermissionError`` after minutes of work. It refuses

* a folder target that is an existing file, or a file target that is an existing folder;
* a target under a file (``-o results.csv/x``): nothing can be created there;
* a target whose nearest existing folder cannot be written: a read-only file system, missing
  permission, or any other reason a file cannot be created there. The test is made for real
  (a temporary file is created and removed), since as root permission bits stop nothing;
* a file target whose suffix is not one the command can write (``suffixes``).

Folders missing on the way are created when the output is written. Files are written whole by
:func:`atomic_output` and :func:`write_text_output`: to a temporary file beside the target that
replaces it only once complete, so an error while writing leaves the old file (or none), never
half of one. A target that exists and is not a regular file (``/dev/stdout``, a FIFO) is
written in place.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

from mambalaya.errors import SpecError

OutputKind = Literal["file", "directory"]

#: Prefix of the temporary files this module creates (the write test and the files being written).
TEMP_PREFIX = ".mambalaya-"


def check_output_path(path: str | os.PathLike[str] | None, *, kind: OutputKind, option: str,
                      suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse, with a :class:`SpecError` naming ``option`` and ``path``, an output ``path`` that
    cannot be written as a ``kind`` ("file" or "directory"); ``None`` (no output asked for) passes.
    See the module docstring for what is refused. Nothing is left behind (the write test's file is removed)."""
    if path is None:
        return
    if kind not in ("file", "directory"):
        raise ValueError(f"kind must be 'file' or 'directory', not {kind!r}")
    shown = f"{option} {os.fspath(path)}"
    target = Path(os.path.abspath(path))
    info = _stat(target, shown)
    if info is not None:
        _check_existing(target, info, kind, shown)
    if kind == "file" and suffixes is not None:
        _check_suffix(Path(path), suffixes, shown)
    if info is not None:
        if kind == "directory":
            _check_writable_folder(target, shown)
            return
        if not stat.S_ISREG(info.st_mode):  # a device or FIFO, written in place
            return
    folder, folder_info = _nearest_existing(target.parent, shown)
    if not stat.S_ISDIR(folder_info.st_mode):
        raise SpecError(f"{shown}: {folder} is a file, not a folder, so nothing can be created under it; "
                        f"name a {_kind_text(kind)} outside it")
    _check_writable_folder(folder, shown)


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` with the same suffix (so a writer that picks the format
    from the suffix still can) for the caller to write; when the block ends without an error it
    replaces ``path``, else it is removed. Missing parent folders are created. A ``path`` that
    exists and is not a regular file (a device such as ``/dev/stdout``, a FIFO) is yielded
    itself; a symbolic link's target is replaced, not the link."""
    given = Path(path)
    try:
        info = os.stat(given)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        yield given
        return
    target = Path(os.path.realpath(given))
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _create_temporary(target, None if info is None else stat.S_IMODE(info.st_mode))
    try:
        yield temporary
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text_output(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole (:func:`atomic_output`), or a :class:`SpecError`
    naming the path and the reason."""
    try:
        with atomic_output(path) as temporary:
            temporary.write_text(text, encoding="utf-8")
    except OSError as err:
        raise SpecError(f"cannot write {os.fspath(path)}: {err.strerror or err}") from None


def _kind_text(kind: OutputKind) -> str:
    return "folder" if kind == "directory" else "file"


def _check_suffix(path: Path, suffixes: tuple[str, ...], shown: str) -> None:
    allowed = tuple("." + s.lower().lstrip(".") for s in suffixes)
    if path.suffix.lower() not in allowed:
        found = f"'{path.suffix}'" if path.suffix else "no extension"
        raise SpecError(f"{shown}: {found} is not a format this command writes; use one of {', '.join(allowed)}")


def _stat(path: Path, shown: str) -> os.stat_result | None:
    """``os.stat(path)``, or None where nothing is there (or a file stands where a folder of its
    path should: :func:`_nearest_existing` names it)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise SpecError(f"{shown}: cannot look at {path}: {err.strerror or err}") from None
    except ValueError as err:  # an embedded NUL byte
        raise SpecError(f"{shown}: not a usable path ({err})") from None


def _nearest_existing(path: Path, shown: str) -> tuple[Path, os.stat_result]:
    """The nearest of ``path`` and its parents that exists, with its status."""
    for candidate in (path, *path.parents):
        info = _stat(candidate, shown)
        if info is not None:
            return candidate, info
    raise SpecError(f"{shown}: no folder on its path exists")  # pragma: no cover - the root exists


def _check_existing(target: Path, info: os.stat_result, kind: OutputKind, shown: str) -> None:
    """Refuse an existing ``target`` of the wrong kind, or a file that cannot be written."""
    is_dir = stat.S_ISDIR(info.st_mode)
    if kind == "directory" and not is_dir:
        raise SpecError(f"{shown}: it is an existing file, not a folder; name a folder (it is created if missing)")
    if kind == "file" and is_dir:
        raise SpecError(f"{shown}: it is an existing folder, not a file; name a file in it instead")
    if kind == "file" and not os.access(target, os.W_OK):
        reason = "it is on a read-only file system" if _read_only_fs(target) else "permission denied"
        raise SpecError(f"{shown}: the existing file cannot be written ({reason})")


def _check_writable_folder(folder: Path, shown: str) -> None:
    """Refuse a folder in which a file cannot be created: tried for real, since permission bits
    do not bind root and a read-only mount binds everyone."""
    problem = None
    if _read_only_fs(folder):
        problem = "it is on a read-only file system"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = "permission denied"
    else:
        problem = _write_test(folder)
    if problem is not None:
        raise SpecError(f"{shown}: cannot create files in {folder} ({problem}); choose a folder you can write to")


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _write_test(folder: Path) -> str | None:
    """Create and remove a temporary file in ``folder``: None if that worked, else the reason."""
    try:
        descriptor, name = tempfile.mkstemp(prefix=TEMP_PREFIX + "write-test-", dir=folder)
    except OSError as err:
        return err.strerror or str(err)
    os.close(descriptor)
    os.unlink(name)
    return None


def _create_temporary(target: Path, mode: int | None) -> Path:
    """A new empty file beside ``target`` with its suffix, created with ``mode`` (an existing
    target's) or the default permissions less the umask."""
    for _ in range(100):
        candidate = target.with_name(f"{TEMP_PREFIX}{target.name}.{secrets.token_hex(4)}.partial{target.suffix}")
        try:
            descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        except FileExistsError:
            continue
        os.close(descriptor)
        if mode is not None:
            os.chmod(candidate, mode)  # the umask applies to os.open's mode; an existing file's is kept whole
        return candidate
    raise OSError(errno.EEXIST, f"no free temporary name beside {target}")  # pragma: no cover
