"""The parts of a point the diagnosis reports beside its limiter: the engine's gauges over the
point's window, the TTFT decomposed (:func:`ttft_parts`) and the decode efficiency against the
roofline floor (:func:`decode_efficiency`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator.config.metric_keys import TTFT_PARTS, M
from orchestrator.metrics.diagnosis.evidence import PointEvidence, Readings
from orchestrator.metrics.telemetry import Row


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


def engine_batch(
    metrics: Mapping[str, float], rows: Sequence[Row], window: tuple[float, float], least: int = 3
) -> float | None:
    """The batch the engine ran over the window: :func:`ran_batch` from the point's metrics and
    the engine's gauge samples in the window."""
    return ran_batch(Readings.of(metrics), engine_samples(rows, window), least)


def ran_batch(r: Readings, samples: dict[str, list[tuple[float, float]]], least: int = 3) -> float | None:
    """The batch the engine ran: its generation tokens over its steps when it counts its steps
    (vLLM; every request in a step makes one token), exact and step-weighted; else its running
    gauge averaged (:func:`batch_values`), None from fewer than ``least`` samples (one sample at a
    point's edge can read an idle engine). The gauge lags a step: read after a step in which one
    of two requests finished, it says 1 through the next step, which prefills the next request
    beside the other; with a few samples on two cores a full batch of 2 read 1.67 (a CI run)."""
    steps, tokens = r.server_engine_steps, r.server_generation_tokens
    if steps and tokens is not None:
        return tokens / steps
    running = batch_values(samples)
    return float(np.mean(running)) if len(running) >= least else None


def batch_values(samples: dict[str, list[tuple[float, float]]]) -> list[float]:
    """The running-requests gauge where the engine ran a batch: its reads above zero. A zero is no
    batch: the engine idle, or (vLLM) the gauge set after a step whose requests all finished and
    read until the next step, the one that prefills those waiting, ends; on two cores that step is
    a tenth of a point, and counting its zeros made a full batch of 2 read 1.6 (a CI run)."""
    return [v for v in gauge_values(samples, "requests_running") if v > 0]


def gauge_values(samples: dict[str, list[tuple[float, float]]], name: str) -> list[float]:
    """One gauge's values from :func:`engine_samples`, in time order (empty when not sampled)."""
    return [v for _, v in samples.get(name, [])]


# --------------------------------------------------------------------------- the parts


def ttft_parts(x: PointEvidence) -> tuple[dict[str, float], dict[str, dict[str, float]], list[str], list[str]]:
    """The point's mean TTFT in parts (ms and shares of the client's TTFT), per class the client's
    TTFT and its server side (the client's less the pooled client overhead); words; unmeasured."""
    r = x.read
    client = r.ttft_ms_mean
    out: dict[str, float] = {}
    unmeasured: list[str] = []
    if client is None:
        return out, {}, [], ["TTFT: no request produced a token"]
    out[M.TTFT_PARTS_CLIENT_TOTAL_MS] = client
    server = r.server_decode_ttft_s_mean if x.disaggregated else r.server_ttft_s_mean
    parts: dict[str, float] = {}
    off = ""
    if x.disaggregated and x.decode_ttft_holds_prefill:
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
        queue, prefill = r.server_queue_time_s_mean, r.server_prefill_time_s_mean
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
        off = _not_adding_up(client, server, queue, prefill)
        if off:  # the engine's means are not parts of the client's: say so, and sum nothing
            unmeasured.append(off)
            parts = {k: v for k, v in parts.items() if k in ("queue", "prefill")}
    for k, v in parts.items():
        out[f"ttft_parts_{k}_ms"] = v
        out[f"ttft_parts_{k}_share"] = v / client if client > 0 else 0.0
    classes: dict[str, dict[str, float]] = {}
    overhead = parts.get("client")
    for cls, cm in x.class_metrics.items():
        if M.TTFT_MS_MEAN in cm and overhead is not None:
            classes[cls] = {M.TTFT_PARTS_SERVER_MS: max(cm[M.TTFT_MS_MEAN] - overhead, 0.0)}
    words = [] if off else _ttft_words(client, parts, len(x.class_metrics) > 1)
    return out, classes, words, unmeasured


def _not_adding_up(client: float, server: float | None, queue: float | None, prefill: float | None) -> str:
    """Why the engine's means are no decomposition of the client's mean TTFT, or "": the engine's
    TTFT above the client's, or its queue and prefill above its TTFT (beyond 5% or 1 ms). Each is a
    mean over the requests its histogram observed in the point's window, which need not be the
    ones the client timed (requests cut off or failed, a histogram observed at a request's end)."""
    if server is None:
        return ""
    server_ms = server * 1e3
    tolerance = max(0.05 * server_ms, 1.0)
    if client - server_ms < -tolerance:
        return (
            f"TTFT parts: the engine's mean TTFT {server_ms:.1f} ms is above the client's {client:.1f} ms, so its "
            "parts do not add up to the client's (its histograms observed other requests than the client timed)"
        )
    inside = (queue or 0.0) * 1e3 + (prefill or 0.0) * 1e3
    if inside - server_ms > tolerance:
        return (
            f"TTFT parts: the engine's queue + prefill means ({inside:.1f} ms) are above its mean TTFT "
            f"({server_ms:.1f} ms), so they are no parts of it (its histograms observed other requests)"
        )
    return ""


def _ttft_words(client: float, parts: dict[str, float], pooled: bool) -> list[str]:
    """The TTFT's parts in words (none when it has no parts); ``pooled``: the engine's
    histograms hold more than one request class."""
    if not parts:
        return []
    names = {
        "prefill_leg": "prefill leg (proxy + prefill server)",
        "kv_transfer": "KV transfer + decode's first step",
    }
    return [
        f"TTFT mean {client:.0f} ms = "
        + " + ".join(f"{names.get(k, k)} {parts[k]:.0f}" for k in TTFT_PARTS if k in parts)
        + (" (the engine's histograms pooled over classes)" if pooled else "")
    ]


def decode_efficiency(
    x: PointEvidence, samples: dict[str, list[tuple[float, float]]], least: int = 3
) -> tuple[dict[str, float], list[str]]:
    """The batch the engine actually ran (:func:`ran_batch`: its counters, else its running gauge
    from at least ``least`` samples) and TPOT against the roofline floor at that batch (``decode_floor_*`` from
    the trial, computed at this batch; the point's planned batch when the gauge is too thin)."""
    r = x.read
    out: dict[str, float] = {}
    batch = ran_batch(r, samples, least)
    if batch is not None:
        out[M.DECODE_BATCH_MEAN] = batch
    words = []
    tpot, floor = r.tpot_ms_p50, r.decode_floor_ms
    if tpot is not None and floor:
        bound = "compute" if (r.decode_floor_compute_ms or 0.0) > (r.decode_floor_memory_ms or 0.0) else "memory"
        planned = r.decode_floor_batch if r.decode_floor_batch is not None else 1.0
        batch = out.get(M.DECODE_BATCH_MEAN, planned)
        which = "the engine's mean" if M.DECODE_BATCH_MEAN in out else "planned: too few gauge samples"
        words.append(
            f"decode: TPOT p50 {tpot:.1f} ms at a batch of {batch:.1f} ({which}), "
            f"{tpot / floor:.1f}x its roofline floor {floor:.2f} ms ({bound}-bound)"
        )
    return out, words


def headroom(x: PointEvidence, samples: dict[str, list[tuple[float, float]]], stalls: Readings) -> str:
    """Why nothing limited the point: what was far from its limit (``samples``: the engine's
    gauges over the window; ``stalls``: the point's stall metrics)."""
    r = x.read
    bits = []
    batch = ran_batch(r, samples, 1)
    if batch is not None:
        bits.append(f"a batch of {batch:.1f}" + (f" of {x.slots} slots" if x.slots else ""))
    waiting = gauge_values(samples, "requests_waiting")
    if waiting:
        bits.append(f"at most {max(waiting):.0f} waiting")
    kv = gauge_values(samples, "kv_cache_usage")
    if kv:
        bits.append(f"KV cache up to {max(kv):.0%}")
    if r.server_preemptions is not None:
        bits.append(f"{r.server_preemptions:.0f} preemptions")
    bits.append(f"{stalls.stalls or 0.0:.0f} stalls")
    return ", ".join(bits)
