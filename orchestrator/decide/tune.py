"""The tuner's decisions, pure: what limited the incumbent (:func:`causes_of`), whether a step's
race adopts a candidate (:func:`judge_step`), and the path in words (:func:`path_lines`).

The loop that runs the steps is :mod:`orchestrator.scheduling.tuning`: diagnose the incumbent at
the objective's point, propose the levers of its limiter (then of its other findings), race the
candidates beside the incumbent, adopt the leader only when the race says it beats the incumbent
with the verdict's confidence, else try the next levers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.race import BETTER, UNDECIDED, Comparison, RaceState
from orchestrator.decide.trials import Point


@dataclass(frozen=True)
class Cause:
    """A cause the tuner acts on, as the incumbent's diagnosis states it."""

    cause: str
    confidence: str
    detail: str
    evidence: dict[str, float] = field(default_factory=dict)

    def words(self) -> str:
        text = f"{self.cause.replace('_', ' ')} ({self.confidence}"
        return text + (f": {self.detail})" if self.detail else ")")


def causes_of(point: Point) -> list[Cause]:
    """The causes to act on, in order: the diagnosis's limiter, then its other findings (prefix
    reuse missed among them). ``none`` and causes outside the server (client, shared machine)
    are left out."""
    findings = point.diagnosis.get("findings") or []
    out: list[Cause] = []
    limiter = point.limiter
    ordered = sorted(findings, key=lambda f: f.get("cause") != limiter)
    for f in ordered:
        cause = str(f.get("cause", ""))
        if cause in ("", "none", "client", "shared_machine") or any(c.cause == cause for c in out):
            continue
        evidence = {str(k): float(v) for k, v in (f.get("evidence") or {}).items() if isinstance(v, (int, float))}
        out.append(Cause(cause, str(f.get("confidence", "")), str(f.get("detail", "")), evidence))
    return out


@dataclass
class StepOutcome:
    """What a step's race said of its candidates against the incumbent."""

    adopted: str | None  # the candidate adopted, None: the incumbent stays
    comparison: Comparison | None  # the adopted candidate (or the best one) against the incumbent
    words: str
    led_undecided: str | None = None  # a candidate that led the race, undecided against the incumbent


def judge_step(state: RaceState | None, incumbent: str, key: str = "") -> StepOutcome:
    """Adopt the race's leader when it is a candidate that beats the incumbent (the leader is
    *better* than it, with the race's confidence); a tie or an undecided race keeps the incumbent."""
    if state is None or state.leader is None:
        return StepOutcome(None, None, "nothing to compare (no candidate finished and met the constraints)")
    if state.leader == incumbent:
        best = _closest(state)
        if best is None:
            return StepOutcome(None, None, "the incumbent stays (no candidate was compared)")
        words = _against_incumbent(best, key, inverted=True)
        return StepOutcome(None, best, f"the incumbent stays: {best.name} {words}, {_said(best)}")
    c = next((c for c in state.comparisons if c.name == incumbent), None)
    if c is None:
        return StepOutcome(None, None, f"{state.leader} leads, but the incumbent was not compared (it did not finish)")
    words = _against_incumbent(c, key)
    if c.outcome == BETTER:
        return StepOutcome(state.leader, c, f"{state.leader} adopted: {words}")
    led = state.leader if c.outcome == UNDECIDED else None
    return StepOutcome(None, c, f"the incumbent stays: {state.leader} {words}, {_said(c)}", led)


def _closest(state: RaceState) -> Comparison | None:
    """The incumbent's nearest rival (the comparison with the smallest advantage)."""
    return min(state.comparisons, key=lambda c: c.advantage, default=None)


def _said(c: Comparison) -> str:
    return {"tie": "a tie within the margin", "undecided": "undecided"}.get(c.outcome, "worse")


def gain(c: Comparison, inverted: bool = False) -> tuple[float, float, float]:
    """The change of the objective from the incumbent to the candidate, with its interval: on the
    log scale a relative change (+0.61: 61% higher, -0.38: 38% lower), on a linear scale the
    difference. The comparison is the leader against the other (:class:`Comparison`);
    ``inverted``: the leader is the incumbent."""
    if not c.log_scale:
        sign = -1.0 if inverted else 1.0
        lo, hi = sorted((sign * c.low, sign * c.high))
        return sign * c.ratio, lo, hi

    def change(r: float) -> float:
        return (1.0 / r if inverted else r) - 1.0

    lo, hi = sorted((change(c.low), change(c.high)))
    return change(c.ratio), lo, hi


def change_words(mid: float, lo: float, hi: float, log_scale: bool) -> str:
    """``+61% [+48%, +74%]``, or a linear scale's difference."""
    if not log_scale:
        return f"{mid:+.4g} [{lo:+.4g}, {hi:+.4g}]"
    return f"{mid:+.0%} [{lo:+.0%}, {hi:+.0%}]"


def _against_incumbent(c: Comparison, key: str, inverted: bool = False) -> str:
    """``tokens_per_second +61% [+48%, +74%]`` (the key left out when empty)."""
    change = change_words(*gain(c, inverted), c.log_scale)
    return f"{key} {change}" if key else change


@dataclass
class Step:
    """One step of the path: the incumbent's diagnosis, the levers tried, the race's decision."""

    index: int
    incumbent: str
    headline: str  # the incumbent's diagnosis at the objective's point
    causes: list[str]
    tried: list[dict[str, Any]] = field(default_factory=list)  # {cause, lever, name, change}
    passed_over: list[dict[str, str]] = field(default_factory=list)  # {cause, lever, why}
    decision: str = ""
    adopted: str | None = None
    adopted_knobs: dict[str, Any] | None = None  # the adopted configuration's knobs over the baseline's
    gain: tuple[float, float, float] | None = None  # of the adopted candidate, against the incumbent
    log_scale: bool = True
    values: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, 95% half-width)
    unjudged: list[str] = field(default_factory=list)  # what the incumbent's diagnosis could not measure
    passed_undecided: bool = False  # a lever was passed over whose race (a second look included) was undecided
    trials: int = 0  # trial runs of the tuning so far, this step's included (a race's repeats count)

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.index,
            "incumbent": self.incumbent,
            "limited_by": self.headline,
            "causes": self.causes,
            "tried": self.tried,
            "passed_over": self.passed_over,
            "decision": self.decision,
            "adopted": self.adopted,
            "adopted_knobs": self.adopted_knobs,
            "gain": list(self.gain) if self.gain else None,
            "values": {k: list(v) for k, v in self.values.items()},
            "not_judged": self.unjudged,
            "trials": self.trials,
        }


def undecided_hint(step: Step) -> str:
    """Where a lever was passed over because its race was undecided, what would decide it."""
    if not step.passed_undecided:
        return ""
    return (
        " (a lever tried before was undecided, not worse: objective.max_repeats=auto lets a step's race run "
        "the repeats its noise asks for)"
    )


def path_lines(steps: list[Step], objective: ObjectiveSpec) -> list[str]:
    """The path, a line a step: ``step 1: baseline limited by batch slots (strong: ...) ->
    max_num_seqs 1 -> 2: tokens_per_second +61% [+48%, +74%]``."""
    out = []
    for s in steps:
        head = f"step {s.index}: {s.incumbent} {s.headline}"
        if not s.tried:
            out.append(f"{head} -> {s.decision or 'no lever left to try'}")
            continue
        tried = "; ".join(f"{t['cause'].replace('_', ' ')}: {t['lever']}, {t['change']}" for t in s.tried)
        out.append(f"{head} -> {tried}: {s.decision}")
    return out
