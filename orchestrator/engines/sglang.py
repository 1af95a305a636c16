"""The SGLang adapter (:class:`SGLangAdapter`): trial spec -> ``python -m sglang.launch_server``
argv/env, SGLang's Prometheus names -> neutral names, and the P/D topology (prefill + decode +
router).

SGLang's wheels are CUDA-only: on the CPU platform its trials are SKIPPED before launch
(:func:`unsupported`); the command lines are still generated for dry runs and checked
against SGLang's own ``ServerArgs`` parser in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.schema import SGLangEngineSpec, TrialSpec
from orchestrator.engines import envs
from orchestrator.engines.base import EngineAdapter, EngineMetric, LaunchContext, Profiler, Role, ServerLaunch, register
from orchestrator.engines.flags import Flag, ServerArgs, engine_flags, lora_flags
from orchestrator.engines.nsys import wrapper as nsys_wrapper
from orchestrator.engines.router import router_launch

SERVER_MODULE = "sglang.launch_server"
# What SGLang logs when its scheduler process dies under a live HTTP server
# (sglang/srt/managers/scheduler.py).
FATAL_LOG_MARKERS = ("Scheduler hit an exception",)

# Neutral name -> SGLang Prometheus family (with --enable-metrics; SGLang 0.5).
METRICS: dict[str, EngineMetric] = {
    "prompt_tokens": EngineMetric("sglang:prompt_tokens_total", "counter"),
    "generation_tokens": EngineMetric("sglang:generation_tokens_total", "counter"),
    "cached_tokens": EngineMetric("sglang:cached_tokens_total", "counter"),
    "cache_hit_rate": EngineMetric("sglang:cache_hit_rate", "gauge"),
    "kv_cache_usage": EngineMetric("sglang:token_usage", "gauge"),
    "requests_running": EngineMetric("sglang:num_running_reqs", "gauge"),
    "requests_waiting": EngineMetric("sglang:num_queue_reqs", "gauge"),
    "spec_decode_accept_length": EngineMetric("sglang:spec_accept_length", "gauge"),
    "retractions": EngineMetric("sglang:num_retracted_reqs", "gauge"),
    "ttft": EngineMetric("sglang:time_to_first_token_seconds", "latency"),
    "itl": EngineMetric("sglang:inter_token_latency_seconds", "latency"),
    "e2e": EngineMetric("sglang:e2e_request_latency_seconds", "latency"),
}


@dataclass(frozen=True)
class SGLangServerArgs(ServerArgs[SGLangEngineSpec]):
    """One SGLang server's arguments: the shared ones and its side of a P/D pair."""

    mode: Role | None = None  # --disaggregation-mode: "prefill" or "decode" of a P/D pair
    bootstrap_port: int | None = None  # the prefill server's KV bootstrap port

    @property
    def transfer_backend(self) -> str | None:
        pd = self.engine.disaggregation
        return pd.connector if self.mode is not None and pd is not None else None


# The server's flags in argv order (after the launch head, before engine.extra_args).
FLAGS: tuple[Flag[SGLangServerArgs], ...] = (
    Flag("model-path", lambda a: a.model_path),
    Flag("served-model-name", lambda a: a.served_name),
    Flag("tokenizer-path", lambda a: a.tokenizer),
    *engine_flags("host"),
    Flag("port", lambda a: a.port),
    *engine_flags("dtype"),
    Flag("tp-size", lambda a: a.tp),
    Flag("enable-metrics", lambda a: True, "switch"),
    *engine_flags("context-length", "chunked-prefill-size", "schedule-policy"),
    *engine_flags("disable-radix-cache", kind="switch"),
    *engine_flags("page-size", "speculative-algorithm", "speculative-draft-model-path", "speculative-num-steps"),
    *engine_flags("speculative-eagle-topk", "speculative-num-draft-tokens", "quantization", "kv-cache-dtype"),
    *engine_flags("mem-fraction-static", "max-running-requests"),
    *engine_flags("disable-cuda-graph", kind="switch"),
    *engine_flags("cuda-graph-max-bs", "random-seed"),
    Flag("disaggregation-mode", lambda a: a.mode),
    Flag("disaggregation-transfer-backend", lambda a: a.transfer_backend),
    Flag("disaggregation-bootstrap-port", lambda a: a.bootstrap_port if a.mode is not None else None),
    Flag("enable-lora", lambda a: a.lora, "switch"),
    Flag("lora-paths", lambda a: [f"{name}={path}" for name, path in a.adapters], "list"),
    *lora_flags("max-loras-per-batch", "max-loaded-loras", "max-lora-rank", "lora-backend"),
)


@register
class SGLangAdapter(EngineAdapter[SGLangEngineSpec]):
    """SGLang servers: one, or a prefill/decode pair behind the SGLang router; CUDA only."""

    spec_type = SGLangEngineSpec

    def env(self, spec: TrialSpec) -> dict[str, str]:
        """Variables added to every server's environment."""
        env = {"SGLANG_DISABLE_REQUEST_LOGGING": "1", "DO_NOT_TRACK": "1"}
        if spec.model.source != "hub":
            env["HF_HUB_OFFLINE"] = "1"
        env.update(self.narrow(spec).env)
        return env

    def launches(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        """Every server of the trial, the measured front last: one server, or prefill + decode +
        the SGLang router (``--pd-disaggregation``) with disjoint GPUs."""
        engine = self.narrow(spec)
        pd = engine.disaggregation
        if pd is None:
            return [self._server(spec, at, at.port, "server", engine.tensor_parallel_size, 0)]
        p_port, d_port, bootstrap = at.next_port(), at.next_port(), at.next_port()
        prefill = self._server(spec, at, p_port, "prefill", pd.prefill_tp, 0, bootstrap)
        decode = self._server(spec, at, d_port, "decode", pd.decode_tp, pd.prefill_tp)
        routing = ["--pd-disaggregation", "--prefill", prefill.base_url, str(bootstrap), "--decode", decode.base_url]
        return [prefill, decode, router_launch(spec, engine.host, at.port, at.next_port(), routing)]

    def _server(
        self,
        spec: TrialSpec,
        at: LaunchContext,
        port: int,
        role: Role,
        tp: int,
        first: int,
        bootstrap: int | None = None,
    ) -> ServerLaunch:
        """One server of ``tp`` GPUs from the trial's ``first``: alone (``role`` "server"), or one
        side of a P/D pair (its ``--disaggregation-mode``; the prefill side takes ``bootstrap``)."""
        engine = self.narrow(spec)
        alone = role == "server"
        args = SGLangServerArgs.of(
            engine, spec.model, at, port, None if alone else tp, mode=None if alone else role, bootstrap_port=bootstrap
        )
        argv = args.argv(envs.command(spec, SERVER_MODULE), FLAGS)
        return ServerLaunch(
            name=role,
            role=role,
            argv=argv,
            env=self.env(spec),
            host=engine.host,
            port=port,
            startup_timeout_s=engine.startup_timeout_s,
            gpus=tuple(range(first, first + tp)),
            fatal_log_markers=FATAL_LOG_MARKERS,
        )

    def batch_slots(self, spec: TrialSpec) -> int | None:
        return self.narrow(spec).max_running_requests

    def lora_rank_limit(self, spec: TrialSpec) -> tuple[int | None, str]:
        return self.narrow(spec).max_lora_rank, ""

    def prefix_cache_on(self, spec: TrialSpec) -> bool | None:
        return not self.narrow(spec).disable_radix_cache

    def decode_ttft_holds_prefill(self, spec: TrialSpec) -> bool:
        return True  # its P/D router sends each request to the prefill and the decode server at once

    def unsupported(self, spec: TrialSpec) -> str | None:
        """Why this trial cannot run on its platform, or None."""
        if spec.platform.device == "cpu":
            return "SGLang needs CUDA GPUs (its wheels are CUDA-only); platform is cpu"
        return None

    def cache_reset(self, spec: TrialSpec) -> tuple[str, str] | None:
        """(method, path) that empties the prefix cache between load points (fails while busy)."""
        return ("POST", "/flush_cache")

    def metrics_for(self, spec: TrialSpec) -> dict[str, EngineMetric]:
        return METRICS

    def version(self, spec: TrialSpec) -> str:
        return envs.package_version(spec, "sglang")

    def profiler(self, spec: TrialSpec, trace_dir: str) -> Profiler | None:
        """SGLang's torch profiler: POST /start_profile with the output folder and activities, POST
        /stop_profile; traces land in ``trace_dir`` (``SGLANG_TORCH_PROFILER_DIR`` too)."""
        p = spec.profile
        if p is None:
            return None
        if p.nsys is not None:  # the CUDA_PROFILER activity: cudaProfilerStart/Stop, nsys's capture range
            nsys = p.nsys
            return Profiler(
                start=("/start_profile", {"output_dir": trace_dir, "activities": ["CUDA_PROFILER"]}),
                wrapper=lambda server: nsys_wrapper(nsys, trace_dir, server),
                stop_grace_s=nsys.stop_grace_s,
            )
        body = {
            "output_dir": trace_dir,
            "activities": ["CPU", "GPU"],
            "with_stack": p.with_stack,
            "record_shapes": p.record_shapes,
        }
        return Profiler(env=(("SGLANG_TORCH_PROFILER_DIR", trace_dir),), start=("/start_profile", body))
