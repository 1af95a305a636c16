"""How close does our client's measurement stay to the truth, and how does vLLM's compare?

    python -m benchmarks.client_fidelity                      # 64/256/512 streams + 3 rates
    python -m benchmarks.client_fidelity --streams 64 --rates 20 --no-vllm
    python -m benchmarks.client_fidelity --client-processes 1 2   # also scale-out over 2 processes

A fake OpenAI server (``testkit/fake_openai_server.py``, its own process) answers with a
scripted TTFT and ITL and records when each request arrived and when each chunk was
actually written. Client and server share one monotonic clock (same machine), so:

* true TTFT / ITL = what the server actually did (first chunk - arrival, chunk gaps);
* client delay per chunk = client receive time - server send time (our client only: we
  keep per-chunk instants; vLLM's client keeps only gaps);
* client CPU = CPU seconds of the client process per 100k streamed tokens.

Prints a table; numbers are for this machine only (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.vllm_client import random_dataset_args, run_vllm_client
from orchestrator.config.schema import TinyModelSpec, WorkloadSpec
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from orchestrator.metrics.summary import latency_of, summarize_point
from orchestrator.models.tiny import ensure_tiny_model
from testkit.fake_openai_server import FakeServerProcess

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def true_latencies(truth: dict[str, Any]) -> tuple[list[float], list[float]]:
    ttft, itl = [], []
    for t in truth["by_request"].values():
        chunks = t["chunks"]
        if chunks:
            ttft.append((chunks[0] - t["arrival"]) * 1e3)
            itl += [(b - a) * 1e3 for a, b in zip(chunks, chunks[1:])]
    return ttft, itl


def children_cpu() -> float:
    """CPU seconds of finished child processes (the client processes of a scale-out run)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_ours(
    server: FakeServerProcess,
    factory: PromptFactory,
    point: dict[str, Any],
    n: int,
    out_tokens: int,
    processes: int = 1,
) -> dict[str, Any]:
    w = WorkloadSpec.model_validate(
        {
            "name": "fidelity",
            "classes": {"main": {"input_tokens": 32, "output_tokens": out_tokens}},
            "load_points": [point],
            "num_requests": n,
            "warmup_requests": 0,
            "client_processes": processes,
        }
    )
    server.reset()
    cpu0, child0, t0 = time.process_time(), children_cpu(), time.perf_counter()
    records = run_points(Endpoint(server.url, "tiny"), w, factory, seed=0)
    cpu = time.process_time() - cpu0 + children_cpu() - child0  # client processes are waited for at the end
    truth = server.truth_json()
    lats = [x for x in (latency_of(r) for r in records) if x is not None]
    delays = []
    for r in records:
        sent = truth["by_request"].get(f"lab-{r.request_id}", {}).get("chunks", [])
        delays += [(c - s) * 1e3 for c, s in zip(r.chunk_times_s, sent)]
    tokens = sum(x.output_tokens for x in lats)
    m = summarize_point(records, target_rate=point.get("rate"))
    return {
        "ttft": [x.ttft_ms for x in lats],
        "itl": [v for x in lats for v in x.itl_ms],
        "delay": delays,
        "truth": true_latencies(truth),
        "cpu_per_100k": cpu / max(tokens, 1) * 1e5,
        "errors": m.get("errors", 0),
        "rate_ratio": (m["achieved_rate"] / m["schedule_rate"]) if "schedule_rate" in m else None,
        "wall_s": time.perf_counter() - t0,
    }


def run_vllm(
    server: FakeServerProcess, tokenizer: str, point: dict[str, Any], n: int, out_tokens: int
) -> dict[str, Any] | None:
    try:
        import vllm.benchmarks.serve  # noqa: F401
    except ImportError:
        return None
    server.reset()
    args = random_dataset_args(server.url, "tiny", tokenizer, 32, out_tokens, n)
    args += ["--save-detailed", "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99"]
    if "concurrency" in point:
        args += ["--max-concurrency", str(point["concurrency"]), "--request-rate", "inf"]
    else:
        args += ["--request-rate", str(point["rate"])]
    try:
        result, cpu = run_vllm_client(args)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return None
    truth = server.truth_json()
    ttft = [x * 1e3 for x in result.get("ttfts", []) if x]
    itl = [v * 1e3 for xs in result.get("itls", []) for v in xs]
    tokens = sum(result.get("output_lens", [])) or n * out_tokens
    return {
        "ttft": ttft,
        "itl": itl,
        "delay": [],
        "truth": true_latencies(truth),
        "cpu_per_100k": cpu / tokens * 1e5,
        "errors": result.get("failed", 0),
        "rate_ratio": None,
        "wall_s": result.get("duration"),
    }


def row(client: str, setting: str, r: dict[str, Any], target_rate: float | None) -> list[str]:
    true_ttft, true_itl = r["truth"]

    def f(x: float | None) -> str:
        return "-" if x is None or x != x else f"{x:.1f}"

    rate = "-" if target_rate is None or r["rate_ratio"] is None else f"{r['rate_ratio'] * 100:.1f}%"
    return [
        client,
        setting,
        f(pct(r["ttft"], 50)),
        f(pct(true_ttft, 50)),
        f(pct(r["ttft"], 99)),
        f(pct(true_ttft, 99)),
        f(pct(r["itl"], 50)),
        f(pct(true_itl, 50)),
        f(pct(r["itl"], 99)),
        f(pct(true_itl, 99)),
        f(pct(r["delay"], 50) if r["delay"] else None),
        f(pct(r["delay"], 99) if r["delay"] else None),
        rate,
        f(r["cpu_per_100k"]),
        str(int(r["errors"])),
    ]


HEADER = [
    "client",
    "load",
    "ttft p50",
    "true",
    "ttft p99",
    "true",
    "itl p50",
    "true",
    "itl p99",
    "true",
    "delay p50",
    "delay p99",
    "sent/sched",
    "cpu s/100k tok",
    "err",
]


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(x) for x in col) for col in zip(HEADER, *rows)]
    for r in [HEADER, ["-" * w for w in widths], *rows]:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description="client fidelity against a fake server with a known truth")
    ap.add_argument("--streams", type=int, nargs="*", default=[64, 256, 512])
    ap.add_argument("--rates", type=float, nargs="*", default=[10.0, 50.0, 100.0])
    ap.add_argument("--ttft", type=float, default=0.02)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream in concurrency points")
    ap.add_argument("--rate-seconds", type=float, default=10.0, help="length of rate points")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's client")
    ap.add_argument(
        "--client-processes",
        type=int,
        nargs="*",
        default=[1],
        help="run our client with each of these numbers of client processes (scale-out)",
    )
    a = ap.parse_args()
    model_dir = str(ensure_tiny_model(TinyModelSpec()))
    factory = PromptFactory(model_dir)
    server = FakeServerProcess("--ttft", str(a.ttft), "--itl", str(a.itl))
    print(
        f"fake server: true TTFT {a.ttft * 1e3:.0f} ms, ITL {a.itl * 1e3:.0f} ms, {a.output_tokens} tokens/request; "
        f"all times in ms; 'true' = what the server actually did",
        flush=True,
    )
    rows: list[list[str]] = []
    try:
        points = [({"concurrency": c}, c * a.rounds, f"{c} streams", None) for c in a.streams]
        points += [({"rate": r}, int(r * a.rate_seconds), f"{r:g} req/s", r) for r in a.rates]
        for point, n, setting, rate in points:
            for procs in a.client_processes:
                name = "ours" if procs == 1 else f"ours x{procs}"
                rows.append(row(name, setting, run_ours(server, factory, point, n, a.output_tokens, procs), rate))
                print_table(rows[-1:]) if len(rows) > 1 else print_table(rows)
            if not a.no_vllm:
                r = run_vllm(server, model_dir, point, n, a.output_tokens)
                if r is not None:
                    rows.append(row("vllm", setting, r, rate))
                    print_table(rows[-1:])
    finally:
        server.stop()
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
