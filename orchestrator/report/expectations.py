"""The lab's expectations checked against what the sweep measured: for each claim of the
experiment's ``expect`` (:class:`~orchestrator.config.schema.ExpectationSpec`), observed, not
observed (with the numbers), or not measurable here (and why)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ExpectationSpec
from orchestrator.decide.objective import fixed_points, fmt, read_at, value_of
from orchestrator.decide.trials import Point, TrialData, named

OBSERVED, NOT_OBSERVED, UNMEASURABLE = "observed", "not observed", "not measurable here"


@dataclass
class Outcome:
    claim: ExpectationSpec
    status: str
    numbers: str

    def line(self) -> str:
        return f"[{self.status}] {self.claim.claim} ({self.numbers})"


def _label(e: ExpectationSpec) -> str:
    return f"{e.metric} at {e.at}" if e.at else str(e.metric)


class _Unmeasurable(Exception):
    """The claim cannot be checked with what was measured."""


# The load points flagged INVALID that the claim being checked read a number at ("budget_256 at
# c4"): the claim is still judged, as the verdict judges such points, with a caution.
_invalid_reads: ContextVar[list[str] | None] = ContextVar("_invalid_reads", default=None)


def _flag_invalid(where: str) -> None:
    reads = _invalid_reads.get()
    if reads is not None and where not in reads:
        reads.append(where)


def _point_flagged(t: TrialData, p: Point) -> None:
    if p.metrics.get(M.INVALID, 0.0) >= 1.0:
        _flag_invalid(f"{t.name} at {p.label}")


def _trial(trials: Sequence[TrialData], name: str, every: Sequence[TrialData]) -> TrialData:
    found = named(list(trials), name)
    if len(found) > 1:
        raise _Unmeasurable(f"{len(found)} trials are {name} ({', '.join(t.name for t in found)}): the claim names one")
    if found:
        return found[0]
    other = next(iter(named(list(every), name)), None)
    if other is None:
        raise _Unmeasurable(f"{name} was not run in this sweep")
    why = f": {other.error.splitlines()[0][:200]}" if other.error else ""
    raise _Unmeasurable(f"{name} was {other.status}{why}")


def _at(t: TrialData, at: str | None) -> str | None:
    """A point label; ``lightest`` / ``heaviest``: the trial's first / last fixed point."""
    if at in ("lightest", "heaviest"):
        points = fixed_points(t)
        if not points:
            raise _Unmeasurable(f"{t.name} has no load point")
        return points[0].label if at == "lightest" else points[-1].label
    return at


def _value(t: TrialData, e: ExpectationSpec) -> float:
    """The claim's metric of ``t``; ``a / b`` is the ratio of two metrics."""
    assert e.metric is not None
    at = _at(t, e.at)
    keys = e.metric.split(" / ")
    values = []
    for key in keys:
        v = value_of(t, key, at)
        if v is None:
            raise _Unmeasurable(f"{t.name} has no {key}" + (f" at {e.at}" if e.at else ""))
        if v.where and read_at(t, v, M.INVALID):
            _flag_invalid(f"{t.name} at {v.where}")
        values.append(v.value)
    if len(values) == 2:
        if values[1] == 0:
            raise _Unmeasurable(f"{t.name}: {keys[1]} is 0")
        return values[0] / values[1]
    return values[0]


def _half(t: TrialData, e: ExpectationSpec) -> float | None:
    """The half-width of the 95% interval of the claim's metric of ``t``: between a race's runs,
    else within its one run (over the point's requests); None where neither is known (a ratio)."""
    assert e.metric is not None
    if " / " in e.metric:
        return None
    v = value_of(t, e.metric, _at(t, e.at))
    if v is None:
        return None
    if v.ci95:
        return v.ci95
    return (v.within[1] - v.within[0]) / 2 if v.within is not None else None


def _too_noisy(change: float, first: float, halves: Sequence[float | None], margin: float) -> str | None:
    """Why a claimed change of more than ``margin`` cannot be judged: the measured ``change``
    (signed in the claim's direction, relative to ``first``) has a 95% interval that holds both
    more and less than ``margin``; None when the interval is not known or rules one side out."""
    if any(h is None for h in halves):
        return None
    reach = math.sqrt(sum(h * h for h in halves if h is not None)) / max(abs(first), 1e-12)
    if change - reach < margin < change + reach:
        return (
            f"the change, {change:+.0%}, has a 95% interval of ±{reach:.0%} here: these runs cannot tell whether "
            f"it is more than the {margin:.0%} the claim needs (more runs, or a larger effect, would)"
        )
    return None


def _chosen(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> list[TrialData]:
    if e.in_ is None:
        if not finished:
            raise _Unmeasurable("no trial FINISHED")
        return list(finished)
    return [_trial(finished, n, every) for n in e.in_]


def _monotone(values: Sequence[float], trend: str, margin: float) -> bool:
    """The values move in ``trend``'s direction: end to end by more than ``margin`` (relative to
    the first), and no step goes the other way by more than ``margin`` of the largest value (a
    smaller step back is noise: a tie)."""
    if len(values) < 2:
        raise _Unmeasurable("fewer than two values to order")
    sign = 1.0 if trend == "increases" else -1.0
    first, last = values[0], values[-1]
    if sign * (last - first) / max(abs(first), 1e-12) <= margin:
        return False
    tolerance = margin * max(abs(v) for v in values)
    return all(sign * (b - a) >= -tolerance for a, b in zip(values, values[1:]))


def _pair(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    sides = e.lower if e.lower is not None else e.higher
    assert sides is not None and e.than is not None
    mine = {n: _value(_trial(finished, n, every), e) for n in sides}
    theirs = {n: _value(_trial(finished, n, every), e) for n in e.than}
    sign = -1.0 if e.lower is not None else 1.0
    changes = {(m, o): sign * (a - b) / max(abs(b), 1e-12) for m, a in mine.items() for o, b in theirs.items()}
    ok = all(c > e.margin for c in changes.values())
    op = "<" if e.lower is not None else ">"
    text = f"{_label(e)}: " + ", ".join(f"{n} {fmt(v)}" for n, v in mine.items())
    text += f" {op} " + ", ".join(f"{n} {fmt(v)}" for n, v in theirs.items())
    if not ok:
        failing = [(m, o) for (m, o), c in changes.items() if c <= e.margin]
        noisy = [
            _too_noisy(
                changes[(m, o)],
                theirs[o],
                [_half(_trial(finished, m, every), e), _half(_trial(finished, o, every), e)],
                e.margin,
            )
            for m, o in failing
        ]
        if all(noisy):
            raise _Unmeasurable(f"{text}; {noisy[0]}")
    return ok, text + (f" (by more than {e.margin:.0%})" if not ok else "")


def _along(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    assert e.along is not None and e.trend is not None
    pool = [_trial(finished, n, every) for n in e.in_] if e.in_ is not None else list(finished)
    keyed = sorted(((k, t) for t in pool if (k := t.num(e.along)) is not None), key=lambda kt: kt[0])
    if len(keyed) < 2:
        raise _Unmeasurable(f"fewer than two finished trials with {e.along} set")
    values = [_value(t, e) for _, t in keyed]
    ok = _monotone(values, e.trend, e.margin)
    text = f"{_label(e)} by {e.along}: " + ", ".join(f"{fmt(k)}: {fmt(v)}" for (k, _), v in zip(keyed, values))
    if not ok:  # end to end within the noise: not judged either way
        sign = 1.0 if e.trend == "increases" else -1.0
        change = sign * (values[-1] - values[0]) / max(abs(values[0]), 1e-12)
        noisy = _too_noisy(change, values[0], [_half(keyed[0][1], e), _half(keyed[-1][1], e)], e.margin)
        if noisy is not None:
            raise _Unmeasurable(f"{text}; {noisy}")
    return ok, text


def _across(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    assert e.metric is not None and e.across_points is not None
    parts, ok = [], True
    for t in _chosen(e, finished, every):
        points = [p for p in fixed_points(t) if e.metric in p.metrics and math.isfinite(p.metrics[e.metric])]
        if len(points) < 2:
            raise _Unmeasurable(f"{t.name} has fewer than two points with {e.metric}")
        values = [p.metrics[e.metric] for p in points]
        for p in points:
            _point_flagged(t, p)
        ok &= _monotone(values, e.across_points, e.margin)
        parts.append(f"{t.name}: " + ", ".join(f"{p.label} {fmt(v)}" for p, v in zip(points, values)))
    return ok, f"{e.metric} over the load points: " + "; ".join(parts)


def _bound(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    values = {t.name: _value(t, e) for t in _chosen(e, finished, every)}
    ok = all((e.above is None or v > e.above) and (e.below is None or v < e.below) for v in values.values())
    bound = " and ".join(
        x
        for x in (
            f"> {fmt(e.above)}" if e.above is not None else "",
            f"< {fmt(e.below)}" if e.below is not None else "",
        )
        if x
    )
    return ok, f"{_label(e)} {bound}: " + ", ".join(f"{n} {fmt(v)}" for n, v in values.items())


def _within(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    assert e.of is not None and e.within is not None
    ref = _value(_trial(finished, e.of, every), e)
    values = {t.name: _value(t, e) for t in _chosen(e, finished, every) if t.name != e.of}
    if not values:  # all() of nothing is True: "observed" with nothing compared
        raise _Unmeasurable(f"no finished trial besides {e.of} to compare with it")
    ok = all(abs(v - ref) <= e.within for v in values.values())
    return ok, f"{_label(e)} within {fmt(e.within)} of {e.of} {fmt(ref)}: " + ", ".join(
        f"{n} {fmt(v)}" for n, v in values.items()
    )


def _limiter_at(t: TrialData, at: str | None) -> Point:
    """The point a limiter claim reads in one run: at ``at``, else the run's last fixed point."""
    points = fixed_points(t)
    where = _at(t, at) if points else None
    p = next((p for p in points if p.label == where), None) if where else (points[-1] if points else None)
    if p is None or not p.limiter:
        raise _Unmeasurable(f"{t.name} has no diagnosed point{' ' + at if at else ''}")
    _point_flagged(t, p)
    return p


def _limiter(e: ExpectationSpec, finished: Sequence[TrialData], every: Sequence[TrialData]) -> tuple[bool, str]:
    """Each trial ``in`` limited by one of the causes: in more than half of its runs, where a race
    ran it more than once (its first run alone can be the odd one out)."""
    assert e.limiter is not None
    parts, ok = [], True
    for t in _chosen(e, finished, every):
        points = [_limiter_at(run, e.at) for run in [t, *t.runs]]
        hits = sum(p.limiter in e.limiter for p in points)
        ok &= hits * 2 > len(points)
        first = points[0]
        if len(points) == 1:
            said = f"{first.limiter.replace('_', ' ')} ({first.diagnosis.confidence or '?'})"
        else:
            seen = Counter(p.limiter.replace("_", " ") for p in points)
            said = ", ".join(f"{c} in {n} of {len(points)} runs" for c, n in seen.most_common())
        parts.append(f"{t.name} at {first.label}: {said}")
    want = " or ".join(c.replace("_", " ") for c in e.limiter)
    return ok, f"limited by {want}? " + "; ".join(parts)


FORMS = {
    "pair": _pair,
    "along": _along,
    "across_points": _across,
    "bound": _bound,
    "within": _within,
    "limiter": _limiter,
}


def check(expect: Sequence[ExpectationSpec], trials: Sequence[TrialData]) -> list[Outcome]:
    """Each claim against the sweep's trials (FINISHED ones are read; the others explain why not)."""
    finished = [t for t in trials if t.status == "FINISHED" and t.points]
    platforms = {name for t in trials if (name := t.param("platform.name")) is not None}
    out = []
    for e in expect:
        if e.needs == "gpu" and platforms and "gpu" not in platforms:
            out.append(Outcome(e, UNMEASURABLE, f"needs a GPU; this sweep ran on {', '.join(sorted(platforms))}"))
            continue
        reads: list[str] = []
        token = _invalid_reads.set(reads)
        try:
            ok, numbers = FORMS[e.form](e, finished, trials)
        except _Unmeasurable as exc:
            out.append(Outcome(e, UNMEASURABLE, str(exc)))
            continue
        finally:
            _invalid_reads.reset(token)
        if reads:
            numbers += f"; caution: read at load points flagged INVALID ({', '.join(reads)}): judge with care"
        out.append(Outcome(e, OBSERVED if ok else NOT_OBSERVED, numbers))
    return out


def tally(outcomes: Sequence[Outcome]) -> str:
    """``Expectations: 3 observed, 1 not observed, 1 not measurable here (of 5)``."""
    counts = [f"{sum(o.status == s for o in outcomes)} {s}" for s in (OBSERVED, NOT_OBSERVED, UNMEASURABLE)]
    return f"Expectations: {', '.join(counts)} (of {len(outcomes)})"


def section(outcomes: Sequence[Outcome]) -> list[str]:
    """``## What the lab expects`` for summary.md."""
    if not outcomes:
        return []
    return [
        "## What the lab expects",
        "",
        "The phenomena the course says this lab shows (the experiment's `expect`), checked against this sweep.",
        "",
        f"{tally(outcomes)}.",
        "",
        *(f"- {o.line()}" for o in outcomes),
        "",
    ]
