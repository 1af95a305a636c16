"""Run-to-run noise of this machine: one configuration run N times, the between-run coefficient
of variation of each headline metric per load point.

    python -m benchmarks.noise [--runs 5] [--same-start] [-- extra overrides...]

The CLI a user runs (``python -m orchestrator``, the default config's vLLM CPU server, Ray, the
monitor, MLflow in a throw-away sqlite file) as one multirun of ``+run=0..N-1``: the same
configuration, each run with fresh requests (the race's rounds draw theirs the same way). By
default each run starts its own server (``reuse_servers=false``), as a race's rounds do;
``--same-start`` runs them all on one start (the noise of requests and time alone). Numbers come
from each run's ``result.json``. Prints a table: per point and metric, the mean, the CV
(sd / mean) and the range over the runs. docs/benchmarks.md keeps the table; docs/statistics.md
reads it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

METRICS = (
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "tokens_per_second",
    "goodput_rps",
)
DEFAULTS = [
    "workload.classes={main:{input_tokens:256,output_tokens:64}}",
    "workload.load_points=[{concurrency:1},{concurrency:4}]",
    "workload.num_requests=32",
]


def run(runs: int, same_start: bool, extra: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "orchestrator",
            f"+run={','.join(str(i) for i in range(runs))}",
            *DEFAULTS,
            f"reuse_servers={str(same_start).lower()}",
            "resume=false",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"hydra.sweep.dir={tmp}/sweep",
            *extra,
            "-m",
        ]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"the sweep failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return [json.loads(f.read_text()) for f in sorted(Path(tmp, "sweep").glob("trials/*/result.json"))]


def table(results: list[dict]) -> list[str]:
    by_point: dict[str, dict[str, list[float]]] = {}
    for r in results:
        for p in r["points"]:
            for m in METRICS:
                v = p["metrics"].get(m)
                if v is not None and math.isfinite(v):
                    by_point.setdefault(p["label"], {}).setdefault(m, []).append(v)
    lines = ["| point | metric | runs | mean | CV | min - max |", "|---|---|---|---|---|---|"]
    for label, metrics in by_point.items():
        for m in METRICS:
            xs = metrics.get(m, [])
            if len(xs) < 2:
                continue
            mean = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
            cv = sd / mean if mean else float("nan")
            lines.append(f"| {label} | {m} | {len(xs)} | {mean:.4g} | {cv:.1%} | {min(xs):.4g} - {max(xs):.4g} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--same-start", action="store_true", help="every run on one server start")
    ap.add_argument("extra", nargs="*", help="more overrides for the configuration")
    a = ap.parse_args()
    results = run(a.runs, a.same_start, a.extra)
    print(f"{len(results)} runs, {'one server start' if a.same_start else 'a server start each'}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
