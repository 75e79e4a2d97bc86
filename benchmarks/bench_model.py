"""Throughput of the performance model and wall time of the reproduction.

    python benchmarks/bench_model.py [--model mamba-1.4b] [--seconds 2] [--skip-reproduce]

Prints whole-layer evaluations per second (latency of one layer under a fixed mapping on one
architecture: traffic model + latency model) for prefill and generation, and the wall time of
`mambalaya reproduce` on the shipped defaults (written to a temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mambalaya.arch import load_arch
from mambalaya.experiments.reproduce import ReproduceConfig, run_reproduce
from mambalaya.cost.latency import layer_latency
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads import PRESETS, build_layer


def rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba-1.4b")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--skip-reproduce", action="store_true")
    args = ap.parse_args()
    arch = load_arch("mambalaya")
    for phase, L in (("prefill", 2048), ("decode", 1)):
        c = build_layer(PRESETS[args.model], phase=phase, seq_len=L, batch=64)
        for name in ("unfused", "stitched"):
            m = named_mapping(name, c, arch.memory.onchip_buffer_bytes, arch=arch)
            r = rate(lambda: layer_latency(arch, c, m), args.seconds)
            print(f"{args.model} {phase:7s} {name:8s}: {r:8,.0f} whole-layer evaluations/s ({len(m.groups)} groups)")
    if not args.skip_reproduce:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run_reproduce(ReproduceConfig(out=Path(tmp)))
            print(f"mambalaya reproduce (shipped defaults, figures included): {time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
