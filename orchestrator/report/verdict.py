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
from orchestrator.objective import (
    Limit,
    Value,
    check_constraint,
    constraint_limits,
    constraint_text,
    fixed_points,
    fmt,
    read_at,
    round_values,
    show,
    value_of,
)
from orchestrator.objective.race import ONE_RUN, OPEN, TIED, WIN, RaceState, look_share, race_state
from orchestrator.tracking.runs import TrialData


@dataclass
class Verdict:
    objective: ObjectiveSpec
    best: TrialData | None
    ties: list[TrialData] = field(default_factory=list)
    feasible: list[TrialData] = field(default_factory=list)
    excluded: list[tuple[TrialData, str]] = field(default_factory=list)
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
    def decision(self) -> str:
        """``win``, ``tie``, ``undecided`` (between runs), ``one run`` (noise not measured), ``none``."""
        if self.best is None:
            return "none"
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
        verdict.undecided = knob_doubts(trials, objective, verdict)
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
    flagged = [t.name for t, v in scored if read_at(t, v, M.INVALID)]
    if flagged:
        verdict.lines.append(
            "Caution: the value of " + ", ".join(flagged) + " was read at a load point flagged "
            "INVALID (the client could not keep up, or the server failed): compare with care."
        )
    if key in ENERGY_KEYS:
        estimated = [t.name for t, v in scored if _energy_estimated(t, v)]
        if estimated:
            verdict.lines.append(
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
        verdict.lines.append(
            "Caution: the constraint of " + ", ".join(judged) + " was judged at a load point flagged INVALID: "
            "whether it is met is not known."
        )
    if verdict.excluded:
        verdict.lines.append("Not meeting them: " + "; ".join(f"{t.name} ({why})" for t, why in verdict.excluded) + ".")
    return verdict


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
        failed = [why for ok, why in checks if not ok]
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
    over the race's looks (objective.race.look_share: interim looks of a race of ``max_repeats``
    runs at most, ``auto``'s cap with auto, then its last), divided over the contenders.
    ``final``: as :func:`orchestrator.objective.race.race_state` (None: the verdict after the race)."""
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


def _runs_to_decide(race: RaceState) -> str:
    """What an undecided race would need: the runs each that would decide its hardest comparison
    (80% of the time) at the spread measured between runs, were the observed difference the true one."""
    needs = [race.runs_to_decide(name) for name in race.undecided]
    spread = f"{race.sd:.1%} between runs" if race.comparisons and race.comparisons[0].log_scale else "between runs"
    if any(n is None for n in needs):
        return (
            f"at the noise measured ({spread}) a difference this close to the margin is not told by any "
            "practical number of runs; widen objective.margin or reduce the noise"
        )
    most = max(n for n in needs if n is not None) if needs else None
    if most is None:
        return "run with a larger budget (objective.budget, objective.max_repeats)"
    return (
        f"at the noise measured ({spread}) deciding it needs about {most} runs each: run with "
        f"objective.max_repeats={most} and a budget for them (objective.budget)"
    )


def knob_doubts(trials: list[TrialData], objective: ObjectiveSpec, verdict: Verdict) -> list[TrialData]:
    """A knob objective is exact; what is uncertain is whether a trial meets the constraints.
    The trials with a better knob than the best's whose constraints held in some runs only: the
    verdict is not decided while any is left (with no best yet, every uncertain one)."""
    sign = 1.0 if objective.maximize else -1.0
    best = value_of(verdict.best, objective.key, objective.at) if verdict.best is not None else None
    names = {t.name for t, why in verdict.excluded if ": uncertain" in why}
    out = []
    for t in trials:
        v = value_of(t, objective.key, objective.at)
        if t.name in names and v is not None and (best is None or sign * v.value > sign * best.value):
            out.append(t)
    return out


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
    sure = _knob_confidence(best, better, objective, verdict.judged)
    return (
        f"**Verdict:** {best.name} wins: {value}; it met the constraints in all {n} of its runs, and {rest}{sure}. "
        f"{goal}"
    )


def knob_better(trials: list[TrialData], objective: ObjectiveSpec, best: TrialData) -> list[TrialData]:
    """The trials with a better knob than ``best``'s (they missed the constraints)."""
    sign = 1.0 if objective.maximize else -1.0
    bv = value_of(best, objective.key, objective.at)
    return [
        t
        for t in trials
        if t is not best
        and bv is not None
        and (v := value_of(t, objective.key, objective.at))
        and sign * v.value > sign * bv.value
    ]


def knob_limits(
    best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData], share: float
) -> list[tuple[str, Limit]]:
    """A knob verdict's statements: each of the best's constraints and, for each trial with a better
    knob, the constraint it misses most clearly, as one-sided limits between runs, the share
    ``share`` of the error ``1 - confidence`` (a look's, :func:`orchestrator.objective.race.look_share`)
    split over these statements (Bonferroni). Empty without constraints, with one run, or at no share."""
    if not objective.subject_to or not best.runs or share <= 0.0:
        return []
    alpha = knob_alpha(best, better, objective, trials, share)
    statements = [(best.name, lim) for lim in constraint_limits(best, objective, trials, alpha)]
    for t in better:
        missed = constraint_limits(t, objective, trials, alpha, missed=True)
        if missed:  # the constraint it misses most clearly: its limit furthest past the bound
            statements.append(
                (
                    t.name,
                    max(missed, key=lambda x: (x.limit - x.bound) / (abs(x.bound) or 1.0) * (-1 if x.above else 1)),
                )
            )
    return statements


def knob_alpha(
    best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData], share: float
) -> float:
    """Each of a knob verdict's statements' error: the share ``share`` of ``1 - confidence`` split
    over the best's constraints and the trials with a better knob (Bonferroni)."""
    count = len(constraint_limits(best, objective, trials, 0.05)) + len(better)
    return (1.0 - objective.confidence) * share / max(count, 1)


def knob_share(best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData]) -> float:
    """The share of the error a knob verdict read from the runs alone spends, as the race spent it:
    the interim look's at the best's runs where its statements all held there (the race stopped on
    them), else the race's last look's (what the interim looks before it left)."""
    n = 1 + len(best.runs)
    interim = look_share(n, objective.most_runs, False)
    said = knob_limits(best, better, objective, trials, interim)
    if said and all(lim.holds for _, lim in said):
        return interim
    return look_share(n, objective.most_runs, True)


def _knob_confidence(
    best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData]
) -> str:
    """How sure a knob verdict is (:func:`knob_limits` at :func:`knob_share`). Empty without
    constraints or with one run."""
    statements = knob_limits(best, better, objective, trials, knob_share(best, better, objective, trials))
    if not statements:
        return ""
    conf = f"{objective.confidence * 100:.4g}%"
    said = "; ".join(f"{'' if name == best.name else name + ': '}{lim.words()}" for name, lim in statements)
    if all(lim.holds for _, lim in statements):
        return f", with {conf} confidence for all these statements together (one-sided limits between runs: {said})"
    failing = "; ".join(f"{name}: {lim.words()}" for name, lim in statements if not lim.holds)
    return (
        f", but not yet with {conf} confidence (one-sided limits between runs: {failing}): more runs would tell "
        "(objective.max_repeats, objective.budget)"
    )


def knob_effects(trials: list[TrialData], varied: list[str], objective: ObjectiveSpec) -> list[str]:
    """For each varied knob, a markdown table: its value per trial and what the objective's
    metric and constraints measured there."""
    keys = [
        k
        for k in dict.fromkeys([objective.key, *objective.subject_to, *objective.show])
        if not ("." in k and "/" not in k)
    ]
    out: list[str] = []
    for knob in varied:
        if knob in keys:
            continue
        rows = sorted(trials, key=lambda t: (t.num(knob) is None, t.num(knob) or 0.0, str(t.param(knob))))
        out += [
            f"What `{knob}` changed:",
            "",
            "| " + " | ".join([knob, "trial", *keys]) + " |",
            "|" + "---|" * (2 + len(keys)),
        ]
        for t in rows:
            cells = [(lambda v: show(v) if v else "")(value_of(t, k, objective.at)) for k in keys]
            out.append("| " + " | ".join([str(t.param(knob)), t.name, *cells]) + " |")
        out.append("")
    return out
