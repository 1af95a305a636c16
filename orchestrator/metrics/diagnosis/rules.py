"""The rules of the limiting resource, one per cause of the vocabulary (over capacity has its
own module): each reads a point's evidence and returns a :class:`Finding`, or None, or says
what it could not measure."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from orchestrator.metrics.diagnosis.evidence import PointEvidence, RuleState, Thresholds
from orchestrator.metrics.diagnosis.findings import Evidence, Finding
from orchestrator.metrics.diagnosis.over_capacity import over_capacity
from orchestrator.metrics.diagnosis.parts import gauge_values
from orchestrator.metrics.diagnosis.vocabulary import STRONG, WEAK
from orchestrator.metrics.fidelity import COALESCED, SERVER_CLOCK


def _client(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    if not x.client_reasons:
        return None
    r = x.read
    lag, cpu = r.loop_lag_ms_p95, r.client_cpu_util or 0.0
    kept_up = max(th.client_kept_up_lag_ms, th.client_kept_up_itl_share * (r.server_itl_s_mean or 0.0) * 1e3)
    if lag is not None and lag <= kept_up and all(_server_side(reason) for reason in x.client_reasons):
        # chunks read together, or read late, by a client that woke on time: the server's front end
        # (HTTP, detokenizing, streaming) wrote them together or late, outside the engine's clock
        s.notes.append(
            f"the client kept up (event-loop lag p95 {lag:.1f} ms <= {kept_up:.1f}, {cpu:.2f} of a core) while "
            + "; ".join(x.client_reasons)
            + ": the server's front end sent them so, so the point is INVALID for what its clock misses but "
            "the client did not limit it"
        )
        return None
    return Finding("client", STRONG, "; ".join(x.client_reasons), Evidence(client_invalid=1.0))


def _server_side(reason: str) -> bool:
    """A client check that a client waking on time cannot fail by itself: reads together, or a
    median beyond the server's clock."""
    return COALESCED in reason or reason.startswith(SERVER_CLOCK)


def _shared(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
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
        Evidence(foreign_cpu_cores=cores),
    )


def _kv(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    r, samples = x.read, s.samples
    preempted = r.server_preemptions
    kv = samples.get("kv_cache_usage", [])
    if preempted is None and not kv:
        s.unmeasured.append("KV-cache capacity: the engine exports neither KV usage nor preemptions")
        return None
    kv_max = max((v for _, v in kv), default=r.server_kv_cache_usage_max or 0.0)
    evidence = Evidence(kv_cache_usage_max=kv_max, preemptions=preempted or 0.0)
    if preempted:
        return Finding(
            "kv_capacity", STRONG, f"{preempted:.0f} preemption(s), KV-cache usage up to {kv_max:.0%}", evidence
        )
    waiting = dict(samples.get("requests_waiting", []))
    full_and_waiting = [t for t, v in kv if v >= th.kv_full and waiting.get(t, 0.0) > 0]
    if full_and_waiting:
        return Finding(
            "kv_capacity",
            STRONG,
            f"KV cache {kv_max:.0%} full while requests waited ({len(full_and_waiting)} of {len(kv)} samples)",
            replace(evidence, samples_full_and_waiting=float(len(full_and_waiting))),
        )
    if kv_max >= th.kv_full:
        return Finding("kv_capacity", WEAK, f"KV cache up to {kv_max:.0%} full, though nothing waited", evidence)
    return None


def _slots(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    samples = s.samples
    running, waiting = dict(samples.get("requests_running", [])), dict(samples.get("requests_waiting", []))
    if not running or not waiting:
        s.unmeasured.append(
            "batch slots: no running/waiting gauge sample over the point (none exported, or no scrape answered)"
        )
        return None
    kv = dict(samples.get("kv_cache_usage", []))
    times = sorted(set(running) & set(waiting))
    if len(times) < th.gauge_samples:
        s.unmeasured.append(
            f"batch slots: {len(times)} gauge sample(s) over the point, at least {th.gauge_samples} needed "
            "(a longer point would tell)"
        )
        return None
    queued = [t for t in times if waiting[t] > 0 and kv.get(t, 0.0) < th.kv_full]
    if not queued or len(queued) < th.waiting_share * len(times):
        return None
    top, most = max(running.values()), max(waiting.values())
    evidence = Evidence(waiting_max=most, running_max=top, samples_waiting=float(len(queued)))
    if x.slots is not None:
        full = [t for t in queued if running[t] >= x.slots]
        if len(full) < th.waiting_share * len(times):
            return None
        return Finding(
            "batch_slots",
            STRONG,
            f"{x.slots} of max_num_seqs {x.slots} running while up to {most:.0f} waited "
            f"({len(full)} of {len(times)} samples)",
            replace(evidence, max_num_seqs=float(x.slots)),
        )
    at_top = [t for t in queued if running[t] >= top]
    if len(at_top) < th.waiting_share * len(times):
        return None
    return Finding(
        "batch_slots",
        WEAK,
        f"running held at {top:.0f} while up to {most:.0f} waited with KV to spare "
        "(the engine's max_num_seqs is not known here)",
        evidence,
    )


def _prefill(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    sm, stalls = s.stalled, s.stalls
    count = int(sm.stalls_prefill or 0)
    if not count:
        return None
    prefill = [st for st in stalls if st.cause == "prefill"]
    share = sum(st.gap_ms - st.median_ms for st in prefill) / max(s.gap_total_ms, 1e-9)
    median = float(np.median([st.median_ms for st in prefill]))
    # what a stall costs per prefill token: its time over the decode step, over the tokens of the
    # prefill's step (a chunked prefill stalls once per chunk: its prompt over its stalled steps)
    steps = max(sm.stalls_per_prefill or 1.0, 1.0)
    costs = [(st.gap_ms - st.median_ms) * steps / st.by_prompt_tokens for st in prefill if st.by_prompt_tokens]
    evidence = Evidence(
        stalls_prefill=float(count),
        stall_worst_ms_prefill=sm.stall_worst_ms_prefill or 0.0,
        prefill_stall_time_share=share,
        stalls_per_prefill=sm.stalls_per_prefill or 0.0,
        stall_prefill_prompt_tokens_mean=sm.stall_prefill_prompt_tokens_mean or 0.0,
        decode_step_ms=median,
        prefill_stall_ms_per_token=float(np.median(costs)) if costs else None,
    )
    strong = count >= th.prefill_stalls and share >= th.prefill_time_share
    detail = (
        f"{count} inter-token gaps >= {s.factor:g}x their stream's median (median {median:.1f} ms) fell during "
        f"another request's prefill (prompts of {sm.stall_prefill_prompt_tokens_mean or 0.0:.0f} tokens on average, "
        f"{sm.stalls_per_prefill or 0.0:.1f} stalled step(s) each), worst {sm.stall_worst_ms_prefill or 0.0:.0f} ms, "
        f"{share:.0%} of inter-token time"
    )
    return Finding("prefill_interference", STRONG if strong else WEAK, detail, evidence)


def _queued(x: PointEvidence, th: Thresholds, s: RuleState) -> tuple[bool, str]:
    """Whether work waited in the engine's queue (queue time, or the waiting gauge)."""
    r, samples = x.read, s.samples
    queue, server = r.server_queue_time_s_mean, r.server_ttft_s_mean
    if queue is not None and server and queue / server >= th.queue_share:
        return True, f"queue time {queue * 1e3:.0f} ms of the server's {server * 1e3:.0f} ms TTFT"
    waiting = gauge_values(samples, "requests_waiting")
    busy = [v for v in waiting if v > 0]
    if waiting and len(busy) >= th.waiting_share * len(waiting):
        return True, f"requests waited in {len(busy)} of {len(waiting)} samples"
    return False, ""


def _compute(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    r = x.read
    if x.device == "cuda":
        sm_util = r.telemetry_gpu_sm_util_pct_mean
        if sm_util is None:
            s.unmeasured.append("compute: no GPU telemetry (NVML)")
            return None
        power, limit = r.telemetry_gpu_power_w_mean, r.telemetry_gpu_power_limit_w_mean
        throttled = r.telemetry_gpu_throttled_share or 0.0
        power_share = power / limit if power is not None and limit else None
        evidence = Evidence(sm_util_pct=sm_util, throttled_share=throttled, power_share=power_share)
        if sm_util < th.sm_busy_pct:
            return None
        share = power_share or 0.0
        detail = (
            f"SM utilisation {sm_util:.0f}%, power {share:.0%} of its limit, throttled in {throttled:.0%} of samples"
        )
        if share >= th.power_at_limit or throttled >= th.throttled_share:
            return Finding("compute", STRONG, detail, evidence)
        if share >= th.power_high:
            return Finding("compute", WEAK, detail, evidence)
        return None
    cores, used = x.cores, r.telemetry_server_cpu_cores_mean
    if not cores or used is None:
        s.unmeasured.append("compute: the servers' CPU was not sampled (platform.telemetry)")
        return None
    # the client's cores: every client process's CPU over the point (client_cpu_util is the worst one's)
    client = (r.client_cpu_s or 0.0) / r.client_wall_s if r.client_wall_s else r.client_cpu_util or 0.0
    available = max(cores - client, 0.1)
    if used < th.cores_busy * available:
        return None
    if any(f.cause in ("kv_capacity", "batch_slots") for f in s.found):
        return None  # the wait has a cause of its own
    queued, why = _queued(x, th, s)
    if not queued:
        s.notes.append(
            f"the servers kept {used:.2f} of {available:.2f} cores busy without a queue: vLLM's CPU build keeps "
            "its cores busy whenever a request runs (1.97 of 2 with one stream here), so busy cores alone do "
            "not show saturation"
        )
        return None
    # the wait may have had a cause of its own that could not be checked: then compute is not sure
    unsure = [u for u in s.unmeasured if u.startswith(("batch slots", "KV-cache capacity"))]
    return Finding(
        "compute",
        WEAK if unsure else STRONG,
        f"the servers' cores were saturated ({used:.2f} of {available:.2f}) while work waited: {why}"
        + ("; whether slots or KV made the wait could not be checked" if unsure else ""),
        Evidence(server_cpu_cores=used, cores_available=available),
    )


def _bandwidth(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    r = x.read
    ratio = r.decode_floor_ratio
    if ratio is None:
        s.unmeasured.append("decode bandwidth: no roofline floor (model shape or hardware roofs unknown)")
        return None
    if (r.decode_floor_compute_ms or 0.0) > (r.decode_floor_memory_ms or 0.0):
        return None  # the floor at this batch is the compute one (the compute rule's business)
    floor = r.decode_floor_ms or 0.0
    evidence = Evidence(decode_floor_ratio=ratio, decode_floor_ms=floor)
    detail = f"TPOT p50 {r.tpot_ms_p50 or 0.0:.1f} ms is {ratio:.1f}x the memory floor {floor:.2f} ms of a step"
    if ratio < th.floor_below:  # faster than the floor allows: the floor's bandwidth is not what limits here
        s.notes.append(
            f"{detail}: below the floor, so the floor does not hold here (weights read from a cache faster "
            "than the memory bandwidth it assumes, e.g. a tiny model in the CPU's caches); decode bandwidth "
            "is not judged"
        )
        return None
    if ratio <= th.floor_near:
        return Finding("decode_bandwidth", STRONG, detail, evidence)
    if ratio <= th.floor_close:
        return Finding("decode_bandwidth", WEAK, detail, evidence)
    return None


def _prefix(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    """Prompts that share prefixes (a trace's blocks, a shared-prefix or multi-turn workload) and a
    server that reused little of them: each request's prefill recomputed what a cache would hold."""
    r = x.read
    ideal, hits = r.prefix_reuse_ideal_share, r.server_prefix_cache_hit_rate
    if ideal is None or ideal < th.prefix_ideal:
        return None
    evidence = Evidence(prefix_reuse_ideal_share=ideal)
    shared = f"the prompts share {ideal:.0%} of their tokens with an earlier prompt"
    if hits is None:  # vLLM counts no prefix-cache queries with its cache off
        if x.prefix_cache is False:
            return Finding("prefix_reuse_missed", STRONG, f"{shared}, and the server's prefix cache is off", evidence)
        return Finding("prefix_reuse_missed", WEAK, f"{shared}; the server reported no prefix-cache hits", evidence)
    if hits >= th.prefix_hit_share * ideal:
        return None
    return Finding(
        "prefix_reuse_missed",
        STRONG,
        f"{shared}, the server's prefix cache served {hits:.0%} (under {th.prefix_hit_share:.0%} of it)",
        replace(evidence, server_prefix_cache_hit_rate=hits),
    )


RULES = (_client, _shared, over_capacity, _kv, _slots, _prefill, _compute, _bandwidth, _prefix)
