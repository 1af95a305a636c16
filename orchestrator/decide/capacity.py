"""SLO capacity: the highest load at which a trial's SLOs hold, found by probing its server.

Pure logic, no I/O: :class:`CapacitySearch` proposes the next probe (a request rate or a
concurrency), the caller runs it as an ordinary load point and reports its verdict from
:func:`judge`. The search brackets (from ``start``, multiplying by ``growth`` while the SLOs
hold, dividing while they do not), then bisects the bracket until it is narrower than
``precision`` (relative), or ``max_probes`` or the time budget are spent.

A probe the client could not drive (the point is flagged invalid) decides nothing: the
search stops there and says so, in the point's own reasons, rather than call the server's
limit what was the client's. A probe whose SLO metric is too close to its limit to tell from
one run (its interval within the run straddles the limit) is run again before it decides
(:class:`orchestrator.trial.capacity_probes.CapacityProbes`); the search sees only decided probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import CapacitySpec

Verdict = Literal["pass", "fail", "invalid"]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reasons: tuple[str, ...] = ()
    note: str = ""  # how it was decided, when not from one run's numbers alone


def metric_of(metrics: dict[str, float], class_metrics: dict[str, dict[str, float]], key: str) -> float | None:
    """A point's metric by name; ``<class>/<metric>`` reads a request class's metric."""
    if "/" in key:
        cls, name = key.split("/", 1)
        value = class_metrics.get(cls, {}).get(name)
    else:
        value = metrics.get(key)
    return None if value is None or not math.isfinite(value) else float(value)


def judge(
    metrics: dict[str, float],
    class_metrics: dict[str, dict[str, float]],
    slo: dict[str, float],
    knob: str,
    min_goodput_fraction: float | None = None,
    min_sustained: float = 0.9,
) -> Judgement:
    """Did a probe meet every SLO (``slo``: metric -> highest allowed value)?

    ``fail`` also when requests failed, when goodput fell below ``min_goodput_fraction`` of
    the completed rate, or (rate probes) when the server completed requests slower than the
    schedule offered them (``qps < min_sustained x schedule_rate``: a growing queue).
    ``invalid`` when the probe measured something else than the server at this load (the
    client could not drive it, the server got another workload, the machine was shared):
    such a probe must not decide."""
    if (invalid := invalid_reason(metrics)) is not None:
        return Judgement("invalid", (invalid,))
    reasons = slo_misses(metrics, class_metrics, slo) + load_misses(metrics, knob, min_goodput_fraction, min_sustained)
    return Judgement("fail" if reasons else "pass", tuple(reasons))


def invalid_reason(metrics: dict[str, float]) -> str | None:
    """Why a probe measured something else than the server at its load (None: it did not)."""
    if metrics.get(M.WORKLOAD_INVALID):
        return "the server got another workload than planned"
    if metrics.get(M.MACHINE_INVALID):
        return "the machine was shared: processes outside the trial took its CPU"
    if metrics.get(M.INVALID):
        return "the client could not drive this load"
    return None


def slo_misses(
    metrics: dict[str, float], class_metrics: dict[str, dict[str, float]], slo: dict[str, float]
) -> list[str]:
    """The SLO metrics above their limit (or not measured), in words."""
    reasons = []
    for key, limit in slo.items():
        value = metric_of(metrics, class_metrics, key)
        if value is None:
            reasons.append(f"{key} not measured")
        elif value > limit:
            reasons.append(f"{key} {value:.4g} > {limit:g}")
    return reasons


def load_misses(
    metrics: dict[str, float], knob: str, min_goodput_fraction: float | None = None, min_sustained: float = 0.9
) -> list[str]:
    """What else fails a probe: failed requests, too little goodput, a rate the server did not sustain."""
    reasons = []
    if metrics.get(M.ERRORS):
        reasons.append(f"{int(metrics[M.ERRORS])} request(s) failed")
    qps = metrics.get(M.QPS, 0.0)
    if min_goodput_fraction is not None and qps > 0 and metrics.get(M.GOODPUT, 0.0) < min_goodput_fraction * qps:
        reasons.append(f"goodput {metrics.get(M.GOODPUT, 0.0):.3g} < {min_goodput_fraction:g} x {qps:.3g} req/s")
    schedule = metrics.get(M.SCHEDULE_RATE)
    if knob == "rate" and schedule and qps < min_sustained * schedule:
        reasons.append(f"saturated: completed {qps:.3g} req/s of {schedule:.3g} offered")
    return reasons


def goodput_counts(metrics: dict[str, float]) -> tuple[float, float]:
    """(requests that met the workload's SLOs, completed requests) of one run of a probe."""
    return metrics.get(M.GOODPUT, 0.0) * metrics.get(M.DURATION_S, 0.0), metrics.get(M.COMPLETED, 0.0)


def share_interval(good: float, total: float, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (95% at ``z`` 1.96) of the share ``good / total``, over requests;
    None without requests. Unlike the share +- z standard errors it stays within 0..1 and keeps its
    level at shares near 0 or 1, where goodput floors are set (0.9, 0.99)."""
    if total <= 0:
        return None
    p = good / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z / (1 + z * z / total) * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def goodput_miss(good: float, completed: float, min_goodput_fraction: float | None) -> str | None:
    """Too little goodput: the requests that met the SLOs, a share of the completed ones, below
    ``min_goodput_fraction`` (None: met, or no floor set)."""
    if min_goodput_fraction is None or completed <= 0 or good >= min_goodput_fraction * completed:
        return None
    return f"goodput share {good / completed:.3g} < {min_goodput_fraction:g} ({good:.0f} of {completed:.0f} requests)"


@dataclass
class Probe:
    value: float
    label: str
    judgement: Judgement
    runs: int = 1  # runs of the probe its judgement stands on


@dataclass
class CapacitySearch:
    """Bracket, then bisect. ``integer`` (concurrency) probes whole numbers only."""

    start: float
    low: float
    high: float
    growth: float = 2.0
    precision: float = 0.1
    max_probes: int = 8
    integer: bool = False
    probes: list[Probe] = field(default_factory=list)
    stop_reason: str | None = None

    @classmethod
    def of(cls, cap: CapacitySpec) -> CapacitySearch:
        """The search ``capacity:`` asks for (whole numbers when the knob is concurrency)."""
        return cls(
            cap.start, cap.lowest, cap.high, cap.growth, cap.precision, cap.max_probes, cap.knob == "concurrency"
        )

    def _snap(self, v: float) -> float:
        return float(max(1, round(v))) if self.integer else v

    @property
    def best_pass(self) -> Probe | None:
        ok = [p for p in self.probes if p.judgement.verdict == "pass"]
        return max(ok, key=lambda p: p.value) if ok else None

    @property
    def lowest_fail(self) -> Probe | None:
        bad = [p for p in self.probes if p.judgement.verdict == "fail"]
        return min(bad, key=lambda p: p.value) if bad else None

    def next_value(self, out_of_time: bool = False) -> float | None:
        """The next probe, or None when the search is over (``stop_reason`` says why)."""
        if self.stop_reason:
            return None
        if self.probes and self.probes[-1].judgement.verdict == "invalid":
            last = self.probes[-1]
            why = "; ".join(last.judgement.reasons) or "it was INVALID"
            return self._stop(f"probe {last.label} decides nothing ({why}), so the search stops there")
        if len(self.probes) >= self.max_probes:
            return self._stop(f"{self.max_probes} probes spent")
        if out_of_time:
            return self._stop("time budget spent")
        if not self.probes:
            return self._snap(self.start)
        ok, bad = self.best_pass, self.lowest_fail
        if ok is not None and bad is not None and ok.value < bad.value:
            if (bad.value - ok.value) / bad.value <= self.precision or (self.integer and bad.value - ok.value <= 1):
                return self._stop(f"bracket {ok.value:g}..{bad.value:g} within {self.precision:.0%}")
            mid = math.sqrt(ok.value * bad.value) if bad.value > 2 * ok.value else (ok.value + bad.value) / 2
            mid = float(math.floor(mid)) if self.integer else mid
            if mid in (ok.value, bad.value):
                return self._stop(f"bracket {ok.value:g}..{bad.value:g} cannot be split further")
            return mid
        if bad is None:  # every probe passed so far: go up
            assert ok is not None
            if ok.value >= self.high:
                return self._stop(f"the SLOs hold at the highest load searched ({self.high:g})")
            return self._snap(min(ok.value * self.growth, self.high))
        # every probe failed so far: go down
        if bad.value <= self.low:
            return self._stop(f"the SLOs fail even at the lowest load searched ({self.low:g})")
        return self._snap(max(bad.value / self.growth, self.low))

    def _stop(self, reason: str) -> float | None:
        """End the search with ``reason``; None, for ``next_value`` to return."""
        self.stop_reason = reason
        return None

    def observe(self, value: float, label: str, judgement: Judgement, runs: int = 1) -> None:
        self.probes.append(Probe(value, label, judgement, runs))

    @property
    def decided(self) -> bool:
        """Whether any probe passed or failed: a search whose every probe was INVALID (a shared
        machine, a client that could not drive the load) measured no capacity, not capacity 0."""
        return any(p.judgement.verdict != "invalid" for p in self.probes)

    def summary(self) -> dict[str, float]:
        """``capacity`` (0 when nothing passed), the bracket, probes run, and whether the
        capacity is only a lower bound (``capacity_censored``: every probe passed). When no probe
        decided anything: only the probes and runs, and ``capacity_undecided`` 1 (no capacity
        is logged, so a comparison never reads such a trial as one that holds no load)."""
        ok, bad = self.best_pass, self.lowest_fail
        counts = {
            "capacity_probes": float(len(self.probes)),
            "capacity_runs": float(sum(p.runs for p in self.probes)),
        }
        if not self.decided:
            return {**counts, "capacity_undecided": 1.0}
        out = {
            "capacity": ok.value if ok else 0.0,
            **counts,
            "capacity_lo": ok.value if ok else 0.0,
            "capacity_undecided": 0.0,
        }
        if bad is not None:
            out["capacity_hi"] = bad.value
        out["capacity_censored"] = float(ok is not None and bad is None)
        return out

    def explanation(self, unit: str) -> str:
        ok, bad = self.best_pass, self.lowest_fail
        if self.probes and not self.decided:
            head = "capacity not measured: no probe decided anything"
        elif ok is None:
            where = (
                f"no probe met the SLOs (lowest tried {min(p.value for p in self.probes):g} {unit})"
                if self.probes
                else "no probe ran"
            )
            head = f"capacity 0 {unit}: {where}"
        elif bad is None:
            head = f"capacity >= {ok.value:g} {unit} (probe {ok.label}): every probe met the SLOs"
        else:
            why = "; ".join(bad.judgement.reasons)
            head = (
                f"capacity {ok.value:g} {unit} (probe {ok.label} met the SLOs; "
                f"probe {bad.label} at {bad.value:g} did not: {why})"
            )
        return f"{head}; stopped: {self.stop_reason or 'not finished'}"
