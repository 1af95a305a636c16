"""The SLO capacity search inside a trial: probes chosen one after the other, each from the
verdicts of the ones before (:mod:`orchestrator.decide.capacity` holds the search itself).

A probe decides the bracket only when it can: one whose SLO metric's 95% interval within the
run (:mod:`orchestrator.metrics.within_run`) straddles its limit, or whose share of requests
meeting the SLOs has a 95% interval (Wilson) holding ``min_goodput_fraction``, is indeterminate and runs
again at the same load with fresh requests, up to ``capacity.runs`` runs, judged on the
requests of all its runs together; still straddling after the last run, it is decided by the
pooled estimate and says so. A run the client could not drive (or that measured another
workload, or a shared machine) decides nothing, in the point's own reasons."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import AT_CAPACITY, M
from orchestrator.config.schema import CapacitySpec, LoadPointSpec
from orchestrator.decide.capacity import (
    CapacitySearch,
    Judgement,
    goodput_counts,
    goodput_miss,
    invalid_reason,
    load_misses,
    metric_of,
    share_interval,
    slo_misses,
)
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult
from orchestrator.metrics.summary import latency_metrics, latency_of, summarize_by_class
from orchestrator.metrics.within_run import HIGH, LEAST, LOW, within_run

UNITS = {"rate": "req/s", "concurrency": "streams"}


def unmeasured(result: PointResult) -> bool:
    """A point that ends a trial's schedule: its servers failed."""
    return bool(result.metrics.get(M.SERVER_FAILED))


def _value_of(runs: list[tuple[PointResult, list[RequestRecord]]], knob: str) -> float:
    """The load (req/s or streams) the runs of one probe were sent at."""
    return float(runs[0][0].setting[knob])


class CapacityProbes:
    """The probes of one search: the trial asks for the :meth:`next` one and tells the search
    what it measured (:meth:`observe`); ``outcome`` says what was found."""

    def __init__(self, cap: CapacitySpec, classes: list[str], say: Progress) -> None:
        self.cap, self.classes, self.say = cap, classes, say
        self.search = CapacitySearch.of(cap)
        self.measured: dict[str, PointResult] = {}  # each run's result, by label
        self._t0: float | None = None
        self._value: float | None = None  # the probe asked for and not yet observed
        self._runs: list[tuple[PointResult, list[RequestRecord]]] = []  # an indeterminate probe's runs so far

    def next(self) -> tuple[LoadPointSpec, str] | None:
        """The next probe and its label (``c4``; its second run ``c4#2``), or None when the search
        has its answer (or its time budget is spent)."""
        cap = self.cap
        if self._t0 is None:
            self._t0 = time.monotonic()
        out_of_time = cap.time_budget_s is not None and time.monotonic() - self._t0 >= cap.time_budget_s
        if self._runs and out_of_time:  # an indeterminate probe decides on the runs it has
            judgement = self._judge(final=True)
            assert judgement is not None
            self._decide(judgement)
        value = _value_of(self._runs, cap.knob) if self._runs else self.search.next_value(out_of_time)
        if value is None:
            self.say(f"SLO capacity: {self.search.explanation(UNITS[cap.knob])}")
            return None
        self._value = value
        point = cap.probe(value)
        return point, point.label + (f"#{len(self._runs) + 1}" if self._runs else "")

    def observe(self, p: PointResult, records: list[RequestRecord]) -> None:
        """The measured result of the run :meth:`next` gave (``records``: its requests)."""
        value, self._value = self._value, None
        assert value is not None, "observe() without next()"
        self.measured[p.label] = p
        if (why := invalid_reason(p.metrics)) is not None:
            earlier, self._runs = self._runs, [(p, records)]
            reasons = tuple(p.invalid_reasons) or (why,)
            note = f"{len(earlier)} earlier run(s) of it were indeterminate" if earlier else ""
            self._decide(Judgement("invalid", reasons, note))
            return
        self._runs.append((p, records))
        judgement = self._judge(final=len(self._runs) >= self.cap.runs)
        if judgement is None:
            return
        self._decide(judgement)

    def _judge(self, final: bool) -> Judgement | None:
        """The probe's judgement on the requests of all its runs; None while it is indeterminate
        and not ``final``."""
        cap, runs = self.cap, self._runs
        last = runs[-1][0]
        pooled = [r for _, rs in runs for r in rs]
        if len(runs) == 1:
            metrics, per_class = last.metrics, last.class_metrics or {self.classes[0]: last.metrics}
        else:
            metrics = latency_metrics([x for x in (latency_of(r) for r in pooled) if x is not None])
            per_class = summarize_by_class(pooled) if len(self.classes) > 1 else {self.classes[0]: metrics}
        misses = slo_misses(metrics, per_class, cap.slo)
        # failed requests and an unsustained rate fail the probe in any run; goodput is judged on
        # the requests of all its runs, as the latencies are
        load = list(
            dict.fromkeys(m for p, _ in runs for m in load_misses(p.metrics, cap.knob, None, cap.min_sustained))
        )
        good, completed = (sum(x) for x in zip(*(goodput_counts(p.metrics) for p, _ in runs), strict=True))
        if (miss := goodput_miss(good, completed, cap.min_goodput_fraction)) is not None:
            misses.append(miss)
        close = [] if load else self._straddling(pooled, metrics, per_class) + self._goodput_close(good, completed)
        n = len(runs)
        if close and not final:
            self.say(f"probe {last.label}: indeterminate ({'; '.join(close)}): runs again with fresh requests")
            return None
        over = f" over {n} runs' requests" if n > 1 else ""
        note = (
            f"still too close to tell after {n} run(s) ({'; '.join(close)}): decided by the estimate{over}"
            if close
            else ""
        )
        if not note and n > 1:
            note = f"decided{over}"
        return Judgement("fail" if misses or load else "pass", tuple(misses + load), note)

    def _straddling(
        self, pooled: list[RequestRecord], metrics: dict[str, float], per_class: dict[str, dict[str, float]]
    ) -> list[str]:
        """The SLO metrics whose 95% interval within the runs' requests (``pooled``) holds their
        limit, in words."""
        bounds = within_run(pooled, self.cap.slo)
        out = []
        for key, limit in self.cap.slo.items():
            lo, hi = bounds.get(key + LOW), bounds.get(key + HIGH)
            if lo is not None and hi is not None and lo <= limit <= hi:
                value = metric_of(metrics, per_class, key)
                shown = f" {value:.4g}" if value is not None else ""
                out.append(f"{key}{shown}, 95% within-run interval {lo:.4g}..{hi:.4g} holds its limit {limit:g}")
        return out

    def _goodput_close(self, good: float, completed: float) -> list[str]:
        """The goodput floor, in words, when the 95% interval of the share of requests that met the
        SLOs (Wilson, over the runs' requests) holds it; fewer than ``LEAST`` requests give no
        interval (as for the latencies: the probe decides at once)."""
        floor = self.cap.min_goodput_fraction
        interval = share_interval(good, completed) if floor is not None and completed >= LEAST else None
        if floor is None or interval is None or not interval[0] <= floor <= interval[1]:
            return []
        lo, hi = interval
        share = good / completed
        return [
            f"goodput share {share:.3g}, 95% interval {lo:.3g}..{hi:.3g} over {completed:.0f} requests holds {floor:g}"
        ]

    def _decide(self, judgement: Judgement) -> None:
        """Tell the search the probe's verdict; mark each of its runs."""
        runs, self._runs = self._runs, []
        last = runs[-1][0]
        self.search.observe(_value_of(runs, self.cap.knob), last.label, judgement, len(runs))
        for p, _ in runs:
            p.metrics[M.SLO_MET] = 1.0 if judgement.verdict == "pass" else 0.0
        if judgement.verdict == "pass":
            said = "SLOs met"
        else:
            said = f"{'not counted' if judgement.verdict == 'invalid' else 'SLOs missed'}: " + "; ".join(
                judgement.reasons
            )
        self.say(f"probe {last.label}: {said}" + (f" ({judgement.note})" if judgement.note else ""))

    def outcome(self) -> tuple[dict[str, float], dict[str, Any]]:
        """The search's metrics (``slo_capacity_rps`` or ``slo_capacity_concurrency``, bracket,
        probes, runs) and its account (every probe's verdict, reasons and runs, why it stopped)."""
        cap, search = self.cap, self.search
        if not search.probes:
            return {}, {}
        name = M.SLO_CAPACITY_RPS if cap.knob == "rate" else M.SLO_CAPACITY_CONCURRENCY
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
                    "runs": p.runs,
                    **({"note": p.judgement.note} if p.judgement.note else {}),
                }
                for p in search.probes
            ],
        }
        return metrics, account
