"""When the race looks and how much of the error each look spends (an alpha-spending function
over a few interim looks, its last look spending what is left), how many runs a comparison
needs (:func:`runs_needed`), and a race's :class:`Schedule` round by round. The comparisons
themselves are :mod:`orchestrator.decide.race`'s; docs/statistics.md says why."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import special

PAIRED_MIN_DF = 4  # the fewest degrees of freedom with which rounds are blocks (see blocked_fit)
PILOT_RUNS = 3  # auto plans once every trial still racing has run this many times


def t_upper(tail: float, df: float) -> float:
    """Student's t quantile with ``tail`` above it (``stats.t.ppf(1 - tail, df)``, from the lower
    tail for precision at the race's small shares, and 30 times faster: the plan asks it often)."""
    if tail <= 0.0:
        return math.inf
    q = -float(special.stdtrit(df, tail))
    return q if math.isfinite(q) else math.inf  # a tail past the routine's range (1e-300): beyond any data


SPEND_RHO = 2.0  # the spending function's power: alpha * t^rho spent by the fraction t of the runs
LOOK_GROWTH = 1.5  # each interim look about this many times the runs of the one before


def interim_looks(reference: int) -> list[int]:
    """The leader's runs at which the race looks before its last, below ``reference`` (the runs
    at most): 2, 3, 5, 8, 12, 18, 27, 41, ... (each about :data:`LOOK_GROWTH` times the one before)."""
    looks, n = [], 2
    while n < reference:
        looks.append(n)
        n = max(n + 1, math.floor(n * LOOK_GROWTH + 0.5))
    return looks


def spent(runs: int, reference: int) -> float:
    """The share of the error spent by the interim look at ``runs`` (the looks before included):
    ``((runs - 1) / (reference - 1))^rho``, all of it at ``reference``."""
    if runs >= reference:
        return 1.0
    return float(((max(runs, 1) - 1) / (reference - 1)) ** SPEND_RHO)


def look_share(runs: int, reference: int, final: bool) -> float:
    """The share of the error a look at ``runs`` (the leader's) spends: at an interim look what
    :func:`spent` adds since the look before (0 between looks); at the race's last look
    (``final``, or ``reference`` reached) all that the interim looks before it left."""
    looks = interim_looks(reference)
    before = [k for k in looks if k < runs]
    prior = spent(before[-1], reference) if before else 0.0
    if final or runs >= reference:
        return 1.0 - prior
    if runs not in looks:
        return 0.0
    return spent(runs, reference) - prior


def runs_needed(
    sd: float,
    advantage: float,
    bound: float,
    alpha: float,
    trials: int = 2,
    power: float = 0.8,
    cap: int = 200,
    reference: int | None = None,
) -> int | None:
    """The runs each with which a comparison whose true advantage is ``advantage`` (on the compared
    scale) is decided with probability ``power``, at the between-run spread ``sd``: a tie inside
    ``bound`` when the advantage is smaller, the leader better when it is larger (the usual
    sample size of two one-sided tests, or of a t-test against the bound), at the race's last look.
    ``alpha``: the comparison's share of the error; the last look spends what the interim looks
    left (:func:`look_share`) of a race of ``reference`` runs at most (None: the runs themselves,
    ``max_repeats`` set to them). None: more than ``cap``, or an advantage on the bound itself (no
    number of runs tells it)."""
    room = abs(bound - abs(advantage))
    if room <= 0:
        return None
    if sd <= 0:
        return 2
    tie = abs(advantage) < bound
    for n in range(2, cap + 1):
        if reach(n, sd, alpha, trials, power, reference or n, tie=tie, even=advantage == 0) <= room:
            return n
    return None


def reach(
    n: int, sd: float, alpha: float, trials: int, power: float, reference: int, tie: bool, even: bool = False
) -> float:
    """How far from the bound (on the compared scale) a true advantage must lie for the race's
    last look at ``n`` runs each to decide it with probability ``power``: over the bound by this
    much to tell the leader better, under it by this much to tell a tie (``even``: a true
    advantage of 0, each one-sided miss then costs half the power)."""
    a = alpha * look_share(n, reference, final=True)
    df = (trials - 1) * (n - 1)  # rounds as blocks (:func:`blocked_fit`), or every run pooled
    df = df if df >= PAIRED_MIN_DF else trials * (n - 1)
    miss = (1 - power) / 2 if tie and even else 1 - power
    q = t_upper(a if tie else a / 2, df) + t_upper(miss, df)
    return q * sd * math.sqrt(2 / n)


@dataclass
class Schedule:
    """When a race looks and where it ends, round by round: it looks at the rounds of
    :func:`interim_looks` of ``limit`` runs at most (``every_round``: at each round, for a race
    that tests no means), and ends at ``limit`` or, with ``auto``, at the runs it planned
    (:func:`planned_runs`: after the pilot's :data:`PILOT_RUNS` runs and again at each later look)."""

    limit: int  # runs of a trial at most: max_repeats, or auto's cap
    auto: bool = False
    every_round: bool = False
    plan: int | None = None  # the runs planned (auto, once the pilot ran), else the limit

    def __post_init__(self) -> None:
        self.looks = list(range(2, self.limit)) if self.every_round else interim_looks(self.limit)
        if not self.auto:
            self.plan = self.limit

    def looks_at(self, runs: int) -> bool:
        """Whether the race looks after ``runs`` runs (between looks the same trials run again)."""
        return runs in self.looks

    def plans_at(self, runs: int) -> bool:
        """Whether ``auto`` makes (or makes again) its plan after ``runs`` runs."""
        return self.auto and runs >= PILOT_RUNS and self.looks_at(runs)

    def replan(self, runs: int) -> bool:
        """Take ``auto``'s plan of ``runs``: a later plan may lengthen the race (a pilot whose spread
        came out low planned too few runs), never shorten it (a plan cut on a quiet stretch would
        fall short the same way); whether it changed."""
        new = runs if self.plan is None else max(self.plan, runs)
        changed, self.plan = new != self.plan, new
        return changed

    def last(self, runs: int) -> bool:
        """Whether the race ends after ``runs`` runs: the limit or the plan reached."""
        return runs >= self.limit or (self.plan is not None and runs >= self.plan)
