"""Each finished trial of a sweep: saved to disk first (``<sweep_dir>/trials/<index>-<hash>/``),
its timeline drawn beside it, then logged to the sweep's MLflow run, then a progress line
(:class:`Recorder`); on an interrupt, what the trials cut short measured is kept."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

from orchestrator.config.logs import Progress
from orchestrator.metrics.result import RESULT_FILE, TrialResult, load_result, save_result
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.sweep_report import point_summary
from orchestrator.tracking import MlflowTracker, result_id


def trial_dir(sweep_dir: Path, job: TrialJob) -> Path:
    """The job's folder in the sweep's: its result, records and timeline."""
    return sweep_dir / "trials" / f"{job.index:03d}-{job.trial_hash}"


class Recorder:
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
        self.run_ids: dict[str, str] = {}  # trial hash -> its MLflow run (a race's repeats are its children)
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
        ``python -m orchestrator.sync``."""
        if self._sweep_run is not None and self._sweep_run.cancel():
            self._sweep_run = None
            self.progress("MLflow was not open yet: results are on disk only (python -m orchestrator.sync logs them)")
        return self.tracker

    def finish(self, job: TrialJob, result: TrialResult) -> None:
        d = save_result(result, trial_dir(self.sweep_dir, job))
        self.dirs[result_id(result)] = d
        _draw_timeline(result, d, self.progress)
        if self.tracker is not None:
            run_id = _log_trial(self.tracker, result, d, self.commit, self.progress, self._repeat_tags(result))
            if run_id:
                self.run_ids[result.trial_hash] = run_id
        self.results.append(result)
        reason = f" ({result.error.splitlines()[0][:200]})" if result.error else ""
        if result.repeat_of:  # a race's later run: counted apart from the trials
            self.counts[f"repeat {result.status}"] += 1
            self.progress(
                f"[run {int(result.spec.get('run', 0)) + 1}] {job.label}: {result.status}{reason} "
                f"{point_summary(result)} [{time.monotonic() - self.t0:.0f}s elapsed]"
            )
            return
        self.counts[result.status] += 1
        self.progress(
            f"[{len(self.results)}/{self.to_run}] {job.label}: {result.status}{reason} "
            f"{point_summary(result)} [{time.monotonic() - self.t0:.0f}s elapsed]"
        )

    def adopt(self, job: TrialJob, result: TrialResult, run_id: str) -> None:
        """A run FINISHED by an earlier sweep (resume), read back from MLflow (``run_id``): it joins
        this sweep's results for the race and the verdict, and is neither saved nor logged again."""
        self.results.append(result)
        self.run_ids[result.trial_hash] = run_id
        run = f"[run {int(result.spec.get('run', 0)) + 1}] " if result.repeat_of else ""
        self.progress(f"{run}{job.label}: its earlier run {run_id} read back from MLflow (resume)")

    def _repeat_tags(self, result: TrialResult) -> dict[str, str]:
        """A race's later run: a child of its trial's run, tagged with the sweep's."""
        if not result.repeat_of or self.tracker is None:
            return {}
        tags = {"run_kind": "repeat", "repeat_of": result.repeat_of, "race_run": str(result.spec.get("run", ""))}
        if self.tracker.parent_run_id:
            tags["sweep_run_id"] = self.tracker.parent_run_id
        first = self.run_ids.get(result.repeat_of)
        if first:
            tags["mlflow.parentRunId"] = first
        return tags

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


def log_partial_results(
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


def _log_trial(
    tracker: MlflowTracker,
    result: TrialResult,
    d: Path,
    commit: str,
    progress: Progress,
    tags: dict[str, str] | None = None,
) -> str | None:
    try:
        return tracker.log_trial(result, d, {"git_commit": commit, **(tags or {})})
    except Exception as exc:  # the result is already on disk
        progress(f"warning: logging trial {result.trial_hash} to MLflow failed ({exc}); it is saved in {d}")
        return None
