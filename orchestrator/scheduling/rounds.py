"""The race after a sweep's first pass: the trials that cannot yet be told apart from the leader
run again (fresh requests, the same for every trial of a round) until the verdict is decided at
one of the race's looks (:func:`orchestrator.decide.looks.interim_looks`), a trial has run
``objective.max_repeats`` times (``auto``: as many as planned after the third run and again at
each later look, :func:`orchestrator.decide.race.planned_runs`), or the next round would pass
the budget (``objective.budget`` first passes). A knob's race (:func:`orchestrator.decide.verdict.knob_standing`) runs on
until its verdict's one-sided limits between runs hold. The statistics are :mod:`orchestrator.decide.race`'s;
the verdict reads the same runs (docs/statistics.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.config.metric_keys import is_knob
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.config.schema.goals import AUTO_MAX_RUNS
from orchestrator.decide.looks import PILOT_RUNS, Schedule
from orchestrator.decide.race import ONE_RUN, OPEN, RaceState, planned_runs, planning_sd, races
from orchestrator.decide.verdict import decide, knob_standing, race_over
from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.outcome import minutes
from orchestrator.scheduling.race_memory import remember
from orchestrator.scheduling.recorder import Recorder
from orchestrator.tracking.runs import from_results


def standing(results: list[TrialResult], objective: ObjectiveSpec, final: bool = False) -> RaceState | None:
    """The race over every run recorded so far, at an interim look (``final``: its last look);
    None: nothing left to compare."""
    data = from_results(results, "race", objective=objective)
    verdict = decide(data.finished, objective)  # who meets the constraints
    if is_knob(objective.key):
        return knob_standing(verdict, objective, final)
    if len(verdict.feasible) < 2:
        return None
    return race_over(verdict.feasible, objective, final)


def run_race(
    jobs: list[TrialJob],
    record: Recorder,
    first_pass_s: float,
    run_round: Callable[[list[TrialJob]], None],
) -> None:
    """Rounds of repeats after the first pass (``run_round`` runs and records a round's jobs).
    The race looks at the rounds of :func:`interim_looks` and at its last; between looks the
    same trials run again. With ``max_repeats: auto`` its last round is planned (tagged on the
    sweep's run, ``race_planned_runs``); the verdict needs no plan to spend the error as it did.
    How it ended is kept for the next sweep of these trials on this machine (:mod:`.race_memory`)."""
    objective = jobs[0].settings.objective
    if objective is None or not races(objective):
        return
    ended = _race(jobs, record, first_pass_s, run_round, objective)
    if ended is not None:
        concurrent = jobs[0].spec.platform.max_concurrent_trials or 1
        remember(jobs, ended[0], ended[1], _round_s(record, jobs, concurrent), first_pass_s)


def _race(
    jobs: list[TrialJob],
    record: Recorder,
    first_pass_s: float,
    run_round: Callable[[list[TrialJob]], None],
    objective: ObjectiveSpec,
) -> tuple[RaceState, int] | None:
    """The race's rounds; where it stood when it ended, and the runs each it made."""
    progress = record.progress
    deadline = time.monotonic() + objective.budget * first_pass_s
    ceiling = deadline + objective.stretch * first_pass_s  # the most a stretch may reach
    by_hash = {job.trial_hash: job for job in jobs}
    concurrent = jobs[0].spec.platform.max_concurrent_trials or 1
    # a knob's race tests no means: whether trials meet the constraints is read every round
    schedule = Schedule(objective.most_runs, objective.max_repeats == "auto", is_knob(objective.key))
    names: list[str] = []
    run = 1
    while True:
        state = standing(record.results, objective)
        if state is None:
            return None
        if schedule.plans_at(run):
            _plan(state, schedule, jobs, record, deadline - time.monotonic(), concurrent)
        last = schedule.last(run)
        if last:
            state = standing(record.results, objective, final=True) or state
        if run > 1 and (last or schedule.looks_at(run)) and state.answer != OPEN:
            progress(f"race: decided after {run} runs ({state.answer})")
            return state, run
        if last:
            return state, run
        if run == 1:  # run 2: noise is not known yet (a knob's: of the trials the verdict reads)
            names = (state.to_repeat() if is_knob(objective.key) else []) or list(state.runs)
        elif schedule.looks_at(run):  # between looks the same trials run again
            names = state.to_repeat()
        called = names_of(record.results)
        chosen = [j for j in jobs if called.get(j.trial_hash) in names and j.trial_hash in by_hash]
        if not chosen:
            return state, run
        chosen = _rotated(chosen, run)
        round_s = _round_s(record, chosen, concurrent)
        left = deadline - time.monotonic()
        if round_s > left and (stretched := _stretch(state, run, round_s, ceiling, objective, progress)):
            deadline, ceiling = stretched, stretched  # once: the runs deciding needs, and no more
            left = deadline - time.monotonic()
        if round_s > left:
            return _stopped(record, objective, state, run, (len(chosen), round_s, left), first_pass_s), run
        who = ", ".join(called[j.trial_hash] for j in chosen)
        progress(
            f"race: run {run + 1} of {who} ({_why_again(run, state, objective)}; fresh requests, the same for each)"
        )
        run_round([repeat_job(j, run) for j in chosen])
        run += 1


def _rotated(chosen: list[TrialJob], run: int) -> list[TrialJob]:
    """Each round starts with another trial (a rotation: for two, AB then BA, a crossover), so
    what a round's first or last place brings (the fresh server start, the machine after the
    last round) falls on every trial alike and never passes for a difference between them."""
    turn = run % len(chosen)
    return chosen[turn:] + chosen[:turn]


def _why_again(run: int, state: RaceState, objective: ObjectiveSpec) -> str:
    """Why the trials of the next round run again, in words."""
    if run == 1:
        return "every trial's run-to-run noise is not known yet"
    if is_knob(objective.key):
        return f"the verdict on {state.leader}'s constraints is not yet sure"
    return f"not yet told apart from {state.leader}"


def _stopped(
    record: Recorder,
    objective: ObjectiveSpec,
    state: RaceState,
    run: int,
    ahead: tuple[int, float, float],
    first: float,
) -> RaceState:
    """The budget stops the race before its next round (``ahead``: its trials, its time, the time
    left): this is its last look, which spends what the looks before left; said with what it
    decided, or what deciding would cost."""
    trials, round_s, left = ahead
    state = standing(record.results, objective, final=True) or state
    spent = objective.budget - max(left, 0) / max(first, 1e-9)
    record.progress(
        f"race: stopping before run {run + 1}: a round of {trials} trial(s) takes ~{round_s:.0f}s, "
        f"the budget has {max(left, 0):.0f}s left (objective.budget={objective.budget:g} first passes)"
        + (
            _cost(state, run, round_s, spent, first)
            if state.answer == OPEN
            else ""
            if state.answer == ONE_RUN  # the first pass only: nothing between runs to decide on
            else f"; decided at this, its last look ({state.answer})"
        )
    )
    return state


def _stretch(
    state: RaceState,
    run: int,
    round_s: float,
    ceiling: float,
    objective: ObjectiveSpec,
    progress: Callable[[str], None],
) -> float | None:
    """Past the budget, once: the new deadline where the runs that would decide the race (at the
    noise and the difference measured, :meth:`RaceState.runs_to_decide_all`) end before ``ceiling``
    (``objective.stretch`` first passes past the budget); None: stop at the budget."""
    need = state.runs_to_decide_all()
    now = time.monotonic()
    if need is None or need <= run or now + (need - run) * round_s > ceiling:
        return None
    more = (need - run) * round_s
    progress(
        f"race: past its budget (objective.budget={objective.budget:g} first passes): deciding needs about {need} "
        f"runs each (~{minutes(more)} more here), within objective.stretch={objective.stretch:g}: running them"
    )
    return now + more * 1.1 + 1.0  # a round's time varies: a tenth to spare


def _cost(state: RaceState, run: int, round_s: float, spent: float, first_pass_s: float) -> str:
    """What deciding would cost here, said when the race stops short of it: the runs each at the
    noise measured, the time and the budget they take (``spent``: first passes of it spent so far),
    and what the runs made can tell."""
    tells = state.tells_at(run)
    if (need := state.runs_to_decide_all()) is None:
        return f"; at the noise measured no practical number of runs decides it here; {tells}" if tells else ""
    more = max(need - run, 0) * round_s
    budget = f" objective.budget={spent + more / first_pass_s:.1f}" if first_pass_s > 0 else ""
    return f"; deciding needs about {need} runs each (~{minutes(more)} more here: objective.max_repeats={need}{budget}); {tells}"


def _plan(
    state: RaceState, schedule: Schedule, jobs: list[TrialJob], record: Recorder, left_s: float, concurrent: int
) -> None:
    """``max_repeats: auto``'s plan, made after the pilot's runs (``PILOT_RUNS``) and again at each
    later interim look: the runs each from the spread between runs and what the budget affords
    (rounds of the trials still racing); said and tagged when it changes."""
    called = names_of(record.results)
    racing = [j for j in jobs if called.get(j.trial_hash) in state.to_repeat()] or jobs
    round_s = _round_s(record, racing, concurrent)
    made = max(state.runs.values(), default=PILOT_RUNS)
    affordable = made + (int(max(left_s, 0.0) // round_s) if round_s > 0 else AUTO_MAX_RUNS)
    before = schedule.plan
    if not schedule.replan(planned_runs(state, affordable, AUTO_MAX_RUNS)):
        return
    noise = "the noise"
    if state.need is not None:
        noise = f"the spread between runs, the verdict's limits hold after {state.need}"
    elif state.comparisons and state.comparisons[0].log_scale:
        noise = f"{state.sd:.1%} between runs, planned for {planning_sd(state):.1%} (its 80% upper limit)"
    again = "" if before is None else f" (was {before}; planned again after {made} runs)"
    short, plan = "", schedule.plan or made
    if (wanted := planned_runs(state, AUTO_MAX_RUNS, AUTO_MAX_RUNS)) > plan:  # the budget cut it short
        short = (
            f"; to tell two equal trials tied the noise asks for {wanted} (~{minutes((wanted - made) * round_s)} "
            f"more here; a wider difference decides sooner), so the race may end undecided: {state.tells_at(plan)}"
        )
    record.progress(
        f"race: planning {schedule.plan} runs each at most{again} (objective.max_repeats=auto: at {noise}, "
        f"the budget affords {min(affordable, AUTO_MAX_RUNS)}, at most {AUTO_MAX_RUNS}){short}"
    )
    tracker = record.tracker
    if tracker is not None:
        tracker.set_sweep_tags({"race_planned_runs": str(schedule.plan)})


def _round_s(record: Recorder, jobs: list[TrialJob], concurrent: int) -> float:
    """How long a round of ``jobs`` takes, from their latest runs."""
    took = [_duration(record.results, j.trial_hash) for j in jobs]
    return max(max(took), sum(took) / concurrent) if took else 0.0


def repeat_job(job: TrialJob, run: int) -> TrialJob:
    """The job's ``run``-th repeat: the same configuration, fresh requests (its own trial hash)."""
    return TrialJob(job.index, [*job.overrides, f"run={run}"], job.spec.model_copy(update={"run": run}), job.settings)


def names_of(results: list[TrialResult]) -> dict[str, str]:
    """Each first run's trial hash -> its name as the race and the report call it
    (``TrialData.name``: configurations of one variant told apart by their knobs)."""
    return {t.trial_hash: t.name for t in from_results(results, "race").trials}


def _duration(results: list[TrialResult], trial_hash: str) -> float:
    """How long the trial's latest run took."""
    runs = [r for r in results if trial_hash in (r.trial_hash, r.repeat_of)]
    return max(0.0, runs[-1].ended_at - runs[-1].started_at) if runs else 0.0
