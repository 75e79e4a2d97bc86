"""Export mambalaya cascades to AccelForge and cross-check off-chip traffic against it.

AccelForge (PyPI ``accelforge``, Python >= 3.12) is a fusion-aware accelerator model. This module
writes its workload / architecture / mapping YAML from a mambalaya :class:`Cascade` and, under
Python >= 3.12 with ``accelforge`` importable, runs AccelForge's model to compare per-tensor
off-chip (``MainMemory``) bits with :mod:`mambalaya.model.traffic`. It imports under Python 3.11
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Access, AffineIndex, Einsum, rank_variable
from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.errors import MambalayaError, SpecError

#: Names of the architecture nodes the exported YAML uses.
DRAM, BUFFER, COMPUTE = "MainMemory", "GlobalBuffer", "MAC"

STATIC_APPROXIMATIONS: tuple[str, ...] = (
    (
        "operators: every Einsum is a multiply-accumulate; nonlinear functions, + - /, constants and "
        "parameters are dropped (one compute per iteration point)"
    ),
    "duplicate accesses to one tensor in one Einsum (X*X) are one access",
    (
        "windows / shifted indices are replaced by their exact unfused footprint (in-range rows of the "
        "tensor + rows of its initial-value state tensor); window selection per position is lost"
    ),
    "auxiliary iteration variables w<n> (used to express a footprint) multiply that Einsum's computes",
)


@dataclass
class _Export:
    einsums: list[dict] = field(default_factory=list)
    variables: dict[str, tuple[int, int]] = field(default_factory=dict)  # rank variable -> (first, last)
    aux_vars: dict[tuple[str, int, int], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    step_einsums: list[str] = field(default_factory=list)  # Einsums the unrolling made
    bits: int = 16

    def aux(self, rank: str, lo: int, hi: int) -> str:
        """The auxiliary variable ranging over rows ``lo..hi`` of ``rank`` (one per range: a
        variable has one bound across all Einsums in AccelForge)."""
        key = (rank, lo, hi)
        if key not in self.aux_vars:
            name = f"w{len(self.aux_vars)}"
            self.aux_vars[key] = name
            self.variables[name] = (lo, hi)
        return self.aux_vars[key]


def _box(idx: AffineIndex, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    lo = hi = idx.const
    for v, c in idx.terms:
        a, b = ranges[v]
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


def _rows(ex: _Export, lo: int, hi: int, rank: str, size: int) -> str:
    """A projection whose footprint is exactly rows ``lo..hi`` of a rank of ``size``: the rank's
    own variable when all rows, else an auxiliary variable bounded to ``lo..hi``. (AccelForge
    sizes a tile as if it started at row 0, so constant or offset projections (``t``,
    ``j+1``) over-count; a variable whose bound starts at ``lo`` does not.)"""
    if lo == 0 and hi == size - 1:
        return rank_variable(rank)
    return ex.aux(rank, lo, hi)


def unrolled_for_export(cascade: Cascade, unroll_scan: int | None) -> Cascade:
    """The cascade AccelForge is given: as it is (every recurrence over one position, a decode
    step), or with its recurrences unrolled into one Einsum per step
    (:func:`~mambalaya.einsum.unroll.unroll_recurrences`) when ``unroll_scan`` is their length."""
    recurrent = [(e, cascade.recurrence(e)) for e in cascade.einsums if cascade.recurrence(e)]
    if unroll_scan is None:
        for e, (rank, _) in recurrent:
            if cascade.size(rank) != 1:
                raise SpecError(
                    f"AccelForge cannot express the recurrence of Einsum {e.name!r} over {cascade.size(rank)} positions "
                    f"of rank {rank}: export a decode step (I = 1) or pass unroll_scan={cascade.size(rank)}"
                )
        return cascade
    if not recurrent:
        raise SpecError(f"unroll_scan given but cascade {cascade.name!r} has no recurrence to unroll")
    # the sequence length when the cascade has one (the chunked SSD recurs over chunks and over
    # positions within a chunk), else the length of every recurrence
    lengths = {"I": cascade.size("I")} if "I" in cascade.ranks else {r: cascade.size(r) for _, (r, _) in recurrent}
    for rank, size in lengths.items():
        if size != unroll_scan:
            raise SpecError(
                f"unroll_scan={unroll_scan} but cascade {cascade.name!r} runs its recurrences over rank {rank} of "
                f"size {size}; build the cascade with seq_len={unroll_scan}"
            )
    return unroll_recurrences(cascade)


def _translate(cascade: Cascade, unroll_scan: int | None = None) -> tuple[Cascade, _Export]:
    """The cascade AccelForge costs (see :func:`unrolled_for_export`) and its AccelForge Einsums."""
    original, cascade = cascade, unrolled_for_export(cascade, unroll_scan)
    ex = _Export()
    ex.step_einsums = [e.name for e in cascade.einsums if e.name not in original.tensors]
    sizes = cascade.variable_sizes
    # the most common width goes to the workload's "All"; a tensor of another width (a mixed
    # precision policy) carries its own bits_per_value on every access
    widths = Counter(t.bits for t in cascade.tensors.values())
    ex.bits = max(widths, key=lambda b: (widths[b], b)) if widths else 16

    def accesses_for(e: Einsum) -> list[dict]:
        ranges = {v: (0, sizes[v] - 1) for v in e.iteration_variables}
        out: list[dict] = []
        by_tensor: dict[str, list[Access]] = {}
        for a in e.inputs:
            by_tensor.setdefault(a.tensor, []).append(a)
        for t, accs in by_tensor.items():
            ranks = cascade.tensors[t].ranks
            shape = cascade.shape(t)
            init_axis = cascade.initial_axis(t)
            if len(accs) > 1 and len({a.indices for a in accs}) == 1:
                ex.notes.append(f"{e.name}: duplicate access {accs[0]} deduplicated")
            # in-range part and below-0 part (the latter along the initial axis only)
            own: list[tuple[str, Any]] = []  # ("var", v) | ("box", (lo, hi))
            neg: tuple[int, tuple[int, int]] | None = None
            empty = False
            for p in range(len(shape)):
                idxs = {a.indices[p] for a in accs}
                only = next(iter(idxs)) if len(idxs) == 1 else None
                if only is not None and only.plain_variable:
                    own.append(("var", only.plain_variable))
                    continue
                lo = min(_box(a.indices[p], ranges)[0] for a in accs)
                hi = max(_box(a.indices[p], ranges)[1] for a in accs)
                a, b = max(lo, 0), min(hi, shape[p] - 1)
                empty = empty or a > b
                own.append(("box", (a, b)))
                if init_axis is not None and init_axis[0] == p and lo < 0:
                    depth = init_axis[1]
                    na, nb = max(lo, -depth), min(hi, -1)
                    if na <= nb:
                        neg = (p, (na + depth, nb + depth))
            if not empty and t != e.name:
                out.append({"name": t, "projection": _projection(ex, ranks, own, shape)})
            if neg is not None:
                out.append(_initial_access(ex, cascade, t, own, neg))
        return out

    for e in cascade.einsums:
        outp = {
            "name": e.name,
            "projection": {r: idx.plain_variable for r, idx in zip(cascade.tensors[e.name].ranks, e.output.indices)},
            "output": True,
        }
        accesses = accesses_for(e) + [outp]
        for ta in accesses:
            if cascade.tensors[ta["name"]].bits != ex.bits:
                ta["bits_per_value"] = cascade.tensors[ta["name"]].bits
        ex.einsums.append({"name": e.name, "tensor_accesses": accesses})
    for e in ex.einsums:
        for ta in e["tensor_accesses"]:
            for v in ta["projection"].values():
                if v not in ex.variables:
                    ex.variables[v] = (0, sizes[v] - 1)
    return cascade, ex


def _initial_access(ex: _Export, cascade: Cascade, t: str, own: list, neg: tuple[int, tuple[int, int]]) -> dict:
    """The access to ``t``'s initial-value tensor for the rows a read reaches below 0."""
    p, (ra, rb) = neg
    init = cascade.tensors[t].initial
    assert init is not None
    ranks, shape = cascade.tensors[t].ranks, cascade.shape(t)
    init_ranks = cascade.tensors[init].ranks
    depth = cascade.initial_axis(t)[1]  # type: ignore[index]
    others = [d for q, d in enumerate(own) if q != p]
    other_ranks = [r for q, r in enumerate(ranks) if q != p]
    other_shape = [n for q, n in enumerate(shape) if q != p]
    if len(init_ranks) == len(ranks):  # a history rank replaces the rank in place
        dims = others[:p] + [("box", (ra, rb))] + others[p:]
        names = other_ranks[:p] + [init_ranks[p]] + other_ranks[p:]
        sizes = other_shape[:p] + [depth] + other_shape[p:]
    else:
        dims, names, sizes = others, other_ranks, other_shape
    return {"name": init, "projection": _projection(ex, names, dims, sizes)}


def _projection(ex: _Export, ranks, dims, shape_of) -> dict[str, str]:
    proj: dict[str, str] = {}
    for r, (kind, val), size in zip(ranks, dims, shape_of):
        if kind == "var":
            proj[r] = val
        else:
            lo, hi = val
            proj[r] = _rows(ex, lo, hi, r, size)
    return proj


# ---------------------------------------------------------------------------------------------
# YAML


def _header(cascade: Cascade, ex: _Export, unroll_scan: int | None) -> str:
    lines = [
        f"AccelForge workload exported by mambalaya from cascade {cascade.name!r}",
        f"({cascade.description})" if cascade.description else "",
        (f"scan unrolled into {unroll_scan} steps (mambalaya's unroll_recurrences, the graph both tools cost): "
         f"{', '.join(ex.step_einsums)}" if unroll_scan else
         "decode step: the recurrence reads the incoming state as an input tensor"),
        "Approximations:",
        *[f"  - {a}" for a in STATIC_APPROXIMATIONS],
        *[f"  - {n}" for n in dict.fromkeys(ex.notes)],
    ]
    if ex.aux_vars:
        lines.append("  - auxiliary variables: " + ", ".join(
            f"{v} (rows {lo}..{hi} of {r})" for (r, lo, hi), v in ex.aux_vars.items()))
    return "".join(f"# {ln}\n" if ln else "" for ln in lines)


def _workload_dict(ex: _Export) -> dict:
    return {
        "workload": {
            "iteration_space_shape": {v: f"{lo} <= {v} < {hi + 1}" for v, (lo, hi) in ex.variables.items()},
            "bits_per_value": {"All": ex.bits},
            "einsums": ex.einsums,
        }
    }


def export_workload(cascade: Cascade, *, unroll_scan: int | None = None) -> str:
    """AccelForge workload YAML for ``cascade`` (a decode step, or a prefill with the scan unrolled)."""
    graph, ex = _translate(cascade, unroll_scan)
    return _header(graph, ex, unroll_scan) + yaml.safe_dump(_workload_dict(ex), sort_keys=False, width=120)


def export_arch(spec: Any, *, buffer_bits: float | None = None, dram_energy_per_bit: float = 1.0) -> str:
    """AccelForge architecture YAML for one of our :class:`~mambalaya.arch.spec.ArchSpec` designs:
    DRAM at our bandwidth (throughput in bits/s; 1 energy unit per bit so the mapper's energy
    objective is off-chip traffic), an on-chip buffer of our size (in bits) and one compute unit
    at our peak MAC rate (computes/s)."""
    size = spec.memory.onchip_buffer_bytes * 8 if buffer_bits is None else buffer_bits
    bw_bits = spec.memory.offchip_bandwidth_bytes_per_s * 8
    return (
        f"# AccelForge architecture exported by mambalaya from arch spec {spec.name!r}\n"
        f"# DRAM {spec.memory.offchip_bandwidth_bytes_per_s:g} B/s, buffer {spec.memory.onchip_buffer_bytes} B,"
        f" peak {spec.peak_macs_per_s:g} MAC/s. Energy = DRAM bits (mapper minimises traffic).\n"
        "arch:\n  nodes:\n"
        f"  - !Memory\n    name: {DRAM}\n    size: inf\n    leak_power: 0\n    area: 0\n"
        "    tensors: {keep: ~Intermediates, may_keep: All}\n    actions:\n"
        f"    - {{name: read, energy: {dram_energy_per_bit}, throughput: {bw_bits:g}, latency: 0}}\n"
        f"    - {{name: write, energy: {dram_energy_per_bit}, throughput: {bw_bits:g}, latency: 0}}\n"
        f"  - !Memory\n    name: {BUFFER}\n    size: {size if size != math.inf else 'inf'}\n    leak_power: 0\n    area: 0\n"
        f"    tensors: {{keep: ~{DRAM}, may_keep: All}}\n    actions:\n"
        "    - {name: read, energy: 0, throughput: inf, latency: 0}\n"
        "    - {name: write, energy: 0, throughput: inf, latency: 0}\n"
        f"  - !Compute\n    name: {COMPUTE}\n    leak_power: 0\n    area: 0\n    actions:\n"
        f"    - {{name: compute, energy: 0, throughput: {spec.peak_macs_per_s:g}, latency: 0}}\n"
    )


def unfused_mapping_yaml(ex: _Export) -> str:
    """Every Einsum its own group: all tensors backed in DRAM; per Einsum, its tensors whole in
    the buffer above all its loops, so each tensor moves once per Einsum (our unfused model)."""
    all_tensors = list(dict.fromkeys(ta["name"] for e in ex.einsums for ta in e["tensor_accesses"]))
    lines = ["mapping:", "  nodes:", f"  - !Storage {{tensors: [{', '.join(all_tensors)}], component: {DRAM}}}"]
    multi = len(ex.einsums) > 1
    if multi:
        lines += ["  - !Sequential", "    nodes:"]
    for e in ex.einsums:
        ts = list(dict.fromkeys(ta["name"] for ta in e["tensor_accesses"]))
        vs = list(dict.fromkeys(v for ta in e["tensor_accesses"] for v in ta["projection"].values()))
        body = [f"- !Storage {{tensors: [{', '.join(ts)}], component: {BUFFER}}}"]
        body += [f"- !Temporal {{rank_variable: {v}, tile_shape: 1}}" for v in vs]
        body += [f"- !Compute {{einsum: {e['name']}, component: {COMPUTE}}}"]
        if multi:
            lines += ["    - !Nested", "      nodes:"] + [f"      {b}" for b in body]
        else:
            lines += [f"  {b}" for b in body]
    return "\n".join(lines) + "\n"


def write_export(cascade: Cascade, arch_spec: Any, out_dir: str | Path, unroll_scan: int | None = None) -> list[Path]:
    """Write ``workload.yaml``, ``arch.yaml`` and ``mapping_unfused.yaml`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    graph, ex = _translate(cascade, unroll_scan)
    files = {
        "workload.yaml": _header(graph, ex, unroll_scan) + yaml.safe_dump(_workload_dict(ex), sort_keys=False, width=120),
        "arch.yaml": export_arch(arch_spec),
        "mapping_unfused.yaml": unfused_mapping_yaml(ex),
    }
    paths = []
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    return paths


# ---------------------------------------------------------------------------------------------
# cross-check (Python >= 3.12 with accelforge)


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


def _dram_bits(result, ex: _Export) -> dict[str, float]:
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
    from mambalaya.model.search import named_mapping, optimal
    from mambalaya.model.traffic import mapping_traffic

    recurrent, (cascade, ex) = cascade, _translate(cascade, unroll_scan)
    spec = arch_spec if arch_spec is not None else _default_arch()
    with tempfile.TemporaryDirectory(prefix="mambalaya-af-") as tmp:
        wl = Path(tmp, "workload.yaml")
        wl.write_text(yaml.safe_dump(_workload_dict(ex), sort_keys=False), encoding="utf-8")
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


_RESULT = "MAMBALAYA-RESULT "


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
                if line.startswith(_RESULT):
                    out = json.loads(line[len(_RESULT):])
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
        print(_RESULT + json.dumps(out), flush=True)
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
