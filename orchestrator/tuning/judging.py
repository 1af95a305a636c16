"""Whether a step's race adopts a candidate, pure: the race over the step's configurations
(:func:`judge_race`), read for the incumbent (:func:`judge_step`: a candidate that beats it with
the race's confidence is adopted; a tie, an undecided race or a leading incumbent keeps it), and
the change it measured in words (:func:`gain`, :func:`change_words`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.objective import value_of
from orchestrator.decide.race import Comparison, Outcome, RaceState
from orchestrator.decide.trials import TrialData
from orchestrator.decide.verdict import decide, race_over


@dataclass(frozen=True)
class StepOutcome:
    """What a step's race said of its candidates against the incumbent."""

    adopted: str | None  # the candidate adopted, None: the incumbent stays
    comparison: Comparison | None  # the adopted candidate (or the best one) against the incumbent
    words: str
    led_undecided: str | None = None  # a candidate that led the race, undecided against the incumbent

    @property
    def undecided(self) -> bool:
        """The race left the incumbent against the candidate it compared undecided."""
        return self.comparison is not None and self.comparison.outcome == Outcome.UNDECIDED


@dataclass(frozen=True)
class Judged:
    """A step's race, judged: the outcome, the race's standing (None: fewer than two configurations
    met the constraints), each configuration's value (mean, 95% half-width) and the ones out of
    the race with why."""

    outcome: StepOutcome
    state: RaceState | None
    values: dict[str, tuple[float, float]]
    out_of_race: list[str]

    @property
    def decision(self) -> str:
        """The step's decision in words."""
        out = f" (out of the race: {'; '.join(self.out_of_race)})" if self.out_of_race else ""
        return self.outcome.words + out


def judge_race(named: Mapping[str, TrialData], incumbent: str, objective: ObjectiveSpec) -> Judged:
    """The step's race over its configurations (``named``: each one's trial, its runs folded in),
    read for ``incumbent``."""
    values: dict[str, tuple[float, float]] = {}
    for name, t in named.items():
        v = value_of(t, objective.key, objective.at) if t.status == "FINISHED" else None
        if v is not None:
            values[name] = (v.value, v.ci95 or 0.0)
    verdict = decide(list(named.values()), objective)
    out_of_race = [f"{t.name}: {why}" for t, why in verdict.excluded]
    state = race_over(verdict.feasible, objective) if len(verdict.feasible) >= 2 else None
    return Judged(judge_step(state, incumbent, objective.key), state, values, out_of_race)


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
        return StepOutcome(None, best, f"the incumbent stays: {best.name} {words}, {SAID[best.outcome]}")
    c = next((c for c in state.comparisons if c.name == incumbent), None)
    if c is None:
        return StepOutcome(None, None, f"{state.leader} leads, but the incumbent was not compared (it did not finish)")
    words = _against_incumbent(c, key)
    if c.outcome == Outcome.BETTER:
        return StepOutcome(state.leader, c, f"{state.leader} adopted: {words}")
    led = state.leader if c.outcome == Outcome.UNDECIDED else None
    return StepOutcome(None, c, f"the incumbent stays: {state.leader} {words}, {SAID[c.outcome]}", led)


# a comparison's outcome in a step's words: a leading incumbent is "better" than the candidate
SAID = {Outcome.TIE: "a tie within the margin", Outcome.UNDECIDED: "undecided", Outcome.BETTER: "worse"}


def _closest(state: RaceState) -> Comparison | None:
    """The incumbent's nearest rival (the comparison with the smallest advantage)."""
    return min(state.comparisons, key=lambda c: c.advantage, default=None)


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
