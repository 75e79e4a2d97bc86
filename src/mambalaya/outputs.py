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
* a file target whose suffix is not one the command can write (``suffixes``);
* a target that is one of the command's own input files (``inputs``: ``-o model.yaml`` beside
  ``--model model.yaml``, ``sweep export S.sqlite -o S.sqlite``), compared as files (the same
  device and inode: another spelling, a symbolic link or a hard link of the input is the input);
  for a folder target, an input that is one of the files the command writes in it (``writes``).
  An input option whose value is not an existing file (a preset name such as ``mamba-130m``)
  names no input file and is passed over.

:func:`check_outputs_differ` refuses two output options of one command naming one file.

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
from fnmatch import fnmatch
from typing import Iterable, Iterator, Literal, Mapping, Union

from mambalaya.errors import SpecError

OutputKind = Literal["file", "directory"]

#: What an input option names: a path, a name that may be one (a preset name is not a file and
#: is passed over), several of them (``--archs a.yaml,b.yaml``), or nothing.
InputPaths = Union[str, "os.PathLike[str]", None, Iterable[Union[str, "os.PathLike[str]", None]]]

#: Prefix of the temporary files this module creates (the write test and the files being written).
TEMP_PREFIX = ".mambalaya-"


def check_output_path(path: str | os.PathLike[str] | None, *, kind: OutputKind, option: str,
                      suffixes: tuple[str, ...] | None = None, inputs: Mapping[str, InputPaths] | None = None,
                      writes: tuple[str, ...] = ()) -> None:
    """Refuse, with a :class:`SpecError` naming ``option`` and ``path``, an output ``path`` that
    cannot be written as a ``kind`` ("file" or "directory"); ``None`` (no output asked for) passes.

    ``inputs`` maps each of the command's path-valued input options (``"--model"``, ``"STORE"``)
    to its value (see :data:`InputPaths`): a file target that is one of them is refused, naming
    both options. ``writes`` names the files (glob patterns such as ``"figures/*"``, relative to
    the folder) a folder target receives: an input among them is refused the same way.
    See the module docstring for what else is refused. Nothing is left behind (the write test's
    file is removed)."""
    if path is None:
        return
    if kind not in ("file", "directory"):
        raise ValueError(f"kind must be 'file' or 'directory', not {kind!r}")
    shown = f"{option} {os.fspath(path)}"
    target = Path(os.path.abspath(path))
    info = _stat(target, shown)
    if info is not None:
        _check_existing(target, info, kind, shown)
    for input_option, input_path, input_info in _input_files(inputs or {}):
        written = _written_over(target, info, kind, writes, input_path, input_info)
        if written is not None:
            where = "that is" if kind == "file" else f"the command writes {written} in it, and that is"
            raise SpecError(f"{shown}: {where} {input_option} {os.fspath(input_path)}, an input of this command; "
                            f"writing {option} would replace what the command reads. Name another "
                            f"{_kind_text(kind)} for {option}")
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


def check_outputs_differ(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Refuse, naming both options, two of a command's output options (``{"--save": ..., "--output":
    ...}``) that name one file: the second written would replace the first. ``None`` passes."""
    seen: list[tuple[str, str | os.PathLike[str], str]] = []
    for option, path in outputs.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        for other_option, other_path, other_real in seen:
            if real == other_real or _same_existing_file(path, other_path):
                both = (f"{other_option} and {option} both name {os.fspath(path)}"
                        if os.fspath(path) == os.fspath(other_path) else
                        f"{other_option} {os.fspath(other_path)} and {option} {os.fspath(path)} name one file")
                raise SpecError(f"{both}: what {option} writes would replace what {other_option} wrote; "
                                "name two files")
        seen.append((option, path, real))


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


def _input_files(inputs: Mapping[str, InputPaths]) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(option, path, status) of each input value that names an existing regular file; a name
    that is not one (a preset, a missing file the reader will refuse) is passed over."""
    for option, value in inputs.items():
        values = [value] if value is None or isinstance(value, (str, os.PathLike)) else list(value)
        for one in values:
            if one is None:
                continue
            try:
                info = os.stat(one)
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(info.st_mode):
                yield option, Path(one), info


def _written_over(target: Path, info: os.stat_result | None, kind: OutputKind, writes: tuple[str, ...],
                  input_path: Path, input_info: os.stat_result) -> str | None:
    """What writing ``target`` (a file, or the ``writes`` files of a folder) writes over the
    input file ``input_path`` (the target, or the matching entry of ``writes``), or None."""
    if kind == "file":
        return os.fspath(target) if info is not None and _same_inode(info, input_info) else None
    try:  # the input's place, relative to the folder (symbolic links resolved on both sides)
        relative: str | None = Path(os.path.realpath(input_path)).relative_to(os.path.realpath(target)).as_posix()
    except ValueError:
        relative = None
    for pattern in writes:
        if not any(c in pattern for c in "*?[") and _same_existing_file(target / pattern, input_path):
            return pattern
        if relative is not None and fnmatch(relative, pattern):
            return relative
    return None


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _same_existing_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` both exist and are one file (:func:`os.path.samefile`)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


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
