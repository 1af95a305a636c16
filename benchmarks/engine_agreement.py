"""Do our client and vLLM's own client agree on a real server?

    python -m benchmarks.engine_agreement [--rounds 6] [--concurrency 8] [--requests 64]

Starts the vLLM CPU server of the default config (tiny model) through the orchestrator's
own adapter, then runs the same fixed workload (random 128-token prompts, 64 output tokens,
closed loop) alternately with our load generator and with ``vllm.benchmarks.serve``,
and compares median TTFT and TPOT. Prints a table; the target is agreement within 10%.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import median

from hydra import compose, initialize_config_dir

from orchestrator.config import to_specs
from orchestrator.config.resolvers import register
from orchestrator.engines import ServerProcess, adapter_for, free_port
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from orchestrator.metrics.summary import summarize_point
from orchestrator.models import resolve_model
from orchestrator.trial import server_env

from benchmarks.vllm_client import random_dataset_args, run_vllm_client

ROOT = Path(__file__).resolve().parents[1]


def ours(url: str, model: str, tokenizer: str, c: int, n: int, in_len: int, out_len: int, seed: int,
         rate: float | None = None) -> dict[str, float]:
    point = {"rate": rate} if rate else {"concurrency": c}
    spec_workload = {"name": "agreement", "classes": {"main": {"input_tokens": in_len, "output_tokens": out_len}},
                     "load_points": [point], "num_requests": n, "warmup_requests": 0}
    from orchestrator.config.schema import WorkloadSpec

    records = run_points(Endpoint(url, model), WorkloadSpec.model_validate(spec_workload), PromptFactory(tokenizer),
                         seed=seed)
    m = summarize_point(records)
    return {"ttft": m["ttft_ms_p50"], "tpot": m["tpot_ms_p50"], "tok_s": m["tokens_per_second"], "err": m["errors"]}


def theirs(url: str, model: str, tokenizer: str, c: int, n: int, in_len: int, out_len: int, seed: int,
           rate: float | None = None) -> dict[str, float]:
    args = random_dataset_args(url, model, tokenizer, in_len, out_len, n)
    load = ["--request-rate", str(rate)] if rate else ["--max-concurrency", str(c), "--request-rate", "inf"]
    r, _ = run_vllm_client([*args, *load, "--seed", str(seed)])
    return {"ttft": r["median_ttft_ms"], "tpot": r["median_tpot_ms"], "tok_s": r["output_throughput"],
            "err": float(r.get("failed", 0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rate", type=float, default=None,
                    help="open loop: Poisson arrivals at this rate instead of a closed loop at --concurrency")
    a = ap.parse_args()
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        spec, _ = to_specs(compose("config", overrides=["engine.max_model_len=1024"]))
    model_path = resolve_model(spec.model)
    launch = adapter_for("vllm").launch(spec, model_path, free_port())
    rows = []
    with tempfile.TemporaryDirectory() as tmp, \
            ServerProcess(launch.argv, server_env(launch, []), Path(tmp) / "server.log", launch.health_url) as srv:
        load = f"Poisson {a.rate:g} req/s" if a.rate else f"c={a.concurrency}"
        print(f"vLLM CPU server healthy after {srv.wait_healthy(600):.0f} s; {load}, {a.requests} requests "
              f"of {a.input_len}+{a.output_len} tokens per run", flush=True)
        # one untimed run each to warm up the server
        ours(launch.base_url, spec.model.name, model_path, a.concurrency, 8, a.input_len, a.output_len, 99)
        theirs(launch.base_url, spec.model.name, model_path, a.concurrency, 8, a.input_len, a.output_len, 99)
        for i in range(a.rounds):
            for name, fn in (("ours", ours), ("vllm", theirs)):
                r = fn(launch.base_url, spec.model.name, model_path, a.concurrency, a.requests, a.input_len,
                       a.output_len, i, a.rate)
                rows.append((i, name, r))
                print(f"round {i}  {name:4s}  ttft p50 {r['ttft']:7.1f} ms  tpot p50 {r['tpot']:6.2f} ms  "
                      f"{r['tok_s']:7.1f} tok/s  errors {int(r['err'])}", flush=True)
    print()
    med = {name: {k: median(r[k] for _, n, r in rows if n == name) for k in ("ttft", "tpot", "tok_s")}
           for name in ("ours", "vllm")}
    spread = {name: {k: (min(r[k] for _, n, r in rows if n == name), max(r[k] for _, n, r in rows if n == name))
                     for k in ("ttft", "tpot", "tok_s")} for name in ("ours", "vllm")}
    print("median over rounds; 'range' = lowest..highest round of that client (run-to-run noise of the server)")
    print(f"{'metric':13s} {'ours':>9s} {'vllm':>9s} {'diff':>8s}   {'ours range':>17s}   {'vllm range':>17s}")
    for k, unit in (("ttft", "ms"), ("tpot", "ms"), ("tok_s", "tok/s")):
        o, v = med["ours"][k], med["vllm"][k]
        (olo, ohi), (vlo, vhi) = spread["ours"][k], spread["vllm"][k]
        print(f"{k + ' (' + unit + ')':13s} {o:9.2f} {v:9.2f} {(o - v) / v * 100:+7.1f}%   "
              f"{olo:8.2f}..{ohi:<8.2f}   {vlo:8.2f}..{vhi:<8.2f}")


if __name__ == "__main__":
    main()
