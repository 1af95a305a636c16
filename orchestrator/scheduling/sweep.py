"""The driver's loop over a sweep: run trials on Ray, write each result to disk, then log it.

Results reach MLflow only after they are on disk (``<sweep_dir>/trials/<hash>/``), so a
tracking failure loses nothing. A progress line is printed per finished trial. Each result is
recorded by :class:`~orchestrator.scheduling.recorder.Recorder`; the report and the status table
are :mod:`orchestrator.scheduling.sweep_report`'s.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.config.errors import DiskFullError, OrchestratorError
from orchestrator.config.logs import Progress, mark, print_progress
from orchestrator.config.schema import SweepSettings
from orchestrator.config.secrets import redact_text
from orchestrator.decide.race import races
from orchestrator.engines.process import interrupts_stop_servers
from orchestrator.feasibility import assess
from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling import outcome
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.preview import dry_run, share_key
from orchestrator.scheduling.race_memory import forecast
from orchestrator.scheduling.ray_exec import (
    cluster_gpus,
    largest_node_cpus,
    run_jobs,
)
from orchestrator.scheduling.recorder import Recorder, log_partial_results, trial_dir
from orchestrator.scheduling.resume import earlier_runs, read_back
from orchestrator.scheduling.rounds import run_race
from orchestrator.scheduling.sweep_report import report_sweep, status_table
from orchestrator.scheduling.sweep_start import Started, SweepStart
from orchestrator.tracking import ui_command

log = logging.getLogger(__name__)


def absolute_dir(path: str | os.PathLike[str]) -> Path:
    """The sweep folder as an absolute path, fixed once where the sweep starts: trials, engines
    and lm-eval run in other processes and folders, where Hydra's relative default
    (``multirun/...``) would point somewhere else."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def run_sweep(
    jobs: list[TrialJob],
    sweep_dir: Path,
    sweep_name: str,
    sweep_params: dict[str, Any] | None = None,
    progress: Progress = print_progress,
    continuing: bool = False,
    race: bool = True,
) -> list[TrialResult]:
    """Run every job, persist and log each result; returns the results in completion order.

    ``continuing``: a later batch of the same Hydra multirun (a search's next trials): its
    trials join the batch before's MLflow parent run instead of starting a new one. ``race``:
    after the first pass, the objective's race (``scheduling.rounds``; off for a search's batches).

    The steps: :class:`.sweep_start.SweepStart` (MLflow in its own thread while Ray starts or connects; on
    resume, the trials FINISHED already left out), :func:`_run_recorded` (the trials, each
    recorded as it finishes; Ctrl-C and a full disk), :func:`_conclude` (report and summary)."""
    if not jobs:
        raise OrchestratorError("the sweep has no trials")
    sweep_dir = absolute_dir(sweep_dir)
    settings = jobs[0].settings
    if settings.dry_run:
        dry_run(jobs, progress)
        return []
    sweep_dir.mkdir(parents=True, exist_ok=True)
    start = SweepStart(jobs, sweep_dir, sweep_name, sweep_params or {}, continuing, progress)
    mark("jobs validated")
    started = start.begin()
    if started is None:  # resume: every trial FINISHED already
        return []
    record = started.record
    _run_recorded(jobs, started, race)
    _conclude(start.experiment, settings, record)
    return record.results


def _run_recorded(jobs: list[TrialJob], started: Started, race: bool = True) -> None:
    """The trials not done already run, each recorded as it finishes. Ctrl-C stops the running
    ones (and their servers) and keeps what they measured; a full disk stops the sweep. Either way
    Ray stops and the sweep's run ends with the sweep's status."""
    done, record, ray_ctx = started.done, started.record, started.ray
    progress = record.progress
    status = "FAILED"
    try:
        with interrupts_stop_servers():
            objective = jobs[0].settings.objective
            if race and races(objective) and (line := forecast(jobs)) is not None:
                progress(line)  # what the last race of these trials here cost, before this one starts
            _run_trials(jobs, done, record)
            # resume: the trials FINISHED before join this sweep's results, for its verdict and race
            # (and, for its race, the repeats run before: one lookup in MLflow for both)
            stored = earlier_runs(jobs, done, record, started.within) if race and done and objective is not None else {}
            earlier = read_back(jobs, done, stored, record) if race and done and objective is not None else []
            if race and races(objective) and earlier is not None:
                # the budget counts the first pass whole: the earlier trials' time as well
                concurrent = jobs[0].spec.platform.max_concurrent_trials or 1
                first_pass_s = (
                    time.monotonic() - record.t0 + sum(r.ended_at - r.started_at for r in earlier) / concurrent
                )
                run_race(jobs, record, first_pass_s, lambda round_jobs: _run_round(round_jobs, record, stored))
            elif race and races(objective):
                progress("race: not run on this resumed sweep (resume=false races every trial again)")
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        progress("interrupted: running trials were stopped (and their servers)")
        log_partial_results(jobs, record.results, record.sweep_dir, record.tracker_if_open(), record.commit, progress)
        raise
    except DiskFullError as exc:  # nothing more can be kept: stop now rather than measure for nothing
        progress(
            f"stopping the sweep: {exc.path}: no space left; running trials were stopped (and their servers); "
            f"{len(record.results)} trial result(s) written before are whole on disk and in MLflow"
        )
        raise
    finally:
        ray_ctx.shutdown()
        record.end_sweep(status)


def _conclude(experiment: str, settings: SweepSettings, record: Recorder) -> None:
    """The sweep's end: its report, the status table, the counts, and where MLflow shows it."""
    progress, tracker = record.progress, record.tracker
    report_sweep(
        experiment,
        record.results,
        record.sweep_dir,
        tracker,
        progress,
        settings.objective,
        record.dirs,
        settings.expect,
        record.run_ids,
    )
    for line in status_table([r for r in record.results if not r.repeat_of]):
        progress(line)
    if any(k.endswith("FAILED") for k in record.counts):
        outcome.note(outcome.TRIAL_FAILED)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(record.counts.items()))
    progress(f"sweep '{experiment}' done in {time.monotonic() - record.t0:.0f}s: {summary}")
    if tracker is not None:
        uri = settings.tracking.uri
        shown = redact_text(uri)  # a URI's password is not printed
        progress(f"MLflow: experiment '{experiment}' at {shown}")
        if uri.startswith(("http://", "https://")):
            progress(f"MLflow UI: {shown.rstrip('/')}/{tracker.ui_path()}")
        else:
            progress(f"MLflow UI: start it ({ui_command(shown)}), then open http://127.0.0.1:5000/{tracker.ui_path()}")


def _run_round(jobs: list[TrialJob], record: Recorder, earlier: dict[str, tuple[str, TrialResult]]) -> None:
    """A round of the race; the runs an earlier sweep FINISHED (``earlier``: resume, read back by
    :func:`.resume.earlier_runs`) join it rather than run again (the same requests: a round's seed
    is its run)."""
    for job in jobs:
        if job.trial_hash in earlier:
            run_id, result = earlier[job.trial_hash]
            record.adopt(job, result, run_id)
    rest = [j for j in jobs if j.trial_hash not in earlier]
    if rest:
        _run_trials(rest, {}, record)


def _run_trials(jobs: list[TrialJob], done: dict[str, str], record: Recorder) -> None:
    """Infeasible trials are SKIPPED here, never submitted (Ray would wait forever); the others
    run on Ray, each recorded as it finishes."""
    settings = jobs[0].settings
    # the CPUs a node offers are judged on a local Ray only: a cluster's autoscaler may add nodes
    gpus, cpus = cluster_gpus(), (largest_node_cpus() if settings.cluster.address is None else None)
    runnable, skipped = [], []
    for job in jobs:
        if job.trial_hash in done:
            record.counts["ALREADY_FINISHED"] += 1
            continue
        reason = assess(job.spec, gpus, cpus)
        if reason is None:
            runnable.append(job)
        else:
            skipped.append((job, reason))

    def record_skipped() -> None:  # once the first trials are submitted: they do not wait for MLflow
        if skipped:
            from orchestrator.trial import skipped_result  # the trial's stack, not the driver's (0.2 s)

            for job, reason in skipped:
                record.finish(job, skipped_result(job.spec, job.overrides, reason))

    if not runnable:
        record_skipped()
        return
    for job, result in run_jobs(
        runnable,
        lambda j: str(trial_dir(record.sweep_dir, j)),
        jobs[0].spec.platform.max_concurrent_trials,
        max_attempts=settings.cluster.max_attempts,
        progress=record.progress,
        share_key=share_key if settings.reuse_servers else None,
        submitted=record_skipped,
    ):
        record.finish(job, result)
