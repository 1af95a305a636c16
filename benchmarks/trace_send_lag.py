"""How late a trace replay's sends go out on this machine: the Mooncake slice of
tests/integration/test_trace_replay.py (``+experiment=prefix_caching variant=apc_on_prefix_1024
workload=mooncake``, 20 requests at a sixth of the trace's speed, in bursts of 4, 5, 10 and 1
requests 18 s apart) against the real vLLM CPU server, run N times; one line per run.

    python -m benchmarks.trace_send_lag [--runs 3] [override ...]
    python -m benchmarks.trace_send_lag --runs 3 platform.server_nice=0     # the servers at our priority

Per run: the send lag of every request (ms, in schedule order: its bursts side by side), its
p50/p95/max, the event loop's worst wake-up (``loop_lag_ms_max``) and whether the point was
valid (``workload.validity.max_send_lag_ms_p95``: 10 ms). Each run starts its own server
(~2.3 min a run on 2 cores). The machine's stolen CPU time (``/proc/stat``, a VM's hypervisor)
over the runs is printed at the end.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from orchestrator.config import to_specs
from orchestrator.config.schema import TinyModelSpec
from orchestrator.metrics.records import parquet_bytes_to_table, table_to_records
from orchestrator.models.tiny import ensure_tiny_model
from orchestrator.trial import run_trial
from testkit.compose import compose_config

SLICE = [
    "+experiment=prefix_caching",
    "variant=apc_on_prefix_1024",
    "workload=mooncake",
    "workload.replay.num_requests=20",
]


def stolen_s() -> float:
    """Seconds of CPU the hypervisor took from this VM's vCPUs so far (all of them)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / 100 if len(fields) > 8 else 0.0


def one_run(overrides: list[str]) -> tuple[list[float], dict[str, float], list[str], float]:
    spec, _ = to_specs(compose_config([*SLICE, *overrides]), [*SLICE, *overrides])
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.monotonic()
        result = run_trial(spec, Path(folder), ["trace_send_lag"], progress=lambda line: None)
        wall = time.monotonic() - t0
    if not result.points:
        raise SystemExit(f"the trial measured nothing: {result.status} {result.error}")
    point = result.points[0]
    records = sorted(
        (r for r in table_to_records(parquet_bytes_to_table(result.records_parquet)) if r.point == 0),
        key=lambda r: r.intended_send_s,
    )
    lags = [(r.sent_s - r.intended_send_s) * 1e3 for r in records]
    return lags, point.metrics, point.invalid_reasons, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides after the slice's")
    args = parser.parse_args()
    ensure_tiny_model(TinyModelSpec())
    steal0 = stolen_s()
    print(f"overrides: {' '.join(args.overrides) or '(none)'}")
    print("| run | send lag per request (ms) | p50 | p95 | max | loop lag max (ms) | valid | wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for i in range(args.runs):
        lags, m, invalid, wall = one_run(args.overrides)
        each = " ".join(f"{x:.1f}" for x in lags)
        valid = "yes" if not invalid else "; ".join(invalid)
        print(
            f"| {i} | {each} | {m['send_lag_ms_p50']:.2f} | {m['send_lag_ms_p95']:.2f} | {m['send_lag_ms_max']:.2f} "
            f"| {m['loop_lag_ms_max']:.1f} | {valid} | {wall:.0f} |",
            flush=True,
        )
    print(f"CPU stolen by the hypervisor over the runs: {stolen_s() - steal0:.2f} s")


if __name__ == "__main__":
    main()
