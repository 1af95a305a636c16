"""The SLO capacity search inside a trial: probes chosen one after the other, each from the
verdicts of the ones before (:mod:`orchestrator.loadgen.capacity` holds the search itself)."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from orchestrator.config.logs import Progress
from orchestrator.config.schema import CapacitySpec, LoadPointSpec
from orchestrator.loadgen.capacity import CapacitySearch, judge
from orchestrator.metrics.result import PointResult

UNITS = {"rate": "req/s", "concurrency": "streams"}
# Read at the probe that sets the capacity: the cost and energy of a token at the SLO's limit.
AT_CAPACITY = ("cost_per_mtok_output", "cost_per_mtok_total", "joules_per_output_token", "output_tokens_per_joule")

Schedule = Generator[LoadPointSpec, PointResult | None, bool]
"""Load points to run; each is sent its result (None: not measured). Returns whether it ran to its end."""


def unmeasured(result: PointResult | None) -> bool:
    """A point that ends a schedule: not measured, or its servers failed."""
    return result is None or bool(result.metrics.get("server_failed"))


class CapacityProbes:
    """The probes of one search, fed their results; ``outcome`` says what was found."""

    def __init__(self, cap: CapacitySpec, classes: list[str], say: Progress) -> None:
        self.cap, self.classes, self.say = cap, classes, say
        self.search = CapacitySearch(
            start=cap.start,
            low=cap.lowest,
            high=cap.high,
            growth=cap.growth,
            precision=cap.precision,
            max_probes=cap.max_probes,
            integer=cap.knob == "concurrency",
        )
        self.measured: dict[str, PointResult] = {}  # each probe's result, by label

    def probes(self) -> Schedule:
        """Yield the next probe until the search has its answer (or its time budget is spent);
        a probe whose server failed ends it early (returns False)."""
        cap, search = self.cap, self.search
        t0 = time.monotonic()
        while True:
            out_of_time = cap.time_budget_s is not None and time.monotonic() - t0 >= cap.time_budget_s
            value = search.next_value(out_of_time)
            if value is None:
                break
            p = yield cap.probe(value)
            if p is None or unmeasured(p):
                return False
            per_class = p.class_metrics or {self.classes[0]: p.metrics}  # one class: its metrics are the point's
            verdict = judge(p.metrics, per_class, cap.slo, cap.knob, cap.min_goodput_fraction, cap.min_sustained)
            search.observe(value, p.label, verdict)
            self.measured[p.label] = p
            p.metrics["slo_met"] = 1.0 if verdict.verdict == "pass" else 0.0
            self.say(
                f"probe {p.label}: "
                + (
                    "SLOs met"
                    if verdict.verdict == "pass"
                    else f"{'not counted' if verdict.verdict == 'invalid' else 'SLOs missed'}: "
                    + "; ".join(verdict.reasons)
                )
            )
        self.say(f"SLO capacity: {search.explanation(UNITS[cap.knob])}")
        return True

    def outcome(self) -> tuple[dict[str, float], dict[str, Any]]:
        """The search's metrics (``slo_capacity_rps`` or ``slo_capacity_concurrency``, bracket,
        probes) and its account (every probe's verdict and reasons, why it stopped)."""
        cap, search = self.cap, self.search
        if not search.probes:
            return {}, {}
        name = "slo_capacity_rps" if cap.knob == "rate" else "slo_capacity_concurrency"
        metrics = {name if k == "capacity" else k.replace("capacity", name): v for k, v in search.summary().items()}
        at = self.measured.get(search.best_pass.label) if search.best_pass else None
        if at is not None:  # what a token costs, in energy and money, at the capacity
            for key in AT_CAPACITY:
                if key in at.metrics:
                    metrics[f"slo_capacity_{key}"] = at.metrics[key]
        account = {
            "knob": cap.knob,
            "metric": name,
            "slo": dict(cap.slo),
            "explanation": search.explanation(UNITS[cap.knob]),
            "stop_reason": search.stop_reason,
            "probes": [
                {
                    "label": p.label,
                    "value": p.value,
                    "verdict": p.judgement.verdict,
                    "reasons": list(p.judgement.reasons),
                }
                for p in search.probes
            ],
        }
        return metrics, account
