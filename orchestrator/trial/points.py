"""One load point, measured: what is gathered around it (:class:`RawPoint`), its stages made from
that alone (:func:`point_stages`: the first, :mod:`orchestrator.trial.measured_point`; the
hardware, the verdict, the floor, the diagnosis), and :class:`PointMeasurer`, which scrapes and
samples a running server group around each point."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from orchestrator.config.errors import ServerCrashedError
from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ClosedLoop, LoadPointSpec, TraceReplay, TrialSpec
from orchestrator.engines import EngineAdapter, EngineMetric
from orchestrator.loadgen.traces import read_trace
from orchestrator.metrics import prometheus, telemetry
from orchestrator.metrics.diagnosis import Diagnosis, engine_batch
from orchestrator.metrics.fidelity import PointVerdict, judge_point
from orchestrator.metrics.monitor import ResourceMonitor
from orchestrator.metrics.probes import TelemetrySampler, start_telemetry
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult, RawPoint
from orchestrator.metrics.summary import (
    server_failure,
    summarize_by_adapter,
    summarize_by_class,
)
from orchestrator.metrics.telemetry import Timeline
from orchestrator.perf.floors import floor_metrics
from orchestrator.trial.diagnose import STALLS_KEPT, Census, foreign_bound, point_diagnosis
from orchestrator.trial.measured_point import MeasuredStage, measured_stage
from orchestrator.trial.profile import ProfileWindow
from orchestrator.trial.servers import GroupView, ServerGroup

log = logging.getLogger(__name__)


def point_setting(point: LoadPointSpec) -> dict[str, object]:
    """A point's setting as recorded on its run: its fields, and a trace's content hash (the run
    says which trace it replayed, not only where it was)."""
    setting: dict[str, object] = point.model_dump(exclude_none=True)
    if isinstance(replay := point.load, TraceReplay):
        setting["trace_sha256"] = read_trace(replay.path, replay.format, replay.block_tokens).sha256
    return setting


@dataclass(frozen=True)
class PointStages:
    """One point's result by stage, in the order they are made, each from the stages before it
    (read through a read-only view: no stage writes into another's numbers): the client's
    summary and the servers' deltas (:func:`.measured_point.measured_stage`), the hardware over the window, the
    validity verdict, the roofline floor at the batch the engine ran, and the diagnosis.
    Flattened to the named metric keys only in :meth:`metrics` (a later stage's key wins)."""

    measured: MeasuredStage
    hardware: Mapping[str, float]
    verdict: PointVerdict
    floor: Mapping[str, float]
    diagnosis: Diagnosis
    classes: Mapping[str, Mapping[str, float]]  # per class, the diagnosis's per-class numbers added
    adapters: Mapping[str, Mapping[str, float]]

    def before_diagnosis(self) -> Mapping[str, float]:
        """What the verdict's console lines and the floor read: the stages up to the verdict."""
        return _view(self.measured.metrics(), self.hardware, self.verdict.metrics)

    def metrics(self) -> dict[str, float]:
        """The point's metrics under their named keys."""
        return {
            **self.measured.metrics(),
            **self.hardware,
            **self.verdict.metrics,
            **self.floor,
            **self.diagnosis.metrics,
        }

    def result(self, index: int, label: str, setting: dict[str, object], window: tuple[float, float]) -> PointResult:
        return PointResult(
            index=index,
            label=label,
            setting=setting,
            metrics=self.metrics(),
            class_metrics={cls: dict(m) for cls, m in self.classes.items()},
            adapter_metrics={name: dict(m) for name, m in self.adapters.items()},
            invalid_reasons=self.verdict.reasons,
            window=window,
            diagnosis=self.diagnosis.as_json(STALLS_KEPT),
        )


def _view(*stages: Mapping[str, float]) -> Mapping[str, float]:
    """The stages so far as one read-only mapping (a later stage's key wins)."""
    merged: dict[str, float] = {}
    for stage in stages:
        merged.update(stage)
    return MappingProxyType(merged)


def point_stages(
    spec: TrialSpec,
    point: LoadPointSpec,
    raw: RawPoint,
    engine_metrics: dict[str, EngineMetric],
    view: GroupView,
    foreign_limit: float | None,
    crash: ServerCrashedError | None,
) -> PointStages:
    """The point's stages from what was gathered around it (``crash``: the servers were not
    serving; its numbers are then neither valid nor the client's fault)."""
    records, window, rows = raw.records, raw.window, raw.rows
    first = measured_stage(spec, point, raw, engine_metrics, view.disaggregated)
    measured = MappingProxyType(first.metrics())
    devices = float(spec.engine.num_gpus or 1) if spec.platform.device == "cuda" else 1.0
    hardware = MappingProxyType(
        telemetry.hardware_metrics(rows, window, measured, spec.platform.price_per_hour, devices)
    )
    if crash is not None:
        reason = f"the server failed: {str(crash).splitlines()[0]}"
        verdict = PointVerdict({M.INVALID: 1.0, M.SERVER_FAILED: 1.0}, server=[reason])
    else:
        capped = point.max_concurrency is not None
        verdict = judge_point(spec.workload, records, _view(measured, hardware), capped, view.front, foreign_limit)
    so_far = _view(measured, hardware, verdict.metrics)
    batch = engine_batch(so_far, rows, window)
    streams = point.load.concurrency if isinstance(point.load, ClosedLoop) else None
    floor = MappingProxyType(floor_metrics(spec, so_far, batch, streams))
    classes = summarize_by_class(records) if len(spec.workload.classes) > 1 else {}
    diagnosis = point_diagnosis(
        spec, point, raw, _view(so_far, floor), classes, verdict.client, view.disaggregated, crash is not None
    )
    for cls, extra in diagnosis.class_metrics.items():
        classes[cls] = {**classes.get(cls, {}), **extra}
    return PointStages(first, hardware, verdict, floor, diagnosis, classes, summarize_by_adapter(records))


class PointMeasurer:
    """Measures load points on one running server group: before a point, the servers are
    alive, their caches emptied where asked, their counters read and the resource monitor
    started; after it, the same read again and the point's :class:`PointResult` made."""

    def __init__(
        self,
        spec: TrialSpec,
        group: ServerGroup,
        adapter: EngineAdapter[Any],
        gpu_ids: list[int],
        timeline: Timeline,
        progress: Progress,
    ) -> None:
        self.spec, self.timeline, self.progress = spec, timeline, progress
        view = self.view = group.view()  # read once: the group does not change while it runs
        self.engine_metrics, self.api_key = adapter.metrics_for(spec), adapter.api_key(spec)
        platform = spec.platform
        # memory and the engine's gauges, sampled over each point (onto the trial's timeline too)
        self.monitor = ResourceMonitor(
            list(view.pids),
            view.metrics_url,
            self.engine_metrics,
            platform.monitor_interval_s,
            gpu_ids,
            platform.monitor_budget,
            timeline,
        )
        cache_reset = adapter.cache_reset(spec)
        # the servers' two live checks: ``ready`` before a point (alive, caches emptied where
        # asked; raises ServerCrashedError), ``alive`` after it (raises the same)
        self.ready: Callable[[], None] = lambda: group.ready(cache_reset)
        self.alive: Callable[[], None] = group.check_alive
        self.census = Census(view.pids, view.urls)  # who used the machine's CPU over each point
        self.foreign_limit = foreign_bound(spec)  # the most of it others may take (workload.validity)
        self.gpu_ids = gpu_ids
        self.sampler: TelemetrySampler | None = None  # the trial's telemetry, while the measurer is open
        self.telemetry_notes: dict[str, str] = {}
        self.window: ProfileWindow | None = None
        self.label = ""  # the point being measured (start)
        self._before: prometheus.Sample = {}
        self._t0 = 0.0
        # stamps a point's start and end; with telemetry on, the sampler's edge() (a sample of
        # every probe at both ends of the window, whatever its interval)
        self.clock: Callable[[], float] = telemetry.now

    def __enter__(self) -> PointMeasurer:
        """Telemetry on (its sampler started) for the points measured until ``__exit__``."""
        self.sampler, self.telemetry_notes = start_telemetry(
            self.spec.platform, list(self.view.pids), self.gpu_ids, self.timeline
        )
        if self.sampler is not None:
            self.clock = self.sampler.edge
        return self

    def __exit__(self, *exc: object) -> None:
        self.monitor.stop()  # idempotent; a point that raised must not leave the sampler running
        if self.sampler is not None:
            self.sampler.stop()
        if self.window is not None:  # nor its profiler window: it would start a trace later, on
            self.window.cancel()  # whatever server then answers at that URL
            self.window = None

    def _scrape(self) -> prometheus.Sample:
        if not self.engine_metrics or self.view.metrics_url is None:
            return {}
        total: prometheus.Sample = {}
        try:
            for url in self.view.counter_urls:
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

    def start(self, index: int, point: LoadPointSpec, label: str | None = None) -> None:
        """Measure a point from now (``label``: its name when not ``point.label``, a capacity
        probe's second run ``c4#2``). Raises :class:`ServerCrashedError` for a server that died
        during warm-up or since the last point: it is not measured."""
        self.ready()
        self.label = label or point.label
        self.progress(f"{self.which(index)} {self.label}: running")
        self._before = self._scrape()
        self.monitor.reset()
        self.monitor.start()
        self.census.start()
        self._t0 = self.clock()
        self.window = self._profile_window(index, point)

    def finish(
        self, index: int, point: LoadPointSpec, records: list[RequestRecord], client: dict[str, float]
    ) -> tuple[PointResult, ServerCrashedError | None]:
        """The point's result, and the servers' failure when they were not serving: what was
        gathered around the point (the census, the profiler's window, the monitor, the counters,
        the servers' state), then, from that alone, its metrics, its verdict, its decode floor and
        its diagnosis."""
        spec = self.spec
        raw = self._gather(records, client)
        crash = self._server_failure(records)
        stages = point_stages(spec, point, raw, self.engine_metrics, self.view, self.foreign_limit, crash)
        for line in stages.verdict.said(self.label, stages.before_diagnosis()):
            self.progress(line)
        result = stages.result(index, self.label, point_setting(point), raw.window)
        self.progress(f"{self.which(index)} {self.label}: {result.said(len(records))}")
        self.progress(f"{self.which(index)} {self.label}: {stages.diagnosis.headline}")
        return result, crash

    def _gather(self, records: list[RequestRecord], client: dict[str, float]) -> RawPoint:
        """The point is over: what was gathered around it, its gatherers stopped."""
        t1 = self.clock()
        foreign = self.census.finish(t1 - self._t0)
        profiled = self.window.finish() if self.window is not None else {}
        self.window = None
        resources = self.monitor.stop()
        rows = self.timeline.snapshot()
        return RawPoint(
            records, client, resources, self._before, self._scrape(), (self._t0, t1), rows, foreign, profiled
        )

    def _profile_window(self, index: int, point: LoadPointSpec) -> ProfileWindow | None:
        """The profiler's window over this point, started, when it is the ``profile.point``."""
        profile, profiler = self.spec.profile, self.view.profiler
        fixed = index < len(self.spec.workload.load_points)  # not a capacity probe of the same label
        if profile is None or profiler is None or not fixed or point.label != profile.point:
            return None
        urls = [url for _, url in self.view.engines]
        window = ProfileWindow(profile, profiler, urls, self.api_key, self.progress)
        window.start()
        return window

    def _server_failure(self, records: list[RequestRecord]) -> ServerCrashedError | None:
        """The servers' state after a point: a process gone, an engine dead under a live API
        server (its log, its health), or every request failing on the server's side."""
        try:
            self.alive()
        except ServerCrashedError as exc:
            return exc
        failed = server_failure(records)
        if failed is None:
            return None
        return ServerCrashedError(
            f"the server answered no request of the point: {failed} "
            "(its process is up and its health check answers 200)"
        )


def trial_metrics(points: list[PointResult], startup_s: float | None) -> dict[str, float]:
    """The trial's own numbers over its points: start-up, peak memory, totals."""
    out: dict[str, float] = {}
    if startup_s is not None:
        out[M.STARTUP_S] = startup_s
    peaks = [p.metrics[M.MEMORY_PEAK_GB] for p in points if M.MEMORY_PEAK_GB in p.metrics]
    if peaks:
        out[M.MEMORY_PEAK_GB_MAX] = max(peaks)
    out[M.REQUESTS_TOTAL] = sum(p.metrics.get(M.REQUESTS, 0.0) for p in points)
    out[M.ERRORS_TOTAL] = sum(p.metrics.get(M.ERRORS, 0.0) for p in points)
    out[M.NUM_POINTS] = float(len(points))
    return out


# ---------------------------------------------------------------------- entry points
