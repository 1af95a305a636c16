"""One load point, measured: what is gathered around it (:class:`RawPoint`), the metrics made
from that (:func:`point_metrics`, pure), the verdict on them (:func:`judge_point`, pure), and
:class:`PointMeasurer`, which scrapes and samples a running server group around each point."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.config.errors import ServerCrashedError
from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import LoadPointSpec, TrialSpec
from orchestrator.engines import EngineMetric
from orchestrator.feasibility import trial_decode_floor
from orchestrator.loadgen.traces import read_trace
from orchestrator.metrics import prometheus, telemetry
from orchestrator.metrics.diagnosis import engine_batch
from orchestrator.metrics.fidelity import clock_gap, server_latency, workload_fidelity
from orchestrator.metrics.monitor import ResourceMonitor
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult
from orchestrator.metrics.summary import (
    client_validity,
    server_failure,
    summarize_by_class,
    summarize_point,
    summarize_repeats,
)
from orchestrator.metrics.telemetry import Timeline
from orchestrator.metrics.within_run import within_run
from orchestrator.trial.diagnose import STALLS_KEPT, Census, foreign_bound, point_diagnosis
from orchestrator.trial.profile import ProfileWindow
from orchestrator.trial.servers import GroupView

log = logging.getLogger(__name__)


@dataclass
class RawPoint:
    """What was gathered around one load point, before any arithmetic."""

    records: list[RequestRecord]
    client: dict[str, float]  # the client's own stats (CPU, loop lag; the worst process's)
    resources: dict[str, float]  # the resource monitor's summary (memory peak, engine gauges)
    before: prometheus.Sample  # the engines' counters and histograms before the point...
    after: prometheus.Sample  # ...and after it


@dataclass
class PointVerdict:
    """Whether a point's numbers describe the server under the planned workload."""

    metrics: dict[str, float]  # client_invalid, workload_invalid, machine_invalid, invalid, what the checks found
    client: list[str]  # the client did not keep up, or the server's clock disagrees with ours
    workload: list[str]  # the server got another workload than planned
    machine: list[str]  # the machine was shared: processes outside the trial took its CPU

    @property
    def reasons(self) -> list[str]:
        return self.client + self.workload + self.machine


def point_metrics(
    spec: TrialSpec,
    point: LoadPointSpec,
    raw: RawPoint,
    engine_metrics: dict[str, EngineMetric],
    disaggregated: bool = False,
) -> dict[str, float]:
    """The point's metrics from its raw inputs: the client's summary (per repeat and their
    intervals when repeated; else the headline latencies' 95% intervals within the run), the engine's gauges, the client's own stats, the engines'
    counter deltas and their latency histograms' percentiles. Under P/D the sampled decode
    server's TTFT and end-to-end start after the prefill: named ``decode_*``, not ours."""
    w = spec.workload
    arriving = ["trace"] if point.trace else [n for n, c in w.classes.items() if c.rate is None]
    scheduled = point.concurrency is None  # open loop: a rate or a trace's instants
    if w.repeats > 1:
        per_repeat = [
            summarize_point([x for x in raw.records if x.repeat == r], w.slo, point.rate, arriving, scheduled)
            for r in range(w.repeats)
        ]
        metrics = summarize_repeats(per_repeat, w.max_ci_rel_width)
    else:
        metrics = summarize_point(raw.records, w.slo, point.rate, arriving, scheduled)
        metrics.update(within_run(raw.records, seed=spec.seed))  # how precisely this one run measured them
    for key, value in raw.resources.items():  # engine gauges are server-side numbers
        metrics[key if key == M.MEMORY_PEAK_GB else f"server_{key}"] = value
    metrics.update(raw.client)
    for key, value in prometheus.deltas(raw.before, raw.after, engine_metrics).items():
        if disaggregated and key in ("ttft_s_mean", "e2e_s_mean"):
            key = f"decode_{key}"
        metrics[f"server_{key}"] = value
    latency = prometheus.latency_buckets(raw.before, raw.after, engine_metrics)
    if disaggregated:
        latency = {(f"decode_{k}" if k in ("ttft", "e2e") else k): v for k, v in latency.items()}
    metrics.update(server_latency(latency))
    ideal, hits = metrics.get(M.TRACE_IDEAL_PREFIX_SHARE), metrics.get(M.SERVER_PREFIX_CACHE_HIT_RATE)
    if ideal and hits is not None:  # how much of the trace's reusable prefix the server reused
        metrics[M.PREFIX_REUSE_EFFICIENCY] = hits / ideal
    return metrics


def point_setting(point: LoadPointSpec) -> dict[str, object]:
    """A point's setting as recorded on its run: its fields, and a trace's content hash (the run
    says which trace it replayed, not only where it was)."""
    setting: dict[str, object] = point.model_dump(exclude_none=True)
    if point.trace is not None:
        setting["trace_sha256"] = read_trace(point.trace, point.trace_format, point.trace_block_tokens).sha256
    return setting


def judge_point(
    spec: TrialSpec,
    point: LoadPointSpec,
    records: list[RequestRecord],
    metrics: dict[str, float],
    front: str | None = None,
) -> PointVerdict:
    """The client kept up (client validity), its clock agrees with the server's (judged only
    when nothing sits between them: ``front`` names a router or proxy), the server got the
    planned requests (workload fidelity) and nothing outside the trial took the machine's CPU
    (``foreign_cpu_cores``, measured by the point's census, against
    ``workload.validity.max_foreign_cpu_cores``)."""
    w = spec.workload
    _, client = client_validity(metrics, w.validity, capped=point.max_concurrency is not None)
    found, workload = workload_fidelity(records, metrics, w)
    gap, gap_reasons = clock_gap(metrics, w.fidelity, via=front)
    client = client + gap_reasons
    machine = []
    foreign, bound = metrics.get(M.FOREIGN_CPU_CORES), foreign_bound(spec)
    if foreign is not None and bound is not None and foreign >= bound:
        machine.append(
            f"the machine was shared: {foreign:.2f} cores busy outside the trial "
            f"(>= workload.validity.max_foreign_cpu_cores: {bound:g})"
        )
    out = {
        **found,
        **gap,
        M.CLIENT_INVALID: 1.0 if client else 0.0,
        M.WORKLOAD_INVALID: 1.0 if workload else 0.0,
        M.MACHINE_INVALID: 1.0 if machine else 0.0,
    }
    out[M.INVALID] = max(out[M.CLIENT_INVALID], out[M.WORKLOAD_INVALID], out[M.MACHINE_INVALID])
    return PointVerdict(out, client, workload, machine)


def hardware_metrics(
    spec: TrialSpec, rows: list[telemetry.Row], window: tuple[float, float], metrics: dict[str, float]
) -> dict[str, float]:
    """What the hardware did over the point's window (telemetry), the energy per token and
    request where energy was measured, and the cost of the point's tokens where a price is set:
    per GPU-hour for the trial's GPUs, per node-hour on the CPU (one node)."""
    out = telemetry.window_metrics(rows, *window)
    out.update(telemetry.energy_metrics({**metrics, **out}))
    devices = float(spec.engine.num_gpus or 1) if spec.platform.device == "cuda" else 1.0
    out.update(telemetry.cost_metrics(metrics, spec.platform.price_per_hour, devices))
    return out


def roofline_metrics(
    spec: TrialSpec, point: LoadPointSpec, metrics: dict[str, float], batch: float | None = None
) -> dict[str, float]:
    """The decode-step floor at this point's batch and context, and measured TPOT over it.

    Batch: the batch the engine actually ran (``batch``: its running-requests gauge averaged over
    the point's window), else the point's concurrency, else the most requests the server ran at
    once (``server_requests_running_max``), else 1. Context: the mean prompt plus half the mean
    output (the middle of a decode)."""
    requests = metrics.get(M.COMPLETED) or metrics.get(M.REQUESTS) or 0.0
    if not requests:
        return {}
    if batch is None or batch <= 0:
        batch = point.concurrency or metrics.get(M.SERVER_REQUESTS_RUNNING_MAX, 1.0) or 1.0
    context = metrics.get(M.INPUT_TOKENS, 0.0) / requests + metrics.get(M.OUTPUT_TOKENS, 0.0) / requests / 2
    try:
        floor = trial_decode_floor(spec, max(1, int(round(batch))), int(context))
    except Exception as exc:  # a missing roof is not a trial failure
        log.warning("decode floor: %s", exc)
        return {}
    if floor is None:
        return {}
    out = {
        M.DECODE_FLOOR_MS: floor.floor_ms,
        M.DECODE_FLOOR_BATCH: float(floor.batch),
        M.DECODE_FLOOR_MEMORY_MS: floor.memory_floor_ms,
        M.DECODE_FLOOR_COMPUTE_MS: floor.compute_floor_ms,
    }
    tpot = metrics.get(M.TPOT_MS_P50)
    if tpot:
        out[M.DECODE_FLOOR_RATIO] = tpot / floor.floor_ms
    return out


class PointMeasurer:
    """Measures load points on one running server group: before a point, the servers are
    alive, their caches emptied where asked, their counters read and the resource monitor
    started; after it, the same read again and the point's :class:`PointResult` made."""

    def __init__(
        self,
        spec: TrialSpec,
        view: GroupView,
        engine_metrics: dict[str, EngineMetric],
        monitor: ResourceMonitor,
        progress: Progress,
        ready: Callable[[], None],
        alive: Callable[[], None],
        timeline: Timeline | None = None,
        api_key: str | None = None,
    ) -> None:
        self.spec, self.view, self.engine_metrics = spec, view, engine_metrics
        self.monitor, self.progress = monitor, progress
        # the servers' two live checks: ``ready`` before a point (alive, caches emptied where
        # asked; raises ServerCrashedError), ``alive`` after it (raises the same)
        self.ready, self.alive = ready, alive
        self.timeline, self.api_key = timeline, api_key
        self.window: ProfileWindow | None = None
        self.label = ""  # the point being measured (start)
        self.census = Census(view.pids, view.urls)  # who used the machine's CPU over each point
        self._before: prometheus.Sample = {}
        self._t0 = 0.0
        # stamps a point's start and end; with telemetry on, the sampler's edge() (a sample of
        # every probe at both ends of the window, whatever its interval)
        self.clock: Callable[[], float] = telemetry.now

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
        """The point's result, and the servers' failure when they were not serving."""
        t1 = self.clock()
        foreign = self.census.finish(t1 - self._t0)
        profiled = self.window.finish() if self.window is not None else {}
        self.window = None
        raw = RawPoint(records, client, self.monitor.stop(), self._before, self._scrape())
        metrics = point_metrics(self.spec, point, raw, self.engine_metrics, self.view.disaggregated)
        metrics.update(profiled)
        if foreign is not None:
            metrics[M.FOREIGN_CPU_CORES] = float(foreign["cores"])
            metrics[M.SWEEP_CPU_CORES] = float(foreign["sweep_cores"])
        rows = self.timeline.snapshot() if self.timeline is not None else []
        if self.timeline is not None:
            metrics.update(hardware_metrics(self.spec, rows, (self._t0, t1), metrics))
        crash = self._server_failure(records)
        reasons, client_reasons = self._judge(point, records, metrics, crash)
        metrics.update(roofline_metrics(self.spec, point, metrics, engine_batch(metrics, rows, (self._t0, t1))))
        classes = summarize_by_class(records) if len(self.spec.workload.classes) > 1 else {}
        diagnosis = point_diagnosis(
            self.spec,
            point,
            records,
            metrics,
            classes,
            rows,
            (self._t0, t1),
            client_reasons,
            foreign,
            self.view.disaggregated,
            crash is not None,
        )
        metrics.update(diagnosis.metrics)
        for cls, extra in diagnosis.class_metrics.items():
            classes.setdefault(cls, {}).update(extra)
        result = PointResult(
            index=index,
            label=self.label,
            setting=point_setting(point),
            metrics=metrics,
            class_metrics=classes,
            invalid_reasons=reasons,
            window=(self._t0, t1),
            diagnosis=diagnosis.as_json(STALLS_KEPT),
        )
        self.progress(
            f"{self.which(index)} {self.label}: "
            f"{int(metrics.get(M.COMPLETED, 0))}/{len(records)} ok in {t1 - self._t0:.1f}s, "
            f"ttft p50 {metrics.get(M.TTFT_MS_P50, float('nan')):.1f} ms, "
            f"itl p99 {metrics.get(M.ITL_MS_P99, float('nan')):.1f} ms, "
            f"{metrics.get(M.TOKENS_PER_SECOND, 0):.0f} tok/s, "
            f"client processes {metrics.get(M.CLIENT_PROCESSES, 1.0):.0f}"
        )
        self.progress(f"{self.which(index)} {self.label}: {diagnosis.headline}")
        return result, crash

    def _judge(
        self, point: LoadPointSpec, records: list[RequestRecord], metrics: dict[str, float], crash: Exception | None
    ) -> tuple[list[str], list[str]]:
        """The point's INVALID reasons (all) and the client's among them; said on the console."""
        if crash is not None:  # numbers of a server that was not serving: neither valid nor the client's fault
            metrics[M.INVALID], metrics[M.SERVER_FAILED] = 1.0, 1.0
            reason = f"the server failed: {str(crash).splitlines()[0]}"
            self.progress(f"point {self.label}: {reason}")
            return [reason], []
        verdict = judge_point(self.spec, point, records, metrics, self.view.front)
        metrics.update(verdict.metrics)
        if verdict.client:
            used, needed = metrics.get(M.CLIENT_PROCESSES, 1.0), metrics.get(M.CLIENT_PROCESSES_NEEDED, 0.0)
            advice = (
                f" (client_processes: auto wanted {needed:.0f} processes; the trial's CPUs allow {used:.0f}: "
                "raise platform.cpus_per_trial)"
                if needed > used
                else ""
            )
            self.progress(
                f"point {self.label} INVALID (the client was the bottleneck): " + "; ".join(verdict.client) + advice
            )
        if verdict.workload:
            self.progress(
                f"point {self.label} INVALID (the server got another workload than planned): "
                + "; ".join(verdict.workload)
            )
        if verdict.machine:
            self.progress(f"point {self.label} INVALID: " + "; ".join(verdict.machine))
        return verdict.reasons, verdict.client

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
