"""A load point's first stage, from what was gathered around it alone (:class:`RawPoint`): what
the client measured, what the servers' own numbers say, the profiler's window, the census and the
prefix reuse, each kept apart (:class:`MeasuredStage`) and flattened to metric keys once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ClosedLoop, LoadPointSpec, TraceReplay, TrialSpec, WorkloadSpec
from orchestrator.engines import EngineMetric
from orchestrator.metrics import prometheus
from orchestrator.metrics.fidelity import expected_hit_rate
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import RawPoint
from orchestrator.metrics.summary import summarize_point, summarize_repeats
from orchestrator.metrics.within_run import HEADLINE, within_run

CLASS_WITHIN = (M.TTFT_MS_P50, M.TTFT_MS_P99, M.ITL_MS_P99, M.ITL_WORST_MS_P50)


def within_keys(w: WorkloadSpec) -> tuple[str, ...]:
    """The latency statistics a point gives a 95% interval within its run: the headline ones, and
    per request class :data:`CLASS_WITHIN` where the workload has several."""
    per_class = [f"{c}/{k}" for c in w.classes for k in CLASS_WITHIN] if len(w.classes) > 1 else []
    return (*HEADLINE, *per_class)


@dataclass(frozen=True)
class ServerDeltas:
    """What the servers' own numbers say of a point, under the engines' neutral names (no
    ``server_`` prefix yet): the resource monitor's summary (memory, the engine's gauges), the
    counters' deltas and histogram means, the latency histograms' percentiles. Under P/D the
    sampled server is the decode side, whose TTFT and end-to-end start after the prefill."""

    gauges: Mapping[str, float]
    counters: Mapping[str, float]
    latency: Mapping[str, float]  # already ``server_<name>_ms_p<q>...`` (metrics.prometheus.server_latency)
    disaggregated: bool = False

    def metrics(self) -> dict[str, float]:
        """Under their metric keys: ``server_<name>``, the decode side's ``server_decode_<name>``."""
        out = {k if k == M.MEMORY_PEAK_GB else f"server_{k}": v for k, v in self.gauges.items()}
        for key, value in self.counters.items():
            decode = self.disaggregated and key in DECODE_TIMED
            out[f"server_decode_{key}" if decode else f"server_{key}"] = value
        out.update(self.latency)
        return out


DECODE_TIMED = ("ttft_s_mean", "e2e_s_mean")  # under P/D, the decode server's: they start after the prefill


@dataclass(frozen=True)
class PrefixReuse:
    """How much of the prompts a prefix cache could serve (a trace's blocks, or what the synthetic
    prompts share) and how much of that the server reused."""

    ideal: float | None
    efficiency: float | None

    @classmethod
    def of(cls, ideal: float | None, hits: float | None) -> PrefixReuse:
        return cls(ideal, hits / ideal if ideal and hits is not None else None)

    def metrics(self) -> dict[str, float]:
        out = {M.PREFIX_REUSE_IDEAL_SHARE: self.ideal} if self.ideal is not None else {}
        return out | ({M.PREFIX_REUSE_EFFICIENCY: self.efficiency} if self.efficiency is not None else {})


@dataclass(frozen=True)
class MeasuredStage:
    """A point's first stage, each source kept apart: the client's summary (per repeat and their
    intervals when repeated; else the headline latencies' 95% intervals within the run), the
    client's own stats, the servers' numbers, the profiler's window, the census and the prefix
    reuse. Flattened to metric keys once (:meth:`metrics`)."""

    summary: Mapping[str, float]
    client: Mapping[str, float]
    server: ServerDeltas
    profiled: Mapping[str, float]
    census: Mapping[str, float]
    prefix: PrefixReuse

    def metrics(self) -> dict[str, float]:
        return {
            **self.summary,
            **self.server.metrics(),
            **self.client,
            **self.profiled,
            **self.census,
            **self.prefix.metrics(),
        }


def measured_stage(
    spec: TrialSpec,
    point: LoadPointSpec,
    raw: RawPoint,
    engine_metrics: dict[str, EngineMetric],
    disaggregated: bool = False,
) -> MeasuredStage:
    """The point's first stage from its raw inputs alone (``disaggregated``: the sampled server is
    a P/D pair's decode side)."""
    summary = client_summary(spec, point, raw.records)
    latency = prometheus.latency_buckets(raw.before, raw.after, engine_metrics)
    if disaggregated:
        latency = {(f"decode_{k}" if k in ("ttft", "e2e") else k): v for k, v in latency.items()}
    counters = prometheus.deltas(raw.before, raw.after, engine_metrics)
    server = ServerDeltas(raw.resources, counters, prometheus.server_latency(latency), disaggregated)
    census = {}
    if raw.foreign is not None:
        census = {
            M.FOREIGN_CPU_CORES: float(raw.foreign["cores"]),
            M.SWEEP_CPU_CORES: float(raw.foreign["sweep_cores"]),
        }
    ideal = raw.client.get(M.TRACE_IDEAL_PREFIX_SHARE)  # a replayed slice's blocks (as the plan cut it)
    if ideal is None and not isinstance(point.load, TraceReplay):  # what the synthetic prompts share
        ideal = expected_hit_rate(spec.workload, int(summary.get(M.REQUESTS, 0)))
    prefix = PrefixReuse.of(ideal, counters.get(SERVER_HIT_RATE))
    return MeasuredStage(summary, dict(raw.client), server, dict(raw.profiled), census, prefix)


SERVER_HIT_RATE = M.SERVER_PREFIX_CACHE_HIT_RATE.removeprefix(
    "server_"
)  # the counters' derived one (prometheus.deltas)


def client_summary(spec: TrialSpec, point: LoadPointSpec, records: list[RequestRecord]) -> dict[str, float]:
    """The client's numbers of the point: per repeat and their intervals when it repeats, else
    the run's with the headline latencies' 95% intervals within it."""
    w = spec.workload
    load = point.load
    arriving = ["trace"] if isinstance(load, TraceReplay) else [n for n, c in w.classes.items() if c.rate is None]
    scheduled = not isinstance(load, ClosedLoop)  # open loop: a rate or a trace's instants
    if w.repeats > 1:
        per_repeat = [
            summarize_point([x for x in records if x.repeat == r], w.slo, point.rate, arriving, scheduled)
            for r in range(w.repeats)
        ]
        return summarize_repeats(per_repeat, w.max_ci_rel_width)
    metrics = summarize_point(records, w.slo, point.rate, arriving, scheduled)
    # how precisely this one run measured them: the headline latencies, and with several request
    # classes each class's own (the labs' claims and verdicts read them: long/ttft_ms_p50)
    metrics.update(within_run(records, within_keys(w), seed=spec.seed))
    return metrics
