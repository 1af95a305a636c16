"""What the telemetry sampler costs the machine it measures: CPU per sample and share of a core.

    python -m benchmarks.telemetry_cost [--seconds 20] [--children 6]

A process tree like a vLLM CPU server's (an API server, an engine core and workers: here
``--children`` idle Python processes under one parent) is sampled by the product's own
:class:`TelemetrySampler` with its probes (servers' CPU and RSS, the machine; NVML and RAPL when
the machine has them) at 1 s and at 0.1 s. This process does nothing else while it samples, so
its CPU time is the sampler's. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--children", type=int, default=6)
    a = ap.parse_args()
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
