"""How sure the verdict is: the trials' runs compared with the leader's, between runs.

Each trial of a race has run ``n`` times, each run with fresh requests (the same requests for
every trial of a round). Its objective value is compared on the log scale (noise on these
metrics is multiplicative: a p99 twice as noisy when twice as large), where the spread between
runs is pooled over every trial (one noise level for the machine, each trial's runs adding to
its degrees of freedom). For each contender, the leader's advantage gets a t-interval:

* it lies above ``margin``: the leader is **better**, by more than what the user said matters
  (the contender is out; with ``margin`` 0, the plain test that excludes 0);
* it lies inside +-``margin`` (two one-sided tests): the two are **equivalent** (a tie);
* otherwise **undecided**: both run again, if the race may go on. A leader better by some
  amount that may be under the margin is undecided too: more runs tell whether it matters.

Many comparisons, many looks: every interval is at ``1 - (1 - confidence) / (m * L)``, with ``m``
contenders and ``L`` the rounds at which the race may stop (Bonferroni). By the union bound the
chance that any statement of the verdict is wrong stays under ``1 - confidence`` whenever the
race stops; conservative, and free of the bias of stopping at the first interval that looks
good. A within-run interval (bootstrap over one run's requests) never enters this: it says how
well one run was measured, not how another run would come out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy import stats

BETTER, TIE, UNDECIDED = "better", "tie", "undecided"
# the race's answer: one winner, a tie among the best, undecided, or one run each (not raced)
WIN, TIED, OPEN, ONE_RUN = "win", "tie", "undecided", "one run"


@dataclass
class Comparison:
    """The leader against one contender."""

    name: str
    outcome: str  # BETTER (the leader is), TIE, UNDECIDED
    ratio: float  # the leader's value / the contender's (geometric means), or the difference on a linear scale
    low: float  # the interval of ``ratio`` at the race's per-comparison level
    high: float
    log_scale: bool
    advantage: float = 0.0  # the leader's advantage on the compared scale (>= 0)

    def words(self, maximize: bool) -> str:
        """``by 35% (interval 12% to 64%)``: how much higher (maximize) or lower (minimize) the
        leader's value is than the contender's."""
        if not self.log_scale:
            return f"by {abs(self.ratio):.4g} (interval {self.low:.4g} to {self.high:.4g})"

        def gain(r: float) -> float:
            return r - 1.0 if maximize else 1.0 - r

        lo, hi = sorted((gain(self.low), gain(self.high)))
        return f"by {gain(self.ratio):.0%} (interval {lo:+.0%} to {hi:+.0%})"


@dataclass
class RaceState:
    """Where a race stands: the leader, each contender's comparison, the answer so far."""

    leader: str | None
    comparisons: list[Comparison] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)  # trial -> runs measured
    df: int = 0
    level: float = 0.0  # each interval's confidence (after the Bonferroni division)
    answer: str = ONE_RUN

    @property
    def undecided(self) -> list[str]:
        return [c.name for c in self.comparisons if c.outcome == UNDECIDED]

    @property
    def tied(self) -> list[str]:
        return [c.name for c in self.comparisons if c.outcome == TIE]

    def to_repeat(self) -> list[str]:
        """Who runs again: the undecided contenders and the leader (paired rounds: same requests)."""
        names = self.undecided
        return [self.leader, *names] if names and self.leader else []


def race_state(
    values: dict[str, list[float]],
    maximize: bool,
    confidence: float = 0.95,
    margin: float = 0.1,
    looks: int = 1,
) -> RaceState:
    """Compare every trial's runs (``values``: trial -> objective value of each run) with the
    leader's; ``looks``: the rounds at which the race may stop (the Bonferroni divisor)."""
    values = {k: [float(x) for x in v if math.isfinite(x)] for k, v in values.items()}
    values = {k: v for k, v in values.items() if v}
    if not values:
        return RaceState(None)
    log_scale = all(x > 0 for v in values.values() for x in v)
    y = {k: [math.log(x) if log_scale else x for x in v] for k, v in values.items()}
    sign = 1.0 if maximize else -1.0
    mean = {k: sum(v) / len(v) for k, v in y.items()}
    leader = max(mean, key=lambda k: sign * mean[k])
    state = RaceState(leader, runs={k: len(v) for k, v in y.items()})
    state.df = sum(len(v) - 1 for v in y.values())
    if len(y) == 1:
        state.answer = WIN
        return state
    if state.df == 0:
        state.answer = ONE_RUN
        return state
    sd = math.sqrt(sum((x - mean[k]) ** 2 for k, v in y.items() for x in v) / state.df)
    alpha = (1.0 - confidence) / ((len(y) - 1) * max(1, looks))
    state.level = 1.0 - alpha
    two_sided, one_sided = stats.t.ppf(1 - alpha / 2, state.df), stats.t.ppf(1 - alpha, state.df)
    scale = abs(mean[leader]) if not log_scale else 1.0
    bound = math.log1p(margin) if log_scale else margin * scale
    for k in y:
        if k == leader:
            continue
        d = sign * (mean[leader] - mean[k])  # >= 0: the leader's advantage
        se = sd * math.sqrt(1 / len(y[leader]) + 1 / len(y[k]))
        lo, hi = d - two_sided * se, d + two_sided * se
        if se == 0.0:  # runs that never vary: the data are exact
            outcome = TIE if d <= bound else BETTER
        elif lo > bound:
            outcome = BETTER
        elif d + one_sided * se < bound and d - one_sided * se > -bound:
            outcome = TIE
        else:
            outcome = UNDECIDED
        back = (lambda v: math.exp(sign * v)) if log_scale else (lambda v: v)
        low, high = sorted((back(lo), back(hi)))
        state.comparisons.append(Comparison(k, outcome, back(d), low, high, log_scale, d))
    state.answer = OPEN if state.undecided else TIED if state.tied else WIN
    return state
