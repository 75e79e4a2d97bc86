"""Time the optimal fusion search and the traffic model's evaluation rate.

    python benchmarks/bench_search.py [--model mamba-2.8b] [--seq-len 2048] [--batch 64] [--buffer 32MiB]

Prints the wall time of the optimal search for one layer, the number of (group, tiling)
mappings its cost model evaluated and the rate, and the rate of the general (per-mapping)
traffic model on whole-layer mappings. Goals (issue 3): search under 2 s, over 10,000
evaluations/s on one core.
"""

from __future__ import annotations

import argparse
import time

from mambalaya.fusion.mapping_file import parse_bytes
from mambalaya.search.mappings import SearchStats, optimal, stitched
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads import PRESETS, build_layer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba-2.8b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--buffer", default="32MiB")
    ap.add_argument("--phase", default="prefill")
    args = ap.parse_args()
    cascade = build_layer(PRESETS[args.model], phase=args.phase, seq_len=args.seq_len, batch=args.batch)
    buffer = parse_bytes(args.buffer)

    stats = SearchStats()
    t0 = time.perf_counter()
    best = optimal(cascade, buffer, stats)
    search_s = time.perf_counter() - t0
    traffic = mapping_traffic(cascade, best)

    greedy = stitched(cascade, buffer)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        mapping_traffic(cascade, greedy)
        n += 1
    whole_rate = n / (time.perf_counter() - t0)

    print(f"{args.model} {args.phase} layer, L={args.seq_len}, batch={args.batch}, buffer {buffer:,} B")
    print(f"  optimal search          : {search_s:.3f} s, {len(best.groups)} groups, "
          f"{traffic.offchip_bytes / 1e9:.3f} GB off-chip")
    print(f"  tilings evaluated       : {stats.evaluations:,} ({stats.evaluations / search_s:,.0f} per s; "
          f"{stats.groups_costed} candidate groups)")
    print(f"  general model, per whole-layer mapping: {whole_rate:,.0f} evaluations/s")


if __name__ == "__main__":
    main()
