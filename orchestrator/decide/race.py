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

Many comparisons, many looks: the race looks at a few rounds only (:func:`interim_looks`: when
the leader has run 2, 3, 5, 8, 12, 18, 27, 41 times, each about 1.5 times the one before) and
at its last, and the error it may commit, ``1 - confidence``, is spent over them
(:func:`look_share`): by the interim look at ``n`` runs a share ``((n - 1) / (R - 1))^2`` of it
(Lan and DeMets' power family, rho 2: little early, most at the end), ``R`` the runs at most
(``max_repeats``; with ``auto`` the most it may plan); the race's last look, where it stops
without a decision (its plan's length, the cap, the budget), spends all that is left. The share
of each look is then divided over the ``m`` contenders (Bonferroni). The amounts add up to
``alpha``, so by the union bound the chance that any statement of the verdict is wrong stays
under ``1 - confidence`` wherever the race stops: free of the bias of stopping at the first
interval that looks good. Few looks keep most of the error for the last one, where ties are
told (a look at every round, as before, left the last of 29 a tenth of it); a large difference
is still told at an interim look.

A within-run interval (bootstrap over one run's requests) never enters this: it says how well
one run was measured, not how another run would come out.

When the race ends undecided, :func:`runs_needed` says how many runs each would have told the
leader and a contender apart (or tied them) at the noise measured between runs.

``objective.max_repeats: auto`` (the default) plans the race's length after the pilot's third
run, and again at every later interim look (:func:`planned_runs`): from the spread between runs
alone, never from the differences seen (an internal pilot, Wittes and Brittain 1990:
re-estimating the size from the variance leaves the error rate as planned), the runs each that
would tie two equal trials with 99% power, within what the budget affords (a later plan may
lengthen the race, never shorten it). The plan only says where the race's last look falls; the
interim looks' shares do not depend on it, so the verdict rebuilt from the runs alone (from
MLflow) spends the error as the race did.

Rounds are blocks (:func:`blocked_fit`): the trials of a round run the same requests, back to
back, on one server start when they share one, so what a round shares cancels in each
comparison (a paired comparison) once enough rounds were run for it to pay.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from scipy import stats

from orchestrator.config.metric_keys import is_knob
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.looks import PAIRED_MIN_DF, look_share, reach, runs_needed, t_upper


class Outcome(StrEnum):
    """What one comparison says of the leader against a contender."""

    BETTER = "better"  # the leader is better, by more than the margin
    TIE = "tie"  # the two are equivalent within the margin
    UNDECIDED = "undecided"  # neither yet: more runs would tell


class Answer(StrEnum):
    """What the race says: one winner, a tie among the best, undecided, or one run each (not raced)."""

    WIN = "win"
    TIED = "tie"
    OPEN = "undecided"
    ONE_RUN = "one run"
    NONE = "none"  # a verdict's only: no trial met the objective


BETTER, TIE, UNDECIDED = Outcome.BETTER, Outcome.TIE, Outcome.UNDECIDED
WIN, TIED, OPEN, ONE_RUN = Answer.WIN, Answer.TIED, Answer.OPEN, Answer.ONE_RUN


@dataclass
class Comparison:
    """The leader against one contender."""

    name: str
    outcome: Outcome
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
    level: float = 0.0  # each interval's confidence (this round's share, divided over the contenders)
    answer: Answer = ONE_RUN
    sd: float = 0.0  # the pooled spread between runs, on the compared scale
    bound: float = 0.0  # the margin on the compared scale
    alpha_total: float = 0.0  # the error a comparison may spend over the whole race
    paired: bool = False  # compared within rounds (blocks), else every run's spread pooled
    need: int | None = None  # a knob race: the runs each at which its verdict's limits would hold

    def runs_to_decide(self, name: str) -> int | None:
        """Runs each that would decide the leader against ``name`` at the measured noise, were
        its observed advantage the true one (:func:`runs_needed`)."""
        c = next((c for c in self.comparisons if c.name == name), None)
        if c is None or not self.sd:
            return None
        return runs_needed(self.sd, c.advantage, self.bound, self.alpha_total, len(self.runs))

    def runs_to_decide_all(self) -> int | None:
        """Runs each that would decide every undecided comparison (:meth:`runs_to_decide`); None:
        one of them takes no practical number, or nothing is undecided."""
        needs = [self.runs_to_decide(name) for name in self.undecided]
        if not needs or any(n is None for n in needs):
            return None
        return max(n for n in needs if n is not None)

    def tells_at(self, runs: int, power: float = 0.8) -> str:
        """What a race ending at ``runs`` runs each tells (``power`` of the time) at the spread
        measured: the difference over which the leader is told better, and under which a tie is
        (none, where the noise is wider than the margin), in words."""
        if not self.sd or not self.comparisons:
            return ""
        trials = max(2, len(self.runs))
        better = self.bound + reach(runs, self.sd, self.alpha_total, trials, power, runs, tie=False)
        tie = self.bound - reach(runs, self.sd, self.alpha_total, trials, power, runs, tie=True)

        def show(x: float) -> str:
            return f"{math.expm1(x):.0%}" if self.comparisons[0].log_scale else f"{x:.4g}"

        ties = f"a tie only under {show(tie)}" if tie > 0 else "no tie (the noise is wider than the margin)"
        return (
            f"at {runs} runs each this machine tells a difference over {show(better)} ({power:.0%} of the time), {ties}"
        )

    @property
    def undecided(self) -> list[str]:
        return [c.name for c in self.comparisons if c.outcome == UNDECIDED]

    @property
    def tied(self) -> list[str]:
        return [c.name for c in self.comparisons if c.outcome == TIE]

    def to_repeat(self) -> list[str]:
        """Who runs again: the undecided contenders and the leader (paired rounds: same requests);
        the leader alone where only its own statements are not yet sure (a knob race)."""
        names = self.undecided
        return [self.leader, *names] if self.leader and (names or self.answer == OPEN) else []


PLAN_POWER = 0.99  # auto's plan ties two equal trials this often, at the spread it plans for
PLAN_SD_UPPER = 0.8  # ... which is the pilot's spread at this upper confidence limit (Browne 1995)


def planning_sd(state: RaceState) -> float:
    """The spread ``auto`` plans for: the pilot's, at its one-sided :data:`PLAN_SD_UPPER` upper
    confidence limit (``s * sqrt(df / chi2_{1-0.8}(df))``: 1.56 s on 4 degrees of freedom).
    A pilot of a few runs estimates the spread poorly, and a plan from the estimate alone gets
    its power only half the time; from the upper limit, at least 80% of the time (Browne 1995)."""
    if state.sd <= 0 or state.df <= 0:
        return state.sd
    return state.sd * math.sqrt(state.df / stats.chi2.ppf(1.0 - PLAN_SD_UPPER, state.df))


def planned_runs(state: RaceState, affordable: int, cap: int) -> int:
    """``auto``'s plan from a race after its pilot (:data:`PILOT_RUNS` runs), made again at each
    later interim look: the runs each that tell a tie of two equal trials with :data:`PLAN_POWER`
    (:func:`runs_needed` at no advantage, the last look spending what a race of ``cap`` runs at
    most leaves it) at the spread of :func:`planning_sd` (a knob race: the runs at which its
    verdict's limits would hold, ``state.need``), at least 3, at most ``cap`` and the runs the
    budget ``affordable`` (never fewer than the runs made)."""
    made = max(state.runs.values(), default=2)
    need = 3 if state.need is None else state.need
    if state.need is None and state.sd > 0 and state.bound > 0:
        trials = max(2, len(state.runs))
        sd = planning_sd(state)
        need = runs_needed(sd, 0.0, state.bound, state.alpha_total, trials, PLAN_POWER, cap, cap) or cap
    return max(made, min(cap, affordable, max(3, need)))


Runs = dict[str, list[float]] | dict[str, dict[int, float]]


def by_round(values: Runs) -> dict[str, dict[int, float]]:
    """Each trial's finite values keyed by the round they were measured in (a list: rounds 0, 1, ...)."""
    out = {}
    for k, v in values.items():
        rounds = v if isinstance(v, dict) else dict(enumerate(v))
        kept = {int(r): float(x) for r, x in rounds.items() if math.isfinite(x)}
        if kept:
            out[k] = kept
    return out


@dataclass
class _Fit:
    """Trials' effects from their runs, rounds as blocks (see :func:`blocked_fit`)."""

    effect: dict[str, float]  # each trial's value, adjusted for the rounds it ran in
    sd: float  # the residual spread of one run, net of what a round shares
    df: int
    contrast: Callable[[str, str], float]  # the variance factor of effect[a] - effect[b] (times sd^2)
    paired: bool  # rounds were blocks (else every run's spread pooled)


def blocked_fit(y: dict[str, dict[int, float]]) -> _Fit:
    """Least squares of ``y[trial][round] = trial effect + round effect + error``: a randomized
    complete block design, each round a block (the same requests for every trial of a round, on
    the same server start when the trials share one, close in time). What a round shares (its
    requests, its server start, the machine's mood of the moment) cancels in every comparison;
    the error left is the runs' own. With two trials and every round complete this is the paired
    t-test.

    Blocks cost degrees of freedom (one per round): with two trials of three runs, two are left
    where pooling keeps four, and at the race's small error shares a t quantile on two degrees is
    twice one on four. So rounds are blocks only when that leaves at least ``PAIRED_MIN_DF``
    degrees of freedom (two trials: from their fifth run); before that, or when the trials share
    too few rounds to be compared within them (a first run lost), every run's spread is pooled,
    rounds ignored. Pooling is conservative when rounds share noise (the shared part inflates the
    spread, never the difference), and the choice rests on the rounds run, never on the values
    measured, so each round's test keeps its error share either way."""
    rows = [(k, r, x) for k, v in y.items() for r, x in v.items()]
    blocked = _least_squares(rows, list(y))
    if blocked is not None and blocked.df >= PAIRED_MIN_DF:
        return blocked
    pooled = _least_squares([(k, 0, x) for k, _, x in rows], list(y))
    assert pooled is not None  # no blocks: every trial is its own mean
    return pooled


def _least_squares(rows: list[tuple[str, int, float]], names: list[str]) -> _Fit | None:
    import numpy as np

    rounds = sorted({r for _, r, _ in rows})
    X = np.zeros((len(rows), len(names) + len(rounds) - 1))
    for row, (k, r, _) in enumerate(rows):
        X[row, names.index(k)] = 1.0
        if (j := rounds.index(r)) > 0:
            X[row, len(names) + j - 1] = 1.0
    obs = np.array([x for *_, x in rows])
    beta, *_ = np.linalg.lstsq(X, obs, rcond=None)
    df = len(rows) - int(np.linalg.matrix_rank(X))
    xtx = X.T @ X
    xtx_inv = np.linalg.pinv(xtx)

    def vector(a: str, b: str) -> np.ndarray:
        c = np.zeros(X.shape[1])
        c[names.index(a)], c[names.index(b)] = 1.0, -1.0
        return c

    # every difference between trials must be estimable (connected through shared rounds)
    if any(not np.allclose(vector(names[0], k) @ xtx_inv @ xtx, vector(names[0], k), atol=1e-8) for k in names[1:]):
        return None
    sd = math.sqrt(float(np.sum((obs - X @ beta) ** 2)) / df) if df > 0 else 0.0
    effect = {k: float(beta[i]) for i, k in enumerate(names)}
    return _Fit(effect, sd, df, lambda a, b: float(vector(a, b) @ xtx_inv @ vector(a, b)), len(rounds) > 1)


def race_state(
    values: Runs,
    maximize: bool,
    confidence: float = 0.95,
    margin: float = 0.1,
    reference: int = 2,
    final: bool | None = None,
) -> RaceState:
    """Compare every trial's runs (``values``: trial -> objective value of each run, by round, or
    a list in round order) with the leader's, at the look of the leader's ``n`` runs (the leader
    runs in every round) of a race of ``reference`` runs at most (:func:`look_share`).
    ``final``: True, the race's last look (it stops here without a decision); False, an interim
    look (between looks nothing is decided); None, the verdict after the race: the interim look's
    decision where it made one (the race stopped on it), else the last look's.
    Rounds are blocks (:func:`blocked_fit`): each comparison is paired within the rounds."""
    rounds = by_round(values)
    if not rounds:
        return RaceState(None)
    log_scale = all(x > 0 for v in rounds.values() for x in v.values())
    y = {k: {r: math.log(x) if log_scale else x for r, x in v.items()} for k, v in rounds.items()}
    sign = 1.0 if maximize else -1.0
    runs = {k: len(v) for k, v in y.items()}
    fit = blocked_fit(y) if len(y) > 1 else None
    mean = fit.effect if fit is not None else {k: sum(v.values()) / len(v) for k, v in y.items()}
    leader = max(mean, key=lambda k: sign * mean[k])
    state = RaceState(leader, runs=runs, paired=fit is not None and fit.paired)
    if len(y) == 1:
        state.answer = WIN
        return state
    state.df = fit.df if fit is not None else 0
    if fit is None or state.df == 0:
        state.answer = ONE_RUN
        return state
    scale = abs(mean[leader]) if not log_scale else 1.0
    bound = math.log1p(margin) if log_scale else margin * scale
    state.sd, state.bound, state.alpha_total = fit.sd, bound, (1.0 - confidence) / (len(y) - 1)
    share = look_share(runs[leader], reference, final is True)
    _judge(state, fit, mean, sign, log_scale, state.alpha_total * share)
    if final is None and state.answer == OPEN:  # the race stopped here undecided: its last look
        _judge(state, fit, mean, sign, log_scale, state.alpha_total * look_share(runs[leader], reference, True))
    return state


def _judge(state: RaceState, fit: _Fit, mean: dict[str, float], sign: float, log_scale: bool, alpha: float) -> None:
    """Each contender against the leader at the error ``alpha`` (0: between looks, nothing told)."""
    assert state.leader is not None
    leader, bound = state.leader, state.bound
    state.level = 1.0 - alpha
    two_sided, one_sided = t_upper(alpha / 2, state.df), t_upper(alpha, state.df)
    state.comparisons = []
    for k in mean:
        if k == leader:
            continue
        d = sign * (mean[leader] - mean[k])  # >= 0: the leader's advantage
        se = fit.sd * math.sqrt(fit.contrast(leader, k))
        lo, hi = d - two_sided * se, d + two_sided * se
        if se <= 1e-12 * max(1.0, abs(d)):  # runs that never vary: the data are exact
            outcome = TIE if d <= bound + 1e-12 else BETTER
        elif lo > bound:
            outcome = BETTER
        elif d + one_sided * se < bound and d - one_sided * se > -bound:
            outcome = TIE
        else:
            outcome = UNDECIDED
        back = (lambda v: math.exp(max(-700.0, min(700.0, sign * v)))) if log_scale else (lambda v: v)
        low, high = sorted((back(lo), back(hi)))
        state.comparisons.append(Comparison(k, outcome, back(d), low, high, log_scale, d))
    state.answer = OPEN if state.undecided else TIED if state.tied else WIN


def races(objective: ObjectiveSpec | None) -> bool:
    """Whether a sweep with this objective races: a metric, or a knob under constraints (a knob
    does not vary between runs; whether a trial meets the constraints does)."""
    if objective is None or objective.most_runs <= 1:
        return False
    return not is_knob(objective.key) or bool(objective.subject_to)
