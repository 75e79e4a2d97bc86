"""Export to AccelForge: a cascade as an AccelForge workload (each Einsum a multiply-accumulate
over its iteration space, windows and shifted indices by their exact unfused footprint), an
architecture spec as an AccelForge arch, and the unfused mapping; the approximations are listed
in :data:`STATIC_APPROXIMATIONS`. :mod:`mambalaya.interop.accelforge` cross-checks with them."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Access, AffineIndex, Einsum, rank_variable
from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.outputs import write_text_output
from mambalaya.errors import SpecError


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
class Export:
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


def _rows(ex: Export, lo: int, hi: int, rank: str, size: int) -> str:
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


def translate(cascade: Cascade, unroll_scan: int | None = None) -> tuple[Cascade, Export]:
    """The cascade AccelForge costs (see :func:`unrolled_for_export`) and its AccelForge Einsums."""
    original, cascade = cascade, unrolled_for_export(cascade, unroll_scan)
    ex = Export()
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


def _initial_access(ex: Export, cascade: Cascade, t: str, own: list, neg: tuple[int, tuple[int, int]]) -> dict:
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


def _projection(ex: Export, ranks, dims, shape_of) -> dict[str, str]:
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


def _header(cascade: Cascade, ex: Export, unroll_scan: int | None) -> str:
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


def workload_dict(ex: Export) -> dict:
    return {
        "workload": {
            "iteration_space_shape": {v: f"{lo} <= {v} < {hi + 1}" for v, (lo, hi) in ex.variables.items()},
            "bits_per_value": {"All": ex.bits},
            "einsums": ex.einsums,
        }
    }


def export_workload(cascade: Cascade, *, unroll_scan: int | None = None) -> str:
    """AccelForge workload YAML for ``cascade`` (a decode step, or a prefill with the scan unrolled)."""
    graph, ex = translate(cascade, unroll_scan)
    return _header(graph, ex, unroll_scan) + yaml.safe_dump(workload_dict(ex), sort_keys=False, width=120)


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


def unfused_mapping_yaml(ex: Export) -> str:
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
    graph, ex = translate(cascade, unroll_scan)  # before the folder is made: a refusal leaves nothing
    files = {
        "workload.yaml": _header(graph, ex, unroll_scan) + yaml.safe_dump(workload_dict(ex), sort_keys=False, width=120),
        "arch.yaml": export_arch(arch_spec),
        "mapping_unfused.yaml": unfused_mapping_yaml(ex),
    }
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        write_text_output(out / name, text)  # each file whole
        paths.append(out / name)
    return paths


# ---------------------------------------------------------------------------------------------
# cross-check (Python >= 3.12 with accelforge)
