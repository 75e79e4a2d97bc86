"""Peak memory of the CLI's model commands on every shipped preset at L = 2^40 (goal, issue 13:
none above 500 MB).

    python benchmarks/bench_cli_memory.py [--seq-len 1099511627776] [--quick]

Runs, for every model preset: ``evaluate`` on each shipped design (prefill at L, and decode),
``compare`` of the paper's three designs, ``fusion map --mapping optimal`` and ``cascade show``,
each in its own process, and prints wall time and peak resident memory (the process's own
``ru_maxrss``; an exit code other than 0 is printed: a size a design cannot map is an error). ``--quick``: two presets only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

DESIGNS = ["mambalaya", "marca-ideal", "geens-ideal", "marca-original", "gpu-h100"]


def commands(model: str, seq_len: int, layer_types: tuple[str, ...] = ()) -> list[list[str]]:
    """The commands run on ``model``; the cascade commands once per layer type of a hybrid
    model (they build one layer, and a hybrid model must be told which)."""
    L = str(seq_len)
    out = [["evaluate", "-a", d, "--model", model, "-L", L] for d in DESIGNS]
    out.append(["evaluate", "--model", model, "--phase", "decode"])
    out.append(["compare", "--archs", "mambalaya,marca-ideal,geens-ideal", "--model", model, "--seq-lens", L])
    for layer in [[]] if not layer_types else [["--layer-type", t] for t in layer_types]:
        out.append(["fusion", "map", "--model", model, "-L", L, "--mapping", "optimal", *layer])
        out.append(["cascade", "show", "--model", model, "-L", L, *layer])
    return out


_WRAPPER = (
    "import resource, runpy, sys\n"
    "sys.argv = ['mambalaya'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('mambalaya', run_name='__main__')\n"
    "finally:\n"
    "    print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def run(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak resident MB, exit code) of one command in its own process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak_kb = max((int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_KB")), default=0)
    return seconds, peak_kb / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=2**40)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from mambalaya.workloads import PRESETS

    models = ["mamba-1.4b", "mamba2-2.7b"] if args.quick else list(PRESETS)
    worst = (0.0, "")
    for model in models:
        layer_types = tuple(dict.fromkeys(getattr(PRESETS[model], "layer_types", ())))
        for cmd in commands(model, args.seq_len, layer_types):
            seconds, peak_mb, rc = run(cmd)
            if peak_mb > worst[0]:
                worst = (peak_mb, " ".join(cmd))
            status = "ok" if rc == 0 else f"exit {rc}"
            print(f"{' '.join(cmd):<90} {seconds:6.1f} s {peak_mb:6.0f} MB  {status}")
    print(f"largest peak resident memory of any command: {worst[0]:.0f} MB ({worst[1]})")


if __name__ == "__main__":
    main()
