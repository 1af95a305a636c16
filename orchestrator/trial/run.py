"""A trial from start to end: check it can run, start its servers, run its load points (the
trial's own loop: each point prepared by the load session, measured around its run; then the
probes of an SLO capacity search, each chosen from the ones before), score accuracy, stop the
servers, and return the result. ``run_trial`` never raises for a trial-level failure and never
talks to MLflow. A trial's LoRA adapters at run time are :mod:`.multi_lora`'s, its secrets and the
scrubbing of its raw logs :mod:`.scrub`'s."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError, InfeasibleConfigError, ServerCrashedError, TrialError
from orchestrator.config.hashing import first_run_hash, trial_hash
from orchestrator.config.logs import Progress, mark, print_progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import LoadPointSpec, TrialSpec
from orchestrator.config.secrets import hide, redact_mapping, redact_override
from orchestrator.engines import ServerLaunch, adapter_for
from orchestrator.evaluation import run_eval
from orchestrator.loadgen import Endpoint, LoadSession, PromptFactory
from orchestrator.loadgen.preflight import preflight
from orchestrator.loadgen.prompts import prompt_factory
from orchestrator.metrics import host
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult, TrialResult, TrialStatus, save_result
from orchestrator.metrics.summary import adapter_key
from orchestrator.models import resolve_adapters, resolve_model, resolve_tokenizer
from orchestrator.perf.floors import roofs_used
from orchestrator.trial.admission import check_feasible, client_cores
from orchestrator.trial.capacity_probes import unmeasured
from orchestrator.trial.load_points import LoadPoints
from orchestrator.trial.measured import Measured
from orchestrator.trial.multi_lora import adapter_scores, load_adapter, with_adapter_names
from orchestrator.trial.points import PointMeasurer
from orchestrator.trial.profile import collect_traces
from orchestrator.trial.scrub import scrub_logs, trial_secrets
from orchestrator.trial.servers import (
    ServerGroup,
    describe_servers,
    shared_server_spec,
    start_servers,
)
from orchestrator.trial.slate import wait_for_clean_slate

log = logging.getLogger(__name__)


@dataclass
class TrialHeader:
    """What a trial's result says of it however it ends: which trial, where, on what servers."""

    trial_hash: str
    experiment: str
    variant: str | None
    overrides: list[str]
    spec: dict[str, Any]
    started_at: float
    hardware: dict[str, Any]
    engine_version: str | None
    servers: list[dict[str, Any]] = field(default_factory=list)
    slate: dict[str, Any] | None = None  # the first server start's reading of the machine
    repeat_of: str | None = None  # a race's later run: its configuration's first run


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
        # what the trial knows to be secret (engine.env's tokens, a flag's key, the API key): hidden
        # in the error and the server log it returns, wherever a server or lm-eval echoed them
        self.secrets = trial_secrets(spec)
        self.got = Measured()  # what it has measured so far
        self.server_logs: list[tuple[str, Path]] = []
        self.model_path = ""
        self.base = TrialHeader(
            trial_hash=self.hash,
            experiment=spec.experiment,
            variant=spec.variant,
            overrides=[redact_override(o) for o in overrides],
            spec=redact_mapping(spec.model_dump(mode="json")),
            started_at=time.time(),
            hardware={**host.describe(gpu_ids), "gpu_ids": gpu_ids},
            engine_version=self.adapter.version(spec),
            repeat_of=first_run_hash(spec),
        )

    # ------------------------------------------------------------------ servers

    def measure(self, shared: ServerGroup | None = None) -> None:
        """Start the servers, run every load point, stop them; on ``shared`` servers (already
        running, owned by another trial of the group) only run the load points."""
        spec = self.spec
        check_feasible(spec, self.gpu_ids)
        held = self.adapter.hold(spec)  # a trial kind without a server (sleep)
        if held is not None:
            self.got.held = held
            return
        roof = roofs_used(spec)  # measured (the CPU's bandwidth, once per node) before any server runs
        if roof is not None:
            self.got.roof_note = f"{roof.bandwidth_gb_s:.0f} GB/s, {roof.peak_tflops:g} TFLOP/s ({roof.source})"
        model_path = self.model_path = resolve_model(spec.model)
        resolve_adapters(spec.model)  # LoRA adapters: checked, the tiny ones trained on first use
        mark("trial: model resolved")
        factory = prompt_factory(resolve_tokenizer(spec.model, model_path))
        mark("trial: tokenizer loaded")
        n = len(spec.workload.load_points)
        launched = spec.engine.launched
        restart = launched is not None and launched.restart_between_points
        if shared is not None:
            self._run_on(shared, factory, 0, n)
        else:  # cold vs warm across a restart (LMCache's disk tier survives it): a fresh server per point
            for start_no, (first, last) in enumerate([(i, i + 1) for i in range(n)] if restart else [(0, n)]):
                with contextlib.ExitStack() as stack:
                    group = self._start(stack, model_path, start_no if restart else None, spec)
                    self._run_on(group, factory, first, last)
                if self.got.crash is not None:
                    break
        if self.got.crash is not None:
            raise self.got.crash

    def start_shared(self, stack: contextlib.ExitStack) -> ServerGroup:
        """Start this trial's servers for a group of trials (stopped when ``stack`` closes)."""
        check_feasible(self.spec, self.gpu_ids)
        model_path = resolve_model(self.spec.model)
        resolve_adapters(self.spec.model)
        return self._start(stack, model_path, None, shared_server_spec(self.spec))

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
            self.base.servers = describe_servers(launches, self.gpu_ids)

        slate = wait_for_clean_slate(spec, self.gpu_ids, self.say)  # nothing of an earlier trial left
        if self.base.slate is None:  # the first start's reading (later starts are checked too)
            self.base.slate = slate
        group, startup = start_servers(
            stack, self.adapter, spec, model_path, self.workdir, self.gpu_ids, log_name, self.say, described
        )
        self.got.starts.append(startup)
        self.say(f"server healthy after {startup:.1f}s")
        return group

    # ------------------------------------------------------------------ load points

    def _run_on(self, group: ServerGroup, factory: PromptFactory, first: int, last: int) -> None:
        """Run load points ``first..last-1`` at the group's front server (checked first by the
        pre-flight), then lm-eval after the trial's last point."""
        spec = self.spec
        measurer = PointMeasurer(spec, group, self.adapter, self.gpu_ids, self.got.timeline, self.say)
        view = measurer.view
        workload = with_adapter_names(spec)
        if (first, last) != (0, len(workload.load_points)):
            workload = workload.model_copy(update={"load_points": workload.load_points[first:last]})
        self.got.measuring = True
        if first == 0 and not self.got.points:  # the servers are the ones the plan was made for
            self._load_adapters(view.engines, measurer.api_key)
            mark("trial: server up, pre-flight")
            tokenizer = resolve_tokenizer(spec.model, self.model_path)
            for name, url in view.engines:
                check = preflight(url, spec.model.name, measurer.api_key, factory, spec.workload, tokenizer, spec.seed)
                self.say(f"pre-flight of {name}: {check.describe()}")
            mark("trial: pre-flight done")
        everything = last == len(spec.workload.load_points)
        endpoint = Endpoint(view.front_url, spec.model.name, api_key=measurer.api_key)
        # a race's later runs draw fresh requests, the same for every trial of the round
        seed = (spec.seed, spec.workload.seed) + ((100_000 + spec.run,) if spec.run else ())
        with measurer, LoadSession(endpoint, workload, factory, seed, client_cores(spec)) as load:
            self.got.telemetry_notes = measurer.telemetry_notes
            load.warm_up()
            capacity = spec.workload.capacity if everything else None
            points = LoadPoints(workload.load_points, first, capacity, list(spec.workload.classes), self.say)
            while (step := points.next()) is not None:
                self.got.capacity = points.capacity or self.got.capacity
                result, records = self._point(load, measurer, *step)
                if unmeasured(result):
                    break
                points.done(result, records)
            else:
                if points.capacity is not None:
                    self.got.capacity = points.capacity
                    self.checkpoint()  # the search's last verdict and its stop reason reach the disk too
        if everything and spec.eval.tasks and self.got.crash is None:
            # accuracy of this very server, after its load points (their caches are its own); never of a dead one
            measurer.alive()
            self.got.scores |= run_eval(
                spec.eval,
                view.front_url,
                spec.model.name,
                resolve_tokenizer(spec.model, self.model_path),
                self.workdir,
                measurer.api_key,
                self.say,
            )
        if everything and spec.eval.adapters and self.got.crash is None:
            measurer.alive()
            tokenizer = resolve_tokenizer(spec.model, self.model_path)
            self.got.scores |= adapter_scores(spec, view.front_url, measurer.api_key, tokenizer, self.workdir, self.say)

    def _load_adapters(self, engines: Sequence[tuple[str, str]], api_key: str | None) -> None:
        """``engine.lora_loading=runtime``: load every LoRA adapter into every engine server
        through its load endpoint, each timed (``adapter.<name>.load_s``: the slowest server's)."""
        path = self.adapter.adapter_loading(self.spec)
        if path is None:
            return
        for name, folder in resolve_adapters(self.spec.model, build=False):
            took = max(load_adapter(url + path, name, folder, api_key) for _, url in engines)
            self.got.scores[adapter_key(name, M.LOAD_S)] = took
            self.say(f"LoRA adapter {name} loaded at run time in {took * 1e3:.0f} ms")

    def _point(
        self, load: LoadSession, measurer: PointMeasurer, point: LoadPointSpec, index: int, label: str | None = None
    ) -> tuple[PointResult, list[RequestRecord]]:
        """One load point (``label``: its name when not the point's own): its requests drawn and
        senders ready, its measurement started (a server that died since the last point is not
        measured), sent, measured and saved to disk; its result and its requests' records."""
        load.prepare(point, index)
        try:
            measurer.start(index, point, label)
        except ServerCrashedError as exc:
            self.got.crash = exc
            raise
        run = load.go()
        result, crash = measurer.finish(index, point, run.records, run.client)
        self.got.point(result, run.records, crash)
        self.checkpoint()  # measured points reach the disk now, whatever happens next
        return result, run.records

    # ------------------------------------------------------------------ the result

    def server_log(self) -> str:
        """Every server's log of the trial, in start order (one server: its log as is)."""
        logs = [(name, p) for name, p in self.server_logs if p.exists()]
        if len(logs) == 1:
            return logs[0][1].read_text(errors="replace")
        return "".join(f"===== {name} =====\n" + p.read_text(errors="replace") for name, p in logs)

    def scrub_logs(self) -> None:
        """Hide the trial's secrets in the raw logs left in its folder (every server's, lm-eval's),
        once their writers have stopped: a server echoes its argv (vLLM's "non-default args"), so
        a key given as ``engine.extra_args=[--api-key, ...]`` was there in plain text. The copies
        in the result and MLflow are hidden as they are made (:meth:`result`). Every server logs
        into the trial's folder (``_start``'s ``log_name``), so its ``*.log`` files are all of them."""
        scrub_logs(self.workdir, self.secrets)

    def checkpoint(self) -> None:
        done, total = len(self.got.points), len(self.spec.workload.load_points)
        interrupted = f"interrupted after {done} of {total} load points"
        save_result(self.result("FAILED", interrupted, traces=False), self.workdir)

    def result(self, status: TrialStatus, error: str | None, traces: bool = True) -> TrialResult:
        """The trial's result; ``traces``: with the profiler's trace files (not in checkpoints)."""
        got = self.got
        metrics, capacity = got.metrics(self.spec)
        header = asdict(self.base)
        header["slate"] = header["slate"] or {}
        return TrialResult(
            **header,
            status=status,
            error=hide(error, self.secrets) if error else error,
            ended_at=time.time(),
            points=list(got.points),
            metrics=metrics,
            capacity=capacity,
            telemetry=got.telemetry(),
            records_parquet=got.records_parquet(),
            telemetry_parquet=got.telemetry_parquet(),
            artifacts=collect_traces(self.workdir) if traces else {},
            server_log=hide(self.server_log(), self.secrets),
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
    try:
        return outcome(run, run.measure)
    finally:  # its servers are stopped by now, on every way out (Ctrl-C included)
        run.scrub_logs()


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
    run.say(status + (f": {hide(error.splitlines()[0], run.secrets)}" if error else ""))
    return run.result(status, error)
