"""What limited a load point, named with its evidence: pure rules over what the point measured.

A diagnosis reads the point's metrics (client, server counters and histograms, telemetry,
roofline), its records (stalls: :mod:`orchestrator.metrics.stalls`) and the engine's gauges
sampled over its window, and says:

* the **TTFT decomposed** (pooled over the point: the engine's histograms carry no request
  class): client overhead (client TTFT - server TTFT), the API server's share (server TTFT -
  queue - prefill: tokenizing, the hop to the engine core), queue wait, prefill compute; under
  P/D the decode server's TTFT (KV transfer and its first step) and the prefill leg before it;
* **decode efficiency**: TPOT against the roofline floor at the batch the engine actually ran
  (its running-requests gauge over the window);
* **stalls**: gaps far above their stream's median, by cause;
* the **limiting resource**, one of :data:`VOCABULARY`, with the numbers that triggered it and a
  confidence (strong / weak), and the other findings beside it. A rule that cannot decide says
  so (:attr:`Diagnosis.unmeasured`) instead of guessing.

Every rule, its thresholds (:class:`Thresholds`), the metrics it reads and what would confirm it
are in docs/diagnosis.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.stalls import Stall, find_stalls, stall_metrics
from orchestrator.metrics.summary import COALESCED
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
PRIORITY = (
    "shared_machine",  # first: a shared machine also starves the client, and then it is the cause
    "client",
    "over_capacity",
    "kv_capacity",
    "batch_slots",
    "prefill_interference",
    "compute",
    "decode_bandwidth",
)


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the rules (docs/diagnosis.md gives the reason for each)."""

    kv_full: float = 0.9  # KV-cache usage at or above which the cache counts as full
    waiting_share: float = 0.25  # share of gauge samples with requests waiting to count as queueing
    queue_share: float = 0.2  # queue time as a share of the server's TTFT to count as queueing
    prefill_stalls: int = 3  # prefill stalls for a strong finding...
    prefill_time_share: float = 0.1  # ...and this share of inter-token time lost to them
    cores_busy: float = 0.9  # servers' CPU cores busy, as a share of the cores they could use
    sm_busy_pct: float = 90.0  # GPU SM utilisation at its limit
    power_at_limit: float = 0.95  # GPU power as a share of its limit (strong)
    power_high: float = 0.8  # ... (weak)
    throttled_share: float = 0.5  # share of GPU samples with a throttle reason
    client_kept_up_lag_ms: float = 2.0  # event-loop lag p95 at most this: the client read on time
    floor_near: float = 1.5  # TPOT within this factor of its roofline floor (strong)
    floor_close: float = 2.5  # ... (weak)
    completion_share: float = 0.8  # an open loop's completions over those a server keeping up makes (strong)...
    completion_share_weak: float = 0.9  # ... (weak)
    queue_growth: float = 3.0  # ... with the requests in flight grown by this many over that time...
    ttft_growth: float = 2.0  # ... or TTFT of the last third of arrivals this many times the first third's
    batch_growth: float = 1.25  # output rate flat (grew < half as much) while requests in flight grew this much


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
    cores: float | None = None  # CPU cores the servers could use (the machine's on the CPU platform)
    device: str = "cpu"
    client_reasons: Sequence[str] = ()
    foreign: Mapping[str, Any] | None = None  # census: {"cores": x, "top": [[pid, command, cores], ...]}
    foreign_limit: float | None = None
    disaggregated: bool = False
    server_failed: bool = False
    engine: str = ""  # the engine's name (vllm, sglang, external): how its P/D pair is wired


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


# --------------------------------------------------------------------------- the engine's gauges


def engine_samples(rows: Sequence[Row], window: tuple[float, float]) -> dict[str, list[tuple[float, float]]]:
    """The engine's gauge samples inside the window (its first 5% left out: the state before the
    load), and its cumulative preemption counter over the whole window, by name."""
    t0, t1 = window
    settle = t0 + 0.05 * (t1 - t0)
    out: dict[str, list[tuple[float, float]]] = {}
    for t, source, name, value in rows:
        if source != "engine":
            continue
        if name == "preemptions" and t0 <= t <= t1:
            out.setdefault(name, []).append((t, value))
        elif settle < t <= t1:
            out.setdefault(name, []).append((t, value))
    return {k: sorted(v) for k, v in out.items()}


def engine_batch(rows: Sequence[Row], window: tuple[float, float]) -> float | None:
    """The batch the engine ran over the window: its running-requests gauge, averaged."""
    running = _values(engine_samples(rows, window), "requests_running")
    return float(np.mean(running)) if running else None


def _values(samples: dict[str, list[tuple[float, float]]], name: str) -> list[float]:
    return [v for _, v in samples.get(name, [])]


# --------------------------------------------------------------------------- the parts


def ttft_parts(x: PointEvidence) -> tuple[dict[str, float], dict[str, dict[str, float]], list[str], list[str]]:
    """The point's mean TTFT in parts (ms and shares of the client's TTFT), per class the client's
    TTFT and its server side (the client's less the pooled client overhead); words; unmeasured."""
    m = x.metrics
    client = m.get("ttft_ms_mean")
    out: dict[str, float] = {}
    unmeasured: list[str] = []
    if client is None:
        return out, {}, [], ["TTFT: no request produced a token"]
    out["ttft_parts_client_total_ms"] = client
    server_key = "server_decode_ttft_s_mean" if x.disaggregated else "server_ttft_s_mean"
    server = m.get(server_key)
    parts: dict[str, float] = {}
    if x.disaggregated and x.engine == "sglang":
        unmeasured.append(
            "KV transfer: SGLang's P/D router sends each request to both servers at once, so the decode "
            "server's TTFT holds the prefill too"
        )
    elif x.disaggregated:
        if server is None:
            unmeasured.append("KV transfer: the decode server exports no TTFT histogram")
        else:
            parts["prefill_leg"] = max(client - server * 1e3, 0.0)  # proxy + prefill server
            parts["kv_transfer"] = server * 1e3  # the decode server's TTFT: KV pulled, first step
    else:
        queue, prefill = m.get("server_queue_time_s_mean"), m.get("server_prefill_time_s_mean")
        if server is None:
            unmeasured.append("client overhead: the engine exports no TTFT histogram")
        else:
            parts["client"] = max(client - server * 1e3, 0.0)
        if queue is None:
            unmeasured.append("queue wait: the engine exports no queue-time histogram")
        else:
            parts["queue"] = queue * 1e3
        if prefill is None:
            unmeasured.append("prefill time: the engine exports no prefill-time histogram")
        else:
            parts["prefill"] = prefill * 1e3
        if server is not None and queue is not None and prefill is not None:
            parts["api"] = max(server * 1e3 - queue * 1e3 - prefill * 1e3, 0.0)
    for k, v in parts.items():
        out[f"ttft_parts_{k}_ms"] = v
        out[f"ttft_parts_{k}_share"] = v / client if client > 0 else 0.0
    classes: dict[str, dict[str, float]] = {}
    overhead = parts.get("client")
    for cls, cm in x.class_metrics.items():
        if "ttft_ms_mean" in cm and overhead is not None:
            classes[cls] = {"ttft_parts_server_ms": max(cm["ttft_ms_mean"] - overhead, 0.0)}
    words = []
    if parts:
        order = ["client", "api", "queue", "prefill", "prefill_leg", "kv_transfer"]
        names = {
            "prefill_leg": "prefill leg (proxy + prefill server)",
            "kv_transfer": "KV transfer + decode's first step",
        }
        words.append(
            f"TTFT mean {client:.0f} ms = "
            + " + ".join(f"{names.get(k, k)} {parts[k]:.0f}" for k in order if k in parts)
            + (" (the engine's histograms pooled over classes)" if len(x.class_metrics) > 1 else "")
        )
    return out, classes, words, unmeasured


def decode_efficiency(
    x: PointEvidence, samples: dict[str, list[tuple[float, float]]]
) -> tuple[dict[str, float], list[str]]:
    """The batch the engine actually ran (its running gauge over the window) and TPOT against the
    roofline floor at that batch (``decode_floor_*`` from the trial, computed at this batch)."""
    m = x.metrics
    out: dict[str, float] = {}
    running = _values(samples, "requests_running")
    if running:
        out["decode_batch_mean"] = float(np.mean(running))
    words = []
    tpot, floor = m.get("tpot_ms_p50"), m.get("decode_floor_ms")
    if tpot is not None and floor:
        bound = "compute" if m.get("decode_floor_compute_ms", 0.0) > m.get("decode_floor_memory_ms", 0.0) else "memory"
        batch = out.get("decode_batch_mean", m.get("decode_floor_batch", 1.0))
        words.append(
            f"decode: TPOT p50 {tpot:.1f} ms at a batch of {batch:.1f} (the engine's mean), "
            f"{tpot / floor:.1f}x its roofline floor {floor:.2f} ms ({bound}-bound)"
        )
    return out, words


# --------------------------------------------------------------------------- the rules


def _client(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    if not x.client_reasons:
        return None
    m = x.metrics
    lag, cpu = m.get("loop_lag_ms_p95"), m.get("client_cpu_util", 0.0)
    if all(COALESCED in r for r in x.client_reasons) and lag is not None and lag <= th.client_kept_up_lag_ms:
        # chunks read together by a client that woke on time: the server wrote them together
        s["notes"].append(
            f"ITL: {m.get('coalesced_chunk_share', 0.0):.0%} {COALESCED} while the client kept up (event-loop "
            f"lag p95 {lag:.1f} ms, {cpu:.2f} of a core): the server sent them together, so the point is "
            "INVALID for its ITL but the client did not limit it"
        )
        return None
    return Finding("client", STRONG, "; ".join(x.client_reasons), {"client_invalid": 1.0})


def _shared(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    if x.foreign is None or x.foreign_limit is None:
        return None
    cores = float(x.foreign.get("cores", 0.0))
    if cores < x.foreign_limit:
        return None
    top = ", ".join(f"pid {pid} ({cmd[:60]}) {c:.2f}" for pid, cmd, c in list(x.foreign.get("top", []))[:3])
    return Finding(
        "shared_machine",
        STRONG,
        f"{cores:.2f} cores busy outside the trial (bound {x.foreign_limit:g}); top: {top or 'unknown'}",
        {"foreign_cpu_cores": cores},
    )


def _in_flight(records: Sequence[RequestRecord], t: float) -> int:
    return sum(1 for r in records if r.sent_s <= t and (r.done_s is None or r.done_s > t))


TOO_SHORT = "too_short"  # _falling_behind: the point is all warm-up
KEEPS_UP, GROWING = "keeps_up", "growing"  # _throughput_plateau's other verdicts


def _emitted(records: Sequence[RequestRecord], t1: float, t2: float) -> float:
    """Output tokens the server streamed to all requests within [t1, t2)."""
    n = 0
    for r in records:
        tokens = r.chunk_tokens if len(r.chunk_tokens) == len(r.chunk_times_s) else [1] * len(r.chunk_times_s)
        n += sum(k for t, k in zip(r.chunk_times_s, tokens, strict=True) if t1 <= t < t2)
    return float(n)


def _mean_in_flight(records: Sequence[RequestRecord], t1: float, t2: float, samples: int = 20) -> float:
    return float(np.mean([_in_flight(records, t1 + (t2 - t1) * (i + 0.5) / samples) for i in range(samples)]))


def _throughput_plateau(
    records: Sequence[RequestRecord], sent: Sequence[RequestRecord], rate: float, th: Thresholds
) -> tuple[str, str, dict[str, float]]:
    """One repeat of an open loop, by the server's output rate: in the last two quarters of the
    arrivals, did the batch grow while the tokens streamed per second did not, below what the
    arrivals ask for (rate x mean output tokens)? A server whose output rate no longer grows with
    its batch cannot catch up by batching more; one whose rate grows with the batch may be warming
    up. Works when requests live longer than the arrivals span (no completion to count yet).
    (verdict, words, evidence): verdict STRONG / WEAK, KEEPS_UP or GROWING."""
    a, b = sent[0].sent_s, sent[-1].sent_s
    m, q3 = a + (b - a) / 2, a + 3 * (b - a) / 4
    rate3, rate4 = _emitted(records, m, q3) / (q3 - m), _emitted(records, q3, b) / (b - q3)
    n3, n4 = _mean_in_flight(records, m, q3), _mean_in_flight(records, q3, b)
    demand = rate * sum(r.output_tokens_target for r in records) / len(sent)  # later turns' too
    share = rate4 / demand if demand > 0 else 1.0
    evidence = {
        "output_rate_share": share,
        "output_tok_s": rate4,
        "demand_tok_s": demand,
        "in_flight_q3": n3,
        "in_flight_q4": n4,
    }
    if share > th.completion_share_weak:
        return KEEPS_UP, "", evidence
    batch_growth = n4 / n3 if n3 > 0 else 1.0
    rate_growth = rate4 / rate3 if rate3 > 0 else float("inf")
    if n4 - n3 < th.queue_growth or batch_growth < th.batch_growth or rate_growth - 1 > (batch_growth - 1) / 2:
        return GROWING, "", evidence
    words = (
        f"the output rate stopped growing with the batch: {rate4:.0f} tok/s with {n4:.1f} in flight over the last "
        f"quarter of arrivals ({rate3:.0f} tok/s with {n3:.1f} the quarter before), {share:.0%} of the "
        f"{demand:.0f} tok/s the arrivals ask for"
    )
    return (STRONG if share <= th.completion_share else WEAK), words, evidence


def _falling_behind(
    records: Sequence[RequestRecord], th: Thresholds, rate: float
) -> tuple[str, str, dict[str, float]] | None:
    """One repeat of an open loop: did completions fall behind arrivals? A request arriving at
    ``t`` completes at ``t + L`` on a server that keeps up, ``L`` the lifetime of the first third
    of arrivals (before any queue): past ``a + L`` the completions are set against the arrivals
    ``L`` earlier, so a healthy server's warm-up (in flight climbing from 1 to rate x L) is not
    taken for a queue. The output rate's plateau (``_throughput_plateau``) decides where this
    cannot: when the first arrivals live longer than half the arrivals' span, and beside a weak
    count. (confidence, words, evidence), (TOO_SHORT, why, {}) or None."""
    sent = sorted((r for r in records if r.turn == 0), key=lambda r: r.sent_s)
    done = sorted(r.done_s for r in records if r.ok and r.done_s is not None)
    if len(sent) < 6 or not done:
        return None
    a, b = sent[0].sent_s, sent[-1].sent_s
    third = max(len(sent) // 3, 1)
    early = [r.done_s - r.sent_s for r in sent[:third] if r.ok and r.done_s is not None]
    if not early or b <= a:
        return None
    lifetime = float(np.median(early))
    plateau = _throughput_plateau(records, sent, rate, th)
    flat = plateau if plateau[0] in (STRONG, WEAK) else None
    if lifetime > (b - a) / 2:  # all warm-up: in flight climbs for a lifetime on any server
        if flat is not None or plateau[0] == KEEPS_UP:
            return flat
        return (
            TOO_SHORT,
            f"the first arrivals lived {lifetime:.1f} s, more than half the {b - a:.1f} s the arrivals spanned: "
            "requests in flight climb for a lifetime on any server, so a queue cannot be told from the warm-up "
            f"(at least {int(np.ceil(2 * lifetime / (b - a) * len(sent)))} requests would tell)",
            {},
        )
    start = a + lifetime
    expected = sum(1 for r in sent if r.sent_s <= b - lifetime)
    completions = sum(1 for t in done if start <= t <= b)
    if expected < 3:
        return flat
    ratio = completions / expected
    grew = _in_flight(records, b) - _in_flight(records, start)
    first = [r.chunk_times_s[0] - r.sent_s for r in sent[:third] if r.chunk_times_s]
    last = [r.chunk_times_s[0] - r.sent_s for r in sent[-third:] if r.chunk_times_s]
    growth = float(np.mean(last) / np.mean(first)) if first and last and np.mean(first) > 0 else 1.0
    if ratio > th.completion_share_weak:
        return flat
    strong = ratio <= th.completion_share and (grew >= th.queue_growth or growth >= th.ttft_growth)
    if not strong and flat is not None and flat[0] == STRONG:
        return flat
    evidence = {"completion_share": ratio, "in_flight_gained": float(grew), "ttft_growth": growth}
    words = (
        f"{completions} requests completed where {expected} would have on a server keeping up ({ratio:.0%}), the "
        f"requests in flight grew by {grew} and TTFT rose {growth:.1f}x from the first third of arrivals to the last"
    )
    return (STRONG if strong else WEAK), words, evidence


def _over_capacity(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    if x.rate is None or x.rate == float("inf"):
        return None
    m = x.metrics
    if x.capped:  # the cap holds the queue on the client's side: sends fall behind the schedule
        sched, achieved = m.get("schedule_rate"), m.get("achieved_rate")
        if sched and achieved is not None and achieved < 0.9 * sched:
            return Finding(
                "over_capacity",
                STRONG,
                f"max_concurrency held sends back: {achieved:.2f} req/s sent of {sched:.2f} scheduled",
                {"achieved_rate": achieved, "schedule_rate": sched},
            )
        return None
    repeats = sorted({r.repeat for r in x.records})  # each repeat is its own run of the arrivals
    found = [_falling_behind([r for r in x.records if r.repeat == k], th, float(x.rate)) for k in repeats]
    short = [f for f in found if f is not None and f[0] == TOO_SHORT]
    if short:
        s["unmeasured"].append("over capacity: " + short[0][1])
        return None
    hits = [f for f in found if f is not None]
    if not hits:
        return None
    confidence = STRONG if len(hits) == len(found) and all(f[0] == STRONG for f in hits) else WEAK
    words = f"at {x.rate:g} req/s " + hits[0][1]
    if len(found) > 1:
        words += f" (in {len(hits)} of {len(found)} repeats)"
    return Finding("over_capacity", confidence, words, {**hits[0][2], "rate": float(x.rate)})


def _kv(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    m, samples = x.metrics, s["samples"]
    preempted = m.get("server_preemptions")
    kv = samples.get("kv_cache_usage", [])
    if preempted is None and not kv:
        s["unmeasured"].append("KV-cache capacity: the engine exports neither KV usage nor preemptions")
        return None
    kv_max = max((v for _, v in kv), default=m.get("server_kv_cache_usage_max", 0.0))
    evidence = {"kv_cache_usage_max": kv_max, "preemptions": preempted or 0.0}
    if preempted:
        return Finding(
            "kv_capacity", STRONG, f"{preempted:.0f} preemption(s), KV-cache usage up to {kv_max:.0%}", evidence
        )
    waiting = dict(samples.get("requests_waiting", []))
    full_and_waiting = [t for t, v in kv if v >= th.kv_full and waiting.get(t, 0.0) > 0]
    if full_and_waiting:
        evidence["samples_full_and_waiting"] = float(len(full_and_waiting))
        return Finding(
            "kv_capacity",
            STRONG,
            f"KV cache {kv_max:.0%} full while requests waited ({len(full_and_waiting)} of {len(kv)} samples)",
            evidence,
        )
    if kv_max >= th.kv_full:
        return Finding("kv_capacity", WEAK, f"KV cache up to {kv_max:.0%} full, though nothing waited", evidence)
    return None


def _slots(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    samples = s["samples"]
    running, waiting = dict(samples.get("requests_running", [])), dict(samples.get("requests_waiting", []))
    if not running or not waiting:
        s["unmeasured"].append("batch slots: the engine exports no running/waiting gauges")
        return None
    kv = dict(samples.get("kv_cache_usage", []))
    times = sorted(set(running) & set(waiting))
    queued = [t for t in times if waiting[t] > 0 and kv.get(t, 0.0) < th.kv_full]
    if not queued or len(queued) < th.waiting_share * len(times):
        return None
    top = max(running.values())
    evidence = {"waiting_max": max(waiting.values()), "running_max": top, "samples_waiting": float(len(queued))}
    if x.slots is not None:
        full = [t for t in queued if running[t] >= x.slots]
        if len(full) < th.waiting_share * len(times):
            return None
        evidence["max_num_seqs"] = float(x.slots)
        return Finding(
            "batch_slots",
            STRONG,
            f"{x.slots} of max_num_seqs {x.slots} running while up to {evidence['waiting_max']:.0f} waited "
            f"({len(full)} of {len(times)} samples)",
            evidence,
        )
    at_top = [t for t in queued if running[t] >= top]
    if len(at_top) < th.waiting_share * len(times):
        return None
    return Finding(
        "batch_slots",
        WEAK,
        f"running held at {top:.0f} while up to {evidence['waiting_max']:.0f} waited with KV to spare "
        "(the engine's max_num_seqs is not known here)",
        evidence,
    )


def _prefill(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    sm, stalls = s["stall_metrics"], s["stalls"]
    count = int(sm.get("stalls_prefill", 0))
    if not count:
        return None
    prefill = [st for st in stalls if st.cause == "prefill"]
    share = sum(st.gap_ms - st.median_ms for st in prefill) / max(s["gap_total_ms"], 1e-9)
    median = float(np.median([st.median_ms for st in prefill]))
    evidence = {
        "stalls_prefill": float(count),
        "stall_worst_ms_prefill": sm.get("stall_worst_ms_prefill", 0.0),
        "prefill_stall_time_share": share,
        "stalls_per_prefill": sm.get("stalls_per_prefill", 0.0),
        "stall_prefill_prompt_tokens_mean": sm.get("stall_prefill_prompt_tokens_mean", 0.0),
    }
    strong = count >= th.prefill_stalls and share >= th.prefill_time_share
    detail = (
        f"{count} inter-token gaps >= {s['factor']:g}x their stream's median (median {median:.1f} ms) fell during "
        f"another request's prefill (prompts of {evidence['stall_prefill_prompt_tokens_mean']:.0f} tokens on average, "
        f"{evidence['stalls_per_prefill']:.1f} stalled step(s) each), worst {evidence['stall_worst_ms_prefill']:.0f} ms, "
        f"{share:.0%} of inter-token time"
    )
    return Finding("prefill_interference", STRONG if strong else WEAK, detail, evidence)


def _queued(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> tuple[bool, str]:
    """Whether work waited in the engine's queue (queue time, or the waiting gauge)."""
    m, samples = x.metrics, s["samples"]
    queue, server = m.get("server_queue_time_s_mean"), m.get("server_ttft_s_mean")
    if queue is not None and server and queue / server >= th.queue_share:
        return True, f"queue time {queue * 1e3:.0f} ms of the server's {server * 1e3:.0f} ms TTFT"
    waiting = _values(samples, "requests_waiting")
    busy = [v for v in waiting if v > 0]
    if waiting and len(busy) >= th.waiting_share * len(waiting):
        return True, f"requests waited in {len(busy)} of {len(waiting)} samples"
    return False, ""


def _compute(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    m = x.metrics
    if x.device == "cuda":
        sm_util = m.get("telemetry_gpu_sm_util_pct_mean")
        if sm_util is None:
            s["unmeasured"].append("compute: no GPU telemetry (NVML)")
            return None
        power, limit = m.get("telemetry_gpu_power_w_mean"), m.get("telemetry_gpu_power_limit_w_mean")
        throttled = m.get("telemetry_gpu_throttled_share", 0.0)
        evidence = {"sm_util_pct": sm_util, "throttled_share": throttled}
        if power is not None and limit:
            evidence["power_share"] = power / limit
        if sm_util < th.sm_busy_pct:
            return None
        share = evidence.get("power_share", 0.0)
        detail = (
            f"SM utilisation {sm_util:.0f}%, power {share:.0%} of its limit, throttled in {throttled:.0%} of samples"
        )
        if share >= th.power_at_limit or throttled >= th.throttled_share:
            return Finding("compute", STRONG, detail, evidence)
        if share >= th.power_high:
            return Finding("compute", WEAK, detail, evidence)
        return None
    cores, used = x.cores, m.get("telemetry_server_cpu_cores_mean")
    if not cores or used is None:
        s["unmeasured"].append("compute: the servers' CPU was not sampled (platform.telemetry)")
        return None
    # the client's cores: every client process's CPU over the point (client_cpu_util is the worst one's)
    client = m["client_cpu_s"] / m["client_wall_s"] if m.get("client_wall_s") else m.get("client_cpu_util", 0.0)
    available = max(cores - client, 0.1)
    if used < th.cores_busy * available:
        return None
    if any(f.cause in ("kv_capacity", "batch_slots") for f in s["found"]):
        return None  # the wait has a cause of its own
    queued, why = _queued(x, th, s)
    if not queued:
        s["notes"].append(
            f"the servers kept {used:.2f} of {available:.2f} cores busy without a queue: vLLM's CPU build keeps "
            "its cores busy whenever a request runs (1.97 of 2 with one stream here), so busy cores alone do "
            "not show saturation"
        )
        return None
    return Finding(
        "compute",
        STRONG,
        f"the servers' cores were saturated ({used:.2f} of {available:.2f}) while work waited: {why}",
        {"server_cpu_cores": used, "cores_available": available},
    )


def _bandwidth(x: PointEvidence, th: Thresholds, s: dict[str, Any]) -> Finding | None:
    m = x.metrics
    ratio = m.get("decode_floor_ratio")
    if ratio is None:
        s["unmeasured"].append("decode bandwidth: no roofline floor (model shape or hardware roofs unknown)")
        return None
    if m.get("decode_floor_compute_ms", 0.0) > m.get("decode_floor_memory_ms", 0.0):
        return None  # the floor at this batch is the compute one (the compute rule's business)
    evidence = {"decode_floor_ratio": ratio, "decode_floor_ms": m.get("decode_floor_ms", 0.0)}
    detail = (
        f"TPOT p50 {m.get('tpot_ms_p50', 0.0):.1f} ms is {ratio:.1f}x the memory floor "
        f"{m.get('decode_floor_ms', 0.0):.2f} ms of a step"
    )
    if ratio <= th.floor_near:
        return Finding("decode_bandwidth", STRONG, detail, evidence)
    if ratio <= th.floor_close:
        return Finding("decode_bandwidth", WEAK, detail, evidence)
    return None


RULES = (_client, _shared, _over_capacity, _kv, _slots, _prefill, _compute, _bandwidth)


def _headroom(x: PointEvidence, s: dict[str, Any]) -> str:
    """Why "none": what was far from its limit."""
    m, samples = x.metrics, s["samples"]
    bits = []
    running = _values(samples, "requests_running")
    if running:
        bits.append(f"a batch of {np.mean(running):.1f}" + (f" of {x.slots} slots" if x.slots else ""))
    waiting = _values(samples, "requests_waiting")
    if waiting:
        bits.append(f"at most {max(waiting):.0f} waiting")
    kv = _values(samples, "kv_cache_usage")
    if kv:
        bits.append(f"KV cache up to {max(kv):.0%}")
    if "server_preemptions" in m:
        bits.append(f"{m['server_preemptions']:.0f} preemptions")
    stalls = s["stall_metrics"].get("stalls", 0.0)
    bits.append(f"{stalls:.0f} stalls")
    return ", ".join(bits)


def diagnose(x: PointEvidence, th: Thresholds | None = None, factor: float | None = None) -> Diagnosis:
    """The point's diagnosis (see the module's docstring)."""
    th = th or Thresholds()
    samples = engine_samples(x.rows, x.window)
    if x.server_failed:
        return Diagnosis("", "", [], [], ["the server failed during the point"], {}, {}, [])
    per_token = None
    m = x.metrics
    ok = sum(1 for r in x.records if r.ok)  # every repeat's (the point's metrics are means over repeats)
    if not ok:
        return Diagnosis("", "", [], [], ["no request of the point completed"], {}, {}, [])
    if m.get("server_prefill_time_s_mean") and m.get("server_prompt_tokens"):
        per_token = m["server_prefill_time_s_mean"] * 1e3 / (m["server_prompt_tokens"] / ok)
    kwargs = {"factor": factor} if factor else {}
    stalls = find_stalls(x.records, samples.get("preemptions", []), per_token, **kwargs)
    sm = stall_metrics(stalls, x.records)
    gap_total = sum((r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1e3 for r in x.records if r.ok)
    state: dict[str, Any] = {
        "samples": samples,
        "stalls": stalls,
        "stall_metrics": sm,
        "gap_total_ms": gap_total,
        "factor": factor or 5.0,
        "unmeasured": [],
        "notes": [],
        "found": [],
    }
    for rule in RULES:
        finding = rule(x, th, state)
        if finding is not None:
            state["found"].append(finding)
    found: list[Finding] = state["found"]
    found.sort(key=lambda f: (f.confidence != STRONG, PRIORITY.index(f.cause)))
    metrics, classes, ttft_words, ttft_missing = ttft_parts(x)
    decode, decode_words = decode_efficiency(x, samples)
    metrics.update(decode)
    metrics.update(sm)
    if x.foreign is not None:
        metrics["foreign_cpu_cores"] = float(x.foreign.get("cores", 0.0))
    unattributed = [st for st in stalls if st.cause == "unattributed"]
    if unattributed:
        state["notes"].append(
            f"{len(unattributed)} stall(s) matched no cause (worst {max(st.gap_ms for st in unattributed):.0f} ms): "
            "not a prefill, a preemption or a late read; the timeline shows when"
        )
    notes = ttft_words + decode_words + state["notes"]
    if found:
        limiter, confidence = found[0].cause, found[0].confidence
    else:
        limiter, confidence = "none", STRONG if not state["unmeasured"] else WEAK
        found = [Finding("none", confidence, _headroom(x, state))]
    for cause in PRIORITY:
        metrics[f"limited_by_{cause}"] = 1.0 if cause == limiter else 0.0
    metrics["limited_by_none"] = 1.0 if limiter == "none" else 0.0
    return Diagnosis(limiter, confidence, found, ttft_missing + state["unmeasured"], notes, metrics, classes, stalls)
