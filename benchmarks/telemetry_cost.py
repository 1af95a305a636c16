"""What the telemetry sampler costs the machine it measures: CPU per sample and share of a core.

    python -m benchmarks.telemetry_cost [--seconds 20] [--children 6]
    python -m benchmarks.telemetry_cost --observer [--pairs 8]    # telemetry on vs off via the CLI

A process tree like a vLLM CPU server's (an API server, an engine core and workers: here
``--children`` idle Python processes under one parent) is sampled by the product's own
:class:`TelemetrySampler` with its probes (servers' CPU and RSS, the machine; NVML and RAPL when
the machine has them) at 1 s and at 0.1 s. This process does nothing else while it samples, so
its CPU time is the sampler's. Prints a table.

``--observer`` measures what the server loses to it: the CLI a user runs (``python -m
orchestrator``, the default config's vLLM CPU server, Ray, the monitor, MLflow in a throw-away
sqlite file) as one multirun of seeds 0..N, each seed a trial with ``platform.telemetry=true``
then one with ``=false``, under the same fixed load (closed loop c=8, 128 requests of 128 prompt
and 64 output tokens). Telemetry is not part of a server's identity, so every trial runs on one
server start (the prefix cache emptied between trials) and each pair is compared on the same
server; seed 0 is a warm-up pair. Numbers come from each trial's ``result.json``.
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
        "sampler_cpu_ms_per_sample": sampler.cost_s * 1e3 / max(sampler.samples, 1),
    }


ROOT = Path(__file__).resolve().parents[1]
OBSERVED = (("tokens_per_second", "tok/s"), ("ttft_ms_p50", "TTFT p50 ms"), ("tpot_ms_p50", "TPOT p50 ms"))


def observer_sweep(tmp: Path, pairs: int, extra: list[str]) -> list[dict[str, object]]:
    """One multirun through the CLI: seeds 0..pairs, each with telemetry on then off, all on one
    server start (telemetry is not part of the server's identity). Returns each trial's
    result.json."""
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "workload.classes.main.input_tokens=128",
        "workload.classes.main.output_tokens=64",
        "workload.load_points=[{concurrency:8}]",
        "workload.num_requests=128",
        "workload.warmup_requests=2",
        f"seed={','.join(str(i) for i in range(pairs + 1))}",
        "platform.telemetry=true,false",
        "resume=false",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"hydra.sweep.dir={tmp}/sweep",
        *extra,
        "-m",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    results = [json.loads(f.read_text()) for f in sorted((tmp / "sweep").glob("**/result.json"))]
    if proc.returncode != 0 or len(results) != 2 * (pairs + 1):
        raise RuntimeError(f"the CLI failed ({proc.returncode}, {len(results)} results):\n{proc.stderr[-3000:]}")
    bad = [r for r in results if r["status"] != "FINISHED"]
    if bad:
        raise RuntimeError(f"{len(bad)} trial(s) did not finish: {bad[0].get('error')}")
    return results


def observer(pairs: int, extra: list[str]) -> None:
    """Telemetry on vs off, paired on one server: per pair the ratio on/off of each metric."""
    with tempfile.TemporaryDirectory(prefix="telemetry-observer-") as tmp:
        results = observer_sweep(Path(tmp), pairs, extra)
    by: dict[tuple[int, bool], dict[str, float]] = {}
    reused = 0.0
    for r in results:
        spec = r["spec"]
        assert isinstance(spec, dict)
        points = r["points"]
        assert isinstance(points, list)
        by[(int(spec["seed"]), bool(spec["platform"]["telemetry"]))] = points[0]["metrics"]
        metrics = r["metrics"]
        assert isinstance(metrics, dict)
        reused += float(metrics.get("server_reused", 0.0))
    ratios: dict[str, list[float]] = {k: [] for k, _ in OBSERVED}
    print(f"{len(results)} trials, {reused:.0f} of them on a reused server; seed 0 is a warm-up pair (not counted)")
    for seed in range(1, pairs + 1):
        on, off = by[(seed, True)], by[(seed, False)]
        for k, _ in OBSERVED:
            ratios[k].append(on[k] / off[k] - 1.0)
        print(
            f"pair {seed}: "
            + "  ".join(
                f"{label} on {on[k]:.2f} off {off[k]:.2f} ({ratios[k][-1] * 100:+.1f}%)" for k, label in OBSERVED
            ),
            flush=True,
        )
    print(f"\ntelemetry on vs off, {pairs} pairs on one server, {os.cpu_count()} cores")
    print("| metric | on vs off, median of pairs | lowest..highest pair |")
    print("|---|---|---|")
    for k, label in OBSERVED:
        v = ratios[k]
        print(f"| {label} | {median(v) * 100:+.1f}% | {min(v) * 100:+.1f}%..{max(v) * 100:+.1f}% |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--children", type=int, default=6)
    ap.add_argument("--observer", action="store_true", help="telemetry on vs off through the CLI on a real server")
    ap.add_argument("--pairs", type=int, default=8, help="--observer: trials with telemetry on and off, paired")
    ap.add_argument("--cli-overrides", nargs="*", default=[], help="more overrides for both CLI runs")
    a = ap.parse_args()
    if a.observer:
        observer(a.pairs, a.cli_overrides)
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
    print("| interval | samples | rows | CPU per sample | share of one core | sampler thread CPU per sample |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['interval_s']:g} s | {r['samples']:.0f} | {r['rows']:.0f} | {r['cpu_ms_per_sample']:.2f} ms "
            f"| {r['core_share_pct']:.2f}% | {r['sampler_cpu_ms_per_sample']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
