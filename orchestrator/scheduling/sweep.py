"""The driver's loop over a sweep: run trials on Ray, write each result to disk, then log it.

Results reach MLflow only after they are on disk (``<sweep_dir>/trials/<hash>/``), so a
tracking failure loses nothing. A progress line is printed per finished trial. Each result is
recorded by :class:`~orchestrator.scheduling.recorder.Recorder`; the report and the status table
are :mod:`orchestrator.scheduling.sweep_report`'s.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator.config.errors import DiskFullError, OrchestratorError
from orchestrator.config.logs import Progress, mark, print_progress
from orchestrator.config.paths import PROJECT_ROOT
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
    RayContext,
    cluster_gpus,
    init_ray,
    largest_node_cpus,
    prepare_workers,
    run_jobs,
)
from orchestrator.scheduling.recorder import Recorder, log_partial_results, trial_dir
from orchestrator.scheduling.resume import already_finished, earlier_runs, read_back
from orchestrator.scheduling.rounds import run_race
from orchestrator.scheduling.sweep_report import report_sweep, status_table
from orchestrator.tracking import MlflowTracker, ui_command

log = logging.getLogger(__name__)


def git_commit(root: Path = PROJECT_ROOT) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


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

    The steps: :class:`_SweepStart` (MLflow in its own thread while Ray starts or connects; on
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
    start = _SweepStart(jobs, sweep_dir, sweep_name, sweep_params or {}, continuing, progress)
    mark("jobs validated")
    started = start.begin()
    if started is None:  # resume: every trial FINISHED already
        return []
    ray_ctx, done, record = started
    _run_recorded(jobs, done, record, ray_ctx, race)
    _conclude(start.experiment, settings, record)
    return record.results


class _SweepStart:
    """The sweep's start, in steps: MLflow's store opens in its own thread while Ray starts or
    connects; the sweep's parent run is made in that thread as soon as the store is open (on
    resume, once MLflow said which trials are FINISHED already); no trial waits for it."""

    mlflow: ThreadPoolExecutor  # one thread does MLflow's work in order
    opening: Future[MlflowTracker | None]  # the store opening
    commit: str

    def __init__(
        self,
        jobs: list[TrialJob],
        sweep_dir: Path,
        sweep_name: str,
        sweep_params: dict[str, Any],
        continuing: bool,
        progress: Progress,
    ) -> None:
        self.jobs, self.sweep_dir, self.sweep_name = jobs, sweep_dir, sweep_name
        self.sweep_params, self.continuing, self.progress = sweep_params, continuing, progress
        self.settings = jobs[0].settings
        self.experiment = self.settings.tracking.experiment_name or jobs[0].spec.experiment

    def begin(self) -> tuple[RayContext, dict[str, str], Recorder] | None:
        """Ray ready, the trials FINISHED already (resume: by hash, with their run ids) and the
        recorder of the others; None when there is nothing to run (Ray stopped again)."""
        self._open_tracking()
        ray_ctx = self._start_ray()
        # nothing to ask MLflow before the trials start: the parent run is made as soon as it opens
        starting = None if self.settings.resume else self.mlflow.submit(self._sweep_run)
        try:
            done: dict[str, str] = {}
            if starting is None:  # resume: MLflow answers first, which trials are FINISHED already
                done = self._finished_already()
                # every trial FINISHED: nothing to run, unless their race may go on (more runs or budget)
                if len(done) == len(self.jobs) and not races(self.settings.objective):
                    self.progress(
                        f"sweep '{self.experiment}': all {len(self.jobs)} trial(s) already FINISHED; nothing to run "
                        "(resume=false runs them again)"
                    )
                    ray_ctx.shutdown()
                    return None
                starting = self.mlflow.submit(self._sweep_run)
            # Without resume the first trial is submitted at once, to the worker Ray starts as the
            # driver connects: a preparation task would take that one and make Ray start a second,
            # both on the cores MLflow is opening on (benchmarks/quick_start).
            record = Recorder(self.sweep_dir, starting, self.commit, len(self.jobs) - len(done), self.progress)
            self.progress(f"sweep '{self.experiment}': {len(self.jobs)} trial(s); results in {self.sweep_dir}")
        except BaseException:
            ray_ctx.shutdown()
            raise
        finally:
            self.mlflow.shutdown(wait=False)  # its thread ends when its work is done
        return ray_ctx, done, record

    def _open_tracking(self) -> None:
        """MLflow's store starts opening in the MLflow thread."""
        # MLflow's import and store (~2 s here) open while Ray starts or connects (~4 s cold, ~0.05 s
        # to a running cluster): the first request goes out that much sooner (benchmarks/quick_start).
        # Ray is imported first: two imports in two threads share one GIL and both take twice as
        # long, and the sooner the driver connects, the sooner Ray starts the job's first worker.
        import ray  # noqa: F401

        # One thread does MLflow's work in order: open the store, then (once it is known that the
        # sweep runs) make the sweep's parent run; the trials do not wait for the parent run.
        self.mlflow = ThreadPoolExecutor(1, thread_name_prefix="mlflow")
        tracking = self.settings.tracking
        self.opening = self.mlflow.submit(_open_tracker, tracking.uri, self.experiment, tracking.enabled, self.progress)
        self.commit = git_commit()

    def _start_ray(self) -> RayContext:
        """Ray started here or connected to (``cluster.address``); the MLflow thread let go if it fails."""
        try:
            ray_ctx = init_ray(self.settings.cluster)
        except BaseException:
            self.mlflow.shutdown(wait=False)
            raise
        mark("Ray ready")
        return ray_ctx

    def _sweep_run(self) -> MlflowTracker | None:
        """In the MLflow thread, after the store opened: the sweep's parent run."""
        mark("MLflow store open")
        tracker = _start_sweep_run(
            self.opening.result(),
            self.jobs,
            self.sweep_dir,
            self.sweep_name,
            self.sweep_params,
            self.continuing,
            self.commit,
            self.progress,
        )
        mark("sweep run logged")
        return tracker

    def _finished_already(self) -> dict[str, str]:
        """Resume: the trials with a FINISHED run, by hash; a worker gets ready for the first
        trial while MLflow answers."""
        try:
            prepare_workers(self.jobs)
        except Exception as exc:  # best effort: the trial prepares itself
            log.debug("could not prepare a worker: %s", exc)
        return already_finished(self.jobs, self.opening.result(), self.progress)


def _run_recorded(
    jobs: list[TrialJob], done: dict[str, str], record: Recorder, ray_ctx: RayContext, race: bool = True
) -> None:
    """The trials not ``done`` run, each recorded as it finishes. Ctrl-C stops the running ones
    (and their servers) and keeps what they measured; a full disk stops the sweep. Either way Ray
    stops and the sweep's run ends with the sweep's status."""
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
            stored = earlier_runs(jobs, done, record) if race and done and objective is not None else {}
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


def _start_sweep_run(
    tracker: MlflowTracker | None,
    jobs: list[TrialJob],
    sweep_dir: Path,
    sweep_name: str,
    sweep_params: dict[str, Any],
    continuing: bool,
    commit: str,
    progress: Progress,
) -> MlflowTracker | None:
    """The sweep's MLflow parent run (a search's next batch continues its own); None when
    tracking is off or the run cannot be created (results stay on disk)."""
    if tracker is None:
        return None
    settings = jobs[0].settings
    experiment = settings.tracking.experiment_name or jobs[0].spec.experiment
    try:
        if continuing and tracker.attach_sweep(str(sweep_dir.resolve())):
            progress(f"sweep '{experiment}': continuing its MLflow run {tracker.parent_run_id} (a search's next batch)")
            return tracker
    except Exception as exc:  # keep measuring; results stay on disk
        progress(f"warning: could not find the search's MLflow run ({exc}); results are kept on disk only")
        return None
    objective = {"objective": settings.objective.model_dump_json(exclude_none=True)} if settings.objective else {}
    try:
        tracker.start_sweep(
            sweep_name,
            {"experiment": experiment, "num_trials": len(jobs), **objective, **sweep_params},
            {"git_commit": commit, "sweep_dir": str(sweep_dir.resolve())},
        )
    except Exception as exc:  # keep measuring; results stay on disk
        progress(f"warning: could not create the MLflow sweep run ({exc}); results are kept on disk only")
        return None
    return tracker


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


def _open_tracker(uri: str, experiment: str, enabled: bool, progress: Progress) -> MlflowTracker | None:
    if not enabled:
        return None
    try:
        return MlflowTracker(uri, experiment)
    except Exception as exc:  # unreachable store: keep measuring, results stay on disk
        progress(redact_text(f"warning: MLflow at {uri} unavailable ({exc}); results are kept on disk only"))
        return None
