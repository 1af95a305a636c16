"""What the rules read: the rules' :class:`Thresholds`, what one point measured
(:class:`PointEvidence`, its metrics as typed :class:`Readings`) and the state the rules share
over it (:class:`RuleState`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from orchestrator.metrics.diagnosis.findings import Finding
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.stalls import Stall
from orchestrator.metrics.telemetry import Row


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the rules (docs/diagnosis.md gives the reason for each)."""

    kv_full: float = 0.9  # KV-cache usage at or above which the cache counts as full
    waiting_share: float = 0.25  # share of gauge samples with requests waiting to count as queueing
    gauge_samples: int = 3  # engine gauge samples a point needs before its batch or slots are judged
    queue_share: float = 0.2  # queue time as a share of the server's TTFT to count as queueing
    prefill_stalls: int = 3  # prefill stalls for a strong finding...
    prefill_time_share: float = 0.1  # ...and this share of inter-token time lost to them
    cores_busy: float = 0.9  # servers' CPU cores busy, as a share of the cores they could use
    sm_busy_pct: float = 90.0  # GPU SM utilisation at its limit
    power_at_limit: float = 0.95  # GPU power as a share of its limit (strong)
    power_high: float = 0.8  # ... (weak)
    throttled_share: float = 0.5  # share of GPU samples with a throttle reason
    client_kept_up_lag_ms: float = 2.0  # event-loop lag p95 at most this: the client read on time...
    client_kept_up_itl_share: float = 0.25  # ... or at most this share of the server's mean ITL
    floor_below: float = 0.95  # TPOT under this share of its floor: the floor does not hold (not judged)
    floor_near: float = 1.5  # TPOT within this factor of its roofline floor (strong)
    floor_close: float = 2.5  # ... (weak)
    prefix_ideal: float = 0.2  # share of prompt tokens the workload could reuse for prefix reuse to matter...
    prefix_hit_share: float = 0.5  # ... and the server's hits under this share of it: reuse missed
    completion_share: float = 0.8  # an open loop's completions over those a server keeping up makes (strong)...
    completion_share_weak: float = 0.9  # ... (weak)
    queue_growth: float = 3.0  # ... with the requests in flight grown by this many over that time...
    ttft_growth: float = 2.0  # ... or TTFT of the last third of arrivals this many times the first third's
    batch_growth: float = 1.25  # output rate flat (grew < half as much) while requests in flight grew this much


@dataclass(frozen=True)
class Readings:
    """The point's metrics the rules read, typed: each field is the metric of its name
    (:class:`orchestrator.config.metric_keys.M`; a unit test keeps the names true), None where
    the point did not measure it."""

    loop_lag_ms_p95: float | None = None
    client_cpu_util: float | None = None
    client_cpu_s: float | None = None
    client_wall_s: float | None = None
    coalesced_chunk_share: float | None = None
    ttft_ms_mean: float | None = None
    tpot_ms_p50: float | None = None
    schedule_rate: float | None = None
    achieved_rate: float | None = None
    server_preemptions: float | None = None
    server_kv_cache_usage_max: float | None = None
    server_queue_time_s_mean: float | None = None
    server_prefill_time_s_mean: float | None = None
    server_prefix_cache_hit_rate: float | None = None
    prefix_reuse_ideal_share: float | None = None
    server_ttft_s_mean: float | None = None
    server_itl_s_mean: float | None = None
    server_decode_ttft_s_mean: float | None = None
    server_prompt_tokens: float | None = None
    server_engine_steps: float | None = None
    server_generation_tokens: float | None = None
    telemetry_gpu_sm_util_pct_mean: float | None = None
    telemetry_gpu_power_w_mean: float | None = None
    telemetry_gpu_power_limit_w_mean: float | None = None
    telemetry_gpu_throttled_share: float | None = None
    telemetry_server_cpu_cores_mean: float | None = None
    decode_floor_ms: float | None = None
    decode_floor_ratio: float | None = None
    decode_floor_memory_ms: float | None = None
    decode_floor_compute_ms: float | None = None
    decode_floor_batch: float | None = None
    # the point's stalls (:func:`orchestrator.metrics.stalls.stall_metrics`)
    stalls: float | None = None
    stalls_prefill: float | None = None
    stall_worst_ms_prefill: float | None = None
    stalls_per_prefill: float | None = None
    stall_prefill_prompt_tokens_mean: float | None = None

    @classmethod
    def of(cls, metrics: Mapping[str, float]) -> Readings:
        return cls(**{f.name: metrics[f.name] for f in fields(cls) if f.name in metrics})


@dataclass
class PointEvidence:
    """What one point measured, as the rules read it."""

    metrics: Mapping[str, float]
    class_metrics: Mapping[str, Mapping[str, float]]
    records: Sequence[RequestRecord]
    rows: Sequence[Row]  # the trial's timeline (engine gauges, telemetry); only the window is read
    window: tuple[float, float]
    rate: float | None = None  # the point's arrival rate (open loop), None for a closed loop
    capped: bool = False  # a rate point with max_concurrency
    slots: int | None = None  # the engine's max_num_seqs, when known
    prefix_cache: bool | None = None  # whether the server caches prefixes, when known
    cores: float | None = None  # CPU cores the servers could use (the machine's on the CPU platform)
    device: str = "cpu"
    client_reasons: Sequence[str] = ()
    foreign: Mapping[str, Any] | None = None  # census: {"cores": x, "top": [[pid, command, cores], ...]}
    foreign_limit: float | None = None
    disaggregated: bool = False
    server_failed: bool = False
    decode_ttft_holds_prefill: bool = False  # P/D: the decode server's TTFT includes the prefill (SGLang's router)

    @cached_property
    def read(self) -> Readings:
        """:attr:`metrics`, typed."""
        return Readings.of(self.metrics)


@dataclass
class RuleState:
    """What the rules share over one point: the engine's gauges over its window, its stalls, and
    what the rules found, could not measure and noted so far (a later rule reads the earlier ones')."""

    samples: dict[str, list[tuple[float, float]]]
    stalls: list[Stall]
    stalled: Readings  # the stall metrics, typed
    gap_total_ms: float  # the inter-token time of every completed stream
    factor: float  # a stall: a gap this many times its stream's median
    unmeasured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    found: list[Finding] = field(default_factory=list)
