"""The driver's loop over a sweep: run trials on Ray, write each result to disk, then log it.

Results reach MLflow only after they are on disk (``<sweep_dir>/trials/<hash>/``), so a
tracking failure loses nothing. A progress line is printed per finished trial.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator.config.errors import DiskFullError, OrchestratorError
from orchestrator.config.logs import Progress, mark, print_progress
from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec
from orchestrator.engines.process import interrupts_stop_servers
from orchestrator.feasibility import assess
from orchestrator.metrics.result import RESULT_FILE, TrialResult, load_result, save_result
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.preview import dry_run, share_key
from orchestrator.scheduling.ray_exec import cluster_gpus, init_ray, prepare_workers, run_jobs
from orchestrator.tracking import MlflowTracker, result_id

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


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


def trial_dir(sweep_dir: Path, job: TrialJob) -> Path:
    return sweep_dir / "trials" / f"{job.index:03d}-{job.trial_hash}"


def _point_summary(result: TrialResult) -> str:
    if not result.points:
        return ""
    m = result.points[-1].metrics
    return (
        f"last point {result.points[-1].label}: ttft p50 {m.get('ttft_ms_p50', float('nan')):.0f} ms, "
        f"itl p99 {m.get('itl_ms_p99', float('nan')):.0f} ms, {m.get('tokens_per_second', 0):.0f} tok/s"
        + _limited(result)
    )


def _limited(result: TrialResult) -> str:
    """``; limited by <cause> (<confidence>)`` of the trial's last point, when it was diagnosed."""
    d = result.points[-1].diagnosis if result.points else {}
    if not d.get("limiter"):
        return ""
    return f"; limited by {d['limiter'].replace('_', ' ')} ({d.get('confidence', '?')})"


def run_sweep(
    jobs: list[TrialJob],
    sweep_dir: Path,
    sweep_name: str,
    sweep_params: dict[str, Any] | None = None,
    progress: Progress = print_progress,
    continuing: bool = False,
) -> list[TrialResult]:
    """Run every job, persist and log each result; returns the results in completion order.

    ``continuing``: a later batch of the same Hydra multirun (a search's next trials): its
    trials join the batch before's MLflow parent run instead of starting a new one."""
    if not jobs:
        raise OrchestratorError("the sweep has no trials")
    sweep_dir = absolute_dir(sweep_dir)
    settings = jobs[0].settings
    if settings.dry_run:
        dry_run(jobs, progress)
        return []
    sweep_dir.mkdir(parents=True, exist_ok=True)
    experiment = settings.tracking.experiment_name or jobs[0].spec.experiment
    mark("jobs validated")
    # MLflow's import and store (~2 s here) open while Ray starts or connects (~4 s cold, ~0.05 s
    # to a running cluster): the first request goes out that much sooner (benchmarks/quick_start).
    # Ray is imported first: two imports in two threads share one GIL and both take twice as
    # long, and the sooner the driver connects, the sooner Ray starts the job's first worker.
    import ray  # noqa: F401

    # One thread does MLflow's work in order: open the store, then (once it is known that the
    # sweep runs) make the sweep's parent run; the trials do not wait for the parent run.
    mlflow = ThreadPoolExecutor(1, thread_name_prefix="mlflow")
    opening = mlflow.submit(_open_tracker, settings.tracking.uri, experiment, settings.tracking.enabled, progress)
    commit = git_commit()

    def sweep_run() -> MlflowTracker | None:  # in the MLflow thread, after the store opened
        mark("MLflow store open")
        tracker = _start_sweep_run(
            opening.result(), jobs, sweep_dir, sweep_name, sweep_params or {}, continuing, commit, progress
        )
        mark("sweep run logged")
        return tracker

    try:
        ray_ctx = init_ray(settings.cluster)
    except BaseException:
        mlflow.shutdown(wait=False)
        raise
    mark("Ray ready")
    # nothing to ask MLflow before the trials start: the parent run is made as soon as it opens
    starting = None if settings.resume else mlflow.submit(sweep_run)
    try:
        done: dict[str, str] = {}
        if starting is None:  # resume: MLflow answers first, which trials are FINISHED already
            try:  # a worker gets ready for the first trial meanwhile
                prepare_workers(jobs)
            except Exception as exc:  # best effort: the trial prepares itself
                log.debug("could not prepare a worker: %s", exc)
            done = _already_finished(jobs, opening.result(), progress)
            if len(done) == len(jobs):
                progress(
                    f"sweep '{experiment}': all {len(jobs)} trial(s) already FINISHED; nothing to run "
                    "(resume=false runs them again)"
                )
                ray_ctx.shutdown()
                return []
            starting = mlflow.submit(sweep_run)
        # Without resume the first trial is submitted at once, to the worker Ray starts as the
        # driver connects: a preparation task would take that one and make Ray start a second,
        # both on the cores MLflow is opening on (benchmarks/quick_start).
        record = _Recorder(sweep_dir, starting, commit, len(jobs) - len(done), progress)
        progress(f"sweep '{experiment}': {len(jobs)} trial(s); results in {sweep_dir}")
    except BaseException:
        ray_ctx.shutdown()
        raise
    finally:
        mlflow.shutdown(wait=False)  # its thread ends when its work is done
    status = "FAILED"
    try:
        with interrupts_stop_servers():
            _run_trials(jobs, done, record)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        progress("interrupted: running trials were stopped (and their servers)")
        _log_partial_results(jobs, record.results, sweep_dir, record.tracker_if_open(), commit, progress)
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
    tracker = record.tracker
    _report(experiment, record.results, sweep_dir, tracker, progress, settings.objective, record.dirs, settings.expect)
    for line in status_table(record.results):
        progress(line)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(record.counts.items()))
    progress(f"sweep '{experiment}' done in {time.monotonic() - record.t0:.0f}s: {summary}")
    if tracker is not None:
        uri = settings.tracking.uri
        progress(f"MLflow: experiment '{experiment}' at {uri}")
        if uri.startswith(("http://", "https://")):
            progress(f"MLflow UI: {uri.rstrip('/')}/{tracker.ui_path()}")
        else:
            progress(f"MLflow UI: start it (make ui), then open http://127.0.0.1:5000/{tracker.ui_path()}")
    return record.results


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


class _Recorder:
    """Each finished trial: to disk first, then MLflow, then a progress line; counts by status."""

    def __init__(
        self,
        sweep_dir: Path,
        sweep_run: Future[MlflowTracker | None],
        commit: str,
        to_run: int,
        progress: Progress,
    ) -> None:
        self.sweep_dir, self.commit, self.to_run = sweep_dir, commit, to_run
        self.progress = progress
        self._sweep_run: Future[MlflowTracker | None] | None = sweep_run
        self._tracker: MlflowTracker | None = None
        self.counts: Counter[str] = Counter()
        self.results: list[TrialResult] = []
        # result_id -> its folder (its timeline, for the report); trials differing only in how they
        # are observed share a trial hash, so the hash alone would mix up their folders
        self.dirs: dict[str, Path] = {}
        self.t0 = time.monotonic()

    @property
    def tracker(self) -> MlflowTracker | None:
        """The sweep's MLflow run (None: tracking off or unavailable), waited for on first use
        (the first result): it is made in the MLflow thread while the first trial starts."""
        pending, self._sweep_run = self._sweep_run, None
        if pending is not None:
            try:
                self._tracker = pending.result()
            except Exception as exc:  # keep measuring; results stay on disk
                self.progress(f"warning: no MLflow sweep run ({exc}); results are kept on disk only")
        return self._tracker

    def tracker_if_open(self) -> MlflowTracker | None:
        """On an interrupt: the sweep's run if it is made or being made, else None, and it will
        not be made (no parent run left RUNNING); what was measured stays on disk for
        ``python -m orchestrator.replay``."""
        if self._sweep_run is not None and self._sweep_run.cancel():
            self._sweep_run = None
            self.progress("MLflow was not open yet: results are on disk only (python -m orchestrator.replay logs them)")
        return self.tracker

    def finish(self, job: TrialJob, result: TrialResult) -> None:
        d = save_result(result, trial_dir(self.sweep_dir, job))
        self.dirs[result_id(result)] = d
        _draw_timeline(result, d, self.progress)
        if self.tracker is not None:
            _log_trial(self.tracker, result, d, self.commit, self.progress)
        self.counts[result.status] += 1
        self.results.append(result)
        reason = f" ({result.error.splitlines()[0][:200]})" if result.error else ""
        self.progress(
            f"[{len(self.results)}/{self.to_run}] {job.label}: {result.status}{reason} "
            f"{_point_summary(result)} [{time.monotonic() - self.t0:.0f}s elapsed]"
        )

    def end_sweep(self, status: str) -> None:
        if self.tracker is None:
            return
        try:
            self.tracker.end_sweep(dict(self.counts), status)
        except Exception as exc:  # a tracking failure must not hide the sweep's own outcome
            self.progress(f"warning: could not close the MLflow sweep run: {exc}")


def _draw_timeline(result: TrialResult, d: Path, progress: Progress) -> None:
    """The trial's timeline (client, engine, hardware) beside its result, before MLflow logs it."""
    if not result.points:
        return
    try:
        from orchestrator.report.timeline import timeline_figure

        timeline_figure(result, d)
    except Exception as exc:  # a figure costs nothing measured
        progress(f"warning: the timeline of trial {result.trial_hash} failed: {exc}")


def _run_trials(jobs: list[TrialJob], done: dict[str, str], record: _Recorder) -> None:
    """Infeasible trials are SKIPPED here, never submitted (Ray would wait forever); the others
    run on Ray, each recorded as it finishes."""
    settings = jobs[0].settings
    gpus = cluster_gpus()
    runnable, skipped = [], []
    for job in jobs:
        if job.trial_hash in done:
            record.counts["ALREADY_FINISHED"] += 1
            continue
        reason = assess(job.spec, gpus)
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


def status_table(results: list[TrialResult]) -> list[str]:
    """What worked on this cluster: one row per trial (variant, engine, status, what it
    measured or why not). The last thing a sweep prints (``gpu_smoke`` is read this way)."""
    if not results:
        return []
    rows = [("trial", "engine", "status", "measured / reason")]
    for r in sorted(results, key=lambda r: r.variant or r.trial_hash):
        if r.status == "FINISHED" and r.points:
            m = r.points[-1].metrics
            what = (
                f"{len(r.points)} point(s); last: {m.get('tokens_per_second', 0):.0f} tok/s, "
                f"ttft p50 {m.get('ttft_ms_p50', float('nan')):.0f} ms" + _limited(r)
            )
        else:
            what = (r.error or "").splitlines()[0][:120] if r.error else ""
        rows.append((r.variant or r.trial_hash[:8], r.engine_version or "?", r.status, what))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + " | " + row[3] for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 20)
    return lines


def _report(
    experiment: str,
    results: list[TrialResult],
    sweep_dir: Path,
    tracker: MlflowTracker | None,
    progress: Progress,
    objective: ObjectiveSpec | None = None,
    trial_dirs: dict[str, Path] | None = None,
    expect: list[ExpectationSpec] | None = None,
) -> None:
    """The sweep's report (lab plots, summary.md, each trial's timeline): written to ``<sweep_dir>/report`` first,
    then logged to the sweep's parent run under ``report/``. A report failure costs nothing
    measured; ``python -m orchestrator.report experiment=NAME`` rebuilds it from MLflow."""
    if not any(r.points for r in results):
        if expect and results:  # nothing measured: each claim says why it cannot be checked here
            from orchestrator.report import from_results

            _say_expectations(from_results(results, experiment, expect=expect), progress)
        return
    try:
        from orchestrator.report import build_report, from_results
        from orchestrator.report.build import best_configuration
        from orchestrator.report.verdict import decide

        data = from_results(results, experiment, objective=objective, trial_dirs=trial_dirs, expect=expect)
        if tracker is not None and tracker.parent_run_id and len(data.trials) < tracker.sweep_trial_count():
            from orchestrator.report import from_mlflow  # a search's batch: report on all its trials so far

            data = from_mlflow(tracker.uri, experiment, tracker.parent_run_id)
            data.objective, data.expect = objective, list(expect or [])
        files = build_report(data, sweep_dir / "report")
        progress(f"report: {len(files)} file(s) in {sweep_dir / 'report'}")
        verdict = decide(data.finished, objective) if objective is not None else None
        if verdict is not None and objective is not None:
            for line in verdict.lines:
                progress(line.replace("**", ""))
            from orchestrator.report.explain import why_winner

            for line in why_winner(verdict.best, data.finished, data.varied_params(), objective):
                if line:
                    progress(line.replace("**", ""))
        else:  # no objective declared: the report's fallback, said here too
            best, why = best_configuration(data.finished)
            if best is not None:
                progress(f"Best configuration: {best.name} ({why}; the experiment declares no objective)")
        _say_expectations(data, progress)
        if tracker is not None:
            tracker.log_sweep_files(files, "report", root=sweep_dir / "report")
            if verdict is not None:
                tracker.set_sweep_tags(
                    {
                        "verdict": verdict.best.name if verdict.best else "none",
                        "verdict_text": verdict.headline.replace("**", ""),
                    }
                )
    except Exception as exc:
        progress(
            f"warning: the sweep report failed ({exc}); rebuild it with "
            f"`python -m orchestrator.report experiment={experiment}`"
        )


def _say_expectations(data: Any, progress: Progress) -> None:
    """The lab's claims on the console: the tally, then each claim with its numbers or why not."""
    if not data.expect:
        return
    from orchestrator.report import expectations

    outcomes = expectations.check(data.expect, data.trials)
    progress(expectations.tally(outcomes))
    for outcome in outcomes:
        progress(f"  {outcome.line()}")


def _already_finished(jobs: list[TrialJob], tracker: MlflowTracker | None, progress: Progress) -> dict[str, str]:
    """Trials of this sweep that already have a FINISHED run (resume): they are not run again."""
    if tracker is None:
        return {}
    try:
        done = tracker.finished_run_ids(j.trial_hash for j in jobs)
    except Exception as exc:  # cannot tell: run everything rather than guess
        progress(f"warning: could not look up finished trials in MLflow ({exc}); running every trial")
        return {}
    for job in jobs:
        if job.trial_hash in done:
            progress(f"{job.label}: already FINISHED (run {done[job.trial_hash]}); skipped (resume=false re-runs it)")
    return done


def _log_partial_results(
    jobs: list[TrialJob],
    reported: list[TrialResult],
    sweep_dir: Path,
    tracker: MlflowTracker | None,
    commit: str,
    progress: Progress,
) -> None:
    """Trials cut short keep the points they measured: workers save them after every point."""
    done = {r.trial_hash for r in reported}
    for job in jobs:
        d = trial_dir(sweep_dir, job)
        if job.trial_hash in done or not (d / RESULT_FILE).exists():
            continue
        result = load_result(d)
        progress(f"{job.label}: kept {len(result.points)} measured load point(s) in {d}")
        if tracker is not None:
            _log_trial(tracker, result, d, commit, progress)


def _open_tracker(uri: str, experiment: str, enabled: bool, progress: Progress) -> MlflowTracker | None:
    if not enabled:
        return None
    try:
        return MlflowTracker(uri, experiment)
    except Exception as exc:  # unreachable store: keep measuring, results stay on disk
        progress(f"warning: MLflow at {uri} unavailable ({exc}); results are kept on disk only")
        return None


def _log_trial(tracker: MlflowTracker, result: TrialResult, d: Path, commit: str, progress: Progress) -> None:
    try:
        tracker.log_trial(result, d, {"git_commit": commit})
    except Exception as exc:  # the result is already on disk
        progress(f"warning: logging trial {result.trial_hash} to MLflow failed ({exc}); it is saved in {d}")
