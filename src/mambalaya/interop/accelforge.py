"""Export mambalaya cascades to AccelForge and cross-check off-chip traffic against it.

AccelForge (PyPI ``accelforge``, Python >= 3.12) is a fusion-aware accelerator model. This module
writes its workload / architecture / mapping YAML from a mambalaya :class:`Cascade` and, under
Python >= 3.12 with ``accelforge`` importable, runs AccelForge's model to compare per-tensor
off-chip (``MainMemory``) bits with :mod:`mambalaya.cost.traffic`. It imports under Python 3.11
without AccelForge; only :func:`cross_check` / :func:`mapper_check` import it. From 3.11, call
:func:`cross_check_via` with a 3.12 interpreter that has both mambalaya (``pip install -e``) and
accelforge: it pickles the cascade to ``python -m mambalaya.interop.accelforge`` and reads JSON.

What the export approximates (AccelForge's Einsums are tensor accesses plus an iteration space;
they carry no operator semantics and no recurrences):

* Operators: every Einsum is a multiply-accumulate over its rank variables. Nonlinear functions
  (``silu``, ``softplus``, ``exp``, ``rsqrt``), ``+ - /``, constants and parameters (``eps``,
  ``D``) are dropped; each Einsum costs one compute per point of its iteration space.
* Duplicate accesses to one tensor in one Einsum (``X*X`` in the RMSNorm) become one access
  (AccelForge keys accesses by tensor name; our model also reads the tensor once per group).
* Windows and shifted indices (the causal conv ``XI[b,i+k-3,e]``, ``CSN[b,j,e] =
  XI[b,j+I-3,e]``, ``H[b,i-1,e,n]``): AccelForge does not clip accesses to a tensor's bounds, so
  each such access is replaced by its exact footprint under an unfused mapping: the in-range
  rows of the tensor (a constant index when one row, the Einsum's own variable when the window
  covers its whole rank, else an auxiliary iteration variable ``w<n>`` ranging over the rows)
  plus, for rows below 0, the rows of the initial-value tensor (the conv state ``CS0``, the SSM
  state ``H0``). The per-position selection of the window is lost (values are wrong, footprints
  are exact) and an auxiliary variable multiplies that Einsum's compute count by its range.
* The scan ``H = AD*H[i-1] + BX`` reads its own output. In a decode step (``I = 1``) it becomes a
  plain Einsum reading the incoming state ``H0``. With ``unroll_scan=T`` (a prefill of ``T``
  positions) the cascade is first unrolled by :func:`mambalaya.einsum.unroll.unroll_recurrences`
  into ``T`` step Einsums ``H_t[b,step,e,n] = AD[b,t,e,n]*H_{t-1}[b,step,e,n] + BX[b,t,e,n]``
  whose readers select a step by an out-of-range read (``H_t[b,t-i,e,n]``). That unrolled
  cascade is a mambalaya cascade like any other (it executes to the recurrent one's values), so
  our model and AccelForge cost the same graph; the recurrent form's total is reported beside
  it (``ours_recurrent_bits``): unfused, it keeps the carried state on chip.
* Traffic is reported in bits (AccelForge's unit); ours is bytes x 8.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import MambalayaError
from mambalaya.interop.accelforge_worker import RESULT_PREFIX, AccelForgeWorker
from mambalaya.interop.accelforge_export import (DRAM, STATIC_APPROXIMATIONS, Export, translate, workload_dict,  # noqa: F401
                                                export_arch, export_workload, unfused_mapping_yaml,  # noqa: F401
                                                unrolled_for_export, write_export)  # noqa: F401

def _require_accelforge():
    if sys.version_info < (3, 12):
        raise MambalayaError(
            f"the AccelForge cross-check needs Python >= 3.12 (this is {sys.version.split()[0]}); "
            "use cross_check_via(<python3.12 with accelforge and mambalaya installed>, cascade)"
        )
    try:
        import accelforge
    except ImportError as err:
        raise MambalayaError(f"the AccelForge cross-check needs the accelforge package (pip install accelforge): {err}") from None
    return accelforge


def _dram_bits(result, ex: Export) -> dict[str, float]:
    """Off-chip bits per our tensor from AccelForge's model (reads + writes at MainMemory)."""
    bits: dict[str, float] = {}
    for (einsum, component, tensor, action), value in result.actions(per_einsum=True, per_tensor=True).items():
        if component != DRAM or tensor == "None":
            continue
        bits[tensor] = bits.get(tensor, 0.0) + float(value)
    return bits


def _rows_vs(ours_bytes: dict[str, tuple[float, float]], theirs: dict[str, float]) -> list[dict]:
    rows = []
    for t in sorted(set(ours_bytes) | set(theirs)):
        o = 8 * sum(ours_bytes.get(t, (0.0, 0.0)))
        a = float(theirs.get(t, 0.0))
        rel = 0.0 if o == a else (abs(a - o) / o if o else math.inf)
        rows.append({"tensor": t, "ours_bits": o, "accelforge_bits": a, "rel_diff": rel})
    return rows


_SCRATCH: list[str] = []


def _scratch_dir() -> str:
    """A working directory for AccelForge that lives as long as this process. AccelForge writes
    mapping.svg into the working directory, and its joblib worker processes, reused from one
    call to the next, keep the directory they were started in: a per-call temporary directory
    would be gone by the next call (FileNotFoundError in a long-lived :class:`AccelForgeWorker`)."""
    if not _SCRATCH:
        import atexit
        import shutil

        _SCRATCH.append(tempfile.mkdtemp(prefix="mambalaya-af-cwd-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


class _Chdir:
    """Run AccelForge in :func:`_scratch_dir` (it writes mapping.svg into the working directory)."""

    def __init__(self, path: str):
        self.path, self.old = path, None

    def __enter__(self):
        self.old = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc):
        os.chdir(self.old)


def cross_check(cascade: Cascade, mapping: str = "unfused", *, unroll_scan: int | None = None,
                buffer_bytes: int | None = None, arch_spec: Any = None) -> list[dict]:
    """Per-tensor off-chip bits, ours vs AccelForge's model.

    ``mapping="unfused"``: AccelForge evaluates the explicit unfused mapping
    (:func:`unfused_mapping_yaml`) against our ``unfused`` mapping. ``mapping="mapper"``:
    AccelForge's mapper (objective: DRAM bits) on an architecture with ``buffer_bytes`` of
    buffer, its chosen mapping re-evaluated by its model, against our ``optimal`` search.
    Returns ``[{tensor, ours_bits, accelforge_bits, rel_diff}]``.
    """
    return _run(cascade, mapping, unroll_scan=unroll_scan, buffer_bytes=buffer_bytes, arch_spec=arch_spec)["rows"]


def _default_arch():
    from mambalaya.arch import load_arch

    return load_arch("mambalaya")


def _run(cascade: Cascade, mapping: str, *, unroll_scan=None, buffer_bytes=None, arch_spec=None) -> dict:
    af = _require_accelforge()
    from mambalaya.search.mappings import named_mapping, optimal
    from mambalaya.cost.traffic import mapping_traffic

    recurrent, (cascade, ex) = cascade, translate(cascade, unroll_scan)
    spec = arch_spec if arch_spec is not None else _default_arch()
    with tempfile.TemporaryDirectory(prefix="mambalaya-af-") as tmp:
        wl = Path(tmp, "workload.yaml")
        wl.write_text(yaml.safe_dump(workload_dict(ex), sort_keys=False), encoding="utf-8")
        if mapping == "unfused":
            arch = Path(tmp, "arch.yaml")
            arch.write_text(export_arch(spec, buffer_bits=math.inf), encoding="utf-8")
            mp = Path(tmp, "mapping.yaml")
            mp.write_text(unfused_mapping_yaml(ex), encoding="utf-8")
            from accelforge.model.main import evaluate_mapping

            t0 = time.perf_counter()
            with _Chdir(_scratch_dir()):
                result = evaluate_mapping(af.Spec.from_yaml(str(arch), str(wl), str(mp)))
            seconds = time.perf_counter() - t0
            t1 = time.perf_counter()
            ours = mapping_traffic(cascade, named_mapping("unfused", cascade, None))
            ours_seconds = time.perf_counter() - t1
            ours_recurrent = ours if recurrent is cascade else mapping_traffic(recurrent, named_mapping("unfused", recurrent, None))
        elif mapping == "mapper":
            import copy

            from accelforge.mapper.FFM.main import map_workload_to_arch
            from accelforge.model.main import evaluate_mapping

            buf = buffer_bytes if buffer_bytes is not None else spec.memory.onchip_buffer_bytes
            arch = Path(tmp, "arch.yaml")
            arch.write_text(export_arch(spec, buffer_bits=buf * 8), encoding="utf-8")
            s = af.Spec.from_yaml(str(arch), str(wl))
            t0 = time.perf_counter()
            with _Chdir(_scratch_dir()):
                # eval_in_detail=False: the detailed pass renders mapping.svg through graphviz's
                # `dot`; we re-evaluate the chosen mapping with the model ourselves instead.
                found = map_workload_to_arch(s, print_progress=False, eval_in_detail=False)
                chosen = copy.deepcopy(s)
                chosen.model.metrics = chosen.mapper.info_metrics
                chosen.mapping = found.data.iloc[0]["Total<SEP>mapping"](_for_model=True)
                result = evaluate_mapping(chosen)
            seconds = time.perf_counter() - t0
            t1 = time.perf_counter()
            ours = mapping_traffic(cascade, optimal(cascade, buf))
            ours_seconds = time.perf_counter() - t1
            ours_recurrent = ours if recurrent is cascade else mapping_traffic(recurrent, optimal(recurrent, buf))
        else:
            raise MambalayaError(f"cross-check mapping must be 'unfused' or 'mapper', not {mapping!r}")
        theirs = _dram_bits(result, ex)
        try:
            latency = float(result.latency())
        except (TypeError, ValueError, KeyError):  # pragma: no cover - reporting only
            latency = float("nan")
    return {
        "rows": _rows_vs(ours.by_tensor, theirs),
        "accelforge_seconds": seconds,
        "ours_seconds": ours_seconds,
        "accelforge_latency_s": latency,
        "ours_groups": [list(g.einsums) for g in ours.mapping.groups],
        # what our model gives the same mapping on the cascade before unrolling (the scan's
        # carried state on chip); equal to the above when nothing was unrolled
        "ours_recurrent_bits": 8 * ours_recurrent.offchip_bytes,
    }


def _serve(jobs: int | None = None) -> int:
    """The worker's loop: one request path per line on stdin, one result line on stdout."""
    import traceback

    import accelforge  # noqa: F401  (imported once, before the first request)

    if jobs is not None:
        from accelforge.util.parallel import set_n_parallel_jobs

        set_n_parallel_jobs(jobs)

    for line in sys.stdin:
        try:
            req = pickle.loads(Path(line.strip()).read_bytes())
            if req["kind"] == "traffic":
                result = _run(req["cascade"], **req["kwargs"])
                if math.isnan(result["accelforge_latency_s"]):
                    result["accelforge_latency_s"] = None
            elif req["kind"] == "gemm_cycles":
                from mambalaya.arch import load_arch
                from mambalaya.interop.accelforge_spatial import accelforge_gemm_cycles

                kw = dict(req["kwargs"])
                result = accelforge_gemm_cycles(req["cascade"], kw["names"], load_arch(kw.get("arch", "mambalaya")),
                                                kw.get("dataflow", "weight-stationary"))
            else:
                raise MambalayaError(f"unknown request kind {req['kind']!r}")
            out: dict[str, Any] = {"result": result}
        except MambalayaError as err:
            out = {"error": str(err)}
        except Exception:  # noqa: BLE001 - reported to the caller, the worker goes on
            out = {"error": traceback.format_exc()[-3000:]}
        print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0


def cross_check_via(python312: "str | AccelForgeWorker", cascade: Cascade, mapping: str = "unfused", *,
                    unroll_scan: int | None = None, buffer_bytes: int | None = None, timeout: float = 1800) -> dict:
    """Run :func:`cross_check` in another interpreter (Python >= 3.12 with accelforge and this
    mambalaya installed), or in an :class:`AccelForgeWorker`: the cascade goes over as a pickle,
    the result comes back as JSON (``{"rows": [...], "accelforge_seconds": ..., ...}``)."""
    if isinstance(python312, AccelForgeWorker):
        return python312.call("traffic", cascade, mapping=mapping, unroll_scan=unroll_scan, buffer_bytes=buffer_bytes)
    with tempfile.TemporaryDirectory(prefix="mambalaya-af-") as tmp:
        pk = Path(tmp, "cascade.pkl")
        pk.write_bytes(pickle.dumps(cascade))
        cmd = [python312, "-m", "mambalaya.interop.accelforge", "--cascade-pickle", str(pk), "--mapping", mapping]
        if unroll_scan is not None:
            cmd += ["--unroll-scan", str(unroll_scan)]
        if buffer_bytes is not None:
            cmd += ["--buffer-bytes", str(buffer_bytes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise MambalayaError(f"AccelForge cross-check in {python312} failed:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mambalaya.interop.accelforge",
                                description="Cross-check a cascade's off-chip traffic against AccelForge (Python >= 3.12).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--serve", action="store_true", help="serve requests from stdin (see AccelForgeWorker)")
    src.add_argument("--cascade-pickle", help="a pickled mambalaya Cascade")
    src.add_argument("--model", help="a preset name (mamba-130m, ...)")
    p.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    p.add_argument("--seq-len", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mapping", default="unfused", choices=["unfused", "mapper"])
    p.add_argument("--unroll-scan", type=int)
    p.add_argument("--buffer-bytes", type=int)
    p.add_argument("--jobs", type=int, help="AccelForge's parallel processes (default: one per core)")
    args = p.parse_args(argv)
    if args.serve:
        return _serve(args.jobs)
    if args.cascade_pickle:
        cascade = pickle.loads(Path(args.cascade_pickle).read_bytes())
    else:
        from mambalaya.workloads import PRESETS, build_layer

        seq = args.unroll_scan or args.seq_len
        cascade = build_layer(PRESETS[args.model], phase=args.phase, seq_len=seq if args.phase == "prefill" else 1,
                              batch=args.batch)
    try:
        out = _run(cascade, args.mapping, unroll_scan=args.unroll_scan, buffer_bytes=args.buffer_bytes)
    except MambalayaError as err:
        print(str(err), file=sys.stderr)
        return 2
    if math.isnan(out["accelforge_latency_s"]):
        out["accelforge_latency_s"] = None
    print(json.dumps(out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
