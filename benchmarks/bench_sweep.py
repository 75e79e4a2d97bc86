"""Design-space sweeps on this machine: points per second, locally and on an external 2-worker
Dask cluster.

    python benchmarks/bench_sweep.py [--workers 2] [--skip-cluster] [--grid realistic|any|wide|hybrid|both] [--repeat N]

Each time is the whole `mambalaya sweep` command, from the interpreter's start to its exit
(the CLI's imports and the worker processes' start included); with ``--repeat`` the local run
is repeated and the median printed too (a shared 2-core machine varies by 10-20% run to run).

The *realistic* grid (issue 13): 3 designs x 3 bandwidths x 4 buffers x 2 models (mamba-370m,
mamba-1.4b) x 4 lengths up to 16384 x 2 batches, prefill, the designs' own mappings = 576
points (goal: 150 points/s on 2 cores). The *any* grid (issue 29): the same three designs, buffers of
16-64 MiB, Mamba-1 and Mamba-2 models and lengths that are not powers of two, 1,152 points, the
same goal.

The grid: 3 designs x 7 bandwidths x 8 buffer sizes x 3 array shapes x 2 models x 2 batch
sizes x (prefill at 4 lengths + decode, which does not depend on L) = 10,080 points. "Locally" is `mambalaya sweep`'s
default (a pool of worker processes it forks itself); the cluster run starts
`dask scheduler` and two `dask worker` processes and passes --scheduler, as a user would.
Goal (issue 6): 10,000 points in under 60 s locally on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REALISTIC = """
name: realistic
chunk_size: 32
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.offchip_bandwidth_bytes_per_s: [1e12, 2.039e12, 4e12]
  memory.onchip_buffer_bytes: [8MiB, 16MiB, 32MiB, 64MiB]
  model: [mamba-370m, mamba-1.4b]
  seq_len: [2048, 4096, 8192, 16384]
  batch: [16, 64]
  phase: [prefill]
"""

#: Issue 29's grid: the three designs, buffers of 16-64 MiB, Mamba-1 and Mamba-2 models,
#: lengths that are not powers of two (the Mamba-2 points run each design's faster scan form).
ANY = """
name: any
chunk_size: 32
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.onchip_buffer_bytes: [16MiB, 24MiB, 40MiB, 64MiB]
  model: [mamba-370m, mamba-1.4b, mamba2-370m, mamba2-1.3b]
  seq_len: [1000, 3000, 6000, 12000]
  batch: [8, 64]
  phase: [prefill]
  memory.offchip_bandwidth_bytes_per_s: [1e12, 2.039e12, 4e12]
"""

#: Hybrid models (issue 45): the three designs, two buffers, Bamba and Nemotron-H, both phases:
#: 48 points, each a whole hybrid model (every layer type searched on Mambalaya).
HYBRID = """
name: hybrid
chunk_size: 4
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.onchip_buffer_bytes: [16MiB, 64MiB]
  model: [bamba-9b, nemotron-h-8b]
  seq_len: [2048, 8192]
  batch: [16]
  phase: [prefill, decode]
"""

SPEC = """
name: bench
chunk_size: 48
grid:
  arch: [mambalaya, marca-ideal, geens-ideal]
  memory.offchip_bandwidth_bytes_per_s: [0.5e12, 1e12, 1.5e12, 2.039e12, 3e12, 4e12, 6e12]
  memory.onchip_buffer_bytes: [2MiB, 4MiB, 8MiB, 16MiB, 32MiB, 50MiB, 64MiB, 128MiB]
  compute.array_rows: [128, 256, 512]
  model: [mamba-130m, mamba-370m]
  batch: [16, 64]
  phase: [prefill, decode]
  seq_len: [1024, 2048, 4096, 8192]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_sweep(spec_path: Path, store: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mambalaya", "sweep", str(spec_path), "--store", str(store), *extra], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--grid", choices=["realistic", "any", "wide", "hybrid", "both"], default="both")
    ap.add_argument("--repeat", type=int, default=1, help="local runs of each grid (the median is printed too)")
    args = ap.parse_args()
    grids = {"realistic": REALISTIC, "any": ANY, "wide": SPEC, "hybrid": HYBRID}
    for name in (["realistic", "wide"] if args.grid == "both" else [args.grid]):
        run_grid(name, grids[name], args.workers, args.skip_cluster, max(1, args.repeat))


def run_grid(name: str, text: str, workers: int, skip_cluster: bool, repeat: int = 1) -> None:
    from mambalaya.experiments.sweep import load_sweep_spec

    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / f"{name}.yaml"
        spec_path.write_text(text)
        n = len(load_sweep_spec(spec_path).points())
        times = []
        for k in range(repeat):
            local = timed_sweep(spec_path, Path(tmp) / f"local{k}.sqlite", ["--workers", str(workers)])
            times.append(local)
            print(f"{name} grid, local ({workers} worker processes): {n} points in {local:.1f} s = {n / local:.0f} points/s")
        if repeat > 1:
            mid = statistics.median(times)
            print(f"{name} grid, local, median of {repeat}: {mid:.1f} s = {n / mid:.0f} points/s")
        if skip_cluster:
            return
        port = free_port()
        env = dict(os.environ)
        sched = subprocess.Popen(["dask", "scheduler", "--port", str(port), "--no-dashboard"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs = [subprocess.Popen(["dask", "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--no-dashboard"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
        try:
            time.sleep(4)
            remote = timed_sweep(spec_path, Path(tmp) / "cluster.sqlite", ["--scheduler", f"tcp://127.0.0.1:{port}"])
            print(f"{name} grid, external Dask cluster (dask scheduler + 2 dask workers): {n} points in {remote:.1f} s "
                  f"= {n / remote:.0f} points/s")
        finally:
            for p in procs + [sched]:
                p.terminate()
            for p in procs + [sched]:
                p.wait(timeout=30)


if __name__ == "__main__":
    main()
