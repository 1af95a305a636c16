"""The SGLang adapter: trial spec -> ``python -m sglang.launch_server`` argv/env, SGLang's
Prometheus names -> neutral names, and the P/D topology (prefill + decode + router).

SGLang's wheels are CUDA-only: on the CPU platform its trials are SKIPPED before launch
(:func:`unsupported`); the command lines are still generated for dry runs and checked
against SGLang's own ``ServerArgs`` parser in the tests.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.config.schema import SGLangEngineSpec, TrialSpec
from orchestrator.engines import envs
from orchestrator.engines.base import EngineMetric, Profiler, ServerLaunch, opt
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

# Where each server's GPUs come from within the trial's assigned list.
BOOTSTRAP_PORT_OFFSET = 1000


def build_argv(
    engine: SGLangEngineSpec,
    model_path: str,
    served_name: str,
    port: int,
    *,
    tp: int | None = None,
    mode: str | None = None,
    bootstrap_port: int | None = None,
    head: list[str],
    tokenizer: str | None = None,
) -> list[str]:
    """One SGLang server's command line as an argv list (never a shell string). ``head``: the
    launch prefix, interpreter and ``-m MODULE`` (:func:`orchestrator.engines.envs.command`)."""
    argv = list(head)
    argv += ["--model-path", model_path, "--served-model-name", served_name]
    argv += opt("tokenizer-path", tokenizer)  # model.tokenizer: the one our prompts are made with
    argv += ["--host", engine.host, "--port", str(port)]
    argv += ["--dtype", engine.dtype]
    argv += ["--tp-size", str(tp or engine.tensor_parallel_size)]
    argv += ["--enable-metrics"]
    argv += opt("context-length", engine.context_length)
    argv += opt("chunked-prefill-size", engine.chunked_prefill_size)
    argv += opt("schedule-policy", engine.schedule_policy)
    if engine.disable_radix_cache:
        argv.append("--disable-radix-cache")
    argv += opt("page-size", engine.page_size)
    argv += opt("speculative-algorithm", engine.speculative_algorithm)
    argv += opt("speculative-draft-model-path", engine.speculative_draft_model_path)
    argv += opt("speculative-num-steps", engine.speculative_num_steps)
    argv += opt("speculative-eagle-topk", engine.speculative_eagle_topk)
    argv += opt("speculative-num-draft-tokens", engine.speculative_num_draft_tokens)
    argv += opt("quantization", engine.quantization)
    argv += opt("kv-cache-dtype", engine.kv_cache_dtype)
    argv += opt("mem-fraction-static", engine.mem_fraction_static)
    argv += opt("max-running-requests", engine.max_running_requests)
    if engine.disable_cuda_graph:
        argv.append("--disable-cuda-graph")
    argv += opt("cuda-graph-max-bs", engine.cuda_graph_max_bs)
    argv += opt("random-seed", engine.random_seed)
    if mode is not None:
        assert engine.disaggregation is not None
        argv += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", engine.disaggregation.connector]
        argv += opt("disaggregation-bootstrap-port", bootstrap_port)
    argv += [str(a) for a in engine.extra_args]
    return argv


def build_env(spec: TrialSpec) -> dict[str, str]:
    env = {"SGLANG_DISABLE_REQUEST_LOGGING": "1", "DO_NOT_TRACK": "1"}
    if spec.model.source != "hub":
        env["HF_HUB_OFFLINE"] = "1"
    assert isinstance(spec.engine, SGLangEngineSpec)
    env.update(spec.engine.env)
    return env


def _spec(spec: TrialSpec) -> SGLangEngineSpec:
    assert isinstance(spec.engine, SGLangEngineSpec)
    return spec.engine


def launch(spec: TrialSpec, model_path: str, port: int) -> ServerLaunch:
    engine = _spec(spec)
    return ServerLaunch(
        name="server",
        argv=build_argv(
            engine,
            model_path,
            spec.model.name,
            port,
            head=envs.command(spec, SERVER_MODULE),
            tokenizer=spec.model.tokenizer,
        ),
        env=build_env(spec),
        host=engine.host,
        port=port,
        startup_timeout_s=engine.startup_timeout_s,
        gpus=tuple(range(engine.tensor_parallel_size)),
        fatal_log_markers=FATAL_LOG_MARKERS,
    )


def launches(
    spec: TrialSpec, model_path: str, port: int, next_port: Callable[[], int], workdir: str
) -> list[ServerLaunch]:
    """Every server of the trial, the measured front last: one server, or prefill + decode +
    the SGLang router (``--pd-disaggregation``) with disjoint GPUs."""
    engine = _spec(spec)
    pd = engine.disaggregation
    if pd is None:
        return [launch(spec, model_path, port)]
    head = envs.command(spec, SERVER_MODULE)
    p_port, d_port, bootstrap = next_port(), next_port(), next_port()

    def server(name: str, port: int, tp: int, first: int) -> ServerLaunch:
        argv = build_argv(
            engine,
            model_path,
            spec.model.name,
            port,
            tp=tp,
            mode=name,
            bootstrap_port=bootstrap if name == "prefill" else None,
            head=head,
            tokenizer=spec.model.tokenizer,
        )
        return ServerLaunch(
            name=name,
            env=build_env(spec),
            host=engine.host,
            port=port,
            startup_timeout_s=engine.startup_timeout_s,
            argv=argv,
            gpus=tuple(range(first, first + tp)),
            fatal_log_markers=FATAL_LOG_MARKERS,
        )

    prefill = server("prefill", p_port, pd.prefill_tp, 0)
    decode = server("decode", d_port, pd.decode_tp, pd.prefill_tp)
    routing = ["--pd-disaggregation", "--prefill", prefill.base_url, str(bootstrap), "--decode", decode.base_url]
    return [prefill, decode, router_launch(spec, engine.host, port, next_port(), routing)]


def unsupported(spec: TrialSpec) -> str | None:
    """Why this trial cannot run on its platform, or None."""
    if spec.platform.device == "cpu":
        return "SGLang needs CUDA GPUs (its wheels are CUDA-only); platform is cpu"
    return None


def cache_reset(spec: TrialSpec) -> tuple[str, str] | None:
    """(method, path) that empties the prefix cache between load points (fails while busy)."""
    return ("POST", "/flush_cache")


def metrics_for(spec: TrialSpec) -> dict[str, EngineMetric]:
    return METRICS


def api_key(spec: TrialSpec) -> str | None:
    return None


def version(spec: TrialSpec) -> str:
    return envs.package_version(spec, "sglang")


def hold(spec: TrialSpec) -> dict[str, float] | None:
    """Not a holding kind: the trial serves."""
    return None


def profiler(spec: TrialSpec, trace_dir: str) -> Profiler | None:
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
