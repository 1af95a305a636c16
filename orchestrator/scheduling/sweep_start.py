"""A sweep's start, in steps (:class:`SweepStart`): MLflow's store opens in its own thread while
Ray starts or connects; the sweep's parent run is made in that thread as soon as the store is
open (on resume, and in a later batch of the same sweep, once MLflow said which trials are done
already); no trial waits for it. What it leaves is :class:`Started`."""

from __future__ import annotations

import logging
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.logs import Progress, mark
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.secrets import redact_text
from orchestrator.decide.race import races
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.ray_exec import RayContext, init_ray, prepare_workers
from orchestrator.scheduling.recorder import Recorder
from orchestrator.scheduling.resume import already_finished
from orchestrator.tracking import MlflowTracker

log = logging.getLogger(__name__)


def git_commit(root: Path = PROJECT_ROOT) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


@dataclass(frozen=True)
class Started:
    """A sweep under way: its Ray, the trials done already (trial hash -> run id), its recorder,
    and the sweep run whose earlier batches they come from (None: resume, any sweep's)."""

    ray: RayContext
    done: dict[str, str]
    record: Recorder
    within: str | None


class SweepStart:
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

    def begin(self) -> Started | None:
        """Ray ready, the trials FINISHED already (resume: by hash, with their run ids; a later
        batch: those its sweep's earlier batches measured, whatever ``resume`` says) and the
        recorder of the others; None when there is nothing to run (Ray stopped again)."""
        self._open_tracking()
        ray_ctx = self._start_ray()
        within_sweep = self.continuing and not self.settings.resume
        # nothing to ask MLflow before the trials start: the parent run is made as soon as it opens
        starting = None if self.settings.resume or within_sweep else self.mlflow.submit(self._sweep_run)
        within: str | None = None
        try:
            done: dict[str, str] = {}
            if starting is None:  # resume: MLflow answers first, which trials are FINISHED already
                done, within = self._finished_already(within_sweep)
                # every trial FINISHED: nothing to run, unless their race may go on (more runs or budget)
                if len(done) == len(self.jobs) and not races(self.settings.objective):
                    self.progress(
                        f"sweep '{self.experiment}': all {len(self.jobs)} trial(s) "
                        + ("measured earlier in this sweep" if within else "already FINISHED")
                        + "; nothing to run"
                        + ("" if within else " (resume=false runs them again)")
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
        return Started(ray_ctx, done, record, within)

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

    def _finished_already(self, within_sweep: bool) -> tuple[dict[str, str], str | None]:
        """Resume: the trials with a FINISHED run, by hash (``within_sweep``: in this sweep's own
        MLflow run, measured by an earlier batch), and that run's id where it is so; a worker gets
        ready for the first trial while MLflow answers."""
        try:
            prepare_workers(self.jobs)
        except Exception as exc:  # best effort: the trial prepares itself
            log.debug("could not prepare a worker: %s", exc)
        tracker = self.opening.result()
        within = None
        if within_sweep:
            try:
                within = tracker.attach_sweep(str(self.sweep_dir.resolve())) if tracker is not None else None
            except Exception as exc:  # cannot tell: run everything rather than guess
                self.progress(f"warning: could not find this sweep's MLflow run ({exc}); running every trial")
            if within is None:
                return {}, None
        return already_finished(self.jobs, tracker, self.progress, within), within


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


def _open_tracker(uri: str, experiment: str, enabled: bool, progress: Progress) -> MlflowTracker | None:
    if not enabled:
        return None
    try:
        return MlflowTracker(uri, experiment)
    except Exception as exc:  # unreachable store: keep measuring, results stay on disk
        progress(redact_text(f"warning: MLflow at {uri} unavailable ({exc}); results are kept on disk only"))
        return None
