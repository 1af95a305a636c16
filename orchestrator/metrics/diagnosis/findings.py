"""What a diagnosis says: a rule's :class:`Finding` with its :class:`Evidence` (named numbers), the
whole :class:`Diagnosis` of a point, and :class:`LoggedDiagnosis`, the diagnosis as a result file
and MLflow keep it and as the decisions (the report, the tuner) read it back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.metrics.diagnosis.vocabulary import VOCABULARY
from orchestrator.metrics.stalls import Stall


@dataclass(frozen=True)
class Evidence:
    """The numbers a finding rests on, each under its own name (None: not part of this finding).
    The tuner's moves read them by name (``running_max``, ``prefill_stall_ms_per_token``); a result
    file and MLflow keep the ones set (:meth:`as_json`), and :meth:`of` reads them back."""

    # client, shared machine
    client_invalid: float | None = None
    foreign_cpu_cores: float | None = None
    # over capacity: sends held back by max_concurrency...
    achieved_rate: float | None = None
    schedule_rate: float | None = None
    # ... the output rate's plateau ...
    output_rate_share: float | None = None
    output_tok_s: float | None = None
    demand_tok_s: float | None = None
    in_flight_q3: float | None = None
    in_flight_q4: float | None = None
    # ... completions behind arrivals, at this arrival rate
    completion_share: float | None = None
    in_flight_gained: float | None = None
    ttft_growth: float | None = None
    rate: float | None = None
    # KV-cache capacity
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    samples_full_and_waiting: float | None = None
    # batch slots: the demand seen (running plus waiting at the peak)
    waiting_max: float | None = None
    running_max: float | None = None
    samples_waiting: float | None = None
    max_num_seqs: float | None = None
    # prefill interference: the stalls, the decode step they stalled, their cost per prompt token
    stalls_prefill: float | None = None
    stall_worst_ms_prefill: float | None = None
    prefill_stall_time_share: float | None = None
    stalls_per_prefill: float | None = None
    stall_prefill_prompt_tokens_mean: float | None = None
    decode_step_ms: float | None = None
    prefill_stall_ms_per_token: float | None = None
    # compute: a GPU's, or the servers' CPU cores
    sm_util_pct: float | None = None
    throttled_share: float | None = None
    power_share: float | None = None
    server_cpu_cores: float | None = None
    cores_available: float | None = None
    # decode bandwidth
    decode_floor_ratio: float | None = None
    decode_floor_ms: float | None = None
    # prefix reuse missed
    prefix_reuse_ideal_share: float | None = None
    server_prefix_cache_hit_rate: float | None = None

    def as_json(self) -> dict[str, float]:
        """The numbers set, by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> Evidence:
        """Evidence as :meth:`as_json` wrote it; a name this version does not know is left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (raw or {}).items() if k in known and isinstance(v, (int, float))})


@dataclass(frozen=True)
class Finding:
    """What one rule found: the cause (a word of :data:`VOCABULARY`), how sure (:data:`STRONG`,
    :data:`WEAK`), the finding in words, and the numbers it rests on."""

    cause: str
    confidence: str
    detail: str
    evidence: Evidence = Evidence()

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "confidence": self.confidence,
            "detail": self.detail,
            "evidence": self.evidence.as_json(),
        }

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Finding:
        """A finding as :meth:`as_json` wrote it (a result file, MLflow's points.csv)."""
        return cls(
            str(raw.get("cause", "")),
            str(raw.get("confidence", "")),
            str(raw.get("detail", "")),
            Evidence.of(raw.get("evidence")),
        )


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

    def logged(self, stalls: int = 0) -> LoggedDiagnosis:
        """The diagnosis as a result file keeps it: words, findings, and up to ``stalls`` stalls
        (worst first, in time order)."""
        worst = sorted(self.stalls, key=lambda s: -s.gap_ms)[:stalls] if stalls else []
        return LoggedDiagnosis(
            self.limiter,
            self.confidence,
            self.headline,
            self.text(),
            tuple(self.findings),
            tuple(self.unmeasured),
            tuple(s.as_row() for s in sorted(worst, key=lambda s: s.start_s)),
        )

    def as_json(self, stalls: int = 0) -> dict[str, Any]:
        """The diagnosis for a result file (:meth:`logged`, as JSON)."""
        return self.logged(stalls).as_json()


@dataclass(frozen=True)
class LoggedDiagnosis:
    """A point's diagnosis as its result file and MLflow keep it, and as the decisions read it
    back (:meth:`of`): the limiter, how sure, the words, the findings with their evidence, what
    could not be measured, the worst stalls. Empty (``limiter`` "") where nothing was diagnosed."""

    limiter: str = ""
    confidence: str = ""
    headline: str = ""
    text: str = ""
    findings: tuple[Finding, ...] = ()
    unmeasured: tuple[str, ...] = ()
    stalls: tuple[dict[str, Any], ...] = ()  # rows (:meth:`orchestrator.metrics.stalls.Stall.as_row`)

    def finding(self, cause: str) -> Finding | None:
        return next((f for f in self.findings if f.cause == cause), None)

    def as_json(self) -> dict[str, Any]:
        if not self.limiter and not self.headline and not self.findings:
            return {}
        out: dict[str, Any] = {
            "limiter": self.limiter,
            "confidence": self.confidence,
            "headline": self.headline,
            "text": self.text,
            "findings": [f.as_json() for f in self.findings],
            "unmeasured": list(self.unmeasured),
        }
        if self.stalls:
            out["stalls"] = [dict(s) for s in self.stalls]
        return out

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> LoggedDiagnosis:
        """The diagnosis as :meth:`as_json` wrote it (``{}`` or None: not diagnosed)."""
        raw = raw or {}
        return cls(
            str(raw.get("limiter") or ""),
            str(raw.get("confidence") or ""),
            str(raw.get("headline") or ""),
            str(raw.get("text") or ""),
            tuple(Finding.of(f) for f in raw.get("findings") or [] if isinstance(f, Mapping)),
            tuple(str(u) for u in raw.get("unmeasured") or []),
            tuple(dict(s) for s in raw.get("stalls") or [] if isinstance(s, Mapping)),
        )
