"""The diagnosis's words and types: the vocabulary of causes (:data:`VOCABULARY`, in
:data:`PRIORITY` order), the rules' :class:`Thresholds`, a rule's :class:`Finding`, what a point
measured as the rules read it (:class:`PointEvidence`, its metrics as typed :class:`Readings`),
the state the rules share (:class:`RuleState`) and the whole :class:`Diagnosis`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from orchestrator.config.metric_keys import LIMITERS
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.stalls import Stall
from orchestrator.metrics.telemetry import Row

STRONG, WEAK = "strong", "weak"


@dataclass(frozen=True)
class Cause:
    """One word of the vocabulary: what it means and the measurement that would confirm it."""

    key: str
    words: str
    confirm: str


VOCABULARY: dict[str, Cause] = {
    c.key: c
    for c in (
        Cause(
            "client",
            "the client: it could not keep up, so the numbers describe the client",
            "rerun with more client processes (workload.client_processes) or cores; the point's validity checks pass",
        ),
        Cause(
            "shared_machine",
            "a shared machine: processes outside the trial took CPU from it",
            "rerun on an idle machine; the foreign CPU (census) falls below workload.validity.max_foreign_cpu_cores",
        ),
        Cause(
            "over_capacity",
            "over capacity: requests arrived faster than the server completed them, the queue grew",
            "a lower rate keeps TTFT flat through the window; the capacity search (workload.capacity) brackets it",
        ),
        Cause(
            "kv_capacity",
            "KV-cache capacity: the cache was full, requests waited or were preempted",
            "more KV space (gpu_memory_utilization, cpu_kvcache_space_gib, fp8 KV) removes preemptions and waits",
        ),
        Cause(
            "batch_slots",
            "batch slots: max_num_seqs requests ran while others waited",
            "a larger engine.max_num_seqs lets the waiting requests in (running rises, queue time falls)",
        ),
        Cause(
            "prefix_reuse_missed",
            "prefix reuse missed: the prompts share prefixes the server computed again instead of reusing",
            "prefix caching on (or cache-aware routing across replicas): server_prefix_cache_hit_rate rises "
            "toward prefix_reuse_ideal_share and the prefill time per request falls",
        ),
        Cause(
            "prefill_interference",
            "prefill interference: other requests' prefills stalled running decodes",
            "chunked prefill with a smaller max_num_batched_tokens (or P/D) shrinks the stalls; the timeline "
            "shows each stall at a prefill",
        ),
        Cause(
            "compute",
            "compute: the accelerator (or the servers' CPU cores) ran at its limit while work waited",
            "the GPU at its power limit or throttling, SM utilisation ~100%; more compute (TP) or less work per "
            "step helps",
        ),
        Cause(
            "decode_bandwidth",
            "decode memory bandwidth: each decode step ran near its roofline floor (weights + KV read per step)",
            "TPOT tracks bytes per step: a smaller dtype (quantized weights, fp8 KV) lowers it in proportion",
        ),
        Cause(
            "none",
            "none: the server had headroom",
            "a heavier point (more concurrency or rate) still scales throughput",
        ),
    )
}
# The causes in the order they are tried, as the registry lists them: shared_machine first (a
# shared machine also starves the client, and then it is the cause), "none" not a cause.
PRIORITY = tuple(cause for cause in LIMITERS if cause != "none")


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
class Finding:
    cause: str
    confidence: str
    detail: str
    evidence: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "confidence": self.confidence, "detail": self.detail, "evidence": self.evidence}


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


@dataclass
class Diagnosis:
    limiter: str
    confidence: str
    findings: list[Finding]
    unmeasured: list[str]
    notes: list[str]  # TTFT parts, decode efficiency, context in words
    metrics: dict[str, float]
    class_metrics: dict[str, dict[str, float]]
    stalls: list[Stall]

    @property
    def headline(self) -> str:
        if not self.limiter:
            return "not diagnosed: " + (self.notes[0] if self.notes else "nothing measured")
        first = next((f for f in self.findings if f.cause == self.limiter), None)
        if self.limiter == "none":
            return f"{VOCABULARY['none'].words}" + (f" ({first.detail})" if first is not None else "")
        if first is None:
            return f"limited by {VOCABULARY[self.limiter].words}"
        return f"limited by {self.limiter.replace('_', ' ')} ({first.confidence}): {first.detail}"

    def text(self) -> str:
        """The whole diagnosis in words: the limiter first, the other findings, the notes."""
        parts = [self.headline]
        others = [f for f in self.findings if f.cause != self.limiter]
        if others:
            parts.append(
                "also " + "; ".join(f"{f.cause.replace('_', ' ')} ({f.confidence}): {f.detail}" for f in others)
            )
        parts += self.notes
        if self.unmeasured:
            parts.append("not measurable: " + "; ".join(self.unmeasured))
        return ". ".join(parts) + "."

    def as_json(self, stalls: int = 0) -> dict[str, Any]:
        """The diagnosis for a result file: words, findings, and up to ``stalls`` stalls (worst first)."""
        out: dict[str, Any] = {
            "limiter": self.limiter,
            "confidence": self.confidence,
            "headline": self.headline,
            "text": self.text(),
            "findings": [f.as_json() for f in self.findings],
            "unmeasured": list(self.unmeasured),
        }
        if stalls:
            worst = sorted(self.stalls, key=lambda s: -s.gap_ms)[:stalls]
            out["stalls"] = [s.as_row() for s in sorted(worst, key=lambda s: s.start_s)]
        return out
