"""A point's verdict: did the client keep up, and did the server receive the workload the
point planned to send? (:func:`judge_point`: :class:`PointVerdict`.)

Client validity (:func:`client_validity`) asks whether the client kept up: send lag, its event
loop, its CPU, coalesced reads, streams that ran dry, the achieved rate. Workload fidelity asks
the other half: whether the requests the server saw were the ones planned, judged from the
server's own counts in the records (``usage``) and the point's server-side deltas (``server_*``
metrics). A point that fails is INVALID with the reasons: its numbers describe a different
workload, or a client, than the one configured (issue 20).

Fidelity rules, each skipped when what it needs was not measured:

* prompt length: the server's ``usage.prompt_tokens`` of each first turn against the plan's
  ``input_tokens`` (median difference beyond ``prompt_tokens_slack`` tokens and
  ``max_prompt_tokens_error`` of the plan: another tokenizer, a template we did not expect);
  without per-request usage, the server's prompt-token counter over the point instead;
* output length: completion tokens against the plan: with ``ignore_eos`` every request must get
  exactly its planned tokens (a server that ignores it, or stops early); without, none more;
* prefix-cache hits against what the workload implies: hits on prompts that share nothing
  (``random``, ``sharegpt``: the prompts are not what we think), too few on ``shared_prefix``
  or ``multi_turn`` prompts with caching on (cache evicted, or a router lost affinity);
* preemptions per request (KV pressure changed what was measured);
* rejected requests (HTTP 4xx: the server refused the planned request).

Server-side errors and timeouts are a load outcome (goodput, the capacity search), not a
workload mismatch; a server that answered nothing is :func:`summary.server_failure`.

The server's own latency histograms (vLLM and SGLang export TTFT, ITL, end-to-end;
:func:`orchestrator.metrics.prometheus.server_latency`) give a second opinion: :func:`clock_gap`
flags a client that saw more than ``max_gap_ms`` beyond the server's bucket: that time is the
client or the network, not the engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import FidelitySpec, ValiditySpec, WorkloadSpec
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import output_tokens_of

# Datasets whose prompts share no prefix on purpose (vllm_random shares leading blocks by design).
NO_SHARED_PREFIX = ("random", "sharegpt")
SHARED_PREFIX = ("shared_prefix", "multi_turn")


def prompt_length(
    records: Sequence[RequestRecord], metrics: Mapping[str, float], limits: FidelitySpec
) -> tuple[dict[str, float], list[str]]:
    """Prompt tokens the server counted against the plan (first turns: later turns' plans are
    built from the server's own counts)."""
    first = [r for r in records if r.ok and r.turn == 0]
    counted = [r for r in first if r.prompt_tokens is not None]
    out: dict[str, float] = {}
    if counted:
        planned = np.asarray([r.input_tokens_target for r in counted], dtype=float)
        served = np.asarray([r.prompt_tokens for r in counted], dtype=float)
        gap, plan = float(np.median(served - planned)), float(np.median(planned))
        out[M.PROMPT_TOKENS_GAP_P50] = gap
        out[M.PROMPT_TOKENS_SERVER_OVER_PLAN] = float(np.median(served / np.maximum(planned, 1)))
        source = f"the server counted {np.median(served):.0f} prompt tokens per request (median)"
    else:
        sent = [r for r in records if r.turn == 0 and r.http_status in (None, 200)]
        server = metrics.get(M.SERVER_PROMPT_TOKENS)
        if not sent or server is None or any(r.turn > 0 for r in records) or any(not r.ok for r in sent):
            return out, []
        plan = float(np.mean([r.input_tokens_target for r in sent]))
        gap = server / len(sent) - plan
        out[M.PROMPT_TOKENS_GAP_P50] = gap
        out[M.PROMPT_TOKENS_SERVER_OVER_PLAN] = (server / len(sent)) / max(plan, 1.0)
        source = f"the server's prompt-token counter grew by {server / len(sent):.0f} per request"
    if abs(gap) > max(limits.prompt_tokens_slack, limits.max_prompt_tokens_error * plan):
        return out, [
            f"prompt length: {source}, {plan:.0f} planned ({out[M.PROMPT_TOKENS_SERVER_OVER_PLAN]:.2f}x): "
            "the prompts were tokenized with another tokenizer than the server's (model.tokenizer, "
            "model.source/path) or wrapped in a template the plan did not count"
        ]
    return out, []


def output_length(
    records: Sequence[RequestRecord], ignore_eos: bool, limits: FidelitySpec
) -> tuple[dict[str, float], list[str]]:
    """Completion tokens against the plan."""
    ok = [r for r in records if r.ok]
    if not ok:
        return {}, []
    got = np.asarray([output_tokens_of(r) for r in ok])
    planned = np.asarray([r.output_tokens_target for r in ok])
    short, long = int((got < planned).sum()), int((got > planned).sum())
    off = (short + long) if ignore_eos else long
    out = {M.OUTPUT_TOKENS_OFF_FRACTION: off / len(ok)}
    if off / len(ok) > limits.max_output_tokens_off:
        what = []
        if long:
            what.append(f"{long} got more tokens than planned")
        if short and ignore_eos:
            what.append(f"{short} stopped short (ignore_eos is on: the server ignored it or hit a limit)")
        return out, [f"output length: {off} of {len(ok)} requests off the plan: " + "; ".join(what)]
    return out, []


def prefix_hits(
    workload: WorkloadSpec, metrics: Mapping[str, float], limits: FidelitySpec
) -> tuple[dict[str, float], list[str]]:
    """Prefix-cache hits against what the workload implies (only where the engine counted)."""
    rate = metrics.get(M.SERVER_PREFIX_CACHE_HIT_RATE)
    if rate is None:
        return {}, []
    ideal = metrics.get(M.TRACE_IDEAL_PREFIX_SHARE)
    if ideal is not None:  # a replayed trace: its blocks say what can be reused; less is the measure
        if rate > ideal + limits.max_unexpected_hit_rate:
            return {}, [
                f"prefix cache: hit rate {rate:.2f} above the {ideal:.2f} the trace's prefix blocks allow "
                f"(+{limits.max_unexpected_hit_rate:g}): the prompts are not what the plan made"
            ]
        return {}, []
    datasets = {c.dataset for c in workload.classes.values()}
    if datasets <= set(NO_SHARED_PREFIX) and rate > limits.max_unexpected_hit_rate:
        return {}, [
            f"prefix cache: hit rate {rate:.2f} on prompts that share no prefix "
            f"(> {limits.max_unexpected_hit_rate:g}): the prompts are not what the plan made"
        ]
    expected = expected_hit_rate(workload, int(metrics.get(M.REQUESTS, 0)))
    if datasets <= set(SHARED_PREFIX) and expected and rate < limits.min_hit_fraction * expected:
        return {M.PREFIX_CACHE_HIT_RATE_EXPECTED: expected}, [
            f"prefix cache: hit rate {rate:.2f}, the workload implies about {expected:.2f} "
            f"(< {limits.min_hit_fraction:g} of it): cache off or evicted, or a router lost affinity"
        ]
    return ({M.PREFIX_CACHE_HIT_RATE_EXPECTED: expected} if expected else {}), []


def expected_hit_rate(workload: WorkloadSpec, requests: int) -> float | None:
    """The share of prompt tokens a prefix cache can serve, weighted by class: a shared prefix
    of ``prefix_tokens`` (once a group's first request has filled it: ``requests`` of the point,
    0 = unknown), a later turn's history. An upper bound: the server rounds down to whole blocks,
    so the rule compares with a fraction of it (``min_hit_fraction``). None when a class
    implies nothing."""
    total, weights = 0.0, 0.0
    for c in workload.classes.values():
        if c.rate is not None:
            continue
        if c.dataset == "shared_prefix" and c.prefix_tokens and c.input_tokens and c.num_groups:
            warm = max(0.0, 1 - c.num_groups / requests) if requests else 1.0
            share = warm * c.prefix_tokens / (c.prefix_tokens + c.input_tokens)
        elif c.dataset == "multi_turn" and c.turns and c.input_tokens and c.output_tokens:
            per_turn = c.input_tokens + c.output_tokens
            history = sum(k * per_turn for k in range(c.turns))
            prompts = history + c.turns * c.input_tokens
            share = history / prompts
        else:
            return None
        total += c.weight * share
        weights += c.weight
    return total / weights if weights else None


def preemptions(
    records: Sequence[RequestRecord], metrics: Mapping[str, float], limits: FidelitySpec
) -> tuple[dict[str, float], list[str]]:
    n = metrics.get(M.SERVER_PREEMPTIONS)
    if n is None or not records:
        return {}, []
    per_request = n / len(records)
    out = {M.PREEMPTIONS_PER_REQUEST: per_request}
    if per_request > limits.max_preemptions_per_request:
        return out, [
            f"preemptions: {n:.0f} during the point ({per_request:.2f} per request > "
            f"{limits.max_preemptions_per_request:g}): KV pressure recomputed requests"
        ]
    return out, []


def rejections(records: Sequence[RequestRecord], limits: FidelitySpec) -> tuple[dict[str, float], list[str]]:
    rejected = [r for r in records if r.http_status is not None and 400 <= r.http_status < 500]
    if not records:
        return {}, []
    out = {M.REJECTED_FRACTION: len(rejected) / len(records)}
    if len(rejected) / len(records) > limits.max_rejected_fraction:
        first = (rejected[0].error or "").splitlines()[0][:200] if rejected else ""
        return out, [
            f"rejected: {len(rejected)} of {len(records)} requests got HTTP {rejected[0].http_status}: {first}"
        ]
    return out, []


def workload_fidelity(
    records: Sequence[RequestRecord], metrics: Mapping[str, float], workload: WorkloadSpec
) -> tuple[dict[str, float], list[str]]:
    """Every rule on one load point: (metrics to add, reasons it is INVALID)."""
    limits = workload.fidelity
    out: dict[str, float] = {}
    reasons: list[str] = []
    for found, why in (
        prompt_length(records, metrics, limits),
        output_length(records, workload.ignore_eos, limits),
        prefix_hits(workload, metrics, limits),
        preemptions(records, metrics, limits),
        rejections(records, limits),
    ):
        out.update(found)
        reasons += why
    return out, reasons


# --------------------------------------------------------------------------- the server's clock


SERVER_CLOCK = "server clock:"  # the clock-gap check's first words


def clock_gap(
    metrics: Mapping[str, float], limits: FidelitySpec, via: str | None = None
) -> tuple[dict[str, float], list[str]]:
    """Client minus server medians of TTFT and ITL (``<name>_gap_ms_p50``); a client median
    beyond the top of the server's bucket by more than ``max_gap_ms`` flags the point.

    ``via`` names what sits between the client and the engines (a router, a P/D proxy): its hop
    is part of the system measured and lies inside the gap, which then no longer says "the
    client or the network"; the gap is logged and not judged (two replicas and a router on two
    cores put 64 ms of real routing time there)."""
    out: dict[str, float] = {}
    reasons: list[str] = []
    for name in ("ttft", "itl"):
        client, server = metrics.get(f"{name}_ms_p50"), metrics.get(f"server_{name}_ms_p50")
        high = metrics.get(f"server_{name}_ms_p50_high")
        if client is None or server is None or high is None:
            continue
        out[f"{name}_gap_ms_p50"] = client - server
        if via is None and limits.max_gap_ms is not None and not math.isinf(high) and client - high > limits.max_gap_ms:
            reasons.append(
                f"{SERVER_CLOCK} the client's {name.upper()} p50 {client:.1f} ms is {client - high:.1f} ms "
                f"above the most the server's histogram allows ({high:.0f} ms; its p50 {server:.1f} ms) "
                f"(> {limits.max_gap_ms:g}):"
                " that time is the client or the network, not the engine"
            )
    return out, reasons


@dataclass
class PointVerdict:
    """Whether a point's numbers describe the server under the planned workload."""

    metrics: dict[str, float]  # client_invalid, workload_invalid, machine_invalid, invalid, what the checks found
    client: list[str] = field(default_factory=list)  # the client did not keep up, or the server's clock disagrees
    workload: list[str] = field(default_factory=list)  # the server got another workload than planned
    machine: list[str] = field(default_factory=list)  # the machine was shared: processes outside the trial took its CPU
    server: list[str] = field(default_factory=list)  # the servers failed: the point's numbers are not the server's

    @property
    def reasons(self) -> list[str]:
        return self.server + self.client + self.workload + self.machine

    def said(self, label: str, metrics: Mapping[str, float]) -> list[str]:
        """The console lines of an INVALID point ``label`` (with ``metrics``: what the client
        processes wanted, when the trial's CPUs allowed fewer)."""
        lines = [f"point {label}: {reason}" for reason in self.server]
        if self.client:
            used, needed = metrics.get(M.CLIENT_PROCESSES, 1.0), metrics.get(M.CLIENT_PROCESSES_NEEDED, 0.0)
            advice = (
                f" (client_processes: auto wanted {needed:.0f} processes; the trial's CPUs allow {used:.0f}: "
                "raise platform.cpus_per_trial)"
                if needed > used
                else ""
            )
            lines.append(f"point {label} INVALID (the client was the bottleneck): " + "; ".join(self.client) + advice)
        if self.workload:
            lines.append(
                f"point {label} INVALID (the server got another workload than planned): " + "; ".join(self.workload)
            )
        if self.machine:
            lines.append(f"point {label} INVALID: " + "; ".join(self.machine))
        return lines


def judge_point(
    workload: WorkloadSpec,
    records: Sequence[RequestRecord],
    metrics: Mapping[str, float],
    capped: bool = False,
    front: str | None = None,
    foreign_limit: float | None = None,
) -> PointVerdict:
    """The workload's checks on one point: the server got the planned requests (workload
    fidelity), the client's clock agrees with the server's (judged only when nothing sits between
    them: ``front`` names a router or proxy), nothing outside the trial took the machine's CPU
    (``foreign_cpu_cores``, measured by the point's census, against ``foreign_limit``) and the
    client kept up (client validity; ``capped``: a rate point with ``max_concurrency``)."""
    found, moved = workload_fidelity(records, metrics, workload)
    gap, gap_reasons = clock_gap(metrics, workload.fidelity, via=front)
    machine = []
    foreign = metrics.get(M.FOREIGN_CPU_CORES)
    if foreign is not None and foreign_limit is not None and foreign >= foreign_limit:
        machine.append(
            f"the machine was shared: {foreign:.2f} cores busy outside the trial "
            f"(>= workload.validity.max_foreign_cpu_cores: {foreign_limit:g})"
        )
    _, client = client_validity(metrics, workload.validity, capped=capped)
    client = client + gap_reasons
    out = {
        **found,
        **gap,
        M.CLIENT_INVALID: 1.0 if client else 0.0,
        M.WORKLOAD_INVALID: 1.0 if moved else 0.0,
        M.MACHINE_INVALID: 1.0 if machine else 0.0,
    }
    out[M.INVALID] = max(out[M.CLIENT_INVALID], out[M.WORKLOAD_INVALID], out[M.MACHINE_INVALID])
    return PointVerdict(out, client, moved, machine)


COALESCED = "of token chunks arrived in one read with an earlier one"  # the coalesced-reads check's words


def client_validity(metrics: Mapping[str, float], limits: ValiditySpec, capped: bool = False) -> tuple[bool, list[str]]:
    """Whether the client kept up: (valid, reasons). Reads the point's metrics.

    With ``capped`` (a rate point with ``max_concurrency``) late sends and a lower achieved
    rate are the cap working, so only the client's own CPU and event-loop lag count; at
    ``rate: inf`` there is no schedule to be late for (sends queue behind each other by
    design), so send lag and rate do not count either.
    """
    reasons = []
    burst = metrics.get(M.TARGET_RATE) == float("inf")  # everything at once: no schedule to keep
    if not capped and not burst and metrics.get(M.SEND_LAG_MS_P95, 0.0) > limits.max_send_lag_ms_p95:
        why = f"send lag p95 {metrics[M.SEND_LAG_MS_P95]:.1f} ms > {limits.max_send_lag_ms_p95:g}"
        late = metrics.get(M.CLIENT_START_LATE_MS, 0.0)
        if late > limits.max_send_lag_ms_p95:  # the first sends went late together: say where they waited
            why += f" (the client woke {late:.1f} ms late for the point's first instant)"
        reasons.append(why)
    if metrics.get(M.LOOP_LAG_MS_P95, 0.0) > limits.max_loop_lag_ms_p95:
        reasons.append(f"event-loop lag p95 {metrics[M.LOOP_LAG_MS_P95]:.1f} ms > {limits.max_loop_lag_ms_p95:g}")
    if metrics.get(M.CLIENT_CPU_UTIL, 0.0) > limits.max_client_cpu_util:
        reasons.append(f"client CPU {metrics[M.CLIENT_CPU_UTIL]:.2f} of a core > {limits.max_client_cpu_util:g}")
    if metrics.get(M.COALESCED_CHUNK_SHARE, 0.0) > limits.max_coalesced_share:
        reasons.append(
            f"{metrics[M.COALESCED_CHUNK_SHARE]:.0%} {COALESCED} "
            f"(> {limits.max_coalesced_share:g}): their gaps are read times, so ITL is not the server's"
        )
    if metrics.get(M.CLIENT_STREAMS_ENDED_EARLY, 0.0) > 0:
        reasons.append(
            f"{metrics[M.CLIENT_STREAMS_ENDED_EARLY]:.0f} stream(s) ran out of planned requests before the point's "
            "duration: it held fewer streams than asked"
        )
    if metrics.get(M.CLIENT_STREAM_WAIT_SHARE, 0.0) > limits.max_stream_wait_share:
        reasons.append(
            f"streams spent {metrics[M.CLIENT_STREAM_WAIT_SHARE]:.1%} of their time waiting for requests past the "
            f"plan (> {limits.max_stream_wait_share:g}): it held fewer streams than asked; drawing prompts "
            "during the point did not keep up, so bound the point by num_requests (all drawn before its clock)"
        )
    schedule, achieved = metrics.get(M.SCHEDULE_RATE), metrics.get(M.ACHIEVED_RATE)
    if (
        not capped
        and schedule
        and achieved is not None
        and metrics.get(M.TARGET_RATE) != float("inf")
        and achieved < schedule * limits.min_rate_ratio
    ):
        reasons.append(f"achieved rate {achieved:.2f} < {limits.min_rate_ratio:g} x schedule {schedule:.2f}")
    return not reasons, reasons
