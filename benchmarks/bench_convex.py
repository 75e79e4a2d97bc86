"""What searching every connected convex group buys on Mamba-2 layers, and what it costs.

    python benchmarks/bench_convex.py [--model mamba2-2.7b] [--arch mambalaya gpu-h100 geens-ideal]

For each design and layer (recurrent and chunked prefill at L = 4096, batch 16; chunked prefill
at L = 16384, batch 1; recurrent decode at batch 64) it prints the latency of ``optimal`` (on
these layers: contiguous groups, their connected convex groups exceed the default search's
limits) and of ``optimal-convex`` (every connected convex group, exact), their ratio, the
seconds each search took and how many groups the convex search costed of how many there are.
Each search runs on a fresh cascade, so no search reuses another's tables.
"""

from __future__ import annotations

import argparse
import time

from mambalaya.arch import load_arch
from mambalaya.search.convex import convex_space
from mambalaya.cost.latency import layer_latency
from mambalaya.search.mappings import SearchStats, named_mapping
from mambalaya.workloads import PRESETS, build_layer

LAYERS = [("recurrent", "prefill", 4096, 16), ("chunked", "prefill", 4096, 16), ("chunked", "prefill", 16384, 1),
          ("recurrent", "decode", 1, 64)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba2-2.7b")
    ap.add_argument("--arch", nargs="+", default=["mambalaya", "gpu-h100", "geens-ideal"])
    args = ap.parse_args()
    print("| design | layer | optimal (ms) | optimal-convex (ms) | gain | search s (optimal / convex) | groups costed |")
    print("|---|---|---|---|---|---|---|")
    for name in args.arch:
        arch = load_arch(name)
        buffer = arch.memory.onchip_buffer_bytes
        for scan, phase, length, batch in LAYERS:
            row = []
            for mapping in ("optimal", "optimal-convex"):
                c = build_layer(PRESETS[args.model], phase=phase, seq_len=length, batch=batch, scan=scan)
                stats = SearchStats()
                t0 = time.perf_counter()
                m = named_mapping(mapping, c, buffer, stats, arch=arch)
                row.append((layer_latency(arch, c, m).latency_s, time.perf_counter() - t0, stats.groups_costed))
            total = convex_space(c, widest=True).masks.size
            (contiguous, t1, _), (convex, t2, costed) = row
            print(f"| {name} | {scan} {phase} L={length} B={batch} | {contiguous * 1e3:.3f} | {convex * 1e3:.3f} | "
                  f"{contiguous / convex:.3f}x | {t1:.1f} / {t2:.1f} | {costed:,} of {total:,} |", flush=True)


if __name__ == "__main__":
    main()
