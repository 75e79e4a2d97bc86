"""Peak Python memory of the tiled executor under `stitched` against untiled execution.

    python benchmarks/bench_tiled_memory.py [--model mamba-130m] [--seq-len 4096] [--goal 10]

A mamba-130m prefill layer (float32, batch 1) run untiled holds every intermediate whole; run
by `run_tiled` under the `stitched` mapping it keeps only tiles. The script prints both peaks
(tracemalloc) and their ratio, checks the outputs agree, and exits 1 if the ratio is under the
goal (10x at L = 4096).
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc

import numpy as np

from mambalaya.execute import execute
from mambalaya.execute.tiled import run_tiled
from mambalaya.search.mappings import stitched
from mambalaya.workloads.blocks.mamba1 import PRESETS, WEIGHTS, mamba1_layer


def peak_mib(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba-130m", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--goal", type=float, default=10.0, help="the least untiled / tiled peak ratio")
    args = ap.parse_args()
    c = mamba1_layer(PRESETS[args.model], batch=1, seq_len=args.seq_len)
    rng = np.random.default_rng(0)
    arrays = {t: (rng.standard_normal(c.shape(t)) * 0.05).astype(np.float32) for t in WEIGHTS}
    arrays["A"] = -rng.uniform(1, 16, c.shape("A")).astype(np.float32)
    arrays["X"] = rng.standard_normal(c.shape("X")).astype(np.float32)
    mapping = stitched(c, 32 * 2**20)
    untiled, untiled_mib = peak_mib(lambda: execute(c, arrays, dtype="float32")["XO"])
    tiled, tiled_mib = peak_mib(lambda: run_tiled(c, mapping, arrays, dtype="float32").outputs["XO"])
    np.testing.assert_allclose(tiled, untiled, rtol=1e-4, atol=1e-4 * np.abs(untiled).max())
    ratio = untiled_mib / tiled_mib
    print(f"{args.model} prefill L={args.seq_len}: peak Python memory untiled {untiled_mib:.1f} MiB, tiled under "
          f"stitched {tiled_mib:.1f} MiB: {ratio:.1f}x lower (goal {args.goal:g}x); outputs equal")
    return 0 if ratio >= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
