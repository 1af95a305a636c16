"""What the telemetry sampler costs the machine it measures: CPU per sample and share of a core.

    python -m benchmarks.telemetry_cost [--seconds 20] [--children 6]
    python -m benchmarks.telemetry_cost --observer [--rounds 3]    # telemetry on vs off via the CLI

A process tree like a vLLM CPU server's (an API server, an engine core and workers: here
``--children`` idle Python processes under one parent) is sampled by the product's own
:class:`TelemetrySampler` with its probes (servers' CPU and RSS, the machine; NVML and RAPL when
the machine has them) at 1 s and at 0.1 s. This process does nothing else while it samples, so
its CPU time is the sampler's. Prints a table.

``--observer`` measures what the server loses to it: the CLI a user runs (``python -m
orchestrator``, the default config's vLLM CPU server, Ray, the monitor, MLflow in a throw-away
sqlite file) with ``platform.telemetry=true`` and ``=false``, alternately (neither always goes
first), each run its own server start under the same fixed load (closed loop c=8, 128 requests
of 128 prompt and 64 output tokens); the server's throughput, TTFT and TPOT are read from the
trial's ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from orchestrator.metrics.probes import TelemetrySampler, open_probes
from orchestrator.metrics.telemetry import Timeline


def measure(pids: list[int], interval_s: float, seconds: float) -> dict[str, float]:
    probes, notes = open_probes(pids, [])
    timeline = Timeline()
    sampler = TelemetrySampler(probes, timeline, interval_s=interval_s)
    cpu0, t0 = time.process_time(), time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return {
        "interval_s": interval_s,
        "samples": sampler.samples,
        "rows": len(timeline.rows),
        "cpu_ms_per_sample": cpu * 1e3 / max(sampler.samples, 1),
        "core_share_pct": cpu / wall * 100,
        "wall_ms_per_sample": sampler.cost_s * 1e3 / max(sampler.samples, 1),
    }


ROOT = Path(__file__).resolve().parents[1]
OBSERVED = (("tokens_per_second", "tok/s"), ("ttft_ms_p50", "TTFT p50 ms"), ("tpot_ms_p50", "TPOT p50 ms"))


def cli_run(tmp: Path, run: str, telemetry: bool, seed: int, extra: list[str]) -> dict[str, float]:
    """One trial through the CLI; its load point's metrics from its result.json."""
    run_dir = tmp / run
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        f"platform.telemetry={str(telemetry).lower()}",
        "workload.classes.main.input_tokens=128",
        "workload.classes.main.output_tokens=64",
        "workload.load_points=[{concurrency:8}]",
        "workload.num_requests=128",
        "workload.warmup_requests=2",
        f"seed={seed}",
        "resume=false",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    results = sorted(run_dir.glob("**/result.json"))
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"the CLI failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(results[-1].read_text())
    if result["status"] != "FINISHED":
        raise RuntimeError(f"the trial ended {result['status']}: {result.get('error')}")
    metrics: dict[str, float] = result["points"][0]["metrics"]
    return metrics


def observer(rounds: int, extra: list[str]) -> None:
    """Telemetry on vs off through the CLI, alternating; a table of medians and ranges."""
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="telemetry-observer-") as tmp:
        for i in range(rounds):
            for telemetry in (True, False) if i % 2 == 0 else (False, True):
                m = cli_run(Path(tmp), f"r{i}-{telemetry}", telemetry, 2 * i + int(telemetry) + 1, extra)
                runs[telemetry].append(m)
                print(
                    f"round {i} telemetry={'on ' if telemetry else 'off'} "
                    + "  ".join(f"{label} {m[k]:.2f}" for k, label in OBSERVED),
                    flush=True,
                )
    print(f"\ntelemetry on vs off through the CLI, {rounds} round(s), median (range), {os.cpu_count()} cores")
    print("| metric | telemetry on | telemetry off | on vs off |")
    print("|---|---|---|---|")
    for k, label in OBSERVED:
        on, off = ([r[k] for r in runs[t]] for t in (True, False))
        print(
            f"| {label} | {median(on):.2f} ({min(on):.2f}..{max(on):.2f}) | {median(off):.2f} "
            f"({min(off):.2f}..{max(off):.2f}) | {(median(on) - median(off)) / median(off) * 100:+.1f}% |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--children", type=int, default=6)
    ap.add_argument("--observer", action="store_true", help="telemetry on vs off through the CLI on a real server")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cli-overrides", nargs="*", default=[], help="more overrides for both CLI runs")
    a = ap.parse_args()
    if a.observer:
        observer(a.rounds, a.cli_overrides)
        return
    code = "import subprocess, sys, time\n" + (
        f"kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']) for _ in range({a.children})]\n"
        "time.sleep(3600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(2.0)  # the children are up
        rows = [measure([parent.pid], interval, a.seconds) for interval in (1.0, 0.1)]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the parent and its children
        parent.wait()
    print(
        f"telemetry sampler over a tree of {a.children + 1} processes, {a.seconds:g} s per interval, {os.cpu_count()} cores"
    )
    print("| interval | samples | rows | CPU per sample | share of one core | wall per sample |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['interval_s']:g} s | {r['samples']:.0f} | {r['rows']:.0f} | {r['cpu_ms_per_sample']:.2f} ms "
            f"| {r['core_share_pct']:.2f}% | {r['wall_ms_per_sample']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
