"""Optuna knob search vs the full grid, on a space whose optimum is known.

    python -m benchmarks.search [--n-trials 20] [--batch-size 4]

A fake OpenAI server (``testkit/fake_openai_server.py``, its own process) whose TTFT grows
with the requests in flight (10 ms + 20 ms per other request) serves every trial
(``engine=external``). The space: 10 concurrencies x 5 output lengths = 50 configurations;
the objective: maximize ``goodput`` (requests per second meeting TTFT <= 100 ms). Goodput
grows with concurrency until TTFT breaks the SLO at 6 streams, and shrinks with longer
outputs: the optimum is 5 streams with the shortest output.

Both searches are the product's own commands (``python -m orchestrator ... -m`` with the
grid, and with ``hydra/sweeper=optuna``), timed from outside. Prints trials measured, wall
time, the best goodput found, and for the search the number of trials it took to come within
5% of the grid's best. The target (issue 13): <= 40% of the grid's trials.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit.fake_openai_server import FakeServerProcess

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = list(range(1, 11))
OUTPUT = [8, 16, 24, 32, 40]


def run(argv: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-3000:])
    return time.monotonic() - t0, p.stdout


def goodputs(store: str) -> list[tuple[int, float]]:
    """(start time, goodput) of every FINISHED trial run in the store, in start order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("default")
    runs = client.search_runs(
        [exp.experiment_id],
        "tags.run_kind = 'trial' and tags.trial_status = 'FINISHED'",
        order_by=["attributes.start_time ASC"],
        max_results=1000,
    )
    return [(r.info.start_time, r.data.metrics.get("goodput", 0.0)) for r in runs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-trials", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--requests", type=int, default=20)
    a = ap.parse_args()
    with FakeServerProcess("--ttft", "0.01", "--itl", "0.002", "--ttft-per-in-flight", "0.02") as server:
        url = server.url
        loads = ",".join(f"[{{concurrency:{c}}}]" for c in CONCURRENCY)
        outs = ",".join(str(n) for n in OUTPUT)
        common = [
            "engine=external",
            f"engine.url={url}",
            "engine.metrics=none",
            "workload.warmup_requests=0",
            f"workload.num_requests={a.requests}",
            "workload.slo.ttft_ms=100",
            f"workload.load_points=choice({loads})",
            f"workload.classes.main.output_tokens={outs}",
            "objective={maximize:goodput}",
        ]
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            grid_store = f"sqlite:///{tmp}/grid.db"
            wall, _ = run([*common, f"tracking.uri={grid_store}", f"hydra.sweep.dir={tmp}/grid", "-m"])
            grid = goodputs(grid_store)
            best = max(g for _, g in grid)
            rows.append(("grid", len(grid), wall, best, "-"))
            search_store = f"sqlite:///{tmp}/search.db"
            wall, out = run(
                [
                    *common,
                    "hydra/sweeper=optuna",
                    f"hydra.sweeper.n_trials={a.n_trials}",
                    f"hydra.sweeper.batch_size={a.batch_size}",
                    f"hydra.sweeper.storage=sqlite:///{tmp}/o.db",
                    f"tracking.uri={search_store}",
                    f"hydra.sweep.dir={tmp}/search",
                    "-m",
                ]
            )
            found = goodputs(search_store)
            reached = next((i + 1 for i, (_, g) in enumerate(found) if g >= 0.95 * best), None)
            rows.append(
                (
                    "optuna",
                    len(found),
                    wall,
                    max(g for _, g in found),
                    f"{reached} ({reached / len(grid):.0%} of the grid)" if reached else "not reached",
                )
            )
            print("\n".join(line for line in out.splitlines() if line.startswith("optuna: best")))
        print(
            f"space: {len(CONCURRENCY)} concurrencies x {len(OUTPUT)} output lengths = "
            f"{len(CONCURRENCY) * len(OUTPUT)} configurations; objective: maximize goodput (TTFT <= 100 ms)"
        )
        print(
            f"{'method':7s} {'trials':>6s} {'wall s':>7s} {'best goodput':>13s}  trials to within 5% of the grid's best"
        )
        for name, n, wall, g, reached in rows:
            print(f"{name:7s} {n:6d} {wall:7.0f} {g:13.2f}  {reached}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
