"""Stalls: inter-token gaps far above their stream's median, each attributed to what happened
at that instant. Pure functions of a point's records and the engine's sampled counters.

A gap between two content chunks of one request is a *stall* when it is at least
:data:`STALL_FACTOR` times the stream's median gap and at least :data:`STALL_MIN_EXCESS_MS`
above it (a 5x "stall" of a 1 ms stream is noise). The stream's median is the request's own
when it has :data:`MIN_GAPS` gaps or more, else the median of its class's gaps.

Each stall gets one cause, tried in this order:

* ``client_read``: the chunk that ends the gap was read together with the next one (one
  instant for both, :attr:`RequestRecord.coalesced_chunks`): the server had sent it earlier
  and the client read it late, so the gap is the client's, not the server's;
* ``prefill``: another request's prefill ran through at least half of the gap. A request's
  prefill ends at its first token; it is taken to start ``prefill_ms_per_token x its prompt
  tokens x 2`` before (the engine's mean prefill time per prompt token over the point, doubled
  for slack, when the engine exports one); without that, at its send, and then only a prefill
  that ended during the gap or within one more gap of it counts (a window from the send holds
  the queue wait too). The longest such prompt is named;
* ``preemption``: the engine's preemption counter rose in a sample interval overlapping the
  gap (the counter is sampled about once a second: a coarse match). vLLM v1 recomputes a
  preempted request and exports no KV-cache swaps, so a swap would show as a preemption here;
  SGLang exports its retractions as a gauge, not a counter, so no stall is attributed to them;
* ``unattributed``: none of these (a scheduler hiccup, garbage collection, the machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.config.metric_keys import STALL_CAUSES, M
from orchestrator.metrics.records import RequestRecord

STALL_FACTOR = 5.0
STALL_MIN_EXCESS_MS = 10.0
MIN_GAPS = 4
PREFILL_SLACK = 2.0
PREFILL_COVER = 0.5  # the share of a stall a prefill must overlap to be its cause
CAUSES = STALL_CAUSES


@dataclass(frozen=True)
class Stall:
    """One stall of one request's stream, on the records' clock."""

    request_id: int
    request_class: str
    start_s: float  # the chunk before the gap
    gap_ms: float
    median_ms: float  # the stream's median gap
    cause: str
    by_request: int | None = None  # the interfering prefill's request
    by_prompt_tokens: int | None = None

    def as_row(self) -> dict[str, float | int | str | None]:
        return {
            "t": self.start_s,
            "gap_ms": round(self.gap_ms, 3),
            "median_ms": round(self.median_ms, 3),
            "request": self.request_id,
            "class": self.request_class,
            "cause": self.cause,
            "by_request": self.by_request,
            "by_prompt_tokens": self.by_prompt_tokens,
        }


def _gaps_ms(r: RequestRecord) -> list[float]:
    t = r.chunk_times_s
    return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def _prompt_tokens(r: RequestRecord) -> int:
    return int(r.prompt_tokens if r.prompt_tokens is not None else r.input_tokens_target)


def _class_medians(records: Sequence[RequestRecord]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(r.request_class, []).extend(_gaps_ms(r))
    return {c: float(np.median(g)) for c, g in by.items() if g}


def _prefill_windows(
    records: Sequence[RequestRecord], prefill_ms_per_token: float | None
) -> list[tuple[float, float, RequestRecord]]:
    """(start, end, record) of each request's prefill: it ends at the first token."""
    out = []
    for r in records:
        if not r.chunk_times_s:
            continue
        end = r.chunk_times_s[0]
        start = r.sent_s
        if prefill_ms_per_token:
            start = max(start, end - PREFILL_SLACK * prefill_ms_per_token * _prompt_tokens(r) / 1e3)
        out.append((start, end, r))
    return out


def _preemption_intervals(counter: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sample intervals over which the cumulative preemption counter rose."""
    pts = sorted(counter)
    return [(t0, t1) for (t0, v0), (t1, v1) in zip(pts, pts[1:]) if v1 > v0]


def find_stalls(
    records: Sequence[RequestRecord],
    preemptions: Sequence[tuple[float, float]] = (),
    prefill_ms_per_token: float | None = None,
    factor: float = STALL_FACTOR,
    min_excess_ms: float = STALL_MIN_EXCESS_MS,
) -> list[Stall]:
    """Every stall of the point's successful streams, in time order. ``preemptions``: the
    engine's cumulative preemption counter as (t, value) samples on the records' clock."""
    ok = [r for r in records if r.ok]
    medians = _class_medians(ok)
    windows = _prefill_windows(ok, prefill_ms_per_token)
    preempted = _preemption_intervals(preemptions)
    stalls: list[Stall] = []
    for r in ok:
        gaps = _gaps_ms(r)
        if not gaps:
            continue
        median = float(np.median(gaps)) if len(gaps) >= MIN_GAPS else medians.get(r.request_class, 0.0)
        limit = max(factor * median, median + min_excess_ms)
        for i, gap in enumerate(gaps):
            if gap < limit:
                continue
            a, b = r.chunk_times_s[i], r.chunk_times_s[i + 1]
            stalls.append(_attribute(r, i, a, b, gap, median, windows, preempted, bool(prefill_ms_per_token)))
    stalls.sort(key=lambda s: s.start_s)
    return stalls


def _attribute(
    r: RequestRecord,
    i: int,
    a: float,
    b: float,
    gap: float,
    median: float,
    windows: list[tuple[float, float, RequestRecord]],
    preempted: list[tuple[float, float]],
    estimated: bool,
) -> Stall:
    times = r.chunk_times_s
    if i + 2 < len(times) and times[i + 2] == times[i + 1]:  # read with the next chunk: one instant
        return Stall(r.request_id, r.request_class, a, gap, median, "client_read")
    # a prefill that ran through most of the gap (a short prefill inside a long gap did not make it);
    # without the engine's prefill time a window starts at the send and holds the queue wait too,
    # so then only a prefill that ended during the gap or within one more gap of it counts
    during = [
        w
        for w in windows
        if w[2].request_id != r.request_id
        and min(w[1], b) - max(w[0], a) >= PREFILL_COVER * (b - a)
        and (estimated or a <= w[1] <= b + (b - a))
    ]
    if during:
        _, _, by = max(during, key=lambda w: _prompt_tokens(w[2]))
        return Stall(r.request_id, r.request_class, a, gap, median, "prefill", by.request_id, _prompt_tokens(by))
    if any(t0 < b and t1 > a for t0, t1 in preempted):
        return Stall(r.request_id, r.request_class, a, gap, median, "preemption")
    return Stall(r.request_id, r.request_class, a, gap, median, "unattributed")


def stall_metrics(stalls: Sequence[Stall], records: Sequence[RequestRecord]) -> dict[str, float]:
    """Counts and the worst gap per cause; ``stall_time_share``: the stalls' time beyond their
    streams' medians over all the point's inter-token time; ``stalls_per_prefill``: stalls per
    interfering prefill (a chunked prefill stalls its neighbours once per chunk)."""
    total_gap_ms = sum(sum(_gaps_ms(r)) for r in records if r.ok)
    out: dict[str, float] = {M.STALLS: float(len(stalls))}
    for cause in CAUSES:
        mine = [s for s in stalls if s.cause == cause]
        out[f"stalls_{cause}"] = float(len(mine))
        if mine:
            out[f"stall_worst_ms_{cause}"] = max(s.gap_ms for s in mine)
    if stalls:
        out[M.STALL_WORST_MS] = max(s.gap_ms for s in stalls)
    if total_gap_ms > 0:
        out[M.STALL_TIME_SHARE] = sum(s.gap_ms - s.median_ms for s in stalls) / total_gap_ms
    by = {s.by_request for s in stalls if s.cause == "prefill"}
    if by:
        out[M.STALLS_PER_PREFILL] = sum(len(_steps(stalls, b)) for b in by) / len(by)
        out[M.STALL_PREFILL_PROMPT_TOKENS_MEAN] = float(
            np.mean([next(s.by_prompt_tokens or 0 for s in stalls if s.by_request == b) for b in by])
        )
    return out


def _steps(stalls: Sequence[Stall], by: int | None) -> list[float]:
    """The engine steps one prefill stalled its neighbours in: every stream stalls at the same
    step, so stalls that overlap one another are one step (a chunked prefill makes several)."""
    spans = sorted(
        (s.start_s, s.start_s + s.gap_ms / 1e3) for s in stalls if s.cause == "prefill" and s.by_request == by
    )
    steps: list[float] = []
    end = float("-inf")
    for a, b in spans:
        if a >= end:
            steps.append(a)
            end = b
        else:
            end = min(end, b)
    return steps
