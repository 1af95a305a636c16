"""The sweep's verdict: the best trial by the experiment's objective, under its constraints.

A value is read from a trial's own metrics (``slo_capacity_rps``), from a knob it was run with
(``engine.max_num_batched_tokens``), or at one load point (default: the heaviest fixed point;
probes of a capacity search are not fixed points). With repeats, each point metric carries a
95% confidence half-width (``<metric>_ci95``); trials whose intervals overlap the best one's
are called a tie, not a loss. Without repeats the verdict says that noise was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.knobs import knob_alpha, knob_better, knob_confidence, knob_doubts, knob_limits
from orchestrator.decide.looks import PILOT_RUNS, look_share
from orchestrator.decide.objective import (
    Value,
    check_constraint,
    constraint_text,
    fixed_points,
    fmt,
    read_at,
    round_values,
    show,
    value_of,
)
from orchestrator.decide.race import ONE_RUN, OPEN, TIED, UNDECIDED, WIN, Answer, Comparison, RaceState, race_state
from orchestrator.decide.trials import TrialData


@dataclass
class Verdict:
    objective: ObjectiveSpec
    best: TrialData | None
    ties: list[TrialData] = field(default_factory=list)
    feasible: list[TrialData] = field(default_factory=list)
    excluded: list[tuple[TrialData, str]] = field(default_factory=list)
    uncertain: list[TrialData] = field(default_factory=list)  # of the excluded: met a constraint in some runs only
    lines: list[str] = field(default_factory=list)
    race: RaceState | None = None  # the between-run comparison, when the trials have several runs
    undecided: list[TrialData] = field(default_factory=list)

    @property
    def headline(self) -> str:
        return self.lines[0] if self.lines else ""

    @property
    def judged(self) -> list[TrialData]:
        """Every trial the objective was read for: meeting the constraints or not."""
        return [*self.feasible, *(t for t, _ in self.excluded)]

    @property
    def decision(self) -> Answer:
        """``win``, ``tie``, ``undecided`` (between runs), ``one run`` (noise not measured), ``none``."""
        if self.best is None:
            return Answer.NONE
        return self.race.answer if self.race is not None else ONE_RUN


def decide(trials: list[TrialData], objective: ObjectiveSpec) -> Verdict:
    """The verdict over the finished trials (in sweep order)."""
    key, sign = objective.key, (1.0 if objective.maximize else -1.0)
    verdict = Verdict(objective, None)
    scored = _score(trials, objective, verdict)
    if not scored:
        verdict.lines = [f"**Verdict:** no trial meets the objective ({_goal(objective)})."]
        verdict.lines += [f"- {t.name}: {why}" for t, why in verdict.excluded]
        return verdict
    best, bv = max(scored, key=lambda tv: sign * tv[1].value)
    verdict.best = best
    race = _race(scored, objective)
    if race is not None:  # several runs: the race's answer, between runs
        verdict.race = race
        by_name = {t.name: (t, v) for t, v in scored}
        best, bv = by_name[race.leader or best.name]
        verdict.best = best
        verdict.ties = [by_name[n][0] for n in race.tied]
        verdict.undecided = [by_name[n][0] for n in race.undecided]
        verdict.lines = [_race_headline(verdict, bv)]
    elif bv.where == "knob" and any(t.runs for t in trials):  # a knob: sure only of the constraints
        verdict.undecided = knob_doubts(trials, objective, verdict.best, verdict.uncertain)
        verdict.race = RaceState(best.name, answer=OPEN if verdict.undecided else WIN)
        verdict.lines = [_knob_headline(verdict, bv)]
    else:
        for t, v in scored:  # overlapping 95% intervals: a tie, not a win
            if t is not best and bv.ci95 and v.ci95 and abs(v.value - bv.value) <= bv.ci95 + v.ci95:
                verdict.ties.append(t)
        verdict.lines = [_headline(verdict, bv, len(scored))]
    others = [(t, v) for t, v in sorted(scored, key=lambda tv: -sign * tv[1].value) if t is not best]
    if others:
        verdict.lines.append(
            "Also meeting the constraints: "
            + "; ".join(
                f"{t.name} {key} {show(v)}" + (f" ({q})" if (q := _quoted(t, objective)) else "") for t, v in others
            )
            + "."
        )
    verdict.lines += _cautions(verdict, scored)
    if verdict.excluded:
        verdict.lines.append("Not meeting them: " + "; ".join(f"{t.name} ({why})" for t, why in verdict.excluded) + ".")
    return verdict


def _cautions(verdict: Verdict, scored: list[tuple[TrialData, Value]]) -> list[str]:
    """What to read with care: values or constraints read at an INVALID point, energy estimated
    from power samples rather than a counter."""
    objective = verdict.objective
    lines: list[str] = []
    flagged = [t.name for t, v in scored if read_at(t, v, M.INVALID)]
    if flagged:
        lines.append(
            "Caution: the value of " + ", ".join(flagged) + " was read at a load point flagged "
            "INVALID (the client could not keep up, or the server failed): compare with care."
        )
    if objective.key in ENERGY_KEYS:
        estimated = [t.name for t, v in scored if _energy_estimated(t, v)]
        if estimated:
            lines.append(
                "Caution: the energy of " + ", ".join(estimated) + " was ESTIMATED from power samples (no energy "
                "counter bracketed the point): from NVML's 1 s averages they were within 2% of the counter on an H200; "
                "from instant readings (GA100 and older), integrated as trapezoids, a stand-in on the H200 was off by up "
                "to 15%; compare with care."
            )
    judged = [  # a constraint judged at an INVALID point, whatever the objective's own value
        f"{t.name} ({k})"
        for t in verdict.judged
        for k in objective.subject_to
        if (c := value_of(t, k, objective.at)) is not None and read_at(t, c, M.INVALID)
    ]
    if judged:
        lines.append(
            "Caution: the constraint of " + ", ".join(judged) + " was judged at a load point flagged INVALID: "
            "whether it is met is not known."
        )
    return lines


ENERGY_KEYS = (M.ENERGY_J, M.JOULES_PER_OUTPUT_TOKEN, M.OUTPUT_TOKENS_PER_JOULE, M.JOULES_PER_REQUEST)


def _energy_estimated(t: TrialData, v: Value) -> bool:
    """The value's point had its energy integrated from power, not read from a counter."""
    point = next((p for p in fixed_points(t) if p.label == v.where), None)
    return point is not None and point.metrics.get(M.ENERGY_FROM_COUNTER) == 0.0


def _goal(objective: ObjectiveSpec) -> str:
    where = f" at {objective.at}" if objective.at else ""
    goal = f"{'maximize' if objective.maximize else 'minimize'} {objective.key}{where}"
    return goal + (f" subject to {constraint_text(objective)}" if objective.subject_to else "")


def _score(trials: list[TrialData], objective: ObjectiveSpec, verdict: Verdict) -> list[tuple[TrialData, Value]]:
    """Each trial's objective value when it meets every constraint; the others go to
    ``verdict.excluded`` with the reasons, the scored ones to ``verdict.feasible``."""
    key = objective.key
    scored: list[tuple[TrialData, Value]] = []
    for t in trials:
        checks = [check_constraint(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
        failed = [c.words for c in checks if not c.met]
        if any(c.uncertain for c in checks):
            verdict.uncertain.append(t)
        v = value_of(t, key, objective.at)
        if v is None:
            failed.append(f"{key} {'not set' if '.' in key and '/' not in key else 'not measured'}")
        elif read_at(t, v, M.PROFILED_EXCLUDED):
            failed.append(f"{key} read at {v.where}, a profiled point (profile.in_verdict=true counts it)")
        if failed:
            verdict.excluded.append((t, "; ".join(failed)))
        else:
            assert v is not None
            scored.append((t, v))
            verdict.feasible.append(t)
    return scored


def _quoted(t: TrialData, objective: ObjectiveSpec) -> str:
    """The constraints' and ``show``'s values of a trial, quoted next to its objective value."""
    keys = [k for k in dict.fromkeys([*objective.subject_to, *objective.show]) if k != objective.key]
    values = {k: value_of(t, k, objective.at) for k in keys}
    return ", ".join(f"{k} {show(v)}" for k, v in values.items() if v is not None)


def _headline(verdict: Verdict, bv: Value, n_scored: int) -> str:
    objective, best = verdict.objective, verdict.best
    assert best is not None
    key, extra = objective.key, _quoted(best, objective)
    head = (
        f"**Verdict:** {best.name}: {key} {show(bv)}"
        + (f" ({extra})" if extra else "")
        + f"; objective: {_goal(objective)}."
    )
    if verdict.ties:
        head += (
            " Tied within the 95% intervals: "
            + ", ".join(f"{t.name} ({show(value_of(t, key, objective.at))})" for t in verdict.ties)  # type: ignore[arg-type]
            + "; the data cannot tell them apart."
        )
    elif bv.where != "knob" and bv.ci95 is None and n_scored > 1:
        head += " One run each: run-to-run noise was not measured (objective.max_repeats >= 2 races the trials)."
        if bv.within is not None:
            lo, hi = bv.within
            head += (
                f" Within its one run {key} lay in {fmt(lo)}..{fmt(hi)} (95%, over that run's requests): how "
                "precisely the run measured it, not how far another run would land."
            )
    return head


def _race(scored: list[tuple[TrialData, Value]], objective: ObjectiveSpec) -> RaceState | None:
    """The race over the scored trials' runs; None when every trial ran once (or a knob decides)."""
    if not any(t.runs for t, _ in scored) or any(v.where == "knob" for _, v in scored):
        return None
    return race_over([t for t, _ in scored], objective)


def race_over(trials: list[TrialData], objective: ObjectiveSpec, final: bool | None = None) -> RaceState:
    """The objective's value in each run of ``trials`` compared with the leader's, the error spent
    over the race's looks (decide.looks.look_share: interim looks of a race of ``max_repeats``
    runs at most, ``auto``'s cap with auto, then its last), divided over the contenders.
    ``final``: as :func:`orchestrator.decide.race.race_state` (None: the verdict after the race)."""
    values = {t.name: round_values(t, objective.key, objective.at) for t in trials}
    maximize = objective.maximize is not None
    return race_state(values, maximize, objective.confidence, objective.margin, objective.most_runs, final)


def _race_headline(verdict: Verdict, bv: Value) -> str:
    """X wins (by d, interval), X and Y tie (within the margin), or undecided after the budget."""
    objective, best, race = verdict.objective, verdict.best, verdict.race
    assert best is not None and race is not None
    key, extra = objective.key, _quoted(best, objective)
    runs = sorted(set(race.runs.values()))
    each = f"{runs[0]} runs each" if len(runs) == 1 else f"{runs[0]}-{runs[-1]} runs"
    paired = " (paired within rounds)" if race.paired else ""
    sure = (
        f"{objective.confidence * 100:.4g}% confidence for all its statements together, "
        f"from the spread between runs{paired}, {each}"
    )
    value = f"{key} {show(bv)}" + (f" ({extra})" if extra else "")
    goal = f"objective: {_goal(objective)}."
    if race.answer == OPEN:
        names = " or ".join([best.name, *(t.name for t in verdict.undecided)])
        return (
            f"**Verdict:** undecided after the budget: {names} ({sure}); the leader {best.name}: {value}; "
            f"{_runs_to_decide(race)}. {goal}"
        )
    if race.answer == TIED:
        names = " and ".join([best.name, *(t.name for t in verdict.ties)])
        return f"**Verdict:** {names} tie within the margin of {objective.margin:.0%} ({sure}); {best.name}: {value}. {goal}"
    closest = min(race.comparisons, key=lambda c: c.advantage, default=None)
    against = f" {closest.words(objective.maximize is not None)} over {closest.name}," if closest else ""
    return f"**Verdict:** {best.name} wins:{against} {sure}; {value}. {goal}"


# what an undecided verdict says where no practical number of runs would decide it (make labs reads it)
NOT_TOLD = "not told by any practical number of runs"


def _runs_to_decide(race: RaceState) -> str:
    """What an undecided race would need: the runs each that would decide its hardest comparison
    (80% of the time) at the spread measured between runs, were the observed difference the true one."""
    needs = [race.runs_to_decide(name) for name in race.undecided]
    spread = f"{race.sd:.1%} between runs" if race.comparisons and race.comparisons[0].log_scale else "between runs"
    if any(n is None for n in needs):
        return (
            f"at the noise measured ({spread}) a difference this close to the margin is {NOT_TOLD}; widen "
            "objective.margin or reduce the noise"
        )
    most = max(n for n in needs if n is not None) if needs else None
    if most is None:
        return "run with a larger budget (objective.budget, objective.max_repeats)"
    return (
        f"at the noise measured ({spread}) deciding it needs about {most} runs each: run with "
        f"objective.max_repeats={most} and a budget for them (objective.budget)"
    )


def _knob_headline(verdict: Verdict, bv: Value) -> str:
    """A knob objective over several runs: the best knob whose constraints held in every run."""
    objective, best = verdict.objective, verdict.best
    assert best is not None
    n = 1 + len(best.runs)
    value = f"{objective.key} {show(bv)}" + (f" ({q})" if (q := _quoted(best, objective)) else "")
    goal = f"objective: {_goal(objective)}."
    if verdict.undecided:
        names = " or ".join([*(t.name for t in verdict.undecided), best.name])
        return (
            f"**Verdict:** undecided after the budget: {names}: {', '.join(t.name for t in verdict.undecided)} "
            f"met the constraints in some runs only; {best.name} in all {n}: {value}; run with a larger budget "
            f"(objective.budget, objective.max_repeats). {goal}"
        )
    better = knob_better(verdict.judged, objective, best)
    rest = (
        f"every trial with a {'greater' if objective.maximize else 'smaller'} {objective.key} "
        f"({', '.join(t.name for t in better)}) missed them in all of its own"
        if better
        else f"no trial has a {'greater' if objective.maximize else 'smaller'} {objective.key}"
    )
    sure = knob_confidence(best, better, objective, verdict.judged)
    return (
        f"**Verdict:** {best.name} wins: {value}; it met the constraints in all {n} of its runs, and {rest}{sure}. "
        f"{goal}"
    )


def knob_standing(verdict: Verdict, objective: ObjectiveSpec, final: bool) -> RaceState | None:
    """A knob race's look: undecided while a trial with a better knob than the best's met the
    constraints in some runs only (:func:`knob_doubts`), then while the verdict's one-sided limits
    do not all hold at this look's share of the error (:func:`knob_limits`; between looks none is
    spent): the best and the trials whose limits do not hold run again. Only the best and the
    trials with a better knob are raced (from the first run on): a worse knob's runs would not
    change the verdict while the best meets the constraints. ``state.need``: the runs
    each at which they would hold at the spread measured (None: not within the race's runs)."""

    trials = verdict.judged
    measured = [t for t in trials if value_of(t, objective.key, objective.at) is not None]
    if len(measured) < 2:
        return None
    best = verdict.best
    doubts = [t.name for t in knob_doubts(trials, objective, verdict.best, verdict.uncertain)]
    state = RaceState(best.name if best is not None else None, runs={t.name: 1 + len(t.runs) for t in measured})
    if doubts or best is None:
        state.answer = OPEN if doubts else WIN
        state.comparisons = [Comparison(n, UNDECIDED, 1.0, 1.0, 1.0, False) for n in doubts]
        return state
    better = knob_better(trials, objective, best)
    n = 1 + len(best.runs)
    share = look_share(n, objective.most_runs, final)
    unsure = [(name, lim) for name, lim in knob_limits(best, better, objective, trials, share) if not lim.holds]
    names = list(dict.fromkeys(name for name, _ in unsure))
    if share == 0.0:  # the first run, or between looks: nothing is told, the same trials run again
        names = [t.name for t in [best, *better]]
    state.answer = OPEN if names else WIN
    state.comparisons = [Comparison(name, UNDECIDED, 1.0, 1.0, 1.0, False) for name in names if name != best.name]
    alpha = knob_alpha(best, better, objective, trials, look_share(max(n, PILOT_RUNS), objective.most_runs, True))
    needs = [lim.runs_to_hold(alpha, objective.most_runs) for _, lim in unsure]
    if needs and all(k is not None for k in needs):
        state.need = max(k for k in needs if k is not None)
    return state
