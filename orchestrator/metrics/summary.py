"""Derived latencies and per-load-point summaries: pure functions of request records.

Definitions (all from client-side monotonic instants):

* TTFT = first content chunk - sent
* E2E  = last content chunk - sent
* ITL  = gaps between consecutive content chunks (so ``E2E - TTFT == sum(ITL)``)
* TPOT = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token
* ITL worst = the largest ITL of each request (``itl_worst_ms_p50`` = the stall a typical
  request saw; head-of-line blocking shows here even when stalls are under 1% of all ITLs)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.config.metric_keys import PERCENTILES, M
from orchestrator.config.schema import SLOSpec
from orchestrator.metrics.records import RequestRecord

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class RequestLatency:
    """Latencies of one successful request, in milliseconds."""

    ttft_ms: float
    e2e_ms: float
    itl_ms: tuple[float, ...]
    tpot_ms: float | None
    output_tokens: int


def output_tokens_of(r: RequestRecord) -> int:
    """Server-reported output tokens, else the tokens counted per chunk."""
    if r.output_tokens is not None:
        return int(r.output_tokens)
    return int(sum(r.chunk_tokens))


def latency_of(r: RequestRecord) -> RequestLatency | None:
    """Latencies of a record, or ``None`` if it failed or produced no token."""
    if not r.ok:
        return None
    times = r.chunk_times_s
    ttft = (times[0] - r.sent_s) * 1e3
    e2e = (times[-1] - r.sent_s) * 1e3
    itl = tuple((b - a) * 1e3 for a, b in zip(times, times[1:]))
    n_out = output_tokens_of(r)
    tpot = (e2e - ttft) / (n_out - 1) if n_out > 1 else None
    return RequestLatency(ttft_ms=ttft, e2e_ms=e2e, itl_ms=itl, tpot_ms=tpot, output_tokens=n_out)


def distribution(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{prefix}_mean``, ``{prefix}_pNN`` for the standard percentiles and ``{prefix}_max``."""
    if len(values) == 0:
        return {}
    arr = np.asarray(values, dtype=float)
    out = {f"{prefix}_mean": float(arr.mean())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"{prefix}_p{p}"] = float(v)
    out[f"{prefix}_max"] = float(arr.max())
    return out


def meets_slo(lat: RequestLatency, slo: SLOSpec) -> bool:
    if slo.ttft_ms is not None and lat.ttft_ms > slo.ttft_ms:
        return False
    if slo.tpot_ms is not None and lat.tpot_ms is not None and lat.tpot_ms > slo.tpot_ms:
        return False
    if slo.e2e_ms is not None and lat.e2e_ms > slo.e2e_ms:
        return False
    return True


def latency_metrics(lats: Sequence[RequestLatency]) -> dict[str, float]:
    """Distributions of TTFT, TPOT, ITL (pooled over requests) and E2E."""
    out: dict[str, float] = {}
    out.update(distribution("ttft_ms", [x.ttft_ms for x in lats]))
    out.update(distribution("tpot_ms", [x.tpot_ms for x in lats if x.tpot_ms is not None]))
    out.update(distribution("itl_ms", [v for x in lats for v in x.itl_ms]))
    out.update(distribution("e2e_ms", [x.e2e_ms for x in lats]))
    # The worst stall each request saw: robust to how rare stalls are among all ITLs.
    out.update(distribution("itl_worst_ms", [max(x.itl_ms) for x in lats if x.itl_ms]))
    if M.ITL_MS_P50 in out and out[M.ITL_MS_P50] > 0:
        out[M.ITL_P99_OVER_P50] = out[M.ITL_MS_P99] / out[M.ITL_MS_P50]
    return out


def summarize_point(
    records: Sequence[RequestRecord],
    slo: SLOSpec | None = None,
    target_rate: float | None = None,
    arrival_classes: Iterable[str] | None = None,
    scheduled: bool = False,
) -> dict[str, float]:
    """Metrics of one load point, named after the workload card (``ttft_ms_p99``, ``qps``, ...).
    An open-loop point (``scheduled``) also counts its latencies from each request's scheduled
    send instant (``*_from_schedule_ms``).

    ``achieved_rate`` counts the actual sends of ``arrival_classes`` (the classes that
    follow the point's arrival setting; default all); ``schedule_rate`` is the rate of the
    drawn schedule itself (a Poisson draw of 100 requests is ~10% off its nominal
    ``target_rate``), so achieved / schedule says whether the client kept up.
    """
    slo = slo or SLOSpec()
    out: dict[str, float] = {M.REQUESTS: float(len(records))}
    if not records:
        return out
    lats = [x for x in (latency_of(r) for r in records) if x is not None]
    ok = [r for r in records if r.ok]
    out[M.COMPLETED] = float(len(ok))
    out[M.ERRORS] = float(len(records) - len(ok))
    start = min(r.sent_s for r in records)
    end = max((r.done_s if r.done_s is not None else r.sent_s) for r in records)
    duration = max(end - start, 1e-9)
    out[M.DURATION_S] = duration
    out[M.QPS] = len(ok) / duration
    chunks = sum(len(r.chunk_times_s) for r in ok)
    if chunks:  # token chunks read together with an earlier one: their gaps are not the server's
        out[M.COALESCED_CHUNK_SHARE] = sum(r.coalesced_chunks for r in ok) / chunks
    out_tokens = sum(output_tokens_of(r) for r in ok)
    in_tokens = sum(int(r.prompt_tokens or r.input_tokens_target) for r in ok)
    out[M.TOKENS_PER_SECOND] = out_tokens / duration
    out[M.TOTAL_TOKENS_PER_SECOND] = (out_tokens + in_tokens) / duration
    out[M.OUTPUT_TOKENS] = float(out_tokens)
    out[M.INPUT_TOKENS] = float(in_tokens)
    out.update(latency_metrics(lats))
    good = sum(1 for x in lats if meets_slo(x, slo))
    out[M.GOODPUT] = good / duration
    out[M.SLO_ATTAINMENT] = good / len(records)
    lags = [(r.sent_s - r.intended_send_s) * 1e3 for r in records]
    out.update(distribution("send_lag_ms", lags))
    if scheduled:  # what a user of the schedule waited: the client's lateness included
        out.update(_from_schedule(records))
    out.update(_arrival_rates(records, arrival_classes))
    if target_rate is not None:
        out[M.TARGET_RATE] = float(target_rate)
    out.update(_turn_latencies(records))
    return out


def _from_schedule(records: Sequence[RequestRecord]) -> dict[str, float]:
    """TTFT and end-to-end latency of the completed requests, counted from each one's scheduled
    send instant (``*_from_schedule_ms``)."""
    timed = [r for r in records if r.ok]
    out = distribution("ttft_from_schedule_ms", [(r.chunk_times_s[0] - r.intended_send_s) * 1e3 for r in timed])
    done = [r for r in timed if r.done_s is not None]
    out.update(distribution("e2e_from_schedule_ms", [(r.done_s - r.intended_send_s) * 1e3 for r in done]))  # type: ignore[operator]
    return out


def _arrival_rates(records: Sequence[RequestRecord], arrival_classes: Iterable[str] | None) -> dict[str, float]:
    """``achieved_rate`` (the actual sends) and ``schedule_rate`` (the drawn schedule) of the
    requests of ``arrival_classes`` (default all) that arrive by the point's setting."""
    out: dict[str, float] = {}
    wanted = set(arrival_classes) if arrival_classes is not None else None
    # Arrivals: a conversation arrives once; its later turns follow the replies, not the schedule.
    arriving = [r for r in records if (wanted is None or r.request_class in wanted) and r.turn == 0]
    for key, instants in (
        (M.ACHIEVED_RATE, [r.sent_s for r in arriving]),
        (M.SCHEDULE_RATE, [r.intended_send_s for r in arriving]),
    ):
        ts = sorted(instants)
        if len(ts) > 1 and ts[-1] > ts[0]:
            out[key] = (len(ts) - 1) / (ts[-1] - ts[0])
    return out


def _turn_latencies(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Multi-turn: TTFT of first turns and of later ones, which resend the history (prefix
    caching shows here); nothing when no request is a later turn."""
    later = [x for r in records if r.turn > 0 and (x := latency_of(r)) is not None]
    if not later:
        return {}
    first = [x for r in records if r.turn == 0 and (x := latency_of(r)) is not None]
    return {
        **distribution("first_turn_ttft_ms", [x.ttft_ms for x in first]),
        **distribution("later_turns_ttft_ms", [x.ttft_ms for x in later]),
    }


def summarize_by_class(records: Iterable[RequestRecord]) -> dict[str, dict[str, float]]:
    """Latency distributions per request class (for workloads that mix classes)."""
    by: dict[str, list[RequestLatency]] = {}
    for r in records:
        lat = latency_of(r)
        if lat is not None:
            by.setdefault(r.request_class, []).append(lat)
    return {name: latency_metrics(lats) for name, lats in sorted(by.items())}


BASE_MODEL = "base"  # the adapter group of requests that named no adapter (the base model)


def adapter_key(name: str, metric: str) -> str:
    """The flat key of one adapter's metric: ``adapter.<name>.<metric>`` (no '/', which names a
    request class; characters MLflow refuses in a key become '_')."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return f"adapter.{safe}.{metric}"


def summarize_by_adapter(records: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """Per LoRA adapter the requests named (``base``: none): their latencies, how many completed,
    their output tokens per second over the point's span, and the TTFT of each adapter's first
    request of the point against its others (``first_ttft_ms``: the cold request when the adapter
    had to be loaded, ``warm_ttft_ms_p50``: the rest) and, where the server reports each prompt's
    cached tokens, the share of prompt tokens its prefix cache served (``prefix_hit_rate``: a
    prompt cached under one adapter is no hit under another). Empty when no request named one."""
    if not any(r.adapter for r in records):
        return {}
    start = min(r.sent_s for r in records)
    end = max((r.done_s if r.done_s is not None else r.sent_s) for r in records)
    span = max(end - start, 1e-9)
    by: dict[str, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.sent_s):
        by.setdefault(r.adapter or BASE_MODEL, []).append(r)
    out: dict[str, dict[str, float]] = {}
    for name, group in sorted(by.items()):
        lats = [x for x in (latency_of(r) for r in group) if x is not None]
        m = latency_metrics(lats)
        m[M.REQUESTS] = float(len(group))
        m[M.COMPLETED] = float(len(lats))
        m[M.TOKENS_PER_SECOND] = sum(x.output_tokens for x in lats) / span
        cached = [r for r in group if r.ok and r.cached_tokens is not None]
        if cached:  # the server said what its prefix cache served (vLLM: --enable-prompt-tokens-details)
            prompt = sum(int(r.prompt_tokens or r.input_tokens_target) for r in cached)
            m[M.PREFIX_HIT_RATE] = sum(int(r.cached_tokens or 0) for r in cached) / max(prompt, 1)
        if lats:
            m[M.FIRST_TTFT_MS] = lats[0].ttft_ms
            if len(lats) > 1:
                m[M.WARM_TTFT_MS_P50] = float(np.percentile([x.ttft_ms for x in lats[1:]], 50))
        out[name] = m
    return out


def server_failure(records: Sequence[RequestRecord]) -> str | None:
    """Why a point's records say the server was not serving, or None: every request failed, and
    each on the server's side (HTTP 5xx, or no HTTP answer: connection refused or reset, a
    stream cut). Rejections (HTTP 4xx) are a workload problem and timeouts an overload, not a
    dead server. The most frequent error is quoted."""
    if not records or not all(_server_side(r) for r in records):
        return None
    errors: dict[str, int] = {}
    for r in records:
        key = (r.error or "no output").splitlines()[0][:300]
        errors[key] = errors.get(key, 0) + 1
    common, count = max(errors.items(), key=lambda kv: kv[1])
    return f"every request failed ({len(records)} of {len(records)}); most often ({count}x): {common}"


def _server_side(r: RequestRecord) -> bool:
    """A failed request whose failure was the server's (see :func:`server_failure`)."""
    if r.ok:
        return False
    if r.http_status is not None and r.http_status != 200:
        return r.http_status >= 500
    kind = (r.error or "").split(":", 1)[0]  # "TimeoutError", aiohttp's "SocketTimeoutError", "cancelled"
    return not (kind.endswith("TimeoutError") or kind == "cancelled")


# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
HEADLINE_LATENCIES = (M.TTFT_MS_P50, M.TTFT_MS_P99, M.TPOT_MS_P50, M.ITL_MS_P50, M.ITL_MS_P99, M.E2E_MS_P50)
CI_METRICS = (*HEADLINE_LATENCIES, M.TOKENS_PER_SECOND, M.QPS)


def summarize_repeats(per_repeat: Sequence[dict[str, float]], max_ci_rel_width: float) -> dict[str, float]:
    """Means over a point's repeats, 95% confidence half-widths (``<metric>_ci95``) of the key
    metrics, and ``ci_wide`` = 1 when one of them is wider than ``max_ci_rel_width`` of its mean."""
    n = len(per_repeat)
    keys = set.intersection(*(set(m) for m in per_repeat)) if per_repeat else set()
    out = {k: float(np.mean([m[k] for m in per_repeat])) for k in sorted(keys)}
    out[M.REPEATS] = float(n)
    if n < 2:
        return out
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    wide = False
    for k in CI_METRICS:
        if k in keys:
            values = np.asarray([m[k] for m in per_repeat])
            half = float(t * values.std(ddof=1) / np.sqrt(n))
            out[f"{k}_ci95"] = half
            wide |= out[k] > 0 and half / out[k] > max_ci_rel_width
    out[M.CI_WIDE] = 1.0 if wide else 0.0
    return out
