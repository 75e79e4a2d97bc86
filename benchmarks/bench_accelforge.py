"""Our optimal search vs AccelForge's mapper on the same exported workload: time and off-chip traffic.

Run from the project's Python (3.11); AccelForge runs in a Python >= 3.12 found by
:func:`mambalaya.interop.accelforge_worker.find_python312` (``$MAMBALAYA_ACCELFORGE_PYTHON``, else
the repository's ``.venv-af``, else ``python3.12``). With ``--unroll-scan T`` both tools search
mambalaya's unrolled cascade (one Einsum per scan step). AccelForge's mapper minimises energy; the
exported architecture charges 1 unit per DRAM bit and nothing else, so its objective is
off-chip traffic, like ours. Its chosen mapping is re-evaluated with its model (the mapper's
own latency estimate disagrees with the model for bandwidth-bound elementwise Einsums).

    python benchmarks/bench_accelforge.py [--model mamba-130m] [--buffer-mib 50] [--tiny] [--check]

``--tiny --check`` (about 4 minutes of AccelForge mapping; moved here from the test suite) also
requires the differences on the tiny decode step to be exactly the explained ones, and exits 1
otherwise. Our optimal fuses the whole layer into one group:

* H: AccelForge writes 0 bits. H is read by YS, so AccelForge classes it as an intermediate
  that may stay on chip; it does not know H is the outgoing SSM state that must leave the
  chip (ours writes it: B*E*N elements). AccelForge therefore under-counts by 1024 bits.
* X: AccelForge's mapping re-reads X in SS, XN and XO (3x); our single group reads it once.
* CS0: AccelForge's mapping reads the conv state in both XC and CSN (plus a re-read); ours once.

Everything else agrees to the bit.
"""

from __future__ import annotations

import argparse
import sys
import time

from mambalaya.interop.accelforge import cross_check_via, unrolled_for_export
from mambalaya.interop.accelforge_worker import find_python312
from mambalaya.search.mappings import optimal
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.blocks.mamba1 import Mamba1Config


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mamba-130m")
    p.add_argument("--tiny", action="store_true", help="d_model=8, d_state=4 instead of a preset")
    p.add_argument("--buffer-mib", type=float, default=50)
    p.add_argument("--unroll-scan", type=int, help="prefill of T positions with the scan unrolled")
    p.add_argument("--check", action="store_true", help="with --tiny (decode): require exactly the explained differences")
    args = p.parse_args()
    py = find_python312()
    if py is None:
        print("no Python >= 3.12 with accelforge and mambalaya; set MAMBALAYA_ACCELFORGE_PYTHON", file=sys.stderr)
        return 1
    if args.check and (not args.tiny or args.unroll_scan):
        p.error("--check applies to --tiny decode")
    config = Mamba1Config(d_model=8, d_state=4) if args.tiny else PRESETS[args.model]
    if args.unroll_scan:
        cascade = build_layer(config, phase="prefill", seq_len=args.unroll_scan, batch=1)
    else:
        cascade = build_layer(config, phase="decode", seq_len=1, batch=1)
    buf = int(args.buffer_mib * 2**20)

    graph = unrolled_for_export(cascade, args.unroll_scan)  # the graph AccelForge is given
    t0 = time.perf_counter()
    ours = mapping_traffic(graph, optimal(graph, buf))
    ours_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    res = cross_check_via(py, cascade, "mapper", unroll_scan=args.unroll_scan, buffer_bytes=buf)
    wall = time.perf_counter() - t0

    ours_bits = 8 * ours.offchip_bytes
    af_bits = sum(r["accelforge_bits"] for r in res["rows"])
    print(f"cascade {cascade.name} ({cascade.description}), buffer {args.buffer_mib:g} MiB")
    print(f"{'':28}{'mambalaya optimal':>20}{'AccelForge mapper':>20}")
    print(f"{'search time (s)':28}{ours_s:>20.3f}{res['accelforge_seconds']:>20.3f}   (subprocess wall {wall:.1f} s)")
    print(f"{'off-chip traffic (bits)':28}{ours_bits:>20,.0f}{af_bits:>20,.0f}")
    print(f"{'groups':28}{len(ours.mapping.groups):>20}")
    print(f"{'AccelForge model latency (s)':28}{'':>20}{res['accelforge_latency_s']:>20.3e}")
    print("per tensor where they differ (bits):")
    for r in res["rows"]:
        if r["ours_bits"] != r["accelforge_bits"]:
            print(f"  {r['tensor']:8}{r['ours_bits']:>16,.0f}{r['accelforge_bits']:>16,.0f}")
    if args.check:
        differing = {r["tensor"]: (r["ours_bits"], r["accelforge_bits"]) for r in res["rows"]
                     if r["ours_bits"] != r["accelforge_bits"]}
        if differing != EXPLAINED_TINY_DECODE:
            print(f"CHECK FAILED: expected exactly {EXPLAINED_TINY_DECODE}", file=sys.stderr)
            return 1
        print("check: the differences are exactly the explained ones")
    return 0


#: The differences on the tiny decode step (d_model 8, d_state 4), explained in the module doc.
EXPLAINED_TINY_DECODE = {"H": (1024.0, 0.0), "X": (128.0, 384.0), "CS0": (768.0, 1280.0)}


if __name__ == "__main__":
    sys.exit(main())
