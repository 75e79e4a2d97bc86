"""Time the numpy executor on one Mamba-1 layer against transformers' CPU path, same process.

    python benchmarks/bench_executor.py [--model mamba-130m] [--seq-len 2048] [--batch 1] [--repeats 3]

Both run the same random weights (copied through mambalaya's weight loader) in float32 on
the CPU; the script checks the outputs agree and prints the best-of-N wall times and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "0")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba-130m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from hf_reference import build_hf_mamba1_block, random_mamba1_state_dict

    from mambalaya.execute import execute
    from mambalaya.workloads import PRESETS, build_layer
    from mambalaya.workloads.hf.weights import load_mamba1_layer

    cfg = PRESETS[args.model]
    state = random_mamba1_state_dict(
        d_model=cfg.d_model, d_state=cfg.d_state, d_inner=cfg.d_inner,
        dt_rank=cfg.dt_rank_value, d_conv=cfg.d_conv, seed=0,
    )
    block = build_hf_mamba1_block(state, d_model=cfg.d_model, d_state=cfg.d_state, expand=cfg.expand,
                                  d_conv=cfg.d_conv, dt_rank=cfg.dt_rank_value, norm_eps=cfg.norm_eps,
                                  dtype="float32")
    weights = load_mamba1_layer(state, layer=0, dtype="float32")
    cascade = build_layer(cfg, phase="prefill", seq_len=args.seq_len, batch=args.batch)
    x = np.random.default_rng(1).standard_normal((args.batch, args.seq_len, cfg.d_model)).astype(np.float32)

    def ours():
        return execute(cascade, {"X": x, **weights}, dtype="float32")["XO"]

    def theirs():
        with torch.no_grad():
            return block(torch.from_numpy(x)).numpy()

    threads = torch.get_num_threads()
    t_ours, y_ours = best_of(ours, args.repeats)
    t_ref, y_ref = best_of(theirs, args.repeats)
    err = float(np.max(np.abs(y_ours - y_ref)) / np.max(np.abs(y_ref)))
    print(f"{args.model} layer, prefill L={args.seq_len}, batch={args.batch}, float32, CPU "
          f"(torch threads={threads}, best of {args.repeats})")
    print(f"  mambalaya numpy executor : {t_ours:8.3f} s")
    print(f"  transformers MambaBlock  : {t_ref:8.3f} s")
    print(f"  ratio (ours / transformers): {t_ours / t_ref:.2f}x   max relative difference {err:.2e}")


if __name__ == "__main__":
    main()
