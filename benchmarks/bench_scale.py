"""Cost of the model against the size of the problem it describes: evaluating and searching
one mamba-1.4b layer at L = 2^11 .. 2^40, and at d_model = 2^11 and 2^20.

    python benchmarks/bench_scale.py [--arch mambalaya] [--batch 64]

Each case runs in fresh processes (``--repeats``, default 3: the fastest time and the largest
peak memory are shown): the design's own mapping searched (mambalaya: the optimal search over groups, tiles, loop orders and residency) and the
layer costed. Printed: wall time and peak resident memory of each case, and the ratio of the
largest to the smallest (goal, issue 13: within 2x in both).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [("L", 2**11), ("L", 2**20), ("L", 2**30), ("L", 2**40), ("d_model", 2**11), ("d_model", 2**20)]


def run_case(arch: str, what: str, value: int, batch: int) -> dict:
    """One case, in this process: returns seconds, peak RSS and the result's latency."""

    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.workloads import PRESETS

    config = PRESETS["mamba-1.4b"]
    seq_len = 2048
    if what == "L":
        seq_len = value
    else:
        config = config.model_copy(update={"d_model": value})
    t0 = time.perf_counter()
    ev = evaluate(arch, "mamba-1.4b", config, phase="prefill", seq_len=seq_len, batch=batch)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": f"{what} = 2^{value.bit_length() - 1}", "seconds": seconds, "peak_mb": peak_mb,
            "latency_s": ev.result.latency_s, "groups": len(ev.mapping.groups),
            "candidates": ev.search.evaluations}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="mambalaya")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per case (the fastest time is shown)")
    ap.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # internal: run one case and print JSON
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.arch, args.case[0], int(args.case[1]), args.batch)))
        return
    rows = []
    for what, value in CASES:
        runs = []
        for _ in range(args.repeats):  # each in a fresh process; the fastest is reported (timing noise only adds)
            out = subprocess.run([sys.executable, __file__, "--arch", args.arch, "--batch", str(args.batch),
                                  "--case", what, str(value)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = min(runs, key=lambda r: r["seconds"])
        row["peak_mb"] = max(r["peak_mb"] for r in runs)
        rows.append(row)
        print(f"{row['case']:>16}: {row['seconds']:6.2f} s  {row['peak_mb']:6.0f} MB peak  "
              f"{row['groups']} groups  {row['candidates']:>9,} candidates  layer latency {row['latency_s']:.4g} s")
    t = [r["seconds"] for r in rows]
    m = [r["peak_mb"] for r in rows]
    print(f"largest / smallest: time {max(t) / min(t):.2f}x, peak memory {max(m) / min(m):.2f}x (goal: within 2x)")


if __name__ == "__main__":
    main()
