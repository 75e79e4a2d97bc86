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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import MambalayaError
from mambalaya.interop.accelforge_worker import RESULT_PREFIX, AccelForgeRecords, AccelForgeWorker, call_accelforge
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


def _dram_bits(result) -> dict[str, float]:
    """Off-chip bits per our tensor from AccelForge's model (reads + writes at MainMemory)."""
    bits: dict[str, float] = {}
    for (einsum, component, tensor, action), value in result.actions(per_einsum=True, per_tensor=True).items():
        if component != DRAM or tensor == "None":
            continue
        bits[tensor] = bits.get(tensor, 0.0) + float(value)
    return bits


def _rows_vs(ours_bytes: dict[str, tuple[float, float]], theirs: dict[str, float],
             live_shares: dict[str, float] | None = None) -> list[dict]:
    """Per tensor, our bits beside AccelForge's. AccelForge moves a tensor whole; ours moves a
    masked tensor's live share (:func:`~mambalaya.einsum.routing.tensor_scale`, the row's
    ``live_share``) and none of a declared mask (share 0: kernels make it from the indices,
    :attr:`~mambalaya.einsum.ir.TensorSpec.stored_bytes_per_element`), so ``rel_diff`` compares
    ours with AccelForge's bits times that share."""
    rows = []
    for t in sorted(set(ours_bytes) | set(theirs)):
        o = 8 * sum(ours_bytes.get(t, (0.0, 0.0)))
        a = float(theirs.get(t, 0.0))
        share = (live_shares or {}).get(t, 1.0)
        rel = 0.0 if o == a * share else (abs(a * share - o) / o if o else math.inf)
        rows.append({"tensor": t, "ours_bits": o, "accelforge_bits": a, "live_share": share, "rel_diff": rel})
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
    """Per-tensor off-chip bits, ours vs AccelForge's model (AccelForge in this interpreter).

    ``mapping="unfused"``: AccelForge evaluates the explicit unfused mapping
    (:func:`unfused_mapping_yaml`) against our ``unfused`` mapping. ``mapping="mapper"``:
    AccelForge's mapper (objective: DRAM bits) on an architecture with ``buffer_bytes`` of
    buffer, its chosen mapping re-evaluated by its model, against our ``optimal`` search.
    Returns ``[{tensor, ours_bits, accelforge_bits, live_share, rel_diff}]``.
    """
    inputs = traffic_inputs(cascade, mapping, unroll_scan=unroll_scan, buffer_bytes=buffer_bytes, arch_spec=arch_spec)
    return compare_traffic(cascade, inputs, run_traffic(inputs), unroll_scan=unroll_scan)["rows"]


def _default_arch():
    from mambalaya.arch import load_arch

    return load_arch("mambalaya")


def traffic_inputs(cascade: Cascade, mapping: str = "unfused", *, unroll_scan: int | None = None,
                   buffer_bytes: int | None = None, arch_spec: Any = None) -> dict:
    """Everything AccelForge reads for a traffic cross-check, as text (no AccelForge needed):
    ``{"mode", "workload", "arch", "mapping", "buffer_bytes"}``. The same inputs give AccelForge's
    same answer, which is what lets a result be recorded and replayed
    (:class:`~mambalaya.interop.accelforge_worker.AccelForgeRecords`)."""
    if mapping not in ("unfused", "mapper"):
        raise MambalayaError(f"cross-check mapping must be 'unfused' or 'mapper', not {mapping!r}")
    ex = translate(cascade, unroll_scan)[1]
    spec = arch_spec if arch_spec is not None else _default_arch()
    buf = None
    if mapping == "mapper":
        buf = buffer_bytes if buffer_bytes is not None else spec.memory.onchip_buffer_bytes
    return {
        "mode": mapping,
        "workload": yaml.safe_dump(workload_dict(ex), sort_keys=False),
        "arch": export_arch(spec, buffer_bits=math.inf if buf is None else buf * 8),
        "mapping": unfused_mapping_yaml(ex) if mapping == "unfused" else None,
        "buffer_bytes": buf,
    }


def run_traffic(inputs: dict) -> dict:
    """AccelForge's side of a traffic cross-check (Python >= 3.12 with accelforge):
    ``{"bits": {tensor: off-chip bits}, "latency_s", "seconds"}``."""
    af = _require_accelforge()
    from accelforge.model.main import evaluate_mapping

    with tempfile.TemporaryDirectory(prefix="mambalaya-af-") as tmp:
        paths = {k: Path(tmp, f"{k}.yaml") for k in ("arch", "workload", "mapping") if inputs[k] is not None}
        for key, path in paths.items():
            path.write_text(inputs[key], encoding="utf-8")
        t0 = time.perf_counter()
        with _Chdir(_scratch_dir()):
            if inputs["mode"] == "unfused":
                result = evaluate_mapping(af.Spec.from_yaml(str(paths["arch"]), str(paths["workload"]), str(paths["mapping"])))
            else:
                import copy

                from accelforge.mapper.FFM.main import map_workload_to_arch

                s = af.Spec.from_yaml(str(paths["arch"]), str(paths["workload"]))
                # eval_in_detail=False: the detailed pass renders mapping.svg through graphviz's
                # `dot`; we re-evaluate the chosen mapping with the model ourselves instead.
                found = map_workload_to_arch(s, print_progress=False, eval_in_detail=False)
                chosen = copy.deepcopy(s)
                chosen.model.metrics = chosen.mapper.info_metrics
                chosen.mapping = found.data.iloc[0]["Total<SEP>mapping"](_for_model=True)
                result = evaluate_mapping(chosen)
        seconds = time.perf_counter() - t0
    try:
        latency = float(result.latency())
    except (TypeError, ValueError, KeyError):  # pragma: no cover - reporting only
        latency = math.nan
    return {"bits": _dram_bits(result), "latency_s": None if math.isnan(latency) else latency, "seconds": seconds}


def moved_shares(cascade: Cascade) -> dict[str, float]:
    """Per tensor our model moves a share of (the others move whole): a masked tensor's live
    share (:func:`~mambalaya.einsum.routing.tensor_scale`), a declared mask's 0."""
    from mambalaya.einsum.routing import tensor_scale

    shares = {t: spec.stored_bytes_per_element * 8 / spec.bits * float(tensor_scale(cascade, t))
              for t, spec in cascade.tensors.items()}  # (TensorSpec.stored_bytes_per_element: 0 for a mask)
    return {t: s for t, s in shares.items() if s != 1}


def compare_traffic(cascade: Cascade, inputs: dict, theirs: dict, *, unroll_scan: int | None = None) -> dict:
    """Our side of a traffic cross-check beside AccelForge's (``theirs``: :func:`run_traffic`'s
    answer to ``inputs``), costed by this interpreter's mambalaya on the cascade AccelForge read:
    ``{"rows": [{tensor, ours_bits, accelforge_bits, live_share, rel_diff}], "accelforge_seconds",
    "ours_seconds", "accelforge_latency_s", "ours_groups", "ours_recurrent_bits"}``."""
    from mambalaya.cost.traffic import mapping_traffic
    from mambalaya.search.mappings import named_mapping, optimal

    recurrent, cascade = cascade, translate(cascade, unroll_scan)[0]
    if inputs["mode"] == "unfused":
        cost = lambda c: mapping_traffic(c, named_mapping("unfused", c, None))  # noqa: E731
    else:
        cost = lambda c: mapping_traffic(c, optimal(c, inputs["buffer_bytes"]))  # noqa: E731
    t0 = time.perf_counter()
    ours = cost(cascade)
    ours_seconds = time.perf_counter() - t0
    ours_recurrent = ours if recurrent is cascade else cost(recurrent)
    return {
        "rows": _rows_vs(ours.by_tensor, theirs["bits"], moved_shares(cascade)),
        "accelforge_seconds": theirs["seconds"],
        "ours_seconds": ours_seconds,
        "accelforge_latency_s": theirs["latency_s"],
        "ours_groups": [list(g.einsums) for g in ours.mapping.groups],
        # what our model gives the same mapping on the cascade before unrolling (the scan's
        # carried state on chip); equal to the above when nothing was unrolled
        "ours_recurrent_bits": 8 * ours_recurrent.offchip_bytes,
    }


def _serve(jobs: int | None = None) -> int:
    """The worker's loop: one request path per line on stdin (a pickle of ``{"kind", "inputs"}``:
    AccelForge's inputs as text), one result line on stdout."""
    import traceback

    import accelforge  # noqa: F401  (imported once, before the first request)

    if jobs is not None:
        from accelforge.util.parallel import set_n_parallel_jobs

        set_n_parallel_jobs(jobs)

    for line in sys.stdin:
        try:
            req = pickle.loads(Path(line.strip()).read_bytes())
            if req["kind"] == "traffic":
                result = run_traffic(req["inputs"])
            elif req["kind"] == "gemm_cycles":
                from mambalaya.interop.accelforge_spatial import run_gemm_cycles

                result = run_gemm_cycles(req["inputs"])
            else:
                raise MambalayaError(f"unknown request kind {req['kind']!r}")
            out: dict[str, Any] = {"result": result}
        except MambalayaError as err:
            out = {"error": str(err)}
        except Exception:  # noqa: BLE001 - reported to the caller, the worker goes on
            out = {"error": traceback.format_exc()[-3000:]}
        print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0


def cross_check_via(accelforge: "str | AccelForgeWorker | AccelForgeRecords", cascade: Cascade,
                    mapping: str = "unfused", *, unroll_scan: int | None = None,
                    buffer_bytes: int | None = None) -> dict:
    """:func:`cross_check` with AccelForge in another interpreter: ``accelforge`` is a Python >= 3.12
    with accelforge and this mambalaya installed (a worker started for this call), an
    :class:`AccelForgeWorker`, or :class:`AccelForgeRecords` (recorded answers, else a worker).
    AccelForge's inputs are made here and go over as text; our side is costed here
    (:func:`compare_traffic`'s result: ``{"rows": [...], "accelforge_seconds": ..., ...}``)."""
    inputs = traffic_inputs(cascade, mapping, unroll_scan=unroll_scan, buffer_bytes=buffer_bytes)
    theirs = call_accelforge(accelforge, "traffic", inputs)
    return compare_traffic(cascade, inputs, theirs, unroll_scan=unroll_scan)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mambalaya.interop.accelforge",
                                description="Cross-check a cascade's off-chip traffic against AccelForge (Python >= 3.12).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--serve", action="store_true", help="serve requests from stdin (see AccelForgeWorker)")
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
    from mambalaya.workloads import PRESETS, build_layer

    seq = args.unroll_scan or args.seq_len
    cascade = build_layer(PRESETS[args.model], phase=args.phase, seq_len=seq if args.phase == "prefill" else 1,
                          batch=args.batch)
    try:
        inputs = traffic_inputs(cascade, args.mapping, unroll_scan=args.unroll_scan, buffer_bytes=args.buffer_bytes)
        out = compare_traffic(cascade, inputs, run_traffic(inputs), unroll_scan=args.unroll_scan)
    except MambalayaError as err:
        print(str(err), file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
