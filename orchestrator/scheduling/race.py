"""The race after a sweep's first pass: the trials that cannot yet be told apart from the leader
run again (fresh requests, the same for every trial of a round) until the verdict is decided,
a trial has run ``objective.max_repeats`` times (``auto``: as many as planned after the third
run, :func:`orchestrator.objective.race.planned_runs`), or the next round would pass the budget
(``objective.budget`` first passes). The statistics are ``objective.race``'s; the verdict reads
the same runs (docs/statistics.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.config.metric_keys import is_knob
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.config.schema.trial import AUTO_MAX_RUNS
from orchestrator.metrics.result import TrialResult
from orchestrator.objective import value_of
from orchestrator.objective.race import (
    OPEN,
    PILOT_RUNS,
    UNDECIDED,
    WIN,
    Comparison,
    RaceState,
    planned_runs,
    planning_sd,
)
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.recorder import Recorder


def races(objective: ObjectiveSpec | None) -> bool:
    """Whether a sweep with this objective races: a metric, or a knob under constraints (a knob
    does not vary between runs; whether a trial meets the constraints does)."""
    if objective is None or objective.most_runs <= 1:
        return False
    return not is_knob(objective.key) or bool(objective.subject_to)


def standing(results: list[TrialResult], objective: ObjectiveSpec) -> RaceState | None:
    """The race over every run recorded so far (None: nothing left to compare)."""
    from orchestrator.report.verdict import decide, knob_doubts, race_over
    from orchestrator.tracking.runs import from_results

    data = from_results(results, "race", objective=objective)
    verdict = decide(data.finished, objective)  # who meets the constraints
    if is_knob(objective.key):  # every trial with its knob set: its constraints measured
        measured = [t for t in data.finished if value_of(t, objective.key, objective.at) is not None]
        doubts = [t.name for t in knob_doubts(data.finished, objective, verdict)]
        leader = verdict.best.name if verdict.best is not None else None
        state = RaceState(leader, runs={t.name: 1 + len(t.runs) for t in measured}, answer=OPEN if doubts else WIN)
        state.comparisons = [Comparison(n, UNDECIDED, 1.0, 1.0, 1.0, False) for n in doubts]
        return state if len(measured) > 1 else None
    if len(verdict.feasible) < 2:
        return None
    return race_over(verdict.feasible, objective)


def run_race(
    jobs: list[TrialJob],
    record: Recorder,
    first_pass_s: float,
    run_round: Callable[[list[TrialJob]], None],
) -> ObjectiveSpec | None:
    """Rounds of repeats after the first pass (``run_round`` runs and records a round's jobs).
    Returns the objective the verdict reads: with ``max_repeats: auto``, the race's plan in its
    place (also tagged on the sweep's run, ``race_planned_runs``)."""
    objective = jobs[0].settings.objective
    if objective is None or not races(objective):
        return objective
    progress = record.progress
    deadline = time.monotonic() + objective.budget * first_pass_s
    by_hash = {job.trial_hash: job for job in jobs}
    concurrent = jobs[0].spec.platform.max_concurrent_trials or 1
    limit, run = objective.most_runs, 1
    while run < limit:
        state = standing(record.results, objective)
        if state is None:
            return objective
        if run == PILOT_RUNS and objective.max_repeats == "auto":
            objective, limit = _plan(state, objective, jobs, record, deadline - time.monotonic(), concurrent)
            state = standing(record.results, objective) or state
        if run > 1 and state.answer != OPEN:
            progress(f"race: decided after {run} runs ({state.answer})")
            return objective
        if run >= limit:
            return objective
        names = state.to_repeat() if run > 1 else list(state.runs)  # run 2: noise is not known yet
        chosen = [j for j in jobs if _name(j) in names and j.trial_hash in by_hash]
        if not chosen:
            return objective
        # each round starts with another trial (a rotation: for two, AB then BA, a crossover), so
        # what a round's first or last place brings (the fresh server start, the machine after
        # the last round) falls on every trial alike and never passes for a difference between them
        turn = run % len(chosen)
        chosen = chosen[turn:] + chosen[:turn]
        round_s = _round_s(record, chosen, concurrent)
        left = deadline - time.monotonic()
        if round_s > left:
            progress(
                f"race: stopping before run {run + 1}: a round of {len(chosen)} trial(s) takes ~{round_s:.0f}s, "
                f"the budget has {max(left, 0):.0f}s left (objective.budget={objective.budget:g} first passes)"
            )
            return objective
        who = ", ".join(_name(j) for j in chosen)
        why = (
            "every trial's run-to-run noise is not known yet" if run == 1 else f"not yet told apart from {state.leader}"
        )
        progress(f"race: run {run + 1} of {who} ({why}; fresh requests, the same for each)")
        run_round([repeat_job(j, run) for j in chosen])
        run += 1
    return objective


def _plan(
    state: RaceState, objective: ObjectiveSpec, jobs: list[TrialJob], record: Recorder, left_s: float, concurrent: int
) -> tuple[ObjectiveSpec, int]:
    """``max_repeats: auto`` resolved after the pilot's runs (``PILOT_RUNS``): the runs each from the
    spread between runs and what the budget affords (rounds of the trials still racing), said and tagged."""
    racing = [j for j in jobs if _name(j) in state.to_repeat()] or jobs
    round_s = _round_s(record, racing, concurrent)
    affordable = PILOT_RUNS + (int(max(left_s, 0.0) // round_s) if round_s > 0 else AUTO_MAX_RUNS)
    n = planned_runs(state, affordable, AUTO_MAX_RUNS)
    noise = "the noise"
    if state.comparisons and state.comparisons[0].log_scale:
        noise = f"{state.sd:.1%} between runs, planned for {planning_sd(state):.1%} (its 80% upper limit)"
    record.progress(
        f"race: planning {n} runs each at most (objective.max_repeats=auto: at {noise}, the budget affords "
        f"{min(affordable, AUTO_MAX_RUNS)}, at most {AUTO_MAX_RUNS})"
    )
    tracker = record.tracker
    if tracker is not None:
        tracker.set_sweep_tags({"race_planned_runs": str(n)})
    return objective.model_copy(update={"max_repeats": n}), n


def _round_s(record: Recorder, jobs: list[TrialJob], concurrent: int) -> float:
    """How long a round of ``jobs`` takes, from their latest runs."""
    took = [_duration(record.results, j.trial_hash) for j in jobs]
    return max(max(took), sum(took) / concurrent) if took else 0.0


def repeat_job(job: TrialJob, run: int) -> TrialJob:
    """The job's ``run``-th repeat: the same configuration, fresh requests (its own trial hash)."""
    return TrialJob(job.index, [*job.overrides, f"run={run}"], job.spec.model_copy(update={"run": run}), job.settings)


def _name(job: TrialJob) -> str:
    """The job's name as the report's data calls it (``TrialData.name``)."""
    return job.spec.variant or f"trial-{job.trial_hash[:8]}"


def _duration(results: list[TrialResult], trial_hash: str) -> float:
    """How long the trial's latest run took."""
    runs = [r for r in results if trial_hash in (r.trial_hash, r.repeat_of)]
    return max(0.0, runs[-1].ended_at - runs[-1].started_at) if runs else 0.0
