"""The one function that sequences a trial: check, start server, run load points, stop.

``run_trial`` never talks to MLflow; it returns a :class:`TrialResult` and the driver logs it.
Every failure becomes a FAILED (or SKIPPED) result with the reason; the server is stopped
on every exit path by :class:`ServerProcess`'s context manager.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError, InfeasibleConfigError, ServerCrashedError, TrialError
from orchestrator.config.hashing import trial_hash
from orchestrator.config.schema import LoadPointSpec, SGLangEngineSpec, TrialSpec, VLLMEngineSpec
from orchestrator.config.secrets import redact_mapping, redact_override, redact_text
from orchestrator.engines import envs
from orchestrator.engines import (
    EngineMetric,
    ExternalServer,
    ServerLaunch,
    ServerProcess,
    adapter_for,
    free_port,
    port_is_free,
    server_for,
)
from orchestrator.evaluation import run_eval
from orchestrator.feasibility import assess, describe, trial_decode_floor
from orchestrator.loadgen import Endpoint, PromptFactory, run_points
from orchestrator.loadgen.capacity import CapacitySearch, judge
from orchestrator.loadgen.datasets import load_sharegpt, load_trace
from orchestrator.loadgen.preflight import preflight
from orchestrator.metrics import hardware, prometheus
from orchestrator.metrics.fidelity import clock_gap, server_latency, workload_fidelity
from orchestrator.metrics.monitor import ResourceMonitor
from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult, TrialResult, save_result
from orchestrator.metrics.summary import (
    client_validity,
    server_failure,
    summarize_by_class,
    summarize_point,
    summarize_repeats,
)
from orchestrator.models import resolve_model, resolve_tokenizer

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def check_feasible(spec: TrialSpec, gpu_ids: list[int]) -> None:
    """Raise :class:`InfeasibleConfigError` when this trial cannot run on what it was given."""
    need = spec.engine.num_gpus
    if spec.platform.device == "cuda" and len(gpu_ids) < need:
        raise InfeasibleConfigError(
            f"needs {need} GPU(s) (tensor_parallel_size x pipeline_parallel_size) but {len(gpu_ids)} were assigned"
        )


def plan_trial(spec: TrialSpec, cluster_gpus: int | None = None) -> dict[str, Any]:
    """What the trial would do, without starting or building anything (for dry runs)."""
    reason = assess(spec, cluster_gpus)
    plan: dict[str, Any] = {"feasible": reason is None, "reason": reason, **describe(spec)}
    plan["servers"] = [x.redacted() for x in _planned_launches(spec)]
    missing_env = envs.missing(spec)
    if missing_env:
        plan["engine_environment"] = missing_env
    return plan


def _planned_launches(spec: TrialSpec) -> list[ServerLaunch]:
    """The trial's server launches with placeholder ports and folder: nothing is bound or built."""
    ports = iter(range(1, 100))
    return adapter_for(spec.engine.name).launches(spec, resolve_model(spec.model, build=False),
                                                  _port_for(spec, pick_free=False), lambda: next(ports),
                                                  "<trial dir>")


def skipped_result(spec: TrialSpec, overrides: list[str], reason: str) -> TrialResult:
    """The result of a trial found infeasible before it was submitted."""
    now = time.time()
    return TrialResult(trial_hash=trial_hash(spec), experiment=spec.experiment, variant=spec.variant,
                       overrides=[redact_override(o) for o in overrides],
                       spec=redact_mapping(spec.model_dump(mode="json")), status="SKIPPED", error=reason,
                       started_at=now, ended_at=now, engine_version=adapter_for(spec.engine.name).version(spec))


def check_inputs(spec: TrialSpec) -> list[str]:
    """Read every file the workload names (datasets, traces); raise ConfigError if one is bad.

    Returns notes for the user (e.g. malformed entries skipped). Runs before anything starts.
    """
    notes = []
    if spec.model.source == "path":
        resolve_model(spec.model)  # a ConfigError naming model.path when it is not a model folder
    if spec.model.tokenizer and not Path(spec.model.tokenizer).expanduser().exists() and spec.model.source != "hub":
        raise ConfigError(f"model.tokenizer: '{spec.model.tokenizer}' does not exist")
    key_env = getattr(spec.engine, "api_key_env", None)
    if key_env and not os.environ.get(key_env):
        raise ConfigError(f"engine.api_key_env: environment variable {key_env} is not set")
    for name, c in spec.workload.classes.items():
        if c.dataset == "sharegpt" and c.path:
            try:
                data = load_sharegpt(c.path)
            except ConfigError as exc:
                raise ConfigError(f"workload.classes.{name}.path: {exc}") from None
            notes.append(f"workload.classes.{name}: {len(data.conversations)} conversations from {c.path}"
                         + (f", {data.malformed} malformed entries skipped" if data.malformed else ""))
    for i, p in enumerate(spec.workload.load_points):
        if p.trace:
            try:
                trace = load_trace(p.trace)
            except ConfigError as exc:
                raise ConfigError(f"workload.load_points.{i}.trace: {exc}") from None
            notes.append(f"workload.load_points.{i}: {len(trace)} requests from trace {p.trace}")
    return notes


def _port_for(spec: TrialSpec, pick_free: bool = True) -> int:
    """The configured port, else a free one for engines we launch (0 for external servers, or
    when ``pick_free`` is off: a plan binds nothing)."""
    engine = spec.engine
    if isinstance(engine, (VLLMEngineSpec, SGLangEngineSpec)) and engine.port:
        if pick_free and not port_is_free(engine.host, engine.port):
            raise TrialError(f"engine.port: {engine.host}:{engine.port} is already in use (another server?); "
                             "choose another port, or leave engine.port null to get a free one")
        return engine.port
    if isinstance(engine, (VLLMEngineSpec, SGLangEngineSpec)) and pick_free:
        return free_port(engine.host)
    return 0


def _port_picker(spec: TrialSpec, taken: set[int]) -> Callable[[], int]:
    """Free ports for a trial's other servers (P/D, side channels), never the same one twice."""
    host = getattr(spec.engine, "host", "127.0.0.1")

    def pick() -> int:
        for _ in range(100):
            port = free_port(host)
            if port not in taken:
                taken.add(port)
                return port
        raise TrialError("no free port found")

    return pick


def server_gpus(launch: ServerLaunch, gpu_ids: list[int]) -> list[int]:
    """The GPUs one server of the trial gets: its slots of the trial's assigned GPUs."""
    if launch.gpus is None:
        return list(gpu_ids)
    return [gpu_ids[i] for i in launch.gpus if i < len(gpu_ids)]


def describe_servers(launches: list[ServerLaunch], gpu_ids: list[int]) -> list[dict[str, Any]]:
    """Each server's redacted command and the GPUs it is given (for results, logs and tests)."""
    return [{**x.redacted(), "cuda_visible_devices": ",".join(str(g) for g in server_gpus(x, gpu_ids))}
            for x in launches]


def server_env(launch: ServerLaunch, gpu_ids: list[int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in launch.unset_env}
    env.update(launch.env)
    mine = server_gpus(launch, gpu_ids)
    if mine:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in mine)
    elif gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a proxy/router: no GPU
    return env


class ServerGroup:
    """The running servers of a trial (one, or prefill + decode + proxy), front last."""

    def __init__(self, launches: list[ServerLaunch], servers: list[ServerProcess | ExternalServer]) -> None:
        self.launches, self.servers = launches, servers

    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.pid]

    def metrics_launch(self) -> ServerLaunch | None:
        """Whose Prometheus endpoint is sampled for gauges: the last engine server (decode under P/D)."""
        return next((x for x in reversed(self.launches) if x.metrics_path), None)

    def counter_urls(self) -> list[str]:
        """Whose counters make a point's server deltas: every replica behind a router (summed),
        else the sampled server."""
        replicas = [x.metrics_url for x in self.launches if x.metrics_path and x.name.startswith("replica")]
        if replicas:
            return replicas
        launch = self.metrics_launch()
        return [launch.metrics_url] if launch is not None else []

    def disaggregated(self) -> bool:
        """Prefill and decode on separate servers (P/D): the sampled server is the decode one."""
        return any(x.name == "prefill" for x in self.launches)

    def engine_launches(self) -> list[ServerLaunch]:
        """The servers that run the model (replicas, prefill and decode): a router or a P/D proxy
        in front lists no real model (SGLang's router answers 'unknown') and tokenizes nothing.
        The front alone when nothing says it is an engine (``engine=external`` without metrics)."""
        return [x for x in self.launches if x.metrics_path] or [self.launches[-1]]

    def front(self) -> str | None:
        """The name of the router or proxy the client talks to, None when it talks to an engine."""
        front = self.launches[-1]
        return None if front.metrics_path or len(self.launches) == 1 else front.name

    def check_alive(self) -> None:
        for s in self.servers:
            s.check_alive()


class _PointHooks:
    """Scrapes and samples around each load point; turns records into a :class:`PointResult`."""

    def __init__(self, spec: TrialSpec, server: ServerGroup, launch: ServerLaunch | None,
                 engine_metrics: dict[str, EngineMetric],
                 monitor: ResourceMonitor, progress: Progress, label: str,
                 checkpoint: Callable[[_PointHooks], None] = lambda hooks: None,
                 cache_reset: tuple[str, str] | None = None) -> None:
        self.spec, self.server, self.launch, self.engine_metrics = spec, server, launch, engine_metrics
        self.monitor, self.progress, self.label = monitor, progress, label
        self.checkpoint = checkpoint
        self.cache_reset = cache_reset
        self.points: list[PointResult] = []
        self.records: list[RequestRecord] = []
        self.crash: ServerCrashedError | None = None
        self._before: prometheus.Sample = {}
        self._t0 = 0.0

    def attach(self, server: ServerGroup, launch: ServerLaunch | None, monitor: ResourceMonitor) -> None:
        """Measure the next points on restarted servers."""
        self.server, self.launch, self.monitor = server, launch, monitor

    def _scrape(self) -> prometheus.Sample:
        if not self.engine_metrics or self.launch is None or not self.launch.metrics_path:
            return {}
        total: prometheus.Sample = {}
        try:
            for url in self.server.counter_urls():
                for name, value in prometheus.scrape(url).items():
                    total[name] = total.get(name, 0.0) + value
        except OSError as exc:
            log.warning("metrics scrape failed: %s", exc)
            return {}
        return total

    def which(self, index: int) -> str:
        """``point 2/4`` for a fixed point, ``probe 3`` for a capacity search's probe."""
        n = len(self.spec.workload.load_points)
        return f"point {index + 1}/{n}" if index < n else f"probe {index - n + 1}"

    def start(self, index: int, point: LoadPointSpec) -> None:
        try:  # a server that died during warm-up or since the last point is not measured
            self.server.check_alive()
        except ServerCrashedError as exc:
            self.crash = exc
            raise
        if self.cache_reset is not None:
            reset_caches(self.server, self.cache_reset)
        self.progress(f"[{self.label}] {self.which(index)} {point.label}: running")
        self._before = self._scrape()
        self.monitor.reset()
        self.monitor.start()
        self._t0 = time.monotonic()

    def end(self, index: int, point: LoadPointSpec, records: list[RequestRecord], client: dict[str, float]) -> bool:
        resources = self.monitor.stop()
        self.records.extend(records)
        w = self.spec.workload
        arriving = ["trace"] if point.trace else [n for n, c in w.classes.items() if c.rate is None]
        if w.repeats > 1:
            per_repeat = [summarize_point([x for x in records if x.repeat == r], w.slo, point.rate, arriving)
                          for r in range(w.repeats)]
            metrics = summarize_repeats(per_repeat, w.max_ci_rel_width)
        else:
            metrics = summarize_point(records, w.slo, point.rate, arriving)
        for key, value in resources.items():  # engine gauges are server-side numbers
            metrics[key if key == "memory_peak_gb" else f"server_{key}"] = value
        metrics.update(client)
        after = self._scrape()
        for key, value in prometheus.deltas(self._before, after, self.engine_metrics).items():
            metrics[f"server_{key}"] = value
        latency = prometheus.latency_buckets(self._before, after, self.engine_metrics)
        if self.server.disaggregated():
            # the decode server's clock starts when the prefill server is done: its TTFT and
            # end-to-end leave the prefill and the KV transfer out, so they are named for what they are
            # and not set against ours (its ITL is the whole decode: that one is compared)
            latency = {(f"decode_{k}" if k in ("ttft", "e2e") else k): v for k, v in latency.items()}
        metrics.update(server_latency(latency))
        crash = self._server_failure(records)
        reasons: list[str] = []
        if crash is not None:  # numbers of a server that was not serving: neither valid nor the client's fault
            metrics["invalid"], metrics["server_failed"] = 1.0, 1.0
            reasons.append(f"the server failed: {str(crash).splitlines()[0]}")
            self.progress(f"[{self.label}] point {point.label}: {reasons[0]}")
        else:
            reasons = self._judge(point, records, metrics)
        metrics.update(roofline_metrics(self.spec, point, metrics))
        classes = summarize_by_class(records) if len(self.spec.workload.classes) > 1 else {}
        self.points.append(PointResult(index=index, label=point.label, setting=point.model_dump(exclude_none=True),
                                       metrics=metrics, class_metrics=classes, invalid_reasons=reasons))
        self.progress(
            f"[{self.label}] {self.which(index)} {point.label}: "
            f"{int(metrics.get('completed', 0))}/{len(records)} ok in {time.monotonic() - self._t0:.1f}s, "
            f"ttft p50 {metrics.get('ttft_ms_p50', float('nan')):.1f} ms, "
            f"itl p99 {metrics.get('itl_ms_p99', float('nan')):.1f} ms, "
            f"{metrics.get('tokens_per_second', 0):.0f} tok/s"
        )
        self.checkpoint(self)  # measured points reach the disk now, whatever happens next
        if crash is not None:
            self.crash = crash
            return False
        return True

    def _judge(self, point: LoadPointSpec, records: list[RequestRecord], metrics: dict[str, float]) -> list[str]:
        """Whether the point's numbers describe the server under the planned workload: the
        client kept up (client validity), the server got the planned requests (workload
        fidelity) and its own clock agrees with ours. Adds the verdicts to ``metrics`` and
        returns the reasons (empty: valid)."""
        w = self.spec.workload
        _, client_reasons = client_validity(metrics, w.validity, capped=point.max_concurrency is not None)
        found, workload_reasons = workload_fidelity(records, metrics, w)
        gap, gap_reasons = clock_gap(metrics, w.fidelity, via=self.server.front())
        metrics.update(found)
        metrics.update(gap)
        metrics["client_invalid"] = 1.0 if client_reasons or gap_reasons else 0.0
        metrics["workload_invalid"] = 1.0 if workload_reasons else 0.0
        metrics["invalid"] = max(metrics["client_invalid"], metrics["workload_invalid"])
        if client_reasons or gap_reasons:
            self.progress(f"[{self.label}] point {point.label} INVALID (the client was the bottleneck): "
                          + "; ".join(client_reasons + gap_reasons))
        if workload_reasons:
            self.progress(f"[{self.label}] point {point.label} INVALID (the server got another workload than "
                          "planned): " + "; ".join(workload_reasons))
        return client_reasons + gap_reasons + workload_reasons

    def _server_failure(self, records: list[RequestRecord]) -> ServerCrashedError | None:
        """The servers' state after a point: a process gone, an engine dead under a live API
        server (its log, its health), or every request failing on the server's side."""
        try:
            self.server.check_alive()
        except ServerCrashedError as exc:
            return exc
        failed = server_failure(records)
        if failed is None:
            return None
        return ServerCrashedError(f"the server answered no request of the point: {failed} "
                                  "(its process is up and its health check answers 200)")


def run_trial(
    spec: TrialSpec,
    workdir: str | os.PathLike[str],
    overrides: list[str] | None = None,
    gpu_ids: list[int] | None = None,
    progress: Progress = _print,
) -> TrialResult:
    """Run one trial end to end and return its result; never raises for a trial-level failure.

    After every load point the result so far is saved in ``workdir`` (status FAILED,
    "interrupted after N of M load points"), so a trial killed mid-way keeps its points.
    """
    run = _TrialRun(spec, workdir, overrides or [], list(gpu_ids or []), progress)
    return _outcome(run, run.measure)


def _outcome(run: _TrialRun, body: Callable[[], None]) -> TrialResult:
    """Run ``body`` and turn how it ended into the trial's result."""
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
    run.progress(f"[{run.label}] {status}" + (f": {error.splitlines()[0]}" if error else ""))
    return run.result(status, error)


def shared_server_spec(spec: TrialSpec) -> TrialSpec:
    """The spec a shared server is started from: with the prefix-cache reset endpoint on, so
    that each trial of the group starts on an empty cache."""
    if hasattr(spec.engine, "reset_cache_between_points"):
        return spec.model_copy(update={"engine": spec.engine.model_copy(update={"reset_cache_between_points": True})})
    return spec


def server_key(spec: TrialSpec) -> str | None:
    """Identity of the servers a trial starts (every argv, env, file, GPU slot, the platform),
    or None when its servers cannot be shared: trials with the same key differ only in
    workload/load settings and can run one after the other on one server start."""
    import hashlib
    import json

    engine = spec.engine
    if not isinstance(engine, (VLLMEngineSpec, SGLangEngineSpec)) or engine.restart_between_points:
        return None
    launches = _planned_launches(shared_server_spec(spec))
    ident = {"servers": [[x.argv, x.env, x.files, x.gpus, x.unset_env] for x in launches],
             "model": spec.model.model_dump(mode="json"), "platform": spec.platform.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_trial_group(
    items: list[tuple[TrialSpec, str | os.PathLike[str], list[str]]],
    gpu_ids: list[int] | None = None,
    progress: Progress = _print,
) -> list[TrialResult]:
    """Trials with one :func:`server_key` run one after the other on one server start (the
    first trial's); each keeps its own result. Prefix caches are emptied between trials. If
    the shared server dies, the trials after it run on fresh servers of their own."""
    gpus = list(gpu_ids or [])
    runs = [_TrialRun(spec, wd, ov, gpus, progress) for spec, wd, ov in items]
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
                    progress(f"[{run.label}] on the running server of [{lead.label}] (server start saved)")
                    reset_caches(group, between_trials)
                    run.base["servers"] = lead.base.get("servers", [])
                results.append(_outcome(run, lambda run=run: run.measure(group)))
                save_result(results[-1], run.workdir)  # final on disk now, not when the whole group ends
                if run.hooks is not None and run.hooks.crash is not None:
                    break
    except (TrialError, ConfigError, InfeasibleConfigError) as exc:
        if started:
            raise
        # the shared server never came up: the same happens to every trial of the group
        error = f"{type(exc).__name__}: {exc}"
        status = "SKIPPED" if isinstance(exc, InfeasibleConfigError) else "FAILED"
        progress(f"[{lead.label}] {status} (and the {len(runs) - 1} trial(s) sharing its server): "
                 f"{error.splitlines()[0]}")
        return [run.result(status, error) for run in runs]
    for run in runs[len(results):]:
        results.append(run_trial(run.spec, run.workdir, run.overrides, gpus, progress))
    return results


def reset_caches(group: ServerGroup, how: tuple[str, str] | None) -> None:
    """Empty every engine server's prefix cache (a busy SGLang refuses: retried)."""
    if how is None:
        return
    method, path = how
    for launch in group.launches:
        if not launch.metrics_path:  # a proxy or router has no cache
            continue
        for attempt in range(20):
            try:
                req = urllib.request.Request(launch.base_url + path, method=method)
                with urllib.request.urlopen(req, timeout=30):
                    break
            except urllib.error.HTTPError as exc:
                if exc.code != 400 or attempt == 19:
                    raise TrialError(f"cache reset {method} {path} on {launch.name} failed: HTTP {exc.code}")
                time.sleep(0.5)
            except OSError as exc:
                raise TrialError(f"cache reset {method} {path} on {launch.name} failed: {exc}") from exc


CAPACITY_UNITS = {"rate": "req/s", "concurrency": "streams"}


class _TrialRun:
    """The state of one trial while it runs: what it has measured so far and how to report it."""

    def __init__(self, spec: TrialSpec, workdir: str | os.PathLike[str], overrides: list[str], gpu_ids: list[int],
                 progress: Progress) -> None:
        # absolute: servers, their files and lm-eval get paths that mean the same in any folder
        workdir = Path(os.path.abspath(workdir))
        self.spec, self.workdir, self.gpu_ids, self.progress = spec, workdir, gpu_ids, progress
        self.overrides = overrides
        self.hash = trial_hash(spec)
        self.label = spec.variant or self.hash[:8]
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "server.log"
        self.adapter = adapter_for(spec.engine.name)
        self.hooks: _PointHooks | None = None
        self.starts: list[float] = []  # start-up seconds of every server (group) start; the first is startup_s
        self.server_logs: list[tuple[str, Path]] = []
        self.held: dict[str, float] = {}
        self.scores: dict[str, float] = {}  # accuracy (lm-eval) after the last load point
        self.search: CapacitySearch | None = None  # the SLO capacity search, when the workload asks for one
        self.model_path = ""
        self.base: dict[str, Any] = dict(
            trial_hash=self.hash, experiment=spec.experiment, variant=spec.variant,
            overrides=[redact_override(o) for o in overrides],
            spec=redact_mapping(spec.model_dump(mode="json")), started_at=time.time(),
            hardware={**hardware.describe(gpu_ids), "gpu_ids": gpu_ids}, engine_version=self.adapter.version(self.spec),
        )

    def measure(self, shared: ServerGroup | None = None) -> None:
        """Start the servers, run every load point, stop them; on ``shared`` servers (already
        running, owned by another trial of the group) only run the load points."""
        spec = self.spec
        self._check()
        if hasattr(self.adapter, "hold"):  # a trial kind without a server (sleep)
            self.held = self.adapter.hold(spec)
            return
        model_path = self.model_path = resolve_model(spec.model)
        factory = PromptFactory(resolve_tokenizer(spec.model, model_path))
        n = len(spec.workload.load_points)
        restart = bool(getattr(spec.engine, "restart_between_points", False))
        if shared is not None:
            self._run_on(shared, factory, 0, n)
        else:  # cold vs warm across a restart (LMCache's disk tier survives it): a fresh server per point
            for start_no, (first, last) in enumerate([(i, i + 1) for i in range(n)] if restart else [(0, n)]):
                with contextlib.ExitStack() as stack:
                    group = self._start(stack, model_path, start_no if restart else None, spec)
                    self._run_on(group, factory, first, last)
                if self.hooks is not None and self.hooks.crash is not None:
                    break
        if self.hooks is not None and self.hooks.crash is not None:
            raise self.hooks.crash

    def _check(self) -> None:
        """Raise :class:`InfeasibleConfigError` if this platform or these GPUs cannot run it."""
        reason = assess(self.spec)
        if reason:
            raise InfeasibleConfigError(reason)
        check_feasible(self.spec, self.gpu_ids)

    def start_shared(self, stack: contextlib.ExitStack) -> ServerGroup:
        """Start this trial's servers for a group of trials (stopped when ``stack`` closes)."""
        self._check()
        return self._start(stack, resolve_model(self.spec.model), None, shared_server_spec(self.spec))

    def _start(self, stack: contextlib.ExitStack, model_path: str, start_no: int | None,
               spec: TrialSpec) -> ServerGroup:
        """Start the servers of ``spec`` (this trial's, or its shared-server variant); they are
        stopped when ``stack`` closes. ``start_no`` numbers the starts of a trial that restarts
        its servers between points."""
        port = _port_for(spec)
        launches = self.adapter.launches(spec, model_path, port, _port_picker(spec, {port}), str(self.workdir))
        own_logs = len(launches) > 1 or start_no is not None
        self.base["servers"] = describe_servers(launches, self.gpu_ids)
        servers = []
        t0 = time.monotonic()
        for launch in launches:
            for path, content in launch.files.items():
                Path(path).write_text(content)
            for folder in launch.scratch:  # registered first: removed after the server has stopped
                stack.callback(shutil.rmtree, folder, True)
            log_path = self.log_path
            if own_logs:
                log_path = self.workdir / f"server-{launch.name}{'' if start_no is None else f'-{start_no}'}.log"
            self.server_logs.append((f"{launch.name}" + ("" if start_no is None else f" (start {start_no})"),
                                     log_path))
            self.progress(f"[{self.label}] starting {spec.engine.name} {launch.name} on {launch.base_url}")
            server = stack.enter_context(server_for(launch, server_env(launch, self.gpu_ids), log_path))
            healthy_after = server.wait_healthy(launch.startup_timeout_s)
            servers.append(server)
        # one server: its own start-up time (0 for an external one); several: until all are up
        startup = healthy_after if len(launches) == 1 else time.monotonic() - t0
        self.starts.append(startup)
        self.progress(f"[{self.label}] server healthy after {startup:.1f}s")
        return ServerGroup(launches, servers)

    def _run_on(self, group: ServerGroup, factory: PromptFactory, first: int, last: int) -> None:
        """Run load points ``first..last-1`` at the group's front server."""
        spec = self.spec
        engine_metrics = self.adapter.metrics_for(spec)
        scraped = group.metrics_launch()
        monitor = ResourceMonitor(group.pids(), scraped.metrics_url if scraped else None, engine_metrics,
                                  spec.platform.monitor_interval_s, self.gpu_ids, spec.platform.monitor_budget)
        if self.hooks is None:
            self.hooks = _PointHooks(spec, group, scraped, engine_metrics, monitor, self.progress, self.label,
                                     self.checkpoint, self.adapter.cache_reset(spec))
        else:
            self.hooks.attach(group, scraped, monitor)
        front = group.launches[-1]
        endpoint = Endpoint(front.base_url, spec.model.name, api_key=self.adapter.api_key(spec))
        workload = spec.workload
        if (first, last) != (0, len(workload.load_points)):
            workload = workload.model_copy(update={"load_points": workload.load_points[first:last]})
        if first == 0 and (self.hooks is None or not self.hooks.points):
            # the servers are the ones the plan was made for (model name, tokenizer): before any load
            for launch in group.engine_launches():
                check = preflight(launch.base_url, spec.model.name, endpoint.api_key, factory, spec.workload,
                                  resolve_tokenizer(spec.model, self.model_path), spec.seed)
                self.progress(f"[{self.label}] pre-flight of {launch.name}: {check.describe()}")
        points: Iterable[LoadPointSpec] = workload.load_points
        if last == len(spec.workload.load_points) and spec.workload.capacity is not None:
            points = self._then_capacity_search(workload.load_points)
        try:
            run_points(endpoint, workload, factory, (spec.seed, spec.workload.seed),
                       self.hooks.start, self.hooks.end, first_index=first, points=points)
        finally:
            monitor.stop()  # idempotent; a point that raised must not leave the sampler running
        if last == len(spec.workload.load_points) and spec.eval.tasks and self.hooks.crash is None:
            # accuracy of this very server, after its load points (their caches are its own); never of a dead one
            group.check_alive()
            self.scores = run_eval(spec.eval, front.base_url, spec.model.name,
                                   resolve_tokenizer(spec.model, self.model_path), self.workdir,
                                   self.adapter.api_key(spec), lambda m: self.progress(f"[{self.label}] {m}"))

    def _then_capacity_search(self, fixed: list[LoadPointSpec]) -> Iterator[LoadPointSpec]:
        """The fixed points, then the probes of the SLO capacity search, each chosen after the
        previous one was measured and judged (:mod:`orchestrator.loadgen.capacity`)."""
        yield from fixed
        cap = self.spec.workload.capacity
        assert cap is not None and self.hooks is not None
        search = self.search = CapacitySearch(start=cap.start, low=cap.lowest, high=cap.high, growth=cap.growth,
                                              precision=cap.precision, max_probes=cap.max_probes,
                                              integer=cap.knob == "concurrency")
        classes = list(self.spec.workload.classes)
        t0 = time.monotonic()
        while True:
            out_of_time = cap.time_budget_s is not None and time.monotonic() - t0 >= cap.time_budget_s
            value = search.next_value(out_of_time)
            if value is None:
                break
            done = len(self.hooks.points)
            yield cap.probe(value)
            if len(self.hooks.points) == done:  # not measured: run_points stops after this
                break
            p = self.hooks.points[-1]
            per_class = p.class_metrics or {classes[0]: p.metrics}  # one class: its metrics are the point's
            verdict = judge(p.metrics, per_class, cap.slo, cap.knob, cap.min_goodput_fraction, cap.min_sustained)
            search.observe(value, p.label, verdict)
            p.metrics["slo_met"] = 1.0 if verdict.verdict == "pass" else 0.0
            self.progress(f"[{self.label}] probe {p.label}: " + ("SLOs met" if verdict.verdict == "pass" else
                          f"{'not counted' if verdict.verdict == 'invalid' else 'SLOs missed'}: "
                          + "; ".join(verdict.reasons)))
        self.progress(f"[{self.label}] SLO capacity: {search.explanation(CAPACITY_UNITS[cap.knob])}")
        self.checkpoint(self.hooks)  # the last verdict and the stop reason reach the disk too

    def capacity_outcome(self) -> tuple[dict[str, float], dict[str, Any]]:
        """The search's metrics (``slo_capacity_rps`` or ``slo_capacity_concurrency``, bracket,
        probes) and its account (every probe's verdict and reasons, why it stopped)."""
        cap, search = self.spec.workload.capacity, self.search
        if cap is None or search is None or not search.probes:
            return {}, {}
        name = "slo_capacity_rps" if cap.knob == "rate" else "slo_capacity_concurrency"
        metrics = {name if k == "capacity" else k.replace("capacity", name): v for k, v in search.summary().items()}
        account = {"knob": cap.knob, "metric": name, "slo": dict(cap.slo),
                   "explanation": search.explanation(CAPACITY_UNITS[cap.knob]), "stop_reason": search.stop_reason,
                   "probes": [{"label": p.label, "value": p.value, "verdict": p.judgement.verdict,
                               "reasons": list(p.judgement.reasons)} for p in search.probes]}
        return metrics, account

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

    def checkpoint(self, hooks: _PointHooks) -> None:
        done, total = len(hooks.points), len(self.spec.workload.load_points)
        save_result(self.result("FAILED", f"interrupted after {done} of {total} load points"), self.workdir)

    def result(self, status: str, error: str | None) -> TrialResult:
        hooks = self.hooks
        points = list(hooks.points) if hooks else []
        records = hooks.records if hooks else []
        capacity_metrics, capacity = self.capacity_outcome()
        return TrialResult(
            **self.base,
            status=status,
            error=error,
            ended_at=time.time(),
            points=points,
            metrics={**_trial_metrics(points, self.starts[0] if self.starts else None),
                     "server_starts": float(len(self.starts)), "server_reused": float(not self.starts),
                     **self.floor_at_batch1(), **self.scores, **capacity_metrics}
            if hooks else dict(self.held),
            capacity=capacity,
            records_parquet=records_to_parquet_bytes(records) if records else b"",
            server_log=redact_text(self.server_log()),
        )


def roofline_metrics(spec: TrialSpec, point: LoadPointSpec, metrics: dict[str, float]) -> dict[str, float]:
    """The decode-step floor at this point's batch and context, and measured TPOT over it.

    Batch: the point's concurrency, else the most requests the server ran at once
    (``server_requests_running_max``), else 1. Context: the mean prompt plus half the mean
    output (the middle of a decode)."""
    requests = metrics.get("completed") or metrics.get("requests") or 0.0
    if not requests:
        return {}
    batch = point.concurrency or int(round(metrics.get("server_requests_running_max", 1.0) or 1.0))
    context = metrics.get("input_tokens", 0.0) / requests + metrics.get("output_tokens", 0.0) / requests / 2
    try:
        floor = trial_decode_floor(spec, batch, int(context))
    except Exception as exc:  # a missing roof is not a trial failure
        log.warning("decode floor: %s", exc)
        return {}
    if floor is None:
        return {}
    out = {"decode_floor_ms": floor.floor_ms, "decode_floor_batch": float(floor.batch)}
    tpot = metrics.get("tpot_ms_p50")
    if tpot:
        out["decode_floor_ratio"] = tpot / floor.floor_ms
    return out


def _trial_metrics(points: list[PointResult], startup_s: float | None) -> dict[str, float]:
    out: dict[str, float] = {}
    if startup_s is not None:
        out["startup_s"] = startup_s
    peaks = [p.metrics["memory_peak_gb"] for p in points if "memory_peak_gb" in p.metrics]
    if peaks:
        out["memory_peak_gb_max"] = max(peaks)
    out["requests_total"] = sum(p.metrics.get("requests", 0.0) for p in points)
    out["errors_total"] = sum(p.metrics.get("errors", 0.0) for p in points)
    out["num_points"] = float(len(points))
    return out
