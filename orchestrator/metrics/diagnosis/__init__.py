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
are in docs/diagnosis.md. The package: ``vocabulary`` (the causes), ``evidence`` (what the rules
read), ``findings`` (what they say: findings, the diagnosis, the diagnosis as logged), ``parts``
(the engine's gauges, the TTFT's parts, decode efficiency), ``rules`` and ``over_capacity`` (one
rule per cause); :func:`diagnose` here runs them. Every public name is importable from here.
"""

from __future__ import annotations

from orchestrator.config.metric_keys import M
from orchestrator.metrics.diagnosis.evidence import PointEvidence, Readings, RuleState, Thresholds
from orchestrator.metrics.diagnosis.findings import Diagnosis, Evidence, Finding, LoggedDiagnosis
from orchestrator.metrics.diagnosis.parts import (
    decode_efficiency,
    engine_batch,
    engine_samples,
    headroom,
    ttft_parts,
)
from orchestrator.metrics.diagnosis.rules import RULES
from orchestrator.metrics.diagnosis.vocabulary import PRIORITY, SERVER_CAUSES, STRONG, VOCABULARY, WEAK, Cause
from orchestrator.metrics.stalls import find_stalls, stall_metrics

__all__ = [
    "PRIORITY",
    "RULES",
    "STRONG",
    "VOCABULARY",
    "WEAK",
    "Cause",
    "Diagnosis",
    "Evidence",
    "Finding",
    "LoggedDiagnosis",
    "PointEvidence",
    "Readings",
    "RuleState",
    "SERVER_CAUSES",
    "Thresholds",
    "decode_efficiency",
    "diagnose",
    "engine_batch",
    "engine_samples",
    "ttft_parts",
]


def diagnose(x: PointEvidence, th: Thresholds | None = None, factor: float | None = None) -> Diagnosis:
    """The point's diagnosis (see the module's docstring)."""
    th = th or Thresholds()
    samples = engine_samples(x.rows, x.window)
    if x.server_failed:
        return Diagnosis("", "", [], [], ["the server failed during the point"], {}, {}, [])
    per_token = None
    r = x.read
    ok = sum(1 for r in x.records if r.ok)  # every repeat's (the point's metrics are means over repeats)
    if not ok:
        return Diagnosis("", "", [], [], ["no request of the point completed"], {}, {}, [])
    if r.server_prefill_time_s_mean and r.server_prompt_tokens:
        per_token = r.server_prefill_time_s_mean * 1e3 / (r.server_prompt_tokens / ok)
    kwargs = {"factor": factor} if factor else {}
    stalls = find_stalls(x.records, samples.get("preemptions", []), per_token, **kwargs)
    sm = stall_metrics(stalls, x.records)
    gap_total = sum((r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1e3 for r in x.records if r.ok)
    state = RuleState(samples, stalls, Readings.of(sm), gap_total, factor or 5.0)
    for rule in RULES:
        finding = rule(x, th, state)
        if finding is not None:
            state.found.append(finding)
    found = state.found
    found.sort(key=lambda f: (f.confidence != STRONG, PRIORITY.index(f.cause)))
    metrics, classes, ttft_words, ttft_missing = ttft_parts(x)
    decode, decode_words = decode_efficiency(x, samples, th.gauge_samples)
    metrics.update(decode)
    metrics.update(sm)
    if x.foreign is not None:
        metrics[M.FOREIGN_CPU_CORES] = float(x.foreign.get("cores", 0.0))
    unattributed = [st for st in stalls if st.cause == "unattributed"]
    if unattributed:
        state.notes.append(
            f"{len(unattributed)} stall(s) matched no cause (worst {max(st.gap_ms for st in unattributed):.0f} ms): "
            "not a prefill, a preemption or a late read; the timeline shows when"
        )
    notes = ttft_words + decode_words + state.notes
    if found:
        limiter, confidence = found[0].cause, found[0].confidence
    else:
        limiter, confidence = "none", STRONG if not state.unmeasured else WEAK
        found = [Finding("none", confidence, headroom(x, samples, state.stalled))]
    for cause in PRIORITY:
        metrics[f"limited_by_{cause}"] = 1.0 if cause == limiter else 0.0
    metrics[M.LIMITED_BY_NONE] = 1.0 if limiter == "none" else 0.0
    return Diagnosis(limiter, confidence, found, ttft_missing + state.unmeasured, notes, metrics, classes, stalls)
