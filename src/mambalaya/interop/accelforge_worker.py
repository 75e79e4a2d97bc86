"""The AccelForge worker's client side: finding a Python >= 3.12 that has accelforge, and one
long-lived process of it serving cross-checks (:class:`AccelForgeWorker`). The serving loop is
``python -m mambalaya.interop.accelforge --serve``; both cross-checks
(:mod:`mambalaya.interop.accelforge`, :mod:`mambalaya.interop.accelforge_spatial`) call it
through :meth:`AccelForgeWorker.call`."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import MambalayaError


def find_python312() -> str | None:
    """A Python >= 3.12 with accelforge and mambalaya importable: ``$MAMBALAYA_ACCELFORGE_PYTHON``,
    else the repository's ``.venv-af`` (made by ``scripts/accelforge-env.sh``), else
    ``/tmp/af312/bin/python``, else ``python3.12`` on PATH."""
    import shutil

    repo_venv = Path(__file__).resolve().parents[3] / ".venv-af" / "bin" / "python"
    candidates = [os.environ.get("MAMBALAYA_ACCELFORGE_PYTHON"), str(repo_venv), "/tmp/af312/bin/python",
                  shutil.which("python3.12")]
    for c in candidates:
        if not c or not Path(c).exists():
            continue
        probe = subprocess.run(
            [c, "-c", "import sys, accelforge, mambalaya; assert sys.version_info >= (3, 12)"],
            capture_output=True, timeout=120, check=False,
        )
        if probe.returncode == 0:
            return c
    return None


#: What starts the worker's result line on its stdout (the rest is JSON).
RESULT_PREFIX = "MAMBALAYA-RESULT "


class AccelForgeWorker:
    """One long-lived Python >= 3.12 process with accelforge imported, serving cross-checks one
    at a time (``python -m mambalaya.interop.accelforge --serve``): its start-up (about 3 s of
    imports) is paid once for many checks. Requests go over as pickles in a temporary folder,
    results come back as JSON lines; AccelForge's own output goes to a log file."""

    def __init__(self, python312: str, jobs: int | None = None):
        """``jobs``: AccelForge's parallel processes (its default: one per core). A caller that
        already keeps every core busy (a parallel test run) passes 1."""
        self.python312 = python312
        self._tmp = tempfile.TemporaryDirectory(prefix="mambalaya-af-worker-")
        self._log = open(Path(self._tmp.name, "accelforge.log"), "w+", encoding="utf-8")  # noqa: SIM115
        jobs_args = [] if jobs is None else ["--jobs", str(jobs)]
        self._proc = subprocess.Popen([python312, "-m", "mambalaya.interop.accelforge", "--serve", *jobs_args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._n = 0

    def call(self, kind: str, cascade: Cascade, **kwargs: Any) -> dict:
        """``kind``: ``traffic`` (:func:`cross_check`) or ``gemm_cycles``
        (:func:`~mambalaya.interop.accelforge_spatial.accelforge_gemm_cycles`)."""
        self._n += 1
        request = Path(self._tmp.name, f"request-{self._n}.pkl")
        request.write_bytes(pickle.dumps({"kind": kind, "cascade": cascade, "kwargs": kwargs}))
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(f"{request}\n")
            self._proc.stdin.flush()
            for line in self._proc.stdout:
                if line.startswith(RESULT_PREFIX):
                    out = json.loads(line[len(RESULT_PREFIX):])
                    break
            else:
                raise BrokenPipeError("the worker exited")
        except (BrokenPipeError, OSError) as err:
            self._log.seek(0)
            raise MambalayaError(f"AccelForge worker in {self.python312} failed ({err}):\n{self._log.read()[-3000:]}") from None
        if "error" in out:
            raise MambalayaError(f"AccelForge {kind} check in {self.python312} failed:\n{out['error']}")
        return out["result"]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()
        self._tmp.cleanup()


__all__ = ["RESULT_PREFIX", "AccelForgeWorker", "find_python312"]
