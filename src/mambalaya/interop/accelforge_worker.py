"""The AccelForge worker's client side: finding a Python >= 3.12 that has accelforge, one
long-lived process of it serving cross-checks (:class:`AccelForgeWorker`), and AccelForge's
answers recorded per input (:class:`AccelForgeRecords`). The serving loop is
``python -m mambalaya.interop.accelforge --serve``; both cross-checks
(:mod:`mambalaya.interop.accelforge`, :mod:`mambalaya.interop.accelforge_spatial`) make
AccelForge's inputs as text in the caller's interpreter, send them through
:func:`call_accelforge`, and cost our side in the caller's interpreter too.

A request is AccelForge's inputs alone (workload, architecture and mapping YAML, a few numbers),
so its answer is a function of them and of AccelForge's version: :class:`AccelForgeRecords`
keeps answers in a folder keyed by both, and replays one only for the same inputs and, where an
AccelForge is installed, the same version; any other request runs AccelForge. Our side is never
recorded: it is costed afresh each time."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import tempfile
from pathlib import Path

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
        # find_spec, not import: importing accelforge takes seconds, finding it milliseconds
        probe = subprocess.run(
            [c, "-c", "import sys; from importlib.util import find_spec; "
                      "assert sys.version_info >= (3, 12) and find_spec('accelforge') and find_spec('mambalaya')"],
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

    def call(self, kind: str, inputs: dict) -> dict:
        """AccelForge's answer to ``inputs``: ``kind`` ``traffic``
        (:func:`~mambalaya.interop.accelforge.run_traffic`) or ``gemm_cycles``
        (:func:`~mambalaya.interop.accelforge_spatial.run_gemm_cycles`)."""
        self._n += 1
        request = Path(self._tmp.name, f"request-{self._n}.pkl")
        request.write_bytes(pickle.dumps({"kind": kind, "inputs": inputs}))
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


def accelforge_version(python312: str) -> str:
    """The accelforge version installed for ``python312``."""
    probe = subprocess.run([python312, "-c", "from importlib.metadata import version; print(version('accelforge'))"],
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        raise MambalayaError(f"could not read accelforge's version in {python312}: {probe.stderr.strip()[-500:]}")
    return probe.stdout.strip()


def request_key(kind: str, inputs: dict) -> str:
    """A request's name in :class:`AccelForgeRecords`: its kind and the SHA-256 of its inputs."""
    digest = hashlib.sha256(json.dumps({"kind": kind, "inputs": inputs}, sort_keys=True).encode()).hexdigest()
    return f"{kind}-{digest[:32]}"


class AccelForgeRecords:
    """AccelForge's answers kept in ``folder``, one JSON file per request (:func:`request_key`)
    with the accelforge version that gave it. :meth:`call` replays a recorded answer when the
    request's inputs are the same and ``python312``'s accelforge (when there is one) is the version
    recorded; otherwise it runs AccelForge in a worker (started on the first such request) and,
    with ``write=True``, records the answer. ``live=True`` runs every request. ``replayed`` and
    ``ran`` count the requests each way (``ran`` names them)."""

    def __init__(self, folder: Path, python312: str | None, *, live: bool = False, write: bool = False,
                 jobs: int | None = None) -> None:
        self.folder, self.python312, self.live, self.write, self.jobs = Path(folder), python312, live, write, jobs
        self.version = None if python312 is None else accelforge_version(python312)
        self.replayed, self.ran = 0, []
        self._worker: AccelForgeWorker | None = None

    def recorded(self, kind: str, inputs: dict) -> dict | None:
        """The recorded answer to this request, if it may be replayed."""
        path = self.folder / f"{request_key(kind, inputs)}.json"
        if self.live or not path.exists():
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        if self.version is not None and record["accelforge_version"] != self.version:
            return None
        return record["result"]

    def call(self, kind: str, inputs: dict) -> dict:
        answer = self.recorded(kind, inputs)
        if answer is not None:
            self.replayed += 1
            return answer
        if self.python312 is None:
            raise MambalayaError(f"no recorded AccelForge answer for this {kind} request ({request_key(kind, inputs)}) "
                                 "and no Python >= 3.12 with accelforge to run it")
        if self._worker is None:
            self._worker = AccelForgeWorker(self.python312, self.jobs)
        answer = self._worker.call(kind, inputs)
        self.ran.append(request_key(kind, inputs))
        if self.write:
            self.folder.mkdir(parents=True, exist_ok=True)
            record = {"kind": kind, "accelforge_version": self.version, "result": answer}
            (self.folder / f"{request_key(kind, inputs)}.json").write_text(json.dumps(record, indent=1, sort_keys=True)
                                                                            + "\n", encoding="utf-8")
        return answer

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def call_accelforge(accelforge: "str | AccelForgeWorker | AccelForgeRecords", kind: str, inputs: dict) -> dict:
    """AccelForge's answer to a request through ``accelforge``: a Python >= 3.12 with accelforge
    and this mambalaya (a worker started and closed for this call), a worker, or records."""
    if isinstance(accelforge, (AccelForgeWorker, AccelForgeRecords)):
        return accelforge.call(kind, inputs)
    worker = AccelForgeWorker(accelforge)
    try:
        return worker.call(kind, inputs)
    finally:
        worker.close()


__all__ = ["RESULT_PREFIX", "AccelForgeRecords", "AccelForgeWorker", "accelforge_version", "call_accelforge",
           "find_python312", "request_key"]
