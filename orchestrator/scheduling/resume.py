"""A resumed sweep (``resume=true``): the trials an earlier sweep FINISHED are not run again
(:func:`already_finished`); their runs, and the repeats their race made, are read back from
MLflow (:func:`earlier_runs`) and their results join this sweep's (:func:`read_back`), so its
verdict covers every trial and its race goes on from where it was.

A later batch of the same sweep (a search's next trials, a tuning's next step) reads back what
its own earlier batches measured whatever ``resume`` says (``within``: the sweep's MLflow run):
``resume=false`` measures afresh what earlier commands measured, never a run of this one twice."""

from __future__ import annotations

from orchestrator.config.logs import Progress
from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.recorder import Recorder
from orchestrator.scheduling.rounds import repeat_job
from orchestrator.tracking import MlflowTracker


def already_finished(
    jobs: list[TrialJob], tracker: MlflowTracker | None, progress: Progress, within: str | None = None
) -> dict[str, str]:
    """Trials of this sweep that already have a FINISHED run (resume; ``within``: in this sweep's
    MLflow run, by an earlier batch): they are not run again."""
    if tracker is None:
        return {}
    try:
        done = tracker.finished_run_ids((j.trial_hash for j in jobs), within)
    except Exception as exc:  # cannot tell: run everything rather than guess
        progress(f"warning: could not look up finished trials in MLflow ({exc}); running every trial")
        return {}
    for job in jobs:
        if job.trial_hash not in done:
            continue
        if within is None:
            progress(f"{job.label}: already FINISHED (run {done[job.trial_hash]}); skipped (resume=false re-runs it)")
        else:
            progress(f"{job.label}: measured earlier in this sweep (run {done[job.trial_hash]}); read back")
    return done


def earlier_runs(
    jobs: list[TrialJob], done: dict[str, str], record: Recorder, within: str | None = None
) -> dict[str, tuple[str, TrialResult]]:
    """Resume: the runs an earlier sweep FINISHED (``within``: an earlier batch of this one), by
    trial hash, with their run ids, read back from MLflow in one lookup: the trials of ``done``
    and every repeat their race may have."""
    objective = jobs[0].settings.objective
    most = objective.most_runs if objective is not None else 1
    hashes = [j.trial_hash for j in jobs if j.trial_hash in done]
    hashes += [repeat_job(j, run).trial_hash for j in jobs for run in range(1, most)]
    if record.tracker is None:
        return {}
    try:
        return record.tracker.finished_results(hashes, within)
    except Exception as exc:  # an older run's artifact, an unreachable store: the sweep goes on
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        record.progress(f"warning: could not read the earlier runs back from MLflow ({why})")
        return {}


def read_back(
    jobs: list[TrialJob], done: dict[str, str], stored: dict[str, tuple[str, TrialResult]], record: Recorder
) -> list[TrialResult] | None:
    """Resume: the results of the trials an earlier sweep FINISHED (``done``; ``stored``: as read
    back from MLflow) join this sweep's, so its verdict covers every trial and its race goes on
    from their runs; None when they cannot be read (said: the verdict then covers this sweep's
    trials only)."""
    wanted = [j for j in jobs if j.trial_hash in done]
    missing = [j.label for j in wanted if j.trial_hash not in stored]
    if missing:
        why = "tracking is off" if record.tracker is None else "no result.json read"
        record.progress(
            f"warning: the earlier runs of {', '.join(missing)} could not be read back from MLflow ({why}): "
            "the verdict covers this sweep's trials only"
        )
        return None
    for job in wanted:
        record.adopt(job, stored[job.trial_hash][1], stored[job.trial_hash][0])
    return [stored[j.trial_hash][1] for j in wanted]
