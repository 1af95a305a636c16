"""The names of the metrics a load point, a trial and a request class carry, defined once: the
constants code reads them by (:class:`M`), the families writers build the other names from
(distributions, the engines' neutral ``server_*`` names, stalls and limiters by cause,
``eval_<task>_<metric>``, ...), :func:`is_known`, and :func:`check_name`, which checks a name
a config gives (objective, expectations) and says which known names are closest. In ``config``,
the lowest layer, because the config's validation checks names against it."""

from __future__ import annotations

import difflib
import re
from typing import Final

PERCENTILES: Final = (50, 90, 95, 99)
STATS: Final = ("mean", *(f"p{p}" for p in PERCENTILES), "max")  # metrics.summary.distribution's
CI95: Final = "_ci95"  # a repeated point's 95% half-width of a metric: ``<metric>_ci95``
# A latency statistic's 95% interval within one run (a bootstrap over the point's requests:
# metrics.within_run): ``<metric>_within95_low`` / ``_high``.
WITHIN95: Final = ("_within95_low", "_within95_high")

# distribution(prefix, values) prefixes: ``<prefix>_<stat>``; a request class's are CLASS_LATENCIES'.
CLASS_LATENCIES: Final = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "itl_worst_ms")
# ``*_from_schedule_ms``: an open-loop point's latencies counted from each request's scheduled
# send instant, what a user of the schedule waits when the client falls behind.
SCHEDULED: Final = ("ttft_from_schedule_ms", "e2e_from_schedule_ms")
DISTRIBUTIONS: Final = (
    *CLASS_LATENCIES,
    "send_lag_ms",
    "loop_lag_ms",
    "first_turn_ttft_ms",
    "later_turns_ttft_ms",
    *SCHEDULED,
)

# The engines' neutral metric names by kind (the engines' METRICS maps: tests check they are
# listed here). Counters: ``server_<name>`` (delta over the point); gauges: ``server_<name>_max``
# (the resource monitor); histograms: ``server_<name>_mean``; latency histograms (seconds):
# ``server_<name>_s_mean`` and ``server_<name>_ms_p50/p99`` (+ ``_res_ms``, ``_low``, ``_high``),
# ``server_decode_<name>...`` for a P/D pair's decode server.
SERVER_COUNTERS: Final = (
    "prefix_cache_hits",
    "prefix_cache_queries",
    "preemptions",
    "generation_tokens",
    "engine_steps",
    "prompt_tokens",
    "cached_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_draft_tokens",
    "external_prefix_cache_hits",
    "external_prefix_cache_queries",
)
SERVER_GAUGES: Final = (
    "kv_cache_usage",
    "requests_running",
    "requests_waiting",
    "cache_hit_rate",
    "spec_decode_accept_length",
    "retractions",
)
SERVER_HISTOGRAMS: Final = ("queue_time_s", "prefill_time_s")
SERVER_LATENCIES: Final = ("ttft", "itl", "e2e")
SERVER_DERIVED: Final = ("prefix_cache_hit_rate", "spec_decode_acceptance_rate")  # metrics.prometheus.deltas
SERVER_QUANTILES: Final = (50, 99)  # metrics.prometheus.server_latency

STALL_CAUSES: Final = ("prefill", "preemption", "client_read", "unattributed")  # ``stalls_<cause>``...
LIMITERS: Final = (  # the diagnosis's vocabulary: ``limited_by_<cause>``
    "shared_machine",
    "client",
    "over_capacity",
    "kv_capacity",
    "batch_slots",
    "prefix_reuse_missed",  # before what recomputing shared prefixes inflates: prefill stalls, compute
    "prefill_interference",
    "compute",
    "decode_bandwidth",
    "none",
)
TTFT_PARTS: Final = ("client", "api", "queue", "prefill", "prefill_leg", "kv_transfer")  # ttft_parts_<part>_ms
CAPACITY_KNOBS: Final = ("rps", "concurrency")  # slo_capacity_<knob>
CAPACITY_BRACKET: Final = ("probes", "runs", "lo", "hi", "censored", "undecided")  # slo_capacity_<knob>_<x>


class M:
    """Metric names, as code reads (and most writers write) them."""

    # the client's summary of a point (metrics.summary)
    REQUESTS: Final = "requests"
    COMPLETED: Final = "completed"
    ERRORS: Final = "errors"
    DURATION_S: Final = "duration_s"
    QPS: Final = "qps"
    COALESCED_CHUNK_SHARE: Final = "coalesced_chunk_share"
    TOKENS_PER_SECOND: Final = "tokens_per_second"
    TOTAL_TOKENS_PER_SECOND: Final = "total_tokens_per_second"
    OUTPUT_TOKENS: Final = "output_tokens"
    INPUT_TOKENS: Final = "input_tokens"
    GOODPUT: Final = "goodput"
    SLO_ATTAINMENT: Final = "slo_attainment"
    ACHIEVED_RATE: Final = "achieved_rate"
    SCHEDULE_RATE: Final = "schedule_rate"
    TARGET_RATE: Final = "target_rate"
    ITL_P99_OVER_P50: Final = "itl_p99_over_p50"
    REPEATS: Final = "repeats"
    CI_WIDE: Final = "ci_wide"
    TTFT_MS_MEAN: Final = "ttft_ms_mean"
    TTFT_MS_P50: Final = "ttft_ms_p50"
    TTFT_MS_P99: Final = "ttft_ms_p99"
    TPOT_MS_P50: Final = "tpot_ms_p50"
    ITL_MS_P50: Final = "itl_ms_p50"
    ITL_MS_P99: Final = "itl_ms_p99"
    E2E_MS_P50: Final = "e2e_ms_p50"
    E2E_MS_P99: Final = "e2e_ms_p99"
    ITL_WORST_MS_P50: Final = "itl_worst_ms_p50"
    SEND_LAG_MS_P95: Final = "send_lag_ms_p95"
    SEND_LAG_MS_P99: Final = "send_lag_ms_p99"
    TTFT_FROM_SCHEDULE_MS_P50: Final = "ttft_from_schedule_ms_p50"
    # the client's own stats (loadgen)
    LOOP_LAG_MS_P95: Final = "loop_lag_ms_p95"
    CLIENT_START_LATE_MS: Final = "client_start_late_ms"  # how late the sender woke for the point's first instant
    CLIENT_CPU_UTIL: Final = "client_cpu_util"
    CLIENT_CPU_S: Final = "client_cpu_s"
    CLIENT_WALL_S: Final = "client_wall_s"
    CLIENT_STREAMS_ENDED_EARLY: Final = "client_streams_ended_early"
    CLIENT_REQUESTS_PAST_PLAN: Final = "client_requests_past_plan"
    CLIENT_STREAM_WAIT_SHARE: Final = "client_stream_wait_share"
    CLIENT_CPU_US_PER_CHUNK: Final = "client_cpu_us_per_chunk"
    CLIENT_NODES: Final = "client_nodes"
    CLIENT_CLOCK_OFFSET_MS_MAX: Final = "client_clock_offset_ms_max"
    CLIENT_CLOCK_UNCERTAINTY_MS_MAX: Final = "client_clock_uncertainty_ms_max"
    CLIENT_PROCESSES: Final = "client_processes"
    CLIENT_PROCESSES_NEEDED: Final = "client_processes_needed"
    CLIENT_PLANNED_CHUNK_RATE: Final = "client_planned_chunk_rate"
    CLIENT_CHUNK_COST_US: Final = "client_chunk_cost_us"
    # the point's verdict (metrics.fidelity.judge_point)
    CLIENT_INVALID: Final = "client_invalid"
    WORKLOAD_INVALID: Final = "workload_invalid"
    MACHINE_INVALID: Final = "machine_invalid"
    INVALID: Final = "invalid"
    SERVER_FAILED: Final = "server_failed"
    PROMPT_TOKENS_GAP_P50: Final = "prompt_tokens_gap_p50"
    PROMPT_TOKENS_SERVER_OVER_PLAN: Final = "prompt_tokens_server_over_plan"
    OUTPUT_TOKENS_OFF_FRACTION: Final = "output_tokens_off_fraction"
    PREFIX_CACHE_HIT_RATE_EXPECTED: Final = "prefix_cache_hit_rate_expected"
    PREEMPTIONS_PER_REQUEST: Final = "preemptions_per_request"
    REJECTED_FRACTION: Final = "rejected_fraction"
    TTFT_GAP_MS_P50: Final = "ttft_gap_ms_p50"
    ITL_GAP_MS_P50: Final = "itl_gap_ms_p50"
    FOREIGN_CPU_CORES: Final = "foreign_cpu_cores"
    SWEEP_CPU_CORES: Final = "sweep_cpu_cores"
    # the engine's numbers (server_* families)
    MEMORY_PEAK_GB: Final = "memory_peak_gb"
    SERVER_PREEMPTIONS: Final = "server_preemptions"
    SERVER_PROMPT_TOKENS: Final = "server_prompt_tokens"
    SERVER_GENERATION_TOKENS: Final = "server_generation_tokens"
    SERVER_ENGINE_STEPS: Final = "server_engine_steps"  # steps that produced output (vLLM)
    SERVER_QUEUE_TIME_S_MEAN: Final = "server_queue_time_s_mean"
    SERVER_PREFILL_TIME_S_MEAN: Final = "server_prefill_time_s_mean"
    SERVER_TTFT_S_MEAN: Final = "server_ttft_s_mean"
    SERVER_ITL_S_MEAN: Final = "server_itl_s_mean"
    SERVER_DECODE_TTFT_S_MEAN: Final = "server_decode_ttft_s_mean"
    SERVER_KV_CACHE_USAGE_MAX: Final = "server_kv_cache_usage_max"
    SERVER_REQUESTS_RUNNING_MAX: Final = "server_requests_running_max"
    SERVER_REQUESTS_WAITING_MAX: Final = "server_requests_waiting_max"
    SERVER_PREFIX_CACHE_HIT_RATE: Final = "server_prefix_cache_hit_rate"
    # a replayed trace's slice (loadgen.traces.slice_metrics) and the cache's efficiency on it
    TRACE_REQUESTS_TRUNCATED: Final = "trace_requests_truncated"
    TRACE_REQUESTS_DROPPED: Final = "trace_requests_dropped"
    TRACE_BLOCK_TOKENS: Final = "trace_block_tokens"
    TRACE_IDEAL_PREFIX_SHARE: Final = "trace_ideal_prefix_share"  # of prompt tokens, an infinite cache
    TRACE_CONVERSATIONS: Final = "trace_conversations"  # a multi-turn trace's first turns in the slice
    TRACE_FOLLOWERS_ROOTED: Final = "trace_followers_rooted"  # followers whose parent was not replayed
    # the share of prompt tokens a prefix cache could serve: a trace's ideal share, else what the
    # synthetic workload implies (metrics.fidelity.expected_hit_rate); read by the diagnosis
    PREFIX_REUSE_IDEAL_SHARE: Final = "prefix_reuse_ideal_share"
    PREFIX_REUSE_EFFICIENCY: Final = "prefix_reuse_efficiency"  # server hit rate / the ideal share
    SERVER_SPEC_DECODE_ACCEPTANCE_RATE: Final = "server_spec_decode_acceptance_rate"
    # what the hardware did (metrics.telemetry): energy and cost
    TELEMETRY_SERVER_CPU_CORES_MEAN: Final = "telemetry_server_cpu_cores_mean"
    TELEMETRY_SERVER_CPU_CORES_MAX: Final = "telemetry_server_cpu_cores_max"
    TELEMETRY_SERVER_RSS_GB_MAX: Final = "telemetry_server_rss_gb_max"
    TELEMETRY_MACHINE_CPU_CORES_MEAN: Final = "telemetry_machine_cpu_cores_mean"
    TELEMETRY_MACHINE_MEM_USED_GB_MAX: Final = "telemetry_machine_mem_used_gb_max"
    TELEMETRY_GPU_POWER_W_MEAN: Final = "telemetry_gpu_power_w_mean"
    TELEMETRY_GPU_POWER_W_MAX: Final = "telemetry_gpu_power_w_max"
    TELEMETRY_GPU_POWER_LIMIT_W_MEAN: Final = "telemetry_gpu_power_limit_w_mean"
    TELEMETRY_GPU_SM_UTIL_PCT_MEAN: Final = "telemetry_gpu_sm_util_pct_mean"
    TELEMETRY_GPU_MEM_UTIL_PCT_MEAN: Final = "telemetry_gpu_mem_util_pct_mean"
    TELEMETRY_GPU_SM_CLOCK_MHZ_MEAN: Final = "telemetry_gpu_sm_clock_mhz_mean"
    TELEMETRY_GPU_TEMP_C_MAX: Final = "telemetry_gpu_temp_c_max"
    TELEMETRY_GPU_THROTTLED_SHARE: Final = "telemetry_gpu_throttled_share"
    ENERGY_J: Final = "energy_j"
    ENERGY_FROM_COUNTER: Final = "energy_from_counter"
    JOULES_PER_OUTPUT_TOKEN: Final = "joules_per_output_token"
    OUTPUT_TOKENS_PER_JOULE: Final = "output_tokens_per_joule"
    JOULES_PER_REQUEST: Final = "joules_per_request"
    COST_USD: Final = "cost_usd"
    COST_PER_MTOK_OUTPUT: Final = "cost_per_mtok_output"
    COST_PER_MTOK_TOTAL: Final = "cost_per_mtok_total"
    # the roofline, the profiler, the diagnosis
    DECODE_FLOOR_MS: Final = "decode_floor_ms"
    DECODE_FLOOR_BATCH: Final = "decode_floor_batch"
    DECODE_FLOOR_MEMORY_MS: Final = "decode_floor_memory_ms"
    DECODE_FLOOR_COMPUTE_MS: Final = "decode_floor_compute_ms"
    DECODE_FLOOR_RATIO: Final = "decode_floor_ratio"
    PROFILED: Final = "profiled"
    PROFILED_EXCLUDED: Final = "profiled_excluded"
    PROFILE_WINDOW_S: Final = "profile_window_s"
    TTFT_PARTS_CLIENT_TOTAL_MS: Final = "ttft_parts_client_total_ms"
    TTFT_PARTS_QUEUE_MS: Final = "ttft_parts_queue_ms"
    TTFT_PARTS_PREFILL_MS: Final = "ttft_parts_prefill_ms"
    TTFT_PARTS_SERVER_MS: Final = "ttft_parts_server_ms"  # a request class's
    DECODE_BATCH_MEAN: Final = "decode_batch_mean"
    STALLS: Final = "stalls"
    STALL_WORST_MS: Final = "stall_worst_ms"
    STALL_TIME_SHARE: Final = "stall_time_share"
    STALLS_PER_PREFILL: Final = "stalls_per_prefill"
    STALL_PREFILL_PROMPT_TOKENS_MEAN: Final = "stall_prefill_prompt_tokens_mean"
    STALLS_PREFILL: Final = "stalls_prefill"
    STALL_WORST_MS_PREFILL: Final = "stall_worst_ms_prefill"
    LIMITED_BY_NONE: Final = "limited_by_none"
    SLO_MET: Final = "slo_met"  # a capacity probe's
    # a trial's own
    STARTUP_S: Final = "startup_s"
    MEMORY_PEAK_GB_MAX: Final = "memory_peak_gb_max"
    REQUESTS_TOTAL: Final = "requests_total"
    ERRORS_TOTAL: Final = "errors_total"
    NUM_POINTS: Final = "num_points"
    SERVER_STARTS: Final = "server_starts"
    SERVER_REUSED: Final = "server_reused"
    DECODE_FLOOR_MS_BATCH1: Final = "decode_floor_ms_batch1"
    ACCURACY: Final = "accuracy"
    ACCURACY_STDERR: Final = "accuracy_stderr"
    EVAL_S: Final = "eval_s"
    # a LoRA adapter's, at a point (adapter.<name>.<metric>): its first request's TTFT (cold: the
    # adapter loaded on first use), its others' median, the share of its prompt tokens the
    # prefix cache served; and of its scores, the share of answers in another's convention
    FIRST_TTFT_MS: Final = "first_ttft_ms"
    WARM_TTFT_MS_P50: Final = "warm_ttft_ms_p50"
    PREFIX_HIT_RATE: Final = "prefix_hit_rate"
    MISROUTED: Final = "misrouted"
    LOAD_S: Final = "load_s"  # an adapter loaded at run time (engine.lora_loading=runtime): seconds
    # eval.adapters: the worst adapter's share of right answers; the worst share of answers in
    # another's convention, the base model's included
    ADAPTERS_ACCURACY_MIN: Final = "adapters_accuracy_min"
    ADAPTERS_MISROUTED_MAX: Final = "adapters_misrouted_max"
    # a tiny adapter's accuracy on the same problems alone (HF, greedy, when it was trained:
    # adapter.<name>.trained_accuracy), and the worst share of it the server kept (served / alone)
    TRAINED_ACCURACY: Final = "trained_accuracy"
    ADAPTERS_KEPT_MIN: Final = "adapters_kept_min"
    SLO_CAPACITY_RPS: Final = "slo_capacity_rps"
    SLO_CAPACITY_CONCURRENCY: Final = "slo_capacity_concurrency"


# Read at the probe that sets a capacity: ``slo_capacity_<metric>`` (trial.capacity_probes).
AT_CAPACITY: Final = (
    M.COST_PER_MTOK_OUTPUT,
    M.COST_PER_MTOK_TOTAL,
    M.JOULES_PER_OUTPUT_TOKEN,
    M.OUTPUT_TOKENS_PER_JOULE,
)
EVAL_FAMILY: Final = re.compile(r"eval_[\w.]+_\w+")  # eval_<task>_<metric>[_<filter>] (lm-eval's names)
# A LoRA adapter's metric (a point's, or its scores): ``adapter.<name>.<metric>`` (metrics.summary.adapter_key).
ADAPTER_FAMILY: Final = re.compile(r"adapter\.[\w.-]+\.\w+")


def _server_names() -> set[str]:
    out = {f"server_{n}" for n in (*SERVER_COUNTERS, *SERVER_DERIVED)}
    out |= {f"server_{n}_max" for n in SERVER_GAUGES}
    out |= {f"server_{n}_mean" for n in SERVER_HISTOGRAMS}
    for lat in (*SERVER_LATENCIES, *(f"decode_{x}" for x in SERVER_LATENCIES)):
        out.add(f"server_{lat}_s_mean")
        for q in SERVER_QUANTILES:
            out |= {f"server_{lat}_ms_p{q}{end}" for end in ("", "_res_ms", "_low", "_high")}
    return out


def _family_names() -> set[str]:
    out = {f"{p}_{s}" for p in DISTRIBUTIONS for s in STATS}
    out |= _server_names()
    out |= {f"stalls_{c}" for c in STALL_CAUSES} | {f"stall_worst_ms_{c}" for c in STALL_CAUSES}
    out |= {f"limited_by_{c}" for c in LIMITERS}
    out |= {f"ttft_parts_{p}_{u}" for p in TTFT_PARTS for u in ("ms", "share")}
    for knob in CAPACITY_KNOBS:
        out |= {f"slo_capacity_{knob}_{x}" for x in CAPACITY_BRACKET}
    out |= {f"slo_capacity_{m}" for m in AT_CAPACITY}
    return out


NAMES: Final = frozenset({v for k, v in vars(M).items() if k.isupper()} | _family_names())
"""Every metric name but the open families (``eval_<task>_<metric>``, ``<metric>_ci95``, ``<class>/<metric>``)."""


def is_known(name: str) -> bool:
    """Whether a point, a trial or a request class can carry ``name`` (``<class>/<metric>``: a
    request class's metric, as the report's points hold them)."""
    tail = name.split("/", 1)[1] if "/" in name else name
    for suffix in (CI95, *WITHIN95):
        if tail.endswith(suffix):
            tail = tail[: -len(suffix)]
    return tail in NAMES or EVAL_FAMILY.fullmatch(tail) is not None or ADAPTER_FAMILY.fullmatch(tail) is not None


# What the model answers, not how fast: lm-eval's scores, and the LoRA adapters' (a lever that
# changes the model's numbers needs one of these among the objective's constraints).
ACCURACY: Final = (M.ACCURACY, M.ADAPTERS_ACCURACY_MIN, M.ADAPTERS_KEPT_MIN)


def is_accuracy(name: str) -> bool:
    """Whether ``name`` scores the model's answers: an accuracy of :data:`ACCURACY`, any lm-eval
    task's metric (``eval_<task>_<metric>``) or an adapter's accuracy."""
    tail = name.split("/", 1)[1] if "/" in name else name
    if tail in ACCURACY or EVAL_FAMILY.fullmatch(tail) is not None:
        return True
    return ADAPTER_FAMILY.fullmatch(tail) is not None and tail.endswith((M.ACCURACY, M.TRAINED_ACCURACY))


def closest(name: str, n: int = 3) -> list[str]:
    """The known names closest to ``name`` (difflib), best first."""
    return difflib.get_close_matches(name, sorted(NAMES), n=n, cutoff=0.6)


# A knob is a trial's parameter by its dotted path (engine.max_num_seqs): the sections of a trial.
KNOB_SECTIONS: Final = ("engine", "model", "workload", "platform", "eval", "profile")


def is_knob(name: str) -> bool:
    """Whether the objective would read ``name`` as a knob (``orchestrator.decide.objective.value_of``)."""
    return "." in name and "/" not in name and name.split(".", 1)[0] in KNOB_SECTIONS


def check_name(where: str, name: str, knobs: bool = True) -> None:
    """Raise ``ValueError`` unless ``name`` is a known metric (a ``<class>/`` prefix stripped) or,
    with ``knobs``, a knob; the message names ``where``, the name and the closest known names."""
    if is_known(name) or (knobs and is_knob(name)):
        return
    tail = name.split("/", 1)[1] if "/" in name else name
    near = closest(tail)
    hint = f"; closest known: {', '.join(near)}" if near else ""
    if knobs and "." in name and "/" not in name:
        hint += f"; a knob's path starts with one of {', '.join(KNOB_SECTIONS)}"
    what = "a metric or a knob (a dotted trial parameter such as engine.max_num_seqs)" if knobs else "a metric"
    raise ValueError(f"{where}: unknown metric {name!r}: not {what}{hint}")


def check_cause(where: str, cause: str) -> None:
    """Raise ``ValueError`` unless ``cause`` is a word of the diagnosis's vocabulary."""
    if cause not in LIMITERS:
        near = difflib.get_close_matches(cause, LIMITERS, n=3, cutoff=0.6)
        hint = f"; closest: {', '.join(near)}" if near else ""
        raise ValueError(f"{where}: unknown limiter {cause!r}; the diagnosis's causes: {', '.join(LIMITERS)}{hint}")
