"""The diagnosis validated against known causes on real vLLM CPU servers: each scenario drives
a server into one state this machine can reach, runs it as a trial (the trial layer in this
process: no Ray, no MLflow) and checks the point's named limiter against the cause it was
driven into, with no wrong *strong* finding beside it. Prints a markdown table of the runs and
the numbers each rule read (docs/diagnosis.md keeps one).

    python -m benchmarks.diagnosis_validation                     # every scenario (~10 minutes here)
    python -m benchmarks.diagnosis_validation headroom kv_capacity # some
    python -m benchmarks.diagnosis_validation --out results.json

Scenarios (the tiny Llama, fp32, eager, 2 GiB of KV unless said):

* ``headroom``: one stream of 128-token prompts, 64 output tokens;
* ``batch_slots``: ``max_num_seqs=2`` under 8 streams;
* ``prefill_interference``: 4 short streams while 1024-token prompts arrive every 1.25 s, chunked
  prefill off (the demo's ``chunking_off``);
* ``kv_capacity``: 6 KV blocks of 128 tokens (``--num-gpu-blocks-override``) under 6 streams of
  128 + 256 tokens: two fit;
* ``over_capacity``: 12 req/s of 128-token prompts and 64 output tokens, open loop, more than
  the server completes (it completed ~9 req/s here);
* ``over_capacity_short``: 8 req/s of 128 + 256 tokens for 6 s: each request lives longer than
  the arrivals span (nothing completes to count); the output rate's plateau tells;
* ``open_loop_keeps_up``: the same requests at 3 req/s: the warm-up of an open loop (in flight
  climbing for a lifetime) is not a queue; each arrival's prefill stalling the running streams
  for a step may be named (weak);
* ``client``: a thread in the client's process that holds the GIL 50 ms at a time (a starved
  client: its event loop lags);
* ``shared_machine``: two processes outside the trial burning a core each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["workload.classes.main.input_tokens=128", "workload.classes.main.output_tokens=64"]


@contextmanager
def nothing() -> Iterator[None]:
    yield


@contextmanager
def gil_hog() -> Iterator[None]:
    """A thread in this (the client's) process that computes in 50 ms slices holding the GIL."""
    stop = threading.Event()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)

    def burn() -> None:
        while not stop.is_set():
            sum(i * i for i in range(20000))

    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)


@contextmanager
def burner(processes: int = 2) -> Iterator[None]:
    """Processes burning a core each, outside this process's tree (double-forked: init adopts
    them), as somebody else's job on the machine."""
    pids = []
    for _ in range(processes):
        out = subprocess.run(
            # its own session, as somebody else's job is (not in this process's autogroup)
            ["sh", "-c", f"setsid {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        pids.append(int(out.stdout.strip()))
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


@dataclass
class Scenario:
    name: str
    expect: str
    how: str
    overrides: list[str]
    around: Callable[[], Any] = nothing
    point: int = -1  # which point of the trial is judged
    consequences: tuple[str, ...] = ()  # strong findings the cause itself brings about (not wrong)
    weak_also: tuple[str, ...] = ()  # weak limiters the state may name instead (machine-dependent margins)


SCENARIOS = [
    Scenario(
        "headroom",
        "none",
        "1 stream, 128 in / 64 out",
        [*SHORT, "workload.load_points=[{concurrency:1}]", "workload.num_requests=12"],
        weak_also=("decode_bandwidth",),  # one stream's TPOT is 2.2-3x its floor: over or under 2.5x by machine
    ),
    Scenario(
        "batch_slots",
        "batch_slots",
        "max_num_seqs=2, 8 streams",
        [*SHORT, "engine.max_num_seqs=2", "workload.load_points=[{concurrency:8}]", "workload.num_requests=32"],
    ),
    Scenario(
        "prefill_interference",
        "prefill_interference",
        "4 short streams, 1024-token prompts every 1.25 s, chunked prefill off",
        [
            "workload=mixed_long_short",
            "engine.enable_chunked_prefill=false",
            "engine.max_model_len=2048",
            "workload.classes.short.input_tokens=128",
            "workload.classes.short.output_tokens=64",
            "workload.classes.long.input_tokens=1024",
            "workload.classes.long.output_tokens=4",
            "workload.classes.long.rate=0.8",
            "+workload.classes.long.arrival=constant",
            "workload.load_points=[{concurrency:4}]",
            "workload.num_requests=24",
        ],
    ),
    Scenario(
        "kv_capacity",
        "kv_capacity",
        "6 KV blocks of 128 tokens (2 requests of 128 + 256 tokens fit), 6 streams",
        [
            "engine.max_model_len=640",
            "engine.extra_args=[--num-gpu-blocks-override,6]",
            "workload.classes.main.input_tokens=128",
            "workload.classes.main.output_tokens=256",
            "workload.load_points=[{concurrency:6}]",
            "workload.num_requests=12",
        ],
    ),
    Scenario(
        "over_capacity",
        "over_capacity",
        "12 req/s open loop, 128 in / 64 out",
        [
            "workload.classes.main.input_tokens=128",
            "workload.classes.main.output_tokens=64",
            "workload.load_points=[{rate:12}]",
            "workload.num_requests=144",
        ],
    ),
    Scenario(
        "over_capacity_short",
        "over_capacity",
        "8 req/s open loop, 128 in / 256 out, 48 requests (each lives longer than the arrivals span)",
        [
            "workload.classes.main.input_tokens=128",
            "workload.classes.main.output_tokens=256",
            "workload.load_points=[{rate:8}]",
            "workload.num_requests=48",
        ],
    ),
    Scenario(
        "open_loop_keeps_up",
        "none",
        "3 req/s open loop, 128 in / 64 out (a third of what over_capacity found the server completes)",
        [
            "workload.classes.main.input_tokens=128",
            "workload.classes.main.output_tokens=64",
            "workload.load_points=[{rate:3}]",
            "workload.num_requests=72",
        ],
        # each arrival's 128-token prefill stalls the one or two running streams for a step: true, and small
        weak_also=("prefill_interference",),
    ),
    Scenario(
        "client",
        "client",
        "a thread holding the client's GIL 50 ms at a time, 4 streams",
        [*SHORT, "workload.load_points=[{concurrency:4}]", "workload.num_requests=16"],
        around=gil_hog,
    ),
    Scenario(
        "shared_machine",
        "shared_machine",
        "two processes outside the trial burning a core each, 2 streams",
        [*SHORT, "workload.load_points=[{concurrency:2}]", "workload.num_requests=12"],
        around=burner,
        consequences=("client",),  # the client shares the machine too: its loop lags
    ),
]

# What each rule read, for the table (whichever of these the point has).
READ = (
    "decode_batch_mean",
    "server_requests_waiting_max",
    "server_kv_cache_usage_max",
    "server_preemptions",
    "stalls",
    "stalls_prefill",
    "stall_worst_ms",
    "ttft_parts_queue_ms",
    "ttft_parts_prefill_ms",
    "telemetry_server_cpu_cores_mean",
    "foreign_cpu_cores",
    "loop_lag_ms_p95",
    "decode_floor_ratio",
)


@dataclass
class Outcome:
    scenario: Scenario
    limiter: str = ""
    confidence: str = ""
    others: list[str] = field(default_factory=list)
    headline: str = ""
    read: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def right(self) -> bool:
        wrong_strong = [
            o for o in self.others if o.endswith("(strong)") and o.split(" ")[0] not in self.scenario.consequences
        ]
        named = self.limiter == self.scenario.expect or (
            self.confidence == "weak" and self.limiter in self.scenario.weak_also
        )
        return named and not wrong_strong


def run(scenario: Scenario, workdir: Path) -> Outcome:
    from hydra import compose, initialize_config_dir

    from orchestrator.config import to_specs
    from orchestrator.config.resolvers import register
    from orchestrator.trial import run_trial

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        spec, _ = to_specs(compose("config", overrides=scenario.overrides), scenario.overrides)
    with scenario.around():
        result = run_trial(spec, workdir / scenario.name, progress=lambda m: print(f"  {m}", flush=True))
    out = Outcome(scenario)
    if result.status != "FINISHED" or not result.points:
        out.error = f"{result.status}: {(result.error or '').splitlines()[0] if result.error else ''}"
        return out
    p = result.points[scenario.point]
    d = p.diagnosis
    out.limiter, out.confidence, out.headline = d.get("limiter", ""), d.get("confidence", ""), d.get("headline", "")
    out.others = [f"{f['cause']} ({f['confidence']})" for f in d.get("findings", []) if f["cause"] != out.limiter]
    out.read = {k: round(p.metrics[k], 3) for k in READ if k in p.metrics}
    return out


def table(outcomes: list[Outcome]) -> list[str]:
    lines = [
        "| scenario | driven by | expected | named | also found | right | what the rules read |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        named = o.error or f"{o.limiter} ({o.confidence})"
        read = ", ".join(f"{k} {v:g}" for k, v in o.read.items())
        lines.append(
            f"| {o.scenario.name} | {o.scenario.how} | {o.scenario.expect} | {named} | "
            f"{', '.join(o.others) or '-'} | {'yes' if o.right else 'NO'} | {read} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", help=f"some of: {', '.join(s.name for s in SCENARIOS)}")
    ap.add_argument("--out", type=Path, help="also write the outcomes as JSON here")
    ap.add_argument("--keep", type=Path, help="keep each scenario's trial folder under this folder")
    args = ap.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.scenarios or s.name in args.scenarios]
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            tmp = str(args.keep)
        for s in chosen:
            print(f"=== {s.name}: {s.how}", flush=True)
            t0 = time.monotonic()
            outcomes.append(run(s, Path(tmp)))
            print(
                f"=== {s.name}: {outcomes[-1].limiter or outcomes[-1].error} in {time.monotonic() - t0:.0f}s",
                flush=True,
            )
    print("\n".join(table(outcomes)))
    for o in outcomes:
        print(f"- {o.scenario.name}: {o.headline}")
    if args.out:
        args.out.write_text(json.dumps([{**o.__dict__, "scenario": o.scenario.name} for o in outcomes], indent=1))
    return 0 if all(o.right for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
