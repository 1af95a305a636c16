"""The objective's arithmetic, shared by the report's verdict and the knob search: a trial's
value of a metric or knob (:func:`value_of`) and whether it meets the constraints
(:func:`constraints_hold`). Below both ``report`` and ``scheduling``: a search reads the same
numbers the verdict does without importing the report."""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.metric_keys import WITHIN95, M, is_knob
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.trials import Point, TrialData


@dataclass
class Value:
    value: float
    ci95: float | None  # a 95% half-width between runs (a race's runs, or the point's repeats)
    where: str  # "trial", "knob" or a point label
    runs: int = 1  # a race's runs of the trial the value is the mean of
    within: tuple[float, float] | None = None  # its 95% interval within one run (over the point's requests)


def fixed_points(t: TrialData) -> list[Point]:
    return [p for p in t.points if M.SLO_MET not in p.metrics]


def point_at(t: TrialData, at: str | None) -> Point | None:
    """The point the objective reads: the fixed point labelled ``at``, else (``at`` None) the last."""
    points = fixed_points(t)
    if at is not None:
        return next((p for p in points if p.label == at), None)
    return points[-1] if points else None


def value_of(t: TrialData, key: str, at: str | None = None) -> Value | None:
    """A trial's value of ``key``: its own metric, else a knob, else the metric at a point; over
    a race's runs, their mean with the 95% t-interval of it (the runs' own spread)."""
    if not t.runs or is_knob(key):  # a knob is the same in every run
        return _one_value(t, key, at)
    values = run_values(t, key, at)
    first = _one_value(t, key, at)
    if not values or first is None:
        return first
    mean, half = between_runs(values)
    return Value(mean, half or None, first.where, len(values))


def between_runs(values: list[float]) -> tuple[float, float]:
    """The mean of one value over several runs and the half-width of its 95% t-interval (0 from
    a single run)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2 or max(values) - min(values) <= 1e-12 * max(abs(mean), 1.0):  # equal runs: no spread, not 1e-17
        return mean, 0.0
    from scipy import stats

    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def run_values(t: TrialData, key: str, at: str | None = None) -> list[float]:
    """The value of ``key`` in each run of the trial (its first, then a race's later runs)."""
    return [v.value for run in (t, *t.runs) if run.status == "FINISHED" and (v := _one_value(run, key, at))]


def round_values(t: TrialData, key: str, at: str | None = None) -> dict[int, float]:
    """The value of ``key`` in each run of the trial, by the race's round it ran in (0 the first
    pass, then the repeats; where a run's round is not known, its place among the runs): the
    race pairs trials within rounds."""
    runs = [t, *t.runs]
    rounds = [r.round for r in runs]
    if None in rounds or len(set(rounds)) < len(rounds):  # rounds not known: by place
        rounds = list(range(len(runs)))
    return {
        int(r): v.value
        for r, run in zip(rounds, runs, strict=True)
        if r is not None and run.status == "FINISHED" and (v := _one_value(run, key, at))
    }


def _one_value(t: TrialData, key: str, at: str | None = None) -> Value | None:
    """One run's value of ``key`` (see :func:`value_of`)."""
    if at is None and key in t.metrics and math.isfinite(t.metrics[key]):
        return Value(t.metrics[key], t.metrics.get(f"{key}_ci95"), "trial")
    if "." in key and "/" not in key:
        knob = t.num(key)
        return Value(knob, None, "knob") if knob is not None else None
    point = point_at(t, at)
    if point is None or key not in point.metrics or not math.isfinite(point.metrics[key]):
        return None
    lo, hi = (point.metrics.get(key + s) for s in WITHIN95)
    within = (lo, hi) if lo is not None and hi is not None else None
    return Value(point.metrics[key], point.metrics.get(f"{key}_ci95"), point.label, within=within)


def fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def short(v: float) -> str:
    """Three significant digits (a value in a sentence, not a table)."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def show(v: Value) -> str:
    return fmt(v.value) + (f" ± {fmt(v.ci95)}" if v.ci95 else "") + (f" ({v.runs} runs)" if v.runs > 1 else "")


@dataclass(frozen=True)
class Check:
    """One constraint of one trial: met or not, in words (``"<key> <value>[, needs <= limit]"``),
    and ``uncertain`` where it was met in some runs of the trial only."""

    met: bool
    words: str
    uncertain: bool = False


def check_constraint(t: TrialData, key: str, bound: object, objective: ObjectiveSpec, trials: list[TrialData]) -> Check:
    """Does ``t`` meet one constraint?"""
    lo: float | None = None
    hi: float | None = None
    if isinstance(bound, str):  # base-D: at least the first measured trial's value minus D
        base = next((v for b in trials if (v := value_of(b, key, objective.at)) is not None), None)
        if base is None:
            return Check(False, f"{key} not measured in any trial")
        lo = base.value - float(bound.split("-", 1)[1])
    elif isinstance(bound, dict):
        lo, hi = bound.get("min"), bound.get("max")
    else:
        hi = float(bound)  # type: ignore[arg-type]
    v = value_of(t, key, objective.at)
    if v is None:
        return Check(False, f"{key} {'not set' if is_knob(key) else 'not measured'}")
    runs = run_values(t, key, objective.at)
    met = [x for x in runs if (lo is None or x >= lo) and (hi is None or x <= hi)]
    if t.runs and 0 < len(met) < len(runs):  # met sometimes: not "meeting"
        limit = " and ".join(s for s in (lo is not None and f">= {fmt(lo)}", hi is not None and f"<= {fmt(hi)}") if s)
        return Check(False, f"{key} {show(v)}: uncertain, {limit} in {len(met)} of {len(runs)} runs", uncertain=True)
    if lo is not None and v.value < lo:
        return Check(False, f"{key} {show(v)}, needs >= {fmt(lo)}")
    if hi is not None and v.value > hi:
        return Check(False, f"{key} {show(v)}, needs <= {fmt(hi)}")
    return Check(True, f"{key} {show(v)}")


@dataclass(frozen=True)
class Limit:
    """A constraint judged with its uncertainty: a one-sided limit of its mean over a trial's runs
    (Student t, ``n - 1`` degrees of freedom), ``above`` the mean or below it. What it says holds
    when the limit stays on the bound's side: an upper limit at or under the bound (a maximum met,
    a minimum missed), a lower limit at or over it (a minimum met, a maximum missed)."""

    key: str
    bound: float
    above: bool
    limit: float
    runs: int
    mean: float = math.nan  # the runs' mean and spread the limit was drawn from
    sd: float = 0.0

    @property
    def holds(self) -> bool:
        return self.limit <= self.bound if self.above else self.limit >= self.bound

    def runs_to_hold(self, alpha: float, cap: int) -> int | None:
        """The fewest runs (``runs`` at least, ``cap`` at most) at which this limit, at one-sided
        level ``1 - alpha``, would hold were the mean and spread measured the true ones; None: not
        within ``cap``, or a mean on the wrong side of the bound (more runs would not make it hold)."""
        from orchestrator.decide.looks import t_upper

        gap = (self.bound - self.mean) if self.above else (self.mean - self.bound)
        if not gap >= 0:
            return None
        for n in range(max(self.runs, 2), cap + 1):
            if t_upper(alpha, n - 1) * self.sd / math.sqrt(n) <= gap:
                return n
        return None

    def words(self) -> str:
        side = "at most" if self.above else "at least"
        return f"{self.key} {side} {fmt(self.limit)} ({'<=' if self.above else '>='} {fmt(self.bound)})"


def constraint_limits(
    t: TrialData, objective: ObjectiveSpec, trials: list[TrialData], alpha: float, missed: bool = False
) -> list[Limit]:
    """Each constraint of ``objective`` on ``t`` at one-sided level ``1 - alpha``: the limit
    on the side a trial that meets it must stay within (``missed``: the other side, for a trial
    that misses it: its limit beyond the bound says it misses it). Empty with fewer than 2 runs."""
    from scipy import stats

    out = []
    for key, bound in objective.subject_to.items():
        values = run_values(t, key, objective.at)
        n = len(values)
        if n < 2:
            return []
        mean = sum(values) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
        half = float(stats.t.ppf(1.0 - alpha, n - 1)) * sd / math.sqrt(n)
        if isinstance(bound, str):  # base-D against the first trial's value
            base = next((v for b in trials if (v := value_of(b, key, objective.at)) is not None), None)
            sides = [] if base is None else [(base.value - float(bound.split("-", 1)[1]), False)]
        elif isinstance(bound, dict):
            sides = [(float(v), k == "max") for k, v in bound.items()]
        else:
            sides = [(float(bound), True)]
        for b, upper in sides:
            above = upper != missed  # the limit's side: above the mean for a maximum met, or a minimum missed
            out.append(Limit(key, b, above, mean + half if above else mean - half, n, mean, sd))
    return out


def constraints_hold(t: TrialData, objective: ObjectiveSpec, trials: list[TrialData]) -> tuple[bool, str]:
    """Whether ``t`` meets every constraint of ``objective`` (``base-D`` against ``trials``), and
    the constraints it misses in words."""
    checks = [check_constraint(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
    failed = [c.words for c in checks if not c.met]
    return not failed, "; ".join(failed)


def constraint_text(objective: ObjectiveSpec) -> str:
    parts = []
    for key, bound in objective.subject_to.items():
        if isinstance(bound, str):
            parts.append(f"{key} >= first trial's - {bound[5:]}")
        elif isinstance(bound, dict):
            parts += [f"{key} {'>=' if k == 'min' else '<='} {fmt(v)}" for k, v in bound.items()]
        else:
            parts.append(f"{key} <= {fmt(float(bound))}")
    return ", ".join(parts)


def read_at(t: TrialData, v: Value, flag: str) -> bool:
    """The value was read at a fixed point that carries ``flag`` (invalid, profiled_excluded), in
    any run of the trial (a race's later runs too: their mean is the value)."""
    for run in (t, *t.runs):
        point = next((p for p in fixed_points(run) if p.label == v.where), None)
        if point is not None and point.metrics.get(flag, 0.0) >= 1.0:
            return True
    return False
