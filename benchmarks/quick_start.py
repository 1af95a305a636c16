"""How long from the command to the first request of a one-trial run?

    python -m benchmarks.quick_start [--repeats 3] [--no-warm]

The README's "measure a running server" command (``engine=external``, one load point of one
request, MLflow in a throw-away sqlite file) against a fake server (its own process, which
records when each request arrived on the machine's monotonic clock, the clock this script reads
before it starts the command). Twice: cold (a new MLflow store, and the command starts a local
Ray, as a first run does) and warm (``cluster.address=auto`` on a Ray started beforehand with
``ray start``, and a store made by an untimed run before), both with ``resume=false`` (the same
trial measured again); then warm with ``resume=true``, the README's command as it is (MLflow
says what is FINISHED before the trial starts), a new trial (seed) each run. Prints
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
from testkit.fake_openai_server import FakeServerProcess


def one_run(
    server: FakeServerProcess,
    tokenizer: str,
    extra: list[str],
    tmp: Path,
    phases: bool = False,
    resume_seed: int | None = None,
) -> tuple[float, float, str]:
    """One command with its MLflow store in ``tmp`` (made there if it is not yet). ``phases``:
    with ``INFERENCE_LAB_TIMING=1`` (on a running Ray its workers then get a runtime_env, which
    Ray sets up through its agent: slower than a user's run). ``resume_seed``: the README's
    command as it is (``resume=true``: MLflow is asked what is FINISHED before the trial starts),
    a new trial each run (this seed); else ``resume=false``, the same trial measured again."""
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
        *(["resume=false"] if resume_seed is None else ["resume=true", f"seed={resume_seed}"]),
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"hydra.run.dir={tmp}/run",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "INFERENCE_LAB_TIMING"}
    if phases:
        env["INFERENCE_LAB_TIMING"] = "1"
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
        modes: list[tuple[str, list[str], bool]] = [("cold (local Ray)", [], False)]
        if not a.no_warm:
            warm = ["cluster.address=auto"]
            modes += [("warm (cluster.address=auto)", warm, False), ("warm, resume=true (a new trial)", warm, True)]
        ray_bin = str(Path(sys.executable).parent / "ray")
        seeds = iter(range(1000, 10_000))
        ray_up = False
        try:
            for name, extra, resume in modes:
                if extra and not ray_up:
                    ray_up = True
                    subprocess.run(
                        [
                            ray_bin,
                            "start",
                            "--head",
                            "--num-cpus=2",
                            "--include-dashboard=false",
                            "--disable-usage-stats",
                        ],
                        check=True,
                        capture_output=True,
                    )
                    one_run(server, tokenizer, extra, Path(tmp) / "warm")  # warm: the store exists (untimed)
                runs = []
                for i in range(a.repeats):
                    store = Path(tmp) / ("warm" if extra else f"cold-{i}")  # cold: a new store each run
                    seed = next(seeds) if resume else None
                    first, wall, phases = one_run(server, tokenizer, extra, store, a.phases, seed)
                    runs.append((first, wall))
                    print(f"{name} run {i + 1}: first request after {first:.1f} s, wall {wall:.1f} s", file=sys.stderr)
                    if a.phases:
                        print(phases, file=sys.stderr)
                rows.append((name, [r[0] for r in runs], [r[1] for r in runs]))
        finally:
            if ray_up:
                subprocess.run([ray_bin, "stop", "--force"], capture_output=True, check=False)
    print("| start | runs | first request s (median, min-max) | wall s (median) |")
    print("|---|---|---|---|")
    for name, firsts, walls in rows:
        print(
            f"| {name} | {len(firsts)} | {median(firsts):.1f} ({min(firsts):.1f}-{max(firsts):.1f}) | {median(walls):.1f} |"
        )


if __name__ == "__main__":
    main()
