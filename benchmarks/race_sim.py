"""The race's procedure on a simulated machine: how often two identical configurations tie,
stay undecided or get a (false) winner, at several levels of noise between runs.

The simulation is the one of ``tests/unit/test_race.py`` (``simulate``): log-normal noise of
``own`` per run and of ``shared`` per round (common to the trials of a round: its requests, its
server start, the machine's moment), ``max_repeats: auto`` (planned after the third run), a
10% margin, 95% confidence, no budget limit. docs/statistics.md keeps the table.

    python -m benchmarks.race_sim --races 300
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from orchestrator.decide.race import TIED, WIN
from testkit.races import simulate

NOISE = ((0.03, 0.0), (0.08, 0.0), (0.10, 0.0), (0.07, 0.05), (0.02, 0.10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=300)
    args = ap.parse_args()
    n = args.races
    print("| noise between runs | ties | undecided | false winners | races | seconds |")
    print("|---|---|---|---|---|---|")
    for own, shared in NOISE:
        t0 = time.monotonic()
        got = Counter(simulate({"a": 100.0, "b": 100.0}, own, seed, "auto", shared=shared) for seed in range(n))
        label = f"{own:.0%}" + (f" own + {shared:.0%} shared by the round" if shared else "")
        undecided = n - got[TIED] - got[WIN]
        print(
            f"| {label} | {got[TIED] / n:.1%} | {undecided / n:.1%} | {got[WIN] / n:.1%} | {n} | "
            f"{time.monotonic() - t0:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
