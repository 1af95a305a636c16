"""A trial from start to end: check it can run, start its servers, run its load points (fed
forward: each point's result is sent to the schedule that chose it, which is how the SLO
capacity search picks its next probe), score accuracy, stop the servers, and return the
result. ``run_trial`` never raises for a trial-level failure and never talks to MLflow."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError, InfeasibleConfigError, ServerCrashedError, TrialError
from orchestrator.config.hashing import trial_hash
from orchestrator.config.logs import Progress, mark, print_progress
from orchestrator.config.schema import LaunchedEngineSpec, LoadPointSpec, TrialSpec
from orchestrator.config.secrets import redact_mapping, redact_override, redact_text
from orchestrator.engines import ServerLaunch, adapter_for
from orchestrator.evaluation import run_eval
from orchestrator.feasibility import trial_decode_floor
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from orchestrator.loadgen.preflight import preflight
from orchestrator.loadgen.prompts import prompt_factory
from orchestrator.metrics import hardware
from orchestrator.metrics.monitor import ResourceMonitor
from orchestrator.metrics.probes import start_telemetry
from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult, TrialResult, TrialStatus, save_result
from orchestrator.metrics.telemetry import Timeline
from orchestrator.models import resolve_model, resolve_tokenizer
from orchestrator.trial.capacity import CapacityProbes, Schedule, unmeasured
from orchestrator.trial.plan import check_feasible, client_cores
from orchestrator.trial.points import PointMeasurer, trial_metrics
from orchestrator.trial.profile import collect_traces
from orchestrator.trial.servers import (
    ServerGroup,
    describe_servers,
    reset_caches,
    shared_server_spec,
    start_servers,
)
from orchestrator.trial.slate import wait_for_clean_slate

log = logging.getLogger(__name__)


class TrialRun:
    """The state of one trial while it runs: what it has measured so far and how to report it."""

    def __init__(
        self,
        spec: TrialSpec,
        workdir: str | os.PathLike[str],
        overrides: list[str],
        gpu_ids: list[int],
        progress: Progress,
    ) -> None:
        # absolute: servers, their files and lm-eval get paths that mean the same in any folder
        self.workdir = Path(os.path.abspath(workdir))
        self.spec, self.gpu_ids, self.overrides = spec, gpu_ids, overrides
        self.hash = trial_hash(spec)
        self.label = spec.variant or self.hash[:8]
        self.say: Progress = lambda msg: progress(f"[{self.label}] {msg}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.adapter = adapter_for(spec.engine.name)
        self.points: list[PointResult] = []
        self.records: list[RequestRecord] = []
        self.crash: ServerCrashedError | None = None  # the servers died: no point after it is measured
        self.measuring = False  # load points have run (a held trial, sleep, has none)
        self.starts: list[float] = []  # start-up seconds of every server (group) start; the first is startup_s
        self.server_logs: list[tuple[str, Path]] = []
        self.held: dict[str, float] = {}
        self.scores: dict[str, float] = {}  # accuracy (lm-eval) after the last load point
        self.capacity: CapacityProbes | None = None  # the SLO capacity search, when the workload asks for one
        self.model_path = ""
        self.timeline = Timeline()  # telemetry and the engine's gauges, on the records' clock
        self.telemetry_notes: dict[str, str] = {}
        self.base: dict[str, Any] = dict(
            trial_hash=self.hash,
            experiment=spec.experiment,
            variant=spec.variant,
            overrides=[redact_override(o) for o in overrides],
            spec=redact_mapping(spec.model_dump(mode="json")),
            started_at=time.time(),
            hardware={**hardware.describe(gpu_ids), "gpu_ids": gpu_ids},
            engine_version=self.adapter.version(spec),
        )

    # ------------------------------------------------------------------ servers

    def measure(self, shared: ServerGroup | None = None) -> None:
        """Start the servers, run every load point, stop them; on ``shared`` servers (already
        running, owned by another trial of the group) only run the load points."""
        spec = self.spec
        check_feasible(spec, self.gpu_ids)
        held = self.adapter.hold(spec)  # a trial kind without a server (sleep)
        if held is not None:
            self.held = held
            return
        model_path = self.model_path = resolve_model(spec.model)
        mark("trial: model resolved")
        factory = prompt_factory(resolve_tokenizer(spec.model, model_path))
        mark("trial: tokenizer loaded")
        n = len(spec.workload.load_points)
        restart = isinstance(spec.engine, LaunchedEngineSpec) and spec.engine.restart_between_points
        if shared is not None:
            self._run_on(shared, factory, 0, n)
        else:  # cold vs warm across a restart (LMCache's disk tier survives it): a fresh server per point
            for start_no, (first, last) in enumerate([(i, i + 1) for i in range(n)] if restart else [(0, n)]):
                with contextlib.ExitStack() as stack:
                    group = self._start(stack, model_path, start_no if restart else None, spec)
                    self._run_on(group, factory, first, last)
                if self.crash is not None:
                    break
        if self.crash is not None:
            raise self.crash

    def start_shared(self, stack: contextlib.ExitStack) -> ServerGroup:
        """Start this trial's servers for a group of trials (stopped when ``stack`` closes)."""
        check_feasible(self.spec, self.gpu_ids)
        return self._start(stack, resolve_model(self.spec.model), None, shared_server_spec(self.spec))

    def _start(
        self, stack: contextlib.ExitStack, model_path: str, start_no: int | None, spec: TrialSpec
    ) -> ServerGroup:
        """Start the servers of ``spec`` (this trial's, or its shared-server variant). ``start_no``
        numbers the starts of a trial that restarts its servers between points."""
        suffix = "" if start_no is None else f"-{start_no}"

        def log_name(server: str, several: bool) -> Path:
            # never server.log itself: each checkpoint replaces that file (atomically, redacted),
            # which would unlink the live log under the server and lose its last lines
            path = self.workdir / (
                f"server-{server}{suffix}.log" if several or start_no is not None else "server.live.log"
            )
            self.server_logs.append((server + ("" if start_no is None else f" (start {start_no})"), path))
            return path

        def described(launches: list[ServerLaunch]) -> None:
            self.base["servers"] = describe_servers(launches, self.gpu_ids)

        slate = wait_for_clean_slate(spec, self.gpu_ids, self.say)  # nothing of an earlier trial left
        self.base.setdefault("slate", slate)  # the first start's reading (later starts are checked too)
        group, startup = start_servers(
            stack, self.adapter, spec, model_path, self.workdir, self.gpu_ids, log_name, self.say, described
        )
        self.starts.append(startup)
        self.say(f"server healthy after {startup:.1f}s")
        return group

    # ------------------------------------------------------------------ load points

    def _run_on(self, group: ServerGroup, factory: PromptFactory, first: int, last: int) -> None:
        """Run load points ``first..last-1`` at the group's front server, then lm-eval after the last."""
        spec = self.spec
        measurer = self._measurer(group)
        front = group.launches[-1]
        endpoint = Endpoint(front.base_url, spec.model.name, api_key=self.adapter.api_key(spec))
        workload = spec.workload
        if (first, last) != (0, len(workload.load_points)):
            workload = workload.model_copy(update={"load_points": workload.load_points[first:last]})
        self.measuring = True
        if first == 0 and not self.points:
            mark("trial: server up, pre-flight")
            self._preflight(group, factory, endpoint.api_key)
            mark("trial: pre-flight done")
        everything = last == len(spec.workload.load_points)
        sampler = None
        try:
            sampler, self.telemetry_notes = start_telemetry(spec.platform, group.pids(), self.gpu_ids, self.timeline)
            if sampler is not None:
                measurer.clock = sampler.edge
            run_points(
                endpoint,
                workload,
                factory,
                (spec.seed, spec.workload.seed),
                lambda i, p: self._point_start(measurer, i, p),
                lambda i, p, recs, client: self._point_end(measurer, i, p, recs, client),
                first_index=first,
                points=self._schedule(workload.load_points, everything),
                client_cores=client_cores(spec),
            )
        finally:
            measurer.monitor.stop()  # idempotent; a point that raised must not leave the sampler running
            if sampler is not None:
                sampler.stop()
        if everything and spec.eval.tasks and self.crash is None:
            # accuracy of this very server, after its load points (their caches are its own); never of a dead one
            group.check_alive()
            self.scores = run_eval(
                spec.eval,
                front.base_url,
                spec.model.name,
                resolve_tokenizer(spec.model, self.model_path),
                self.workdir,
                self.adapter.api_key(spec),
                self.say,
            )

    def _measurer(self, group: ServerGroup) -> PointMeasurer:
        """What measures each point on ``group``: its resource monitor (memory, engine gauges onto
        the trial's timeline), cache resets, the profiler's window."""
        spec = self.spec
        engine_metrics = self.adapter.metrics_for(spec)
        scraped = group.metrics_launch()
        monitor = ResourceMonitor(
            group.pids(),
            scraped.metrics_url if scraped else None,
            engine_metrics,
            spec.platform.monitor_interval_s,
            self.gpu_ids,
            spec.platform.monitor_budget,
            self.timeline,
        )
        return PointMeasurer(
            spec,
            group,
            engine_metrics,
            monitor,
            self.say,
            self.adapter.cache_reset(spec),
            self.timeline,
            self.adapter.api_key(spec),
        )

    def _preflight(self, group: ServerGroup, factory: PromptFactory, api_key: str | None) -> None:
        """The servers are the ones the plan was made for (model name, tokenizer): before any load."""
        spec = self.spec
        for launch in group.engine_launches():
            check = preflight(
                launch.base_url,
                spec.model.name,
                api_key,
                factory,
                spec.workload,
                resolve_tokenizer(spec.model, self.model_path),
                spec.seed,
            )
            self.say(f"pre-flight of {launch.name}: {check.describe()}")

    def _point_start(self, measurer: PointMeasurer, index: int, point: LoadPointSpec) -> None:
        try:
            measurer.start(index, point)
        except ServerCrashedError as exc:
            self.crash = exc
            raise

    def _point_end(
        self,
        measurer: PointMeasurer,
        index: int,
        point: LoadPointSpec,
        records: list[RequestRecord],
        client: dict[str, float],
    ) -> PointResult:
        result, crash = measurer.finish(index, point, records, client)
        self.records.extend(records)
        self.points.append(result)
        self.crash = crash or self.crash
        self.checkpoint()  # measured points reach the disk now, whatever happens next
        return result

    def _schedule(self, fixed: Sequence[LoadPointSpec], last: bool) -> Schedule:
        """The fixed points, then (when they are the ``last`` of the trial) the probes of its SLO
        capacity search. Each point's result is sent back here; a server that failed ends it."""
        for point in fixed:
            if unmeasured((yield point)):
                return False
        cap = self.spec.workload.capacity
        if last and cap is not None:
            self.capacity = CapacityProbes(cap, list(self.spec.workload.classes), self.say)
            if not (yield from self.capacity.probes()):
                return False
            self.checkpoint()  # the last verdict and the stop reason reach the disk too
        return True

    # ------------------------------------------------------------------ the result

    def server_log(self) -> str:
        """Every server's log of the trial, in start order (one server: its log as is)."""
        logs = [(name, p) for name, p in self.server_logs if p.exists()]
        if len(logs) == 1:
            return logs[0][1].read_text(errors="replace")
        return "".join(f"===== {name} =====\n" + p.read_text(errors="replace") for name, p in logs)

    def floor_at_batch1(self) -> dict[str, float]:
        """The roofline floor of a decode step at batch 1, empty context (week 3's number)."""
        try:
            floor = trial_decode_floor(self.spec)
        except Exception as exc:  # unknown roofs: no floor, not a failure
            log.warning("decode floor: %s", exc)
            return {}
        return {"decode_floor_ms_batch1": floor.floor_ms} if floor else {}

    def checkpoint(self) -> None:
        done, total = len(self.points), len(self.spec.workload.load_points)
        interrupted = f"interrupted after {done} of {total} load points"
        save_result(self.result("FAILED", interrupted, traces=False), self.workdir)

    def result(self, status: TrialStatus, error: str | None, traces: bool = True) -> TrialResult:
        """The trial's result; ``traces``: with the profiler's trace files (not in checkpoints)."""
        capacity_metrics, capacity = self.capacity.outcome() if self.capacity else ({}, {})
        metrics = dict(self.held)
        if self.measuring:
            metrics = {
                **trial_metrics(self.points, self.starts[0] if self.starts else None),
                "server_starts": float(len(self.starts)),
                "server_reused": float(not self.starts),
                **self.floor_at_batch1(),
                **self.scores,
                **capacity_metrics,
            }
        return TrialResult(
            **self.base,
            status=status,
            error=error,
            ended_at=time.time(),
            points=list(self.points),
            metrics=metrics,
            capacity=capacity,
            telemetry=dict(self.telemetry_notes),
            records_parquet=records_to_parquet_bytes(self.records) if self.records else b"",
            telemetry_parquet=self.timeline.to_parquet() if self.timeline.rows else b"",
            artifacts=collect_traces(self.workdir) if traces else {},
            server_log=redact_text(self.server_log()),
        )


def run_trial(
    spec: TrialSpec,
    workdir: str | os.PathLike[str],
    overrides: list[str] | None = None,
    gpu_ids: list[int] | None = None,
    progress: Progress = print_progress,
) -> TrialResult:
    """Run one trial end to end and return its result; never raises for a trial-level failure.

    After every load point the result so far is saved in ``workdir`` (status FAILED,
    "interrupted after N of M load points"), so a trial killed mid-way keeps its points.
    """
    run = TrialRun(spec, workdir, overrides or [], list(gpu_ids or []), progress)
    return outcome(run, run.measure)


def outcome(run: TrialRun, body: Callable[[], None]) -> TrialResult:
    """Run ``body`` and turn how it ended into the trial's result."""
    status: TrialStatus
    error: str | None
    try:
        body()
        status, error = "FINISHED", None
    except InfeasibleConfigError as exc:
        status, error = "SKIPPED", str(exc)
    except (TrialError, ConfigError) as exc:
        status, error = "FAILED", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # an unexpected bug still yields a result with the reason
        log.exception("trial %s failed", run.hash)
        status, error = "FAILED", f"{type(exc).__name__}: {exc}"
    run.say(status + (f": {error.splitlines()[0]}" if error else ""))
    return run.result(status, error)


def run_trial_group(
    items: Sequence[tuple[TrialSpec, str | os.PathLike[str], list[str]]],
    gpu_ids: list[int] | None = None,
    progress: Progress = print_progress,
) -> list[TrialResult]:
    """Trials with one :func:`server_key` run one after the other on one server start (the
    first trial's); each keeps its own result. Prefix caches are emptied between trials. If
    the shared server dies, the trials after it run on fresh servers of their own."""
    gpus = list(gpu_ids or [])
    runs = [TrialRun(spec, wd, ov, gpus, progress) for spec, wd, ov in items]
    lead = runs[0]
    between_trials = lead.adapter.cache_reset(shared_server_spec(lead.spec))
    results: list[TrialResult] = []
    started = False
    try:
        with contextlib.ExitStack() as stack:
            group = lead.start_shared(stack)
            started = True
            for run in runs:
                if results:
                    run.say(f"on the running server of [{lead.label}] (server start saved)")
                    reset_caches(group, between_trials)
                    run.base["servers"] = lead.base.get("servers", [])
                    run.base["slate"] = {"checked": False, "note": f"on the running server of [{lead.label}]"}
                results.append(outcome(run, functools.partial(run.measure, group)))
                save_result(results[-1], run.workdir)  # final on disk now, not when the whole group ends
                if run.crash is not None:
                    break
    except (TrialError, ConfigError, InfeasibleConfigError) as exc:
        if started:
            raise
        # the shared server never came up: the same happens to every trial of the group
        error = f"{type(exc).__name__}: {exc}"
        status: TrialStatus = "SKIPPED" if isinstance(exc, InfeasibleConfigError) else "FAILED"
        lead.say(f"{status} (and the {len(runs) - 1} trial(s) sharing its server): {error.splitlines()[0]}")
        return [run.result(status, error) for run in runs]
    for run in runs[len(results) :]:
        results.append(run_trial(run.spec, run.workdir, run.overrides, gpus, progress))
    return results
