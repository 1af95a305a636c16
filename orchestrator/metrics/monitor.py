"""Background sampling during a load point: memory of the server and the engine's gauges.

Memory is the RSS of the server's whole process tree (CPU) or, with GPUs, the device
memory in use read through NVML; gauges (e.g. KV-cache usage) are read from the engine's
Prometheus endpoint. Both keep their maximum over the sampling window.

The observer must not move what it observes: one scrape of vLLM's ``/metrics`` costs its
API server ~10 ms of CPU, on the process that streams tokens. Each kind of sample therefore
keeps to a time budget: after a sample that took ``w`` seconds, the next one of that kind
waits ``max(interval_s, w / budget)`` (1% of wall time by default, so ~1 s between scrapes
of vLLM's page on a CPU server), measured in docs/benchmarks.md ("observer effect"). A
scrape's ``w`` is the fastest any scrape has taken: under load an answer also waits its turn
behind the server's own work, which is not what the scrape costs. The fastest is kept over the
trial's points, a scrape that failed costs nothing (the next comes after the interval, doubled
at each failure in a row, never later than the budget would put it), and one
scrape alone is no measure: the second comes after the interval. A CI run on two cores had no
gauge sample over a whole 9 s point held at ``max_num_seqs``; before, a point's first scrape set
the pace alone and a failed one counted as a 2 s cost, the two ways left to lose a whole point.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from orchestrator.config.metric_keys import M
from orchestrator.metrics import nvml, prometheus, telemetry
from orchestrator.metrics.telemetry import Timeline

log = logging.getLogger(__name__)


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants (0 if it is gone)."""
    total = 0
    for p in process_tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def gpu_used_bytes(device_indices: list[int]) -> int | None:
    """Device memory in use on the given GPUs via NVML; None where NVML is unavailable."""
    try:
        with nvml.session() as nv:
            return int(sum(nv.nvmlDeviceGetMemoryInfo(nvml.handle(nv, i)).used for i in device_indices))
    except Exception:  # no nvidia-ml-py, no driver (NVML's own error tree): no number
        return None


# The engine's counters that go onto the trial's timeline beside its gauges (cumulative values):
# when preemptions happened, and the prefix-cache hit rate of each scrape interval.
TIMELINE_COUNTERS = ("preemptions", "prefix_cache_hits", "prefix_cache_queries")


class ResourceMonitor:
    """Samples memory and gauges in a daemon thread, each at most every ``interval_s`` and
    within ``budget`` (a fraction of wall time) of its own measured cost; keeps maxima.

    A point's first :attr:`POINT_SCRAPES` scrapes after its start come every ``interval_s``
    whatever their cost: the diagnosis judges the engine's batch from 3 gauge samples inside the
    window (:func:`orchestrator.metrics.diagnosis.parts.ran_batch`), and at the budget alone a
    scrape of 25 ms (this VM under load) waited 2.5 s, so a 2-5 s point had 0-2 of them (two CI
    runs: a point with no engine sample, a tuning baseline left unjudged). Three scrapes more per
    point is ~75 ms of the API server's time, beside its seconds of work on any point."""

    POINT_SCRAPES = 3

    def __init__(
        self,
        pids: list[int],
        metrics_url: str | None,
        gauges: Mapping[str, Any],
        interval_s: float = 0.5,
        gpu_indices: list[int] | None = None,
        budget: float = 0.01,
        timeline: Timeline | None = None,
    ) -> None:
        self.pids = pids
        self.metrics_url = metrics_url
        self.gauges = {k: v for k, v in gauges.items() if v.kind == "gauge"}
        # counters kept on the timeline only (their deltas per point come from the point's scrapes)
        self.counters = {k: v for k, v in gauges.items() if v.kind == "counter" and k in TIMELINE_COUNTERS}
        self.interval_s = interval_s
        self.gpu_indices = gpu_indices or []
        self.budget = budget
        self.timeline = timeline  # every gauge sample also goes here (the engine's state over time)
        self._sampler = telemetry.Background("resource-monitor")
        self._fastest = [float("inf")] * len(self._kinds())  # each kind's cheapest sample, over all points
        self._failed = [0] * len(self._fastest)  # each kind's failures in a row
        self.reset()

    def reset(self) -> None:
        self.peak_memory_bytes = 0
        self.memory_read = 0  # samples that read the memory (NVML can fail on a GPU trial)
        self.gauge_max: dict[str, float] = {}
        self.samples = 0
        self.scrapes = 0
        self.answered = 0  # scrapes answered since the point's start (its first ones keep the interval)

    def sample(self) -> None:
        """One sample of everything, now (also the final sample of :meth:`stop`)."""
        self.sample_memory()
        self.sample_gauges()

    def sample_memory(self) -> bool:
        """The GPUs' used memory on a GPU trial (a failed NVML read is a miss: the host memory of
        the server's processes is another quantity, never mixed into the GPU peak), else the
        resident memory of the server's process trees."""
        self.samples += 1
        if self.gpu_indices:
            mem = gpu_used_bytes(self.gpu_indices)
        else:
            mem = sum(tree_rss_bytes(p) for p in self.pids) if self.pids else None
        if mem is None:
            return False
        self.peak_memory_bytes = max(self.peak_memory_bytes, mem)
        self.memory_read += 1
        return True

    def sample_gauges(self) -> bool:
        """One scrape of the engine's gauges; False when it failed (no answer in 2 s)."""
        if not (self.metrics_url and self.gauges):
            return False
        self.scrapes += 1
        try:
            families = [ref.family for ref in (*self.gauges.values(), *self.counters.values())]
            scraped = prometheus.scrape(self.metrics_url, timeout_s=2.0, families=families)
        except OSError as exc:
            log.debug("gauge scrape failed: %s", exc)
            return False
        seen = {}
        for name, ref in self.gauges.items():
            v = prometheus.gauge(scraped, ref.family)
            if v is not None:
                self.gauge_max[name] = max(self.gauge_max.get(name, v), v)
                seen[name] = v
        for name, ref in self.counters.items():
            c = prometheus.counter(scraped, ref.family)
            if c is not None:
                seen[name] = c
        if self.timeline is not None and seen:
            self.timeline.add(telemetry.now(), "engine", seen)
        return True

    def _kinds(self) -> list[tuple[Callable[[], bool], Callable[[], float], bool]]:
        # What a sample costs: reading /proc, our CPU (its wall time under a busy GIL is not a
        # cost); a scrape, the fastest wall time a scrape has taken (the server's API process
        # answering it). Not each scrape's own wall time: on a saturated server an answer waits
        # behind the server's work, so its wall time is the load, not the scrape's cost, and
        # scrapes would thin out to one every tens of seconds exactly when the engine's state
        # matters (a CI run: 1 gauge sample over an 8 s point held at max_num_seqs).
        kinds: list[tuple[Callable[[], bool], Callable[[], float], bool]] = [
            (self.sample_memory, time.thread_time, False)
        ]
        if self.metrics_url and self.gauges:
            kinds.append((self.sample_gauges, time.monotonic, True))
        return kinds

    def _round(self, kinds: list[Any], due: list[float]) -> None:
        """Every kind of sample that is due, each then due again after the interval (or longer,
        to keep within the budget)."""
        fastest = self._fastest
        for i, (kind, cost_clock, service_time) in enumerate(kinds):
            t0 = time.monotonic()
            if t0 < due[i]:
                continue
            c0 = cost_clock()
            try:
                ok = kind()
            except Exception as exc:  # a sampling hiccup must not kill the measurement
                log.debug("monitor sample failed: %s", exc)
                ok = False
            cost = cost_clock() - c0
            if service_time:
                if not ok:  # no answer: not a cost; again after the interval, doubled at each failure in a row
                    self._failed[i] += 1
                    wait = self.interval_s * 2 ** min(self._failed[i] - 1, 20)
                    due[i] = t0 + min(wait, max(self.interval_s, cost / self.budget))
                    continue
                self._failed[i] = 0
                self.answered += 1
                if fastest[i] == float("inf"):  # one scrape alone is no measure of the cost: again soon
                    fastest[i] = cost
                    due[i] = t0 + self.interval_s
                    continue
                fastest[i] = cost = min(fastest[i], cost)
                if self.answered <= self.POINT_SCRAPES:  # the start's scrape, then 3 more at the interval
                    due[i] = t0 + self.interval_s
                    continue
            due[i] = t0 + max(self.interval_s, cost / self.budget)

    def _loop(self, stop: threading.Event, kinds: list[Any], due: list[float]) -> None:
        while not stop.wait(max(0.0, min(due) - time.monotonic())):
            self._round(kinds, due)

    def start(self) -> None:
        """Sample now, in the caller's thread (a point's start, before its clock and its first
        sends), then every interval in a daemon thread. A first sample in the thread ran beside
        the point's first sends and held them up: a /metrics scrape parsed under the GIL put 5 ms
        between the first and second request of a trace's burst (docs/benchmarks.md)."""
        self._sampler.stop()
        self.answered = 0
        kinds = self._kinds()
        due = [0.0] * len(kinds)
        self._round(kinds, due)
        self._sampler.start(lambda stop: self._loop(stop, kinds, due))

    def stop_thread(self) -> None:
        self._sampler.stop()

    def stop(self) -> dict[str, float]:
        """Stop sampling; return ``memory_peak_gb`` and ``<gauge>_max`` metrics. Idempotent."""
        self.stop_thread()
        self.sample()
        out = {}
        if self.memory_read:
            out[M.MEMORY_PEAK_GB] = self.peak_memory_bytes / 1e9
        elif self.gpu_indices:
            log.warning("GPU memory not measured: NVML could not be read in %d sample(s)", self.samples)
        out.update({f"{k}_max": v for k, v in self.gauge_max.items()})
        return out
