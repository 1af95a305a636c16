"""How long from the command to the first request of a one-trial run?

    python -m benchmarks.quick_start [--repeats 3] [--no-warm]

The README's "measure a running server" command (``engine=external``, one load point of one
request, MLflow in a throw-away sqlite file) against a fake server (its own process, which
records when each request arrived on the machine's monotonic clock, the clock this script reads
before it starts the command). Twice: cold (a new MLflow store, and the command starts a local
Ray, as a first run does) and warm (``cluster.address=auto`` on a Ray started beforehand with
``ray start``, and a store made by an untimed run before). Prints
per run the time to the first request and the command's whole wall time, and the phases the
command logs with their times (``INFERENCE_LAB_TIMING=1``). Targets (issue 24): <= 10 s cold,
<= 3 s warm.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from orchestrator.config.schema import TinyModelSpec
from orchestrator.models.tiny import ensure_tiny_model
from orchestrator.scheduling.sweep import PROJECT_ROOT
from tests.fake_openai_server import FakeServerProcess


def one_run(server: FakeServerProcess, tokenizer: str, extra: list[str], tmp: Path) -> tuple[float, float, str]:
    """One command with its MLflow store in ``tmp`` (made there if it is not yet)."""
    server.reset()
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=external",
        f"engine.url={server.url}",
        "model.name=tiny",
        f"model.tokenizer={tokenizer}",
        "workload=short_short",
        "workload.load_points=[{concurrency:1}]",
        "workload.num_requests=1",
        "workload.warmup_requests=0",
        "platform.telemetry=false",
        "resume=false",  # the same trial every run: measure it again
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"hydra.run.dir={tmp}/run",
        *extra,
    ]
    env = {**os.environ, "INFERENCE_LAB_TIMING": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, env=env, timeout=300)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}\n{proc.stderr[-3000:]}")
    truth = server.truth_json()
    arrivals = [r["arrival"] for r in truth["by_request"].values()]  # type: ignore[union-attr]
    if not arrivals:
        raise SystemExit("the fake server saw no request")
    phases = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if "[timing] " in line:
            label, at = line.split("[timing] ", 1)[1].rsplit(" at ", 1)
            phases.append(f"  {float(at) - t0:6.2f} s  {label}")
    return min(arrivals) - t0, wall, "\n".join(sorted(phases, key=lambda x: float(x.split()[0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-warm", action="store_true", help="skip the run on a running Ray")
    ap.add_argument("--phases", action="store_true", help="print the command's logged phases of each run")
    a = ap.parse_args()
    tokenizer = str(ensure_tiny_model(TinyModelSpec()))
    rows = []
    with FakeServerProcess("--ttft", "0.02", "--itl", "0.01") as server, tempfile.TemporaryDirectory() as tmp:
        modes = [("cold (local Ray)", [])]
        if not a.no_warm:
            modes.append(("warm (cluster.address=auto)", ["cluster.address=auto"]))
        for name, extra in modes:
            if extra:
                subprocess.run(
                    ["ray", "start", "--head", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                    check=True,
                    capture_output=True,
                    env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
                )
            try:
                runs = []
                if extra:  # warm: the store exists too (an untimed run made it)
                    one_run(server, tokenizer, extra, Path(tmp) / "warm")
                for i in range(a.repeats):
                    store = Path(tmp) / ("warm" if extra else f"cold-{i}")  # cold: a new store each run
                    first, wall, phases = one_run(server, tokenizer, extra, store)
                    runs.append((first, wall))
                    print(f"{name} run {i + 1}: first request after {first:.1f} s, wall {wall:.1f} s", file=sys.stderr)
                    if a.phases:
                        print(phases, file=sys.stderr)
                rows.append((name, [r[0] for r in runs], [r[1] for r in runs]))
            finally:
                if extra:
                    subprocess.run(
                        [str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True, check=False
                    )
    print("| start | runs | first request s (median, min-max) | wall s (median) |")
    print("|---|---|---|---|")
    for name, firsts, walls in rows:
        print(
            f"| {name} | {len(firsts)} | {median(firsts):.1f} ({min(firsts):.1f}-{max(firsts):.1f}) | {median(walls):.1f} |"
        )


if __name__ == "__main__":
    main()
