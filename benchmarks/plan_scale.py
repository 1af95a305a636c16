"""How long does a sweep of 100, 1,000 and 10,000 trials take to validate and plan?

    python -m benchmarks.plan_scale [--sizes 100 1000 10000] [--basic 100] [--repeats 1]

Runs the command a user runs, ``python -m orchestrator dry_run=json <grid> -m``, on a grid that
mixes config-group overrides and value overrides (``workload=short_short,long_short
engine.block_size=32,64 engine.max_num_seqs=range(..) seed=range(..)``): every job is composed,
validated, hashed, planned (server commands, feasibility) and printed, and the plan of the whole
is printed at the end. Nothing starts. Prints per size the wall time, the time per trial and the
command's peak memory (RSS), for the default sweeper (``hydra/sweeper=grid``: each set of config
groups composed once) and, with ``--basic N``, Hydra's basic sweeper at those sizes (every job
composed twice) for comparison. Target (issue 24): under 10 s at 10,000 trials.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from statistics import median

from orchestrator.scheduling.sweep import PROJECT_ROOT


def grid(trials: int) -> list[str]:
    """A grid of exactly ``trials`` jobs (a multiple of 4): 2 workloads x 2 block sizes x
    max_num_seqs x seeds."""
    cells = trials // 4
    seqs = max(1, math.isqrt(cells))
    while cells % seqs:
        seqs -= 1
    return [
        "workload=short_short,long_short",
        "engine.block_size=32,64",
        f"engine.max_num_seqs=range(1,{seqs + 1})",
        f"seed=range({cells // seqs})",
    ]


def run(trials: int, sweeper: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "orchestrator", "dry_run=json", f"hydra/sweeper={sweeper}", *grid(trials), "-m"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = 0
    plan: dict[str, int] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith('{"plan"'):
            plan = json.loads(line)["plan"]
        elif line.startswith("{"):
            lines += 1
    stderr = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or lines != trials or plan.get("trials") != trials:
        raise SystemExit(f"{sweeper} x {trials}: exit {proc.returncode}, {lines} lines, plan {plan}\n{stderr[-2000:]}")
    return {"wall_s": wall, "peak_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--basic", type=int, nargs="*", default=[100], help="sizes for Hydra's basic sweeper too")
    ap.add_argument("--repeats", type=int, default=1, help="runs per size; the median is shown")
    a = ap.parse_args()
    rows = []
    for sweeper, sizes in (("grid", a.sizes), ("basic", a.basic)):
        for n in sizes:
            runs = [run(n, sweeper) for _ in range(a.repeats)]
            wall, peak, cpu = (median(r[k] for r in runs) for k in ("wall_s", "peak_mb", "cpu_s"))
            rows.append((sweeper, n, wall, 1000 * wall / n, cpu, peak))
            print(f"{sweeper:>5} {n:>6} trials: {wall:.1f} s", file=sys.stderr, flush=True)
    print("| sweeper | trials | wall s | ms per trial | CPU s | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for sweeper, n, wall, per, cpu, peak in rows:
        print(f"| {sweeper} | {n} | {wall:.1f} | {per:.2f} | {cpu:.1f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
