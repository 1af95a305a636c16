"""The over-capacity rule: did an open loop's server fall behind its arrivals? Completions are
set against the arrivals a request's lifetime earlier (a healthy server's warm-up is not a queue),
and where that cannot tell, the output rate's plateau against the batch decides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from orchestrator.metrics.diagnosis.evidence import PointEvidence, RuleState, Thresholds
from orchestrator.metrics.diagnosis.findings import Evidence, Finding
from orchestrator.metrics.diagnosis.vocabulary import STRONG, WEAK
from orchestrator.metrics.records import RequestRecord


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
) -> tuple[str, str, Evidence]:
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
    evidence = Evidence(
        output_rate_share=share, output_tok_s=rate4, demand_tok_s=demand, in_flight_q3=n3, in_flight_q4=n4
    )
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


def _falling_behind(records: Sequence[RequestRecord], th: Thresholds, rate: float) -> tuple[str, str, Evidence] | None:
    """One repeat of an open loop: did completions fall behind arrivals? A request arriving at
    ``t`` completes at ``t + L`` on a server that keeps up, ``L`` the lifetime of the first third
    of arrivals (before any queue): past ``a + L`` the completions are set against the arrivals
    ``L`` earlier, so a healthy server's warm-up (in flight climbing from 1 to rate x L) is not
    taken for a queue. The output rate's plateau (``_throughput_plateau``) decides where this
    cannot: when the first arrivals live longer than half the arrivals' span, and beside a weak
    count. (confidence, words, evidence), (TOO_SHORT, why, no evidence) or None."""
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
            Evidence(),
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
    evidence = Evidence(completion_share=ratio, in_flight_gained=float(grew), ttft_growth=growth)
    words = (
        f"{completions} requests completed where {expected} would have on a server keeping up ({ratio:.0%}), the "
        f"requests in flight grew by {grew} and TTFT rose {growth:.1f}x from the first third of arrivals to the last"
    )
    return (STRONG if strong else WEAK), words, evidence


def over_capacity(x: PointEvidence, th: Thresholds, s: RuleState) -> Finding | None:
    if x.rate is None or x.rate == float("inf"):
        return None
    if x.capped:  # the cap holds the queue on the client's side: sends fall behind the schedule
        sched, achieved = x.read.schedule_rate, x.read.achieved_rate
        if sched and achieved is not None and achieved < 0.9 * sched:
            return Finding(
                "over_capacity",
                STRONG,
                f"max_concurrency held sends back: {achieved:.2f} req/s sent of {sched:.2f} scheduled",
                Evidence(achieved_rate=achieved, schedule_rate=sched),
            )
        return None
    repeats = sorted({r.repeat for r in x.records})  # each repeat is its own run of the arrivals
    found = [_falling_behind([r for r in x.records if r.repeat == k], th, float(x.rate)) for k in repeats]
    short = [f for f in found if f is not None and f[0] == TOO_SHORT]
    if short:
        s.unmeasured.append("over capacity: " + short[0][1])
        return None
    hits = [f for f in found if f is not None]
    if not hits:
        return None
    confidence = STRONG if len(hits) == len(found) and all(f[0] == STRONG for f in hits) else WEAK
    words = f"at {x.rate:g} req/s " + hits[0][1]
    if len(found) > 1:
        words += f" (in {len(hits)} of {len(found)} repeats)"
    return Finding("over_capacity", confidence, words, replace(hits[0][2], rate=float(x.rate)))
