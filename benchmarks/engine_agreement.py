"""Do the product's numbers agree with vLLM's own client on a real server?

    python -m benchmarks.engine_agreement [--rounds 3] [--concurrency 8 | --rate 3] [--requests 128]
    python -m benchmarks.engine_agreement --observer          # the product's own observer effect
    python -m benchmarks.engine_agreement --url http://127.0.0.1:8000 --model-path DIR --model-name NAME

Our side is the entry point a user runs: ``python -m orchestrator engine=external ...`` in a
subprocess, with Ray, the resource monitor and MLflow (a throw-away sqlite file); its numbers
are read from the trial's ``result.json``. vLLM's side is ``vllm.benchmarks.serve``. Each
round runs both, alternately, on one server: the vLLM CPU server of the default config
(started here through the orchestrator's adapter) or one you started (``--url``).

Both clients send the same kind of prompts, built by our PromptFactory (``--vllm-prompts
ours``, the default: vLLM's client reads them as a custom dataset), with a fresh seed per
run so no run finds another's prompts in the prefix cache. ``--vllm-prompts random`` gives
vLLM's client its own random dataset instead: on a small vocabulary those prompts repeat
their leading blocks and hit the prefix cache, which is what made vLLM's client report half
our TTFT (see docs/benchmarks.md). The server's own counters are read around every run and
shown next to each client's numbers (prompt tokens per request, prefix-cache hit rate).

``--observer`` compares the CLI (Ray, monitor, MLflow) with a bare in-process load run (no
Ray, no monitor) under the same fixed load: the server's throughput with and without the
product around it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir

from benchmarks.vllm_client import run_vllm_client
from orchestrator.config import to_specs
from orchestrator.config.resolvers import register
from orchestrator.config.schema import WorkloadSpec
from orchestrator.engines import ServerProcess, adapter_for, free_port
from orchestrator.engines.base import EngineMetric
from orchestrator.engines.vllm import METRICS
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from orchestrator.metrics import prometheus
from orchestrator.metrics.summary import summarize_point
from orchestrator.models import resolve_model
from orchestrator.trial import server_env

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = {**METRICS, "requests": EngineMetric("vllm:request_success", "counter")}
KEYS = (("ttft", "ms"), ("tpot", "ms"), ("tok_s", "tok/s"))


class Setup:
    def __init__(self, a: argparse.Namespace, url: str, model_name: str, model_path: str, tmp: Path) -> None:
        self.a, self.url, self.model_name, self.model_path, self.tmp = a, url, model_name, model_path, tmp
        self.factory = PromptFactory(model_path)

    @property
    def load_point(self) -> dict[str, Any]:
        return {"rate": self.a.rate} if self.a.rate else {"concurrency": self.a.concurrency}

    def server_counters(self) -> prometheus.Sample:
        return prometheus.scrape(self.url + "/metrics", families=[m.family for m in COUNTERS.values()])

    def measured(self, run: Any, *args: Any) -> dict[str, float]:
        """Run one client; add the server's own counters over that run."""
        before = self.server_counters()
        row = run(*args)
        d = prometheus.deltas(before, self.server_counters(), COUNTERS)
        row["prompt_tok"] = d.get("prompt_tokens", float("nan")) / max(d.get("requests", 0.0), 1.0)
        row["hit"] = d.get("prefix_cache_hit_rate", 0.0)
        return row

    # -- our side: the CLI a user runs ----------------------------------------------------
    def cli(self, seed: int) -> dict[str, float]:
        a = self.a
        run_dir = self.tmp / f"cli-{seed}"
        point = f"{{rate:{a.rate:g}}}" if a.rate else f"{{concurrency:{a.concurrency}}}"
        argv = [
            sys.executable,
            "-m",
            "orchestrator",
            "engine=external",
            f"engine.url={self.url}",
            f"model.name={self.model_name}",
            f"model.path={self.model_path}",
            f"workload.classes.main.input_tokens={a.input_len}",
            f"workload.classes.main.output_tokens={a.output_len}",
            f"workload.load_points=[{point}]",
            f"workload.num_requests={a.requests}",
            f"workload.warmup_requests={a.warmups}",
            f"seed={seed}",
            "resume=false",
            f"tracking.uri=sqlite:///{self.tmp}/mlflow.db",
            f"hydra.run.dir={run_dir}",
            *a.cli_overrides,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        results = sorted(run_dir.glob("**/result.json"))
        if proc.returncode != 0 or not results:
            raise RuntimeError(f"the CLI failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(results[-1].read_text())
        if result["status"] != "FINISHED":
            raise RuntimeError(f"the CLI's trial ended {result['status']}: {result.get('error')}")
        m = result["points"][0]["metrics"]
        return {
            "ttft": m["ttft_ms_p50"],
            "tpot": m["tpot_ms_p50"],
            "tok_s": m["tokens_per_second"],
            "err": m.get("errors", 0.0),
        }

    # -- our load generator alone, in this process: no Ray, no monitor, no MLflow --------------
    def bare(self, seed: int) -> dict[str, float]:
        a = self.a
        workload = WorkloadSpec.model_validate(
            {
                "name": "agreement",
                "classes": {"main": {"input_tokens": a.input_len, "output_tokens": a.output_len}},
                "load_points": [self.load_point],
                "num_requests": a.requests,
                "warmup_requests": a.warmups,
            }
        )
        records = run_points(Endpoint(self.url, self.model_name), workload, self.factory, seed=seed)
        m = summarize_point(records)  # warmup requests are not returned
        return {"ttft": m["ttft_ms_p50"], "tpot": m["tpot_ms_p50"], "tok_s": m["tokens_per_second"], "err": m["errors"]}

    # -- vLLM's client -------------------------------------------------------------------------
    def vllm(self, seed: int) -> dict[str, float]:
        a = self.a
        args = [
            "--backend",
            "openai",
            "--base-url",
            self.url,
            "--endpoint",
            "/v1/completions",
            "--model",
            self.model_name,
            "--tokenizer",
            self.model_path,
            "--num-prompts",
            str(a.requests),
            "--ignore-eos",
            "--seed",
            str(seed),
            "--num-warmups",
            str(a.warmups),
        ]
        if a.vllm_prompts == "random":
            args += [
                "--dataset-name",
                "random",
                "--random-input-len",
                str(a.input_len),
                "--random-output-len",
                str(a.output_len),
            ]
        else:  # our prompts, as a custom dataset, sent as they are (no chat template, no shuffle)
            rng = np.random.default_rng([seed, 7919])
            path = self.tmp / f"prompts-{seed}.jsonl"
            path.write_text(
                "".join(
                    json.dumps({"prompt": self.factory.prompt(a.input_len, rng)}) + "\n"
                    for _ in range(a.requests + a.warmups)
                )
            )
            args += [
                "--dataset-name",
                "custom",
                "--dataset-path",
                str(path),
                "--custom-output-len",
                str(a.output_len),
                "--skip-chat-template",
                "--disable-shuffle",
            ]
        args += (
            ["--request-rate", f"{a.rate:g}"]
            if a.rate
            else ["--max-concurrency", str(a.concurrency), "--request-rate", "inf"]
        )
        r, _ = run_vllm_client(args)
        return {
            "ttft": r["median_ttft_ms"],
            "tpot": r["median_tpot_ms"],
            "tok_s": r["output_throughput"],
            "err": float(r.get("failed", 0)),
        }


def table(rows: list[tuple[int, str, dict[str, float]]], names: tuple[str, str]) -> None:
    print("\nmedian over rounds; 'range' = lowest..highest round of that client (run-to-run noise)")
    print(
        f"{'metric':13s} {names[0]:>9s} {names[1]:>9s} {'diff':>8s}   {names[0] + ' range':>17s}   "
        f"{names[1] + ' range':>17s}"
    )
    for k, unit in KEYS:
        vals = {n: [r[k] for _, name, r in rows if name == n] for n in names}
        o, v = median(vals[names[0]]), median(vals[names[1]])
        print(
            f"{k + ' (' + unit + ')':13s} {o:9.2f} {v:9.2f} {(o - v) / v * 100:+7.1f}%   "
            f"{min(vals[names[0]]):8.2f}..{max(vals[names[0]]):<8.2f}   "
            f"{min(vals[names[1]]):8.2f}..{max(vals[names[1]]):<8.2f}"
        )
    for n in names:
        hits = [r["hit"] for _, name, r in rows if name == n]
        ptok = [r["prompt_tok"] for _, name, r in rows if name == n]
        print(
            f"server counters for {n}: prompt tokens per request {median(ptok):.1f}, "
            f"prefix-cache hit rate {min(hits):.1%}..{max(hits):.1%}"
        )


def run(a: argparse.Namespace, url: str, model_name: str, model_path: str, tmp: Path) -> None:
    s = Setup(a, url, model_name, model_path, tmp)
    load = f"Poisson {a.rate:g} req/s" if a.rate else f"closed loop c={a.concurrency}"
    clients = (("cli", s.cli), ("bare", s.bare)) if a.observer else (("cli", s.cli), ("vllm", s.vllm))
    print(
        f"{load}; {a.requests} requests of {a.input_len}+{a.output_len} tokens per run (+{a.warmups} warmup); "
        f"{' vs '.join(n for n, _ in clients)}",
        flush=True,
    )
    for k, (_, fn) in enumerate(clients):  # one untimed run each: server and client paths warm
        fn(10_000 + k)
    rows: list[tuple[int, str, dict[str, float]]] = []
    for i in range(a.rounds):
        order = clients if i % 2 == 0 else clients[::-1]  # neither client always goes first
        for j, (name, fn) in enumerate(order):
            r = s.measured(fn, 2 * i + j + 1)  # a fresh seed per run: no run's prompts are cached
            rows.append((i, name, r))
            print(
                f"round {i}  {name:4s}  ttft p50 {r['ttft']:8.1f} ms  tpot p50 {r['tpot']:6.2f} ms  "
                f"{r['tok_s']:7.1f} tok/s  prompt tok/req {r['prompt_tok']:6.1f}  "
                f"prefix hits {r['hit']:6.1%}  errors {int(r['err'])}",
                flush=True,
            )
    table(rows, (clients[0][0], clients[1][0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop: Poisson arrivals at this rate instead of a closed loop at --concurrency",
    )
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--vllm-prompts", choices=("ours", "random"), default="ours")
    ap.add_argument("--observer", action="store_true", help="CLI vs a bare in-process run, no vLLM client")
    ap.add_argument("--url", help="a running server to measure (default: start the default config's server)")
    ap.add_argument("--model-path", help="with --url: the model/tokenizer directory the server serves")
    ap.add_argument("--model-name", default=None, help="with --url: the served model name")
    ap.add_argument(
        "--server-overrides",
        nargs="*",
        default=[],
        help="Hydra overrides for the server started here, e.g. engine.dtype=bfloat16",
    )
    ap.add_argument(
        "--cli-overrides",
        nargs="*",
        default=[],
        help="extra overrides for our CLI, e.g. platform.monitor_interval_s=0.5",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agreement-") as tmp:
        if a.url:
            if not a.model_path:
                ap.error("--url needs --model-path (the tokenizer both clients use)")
            run(a, a.url.rstrip("/"), a.model_name or a.model_path, a.model_path, Path(tmp))
            return
        register()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            server = ["engine.max_model_len=2048", *a.server_overrides]
            spec, _ = to_specs(compose("config", overrides=server), server)
        model_path = resolve_model(spec.model)
        launch = adapter_for("vllm").launch(spec, model_path, free_port())
        env = server_env(launch, [])
        with ServerProcess(launch.argv, env, Path(tmp) / "server.log", launch.health_url) as srv:
            print(
                f"vLLM CPU server ({' '.join(a.server_overrides) or 'default config'}) healthy after "
                f"{srv.wait_healthy(600):.0f} s",
                flush=True,
            )
            run(a, launch.base_url, spec.model.name, str(model_path), Path(tmp))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
