"""The resource monitor keeps each kind of sample within its share of wall time."""

from __future__ import annotations

import os
import time

import pytest

from orchestrator.engines.base import EngineMetric
from orchestrator.metrics.monitor import ResourceMonitor

pytestmark = pytest.mark.measures


class SlowGauges(ResourceMonitor):
    """A monitor whose gauge scrape takes 20 ms (as vLLM's /metrics page costs its server ~10 ms);
    it notes when each scrape began and ended."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.gauge_calls: list[tuple[float, float]] = []

    @classmethod
    def scraping(cls, interval_s: float, budget: float):
        """One such monitor of this process, with one gauge at an address no test server holds."""
        return cls(
            [os.getpid()],
            "http://127.0.0.1:9/metrics",
            {"kv": EngineMetric("x:kv", "gauge")},
            interval_s,
            budget=budget,
        )

    def sample_gauges(self) -> bool:
        t0 = time.monotonic()
        time.sleep(0.02)
        self.gauge_calls.append((t0, time.monotonic()))
        return True


FLOOR = 1 + ResourceMonitor.POINT_SCRAPES  # a point's start scrape and those at the interval after it


def scrapes_of(mon: SlowGauges, n: int) -> list[tuple[float, float]]:
    """Run the monitor until it has scraped ``n`` times (or 30 s), stop it; the scrapes' times."""
    mon.start()
    deadline = time.monotonic() + 30
    while len(mon.gauge_calls) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    mon.stop_thread()
    return list(mon.gauge_calls)


def test_costly_samples_wait_for_their_budget():
    budget = 0.1
    mon = SlowGauges.scraping(0.01, budget)  # a 20 ms scrape may run every >= 200 ms, however slow the machine makes it
    calls = scrapes_of(mon, FLOOR + 4)
    assert len(calls) >= FLOOR + 4
    # the rule itself, from the scrapes' own times: after the point's first scrapes, each waits
    # the fastest scrape's cost so far / budget (not the 10 ms interval); a slower machine only
    # makes both longer
    fastest = min(end - start for start, end in calls[: FLOOR - 1])
    for (start, end), (nxt, _) in zip(calls[FLOOR - 1 :], calls[FLOOR:]):
        fastest = min(fastest, end - start)
        assert nxt - start >= fastest / budget - 0.001
    # memory is cheap: it keeps its short interval between the scrapes
    assert mon.samples > 2 * len(calls)
    assert mon.stop()["memory_peak_gb"] > 0  # the final sample covers both kinds


class LoadedServer(SlowGauges):
    """A first scrape answered in 5 ms, then every answer 300 ms late: the server got busy and
    the answer waited its turn behind the server's own work."""

    def sample_gauges(self) -> bool:
        t0 = time.monotonic()
        time.sleep(0.005 if not self.gauge_calls else 0.3)
        self.gauge_calls.append((t0, time.monotonic()))
        return True


def test_a_busy_server_is_still_scraped_at_the_pace_of_its_fastest_answer():
    """A late answer is the server's load, not the scrape's cost: scrapes do not thin out to one
    per 30 s (0.3 s / 1%) exactly when the engine's gauges matter."""
    mon = LoadedServer.scraping(0.01, 0.01)
    calls = scrapes_of(mon, FLOOR + 3)
    assert len(calls) >= FLOOR + 3
    fastest = calls[0][1] - calls[0][0]
    for (start, _), (nxt, _) in zip(calls[FLOOR - 1 :], calls[FLOOR:]):
        assert nxt - start >= fastest / 0.01 - 0.001  # still within the budget of a scrape's cost
        assert nxt - start < 0.3 / 0.01  # not the late answers' pace


class SlowFromTheSecondPoint(SlowGauges):
    """Answers in 5 ms over the first point; from the second point on, each answer is 300 ms late
    (the server is busy from the point's first instant)."""

    points = 0

    def start(self) -> None:
        self.points += 1
        super().start()

    def sample_gauges(self) -> bool:
        t0 = time.monotonic()
        time.sleep(0.005 if self.points < 2 else 0.3)
        self.gauge_calls.append((t0, time.monotonic()))
        return True


def test_the_fastest_scrape_is_kept_over_the_trials_points():
    """A point whose first scrape waited behind a busy server still gets its gauge samples: the
    pace comes from the fastest answer of the trial, not from that one scrape (a CI run had no gauge
    sample over a 9 s point held at max_num_seqs)."""
    mon = SlowFromTheSecondPoint.scraping(0.01, 0.1)
    first = scrapes_of(mon, FLOOR)
    fastest = min(end - start for start, end in first)
    mon.reset()
    calls = scrapes_of(mon, len(first) + FLOOR + 3)[len(first) :]
    assert len(calls) >= FLOOR + 3
    for (start, _), (nxt, _) in zip(calls[FLOOR - 1 :], calls[FLOOR:]):
        assert nxt - start < 0.3 / 0.1  # 3 s: the pace one late answer would have set
        assert nxt - start >= fastest / 0.1 - 0.001


def test_a_point_gets_its_first_scrapes_at_the_interval_whatever_they_cost():
    """At 1%, a 20 ms scrape may run every 2 s, so a 2 s point had at most one gauge sample inside
    it, and the diagnosis judges the engine's batch from 3: each point's first scrapes after its
    start come at the interval, then the budget rules, and the next point starts over."""
    interval = 0.05
    mon = SlowGauges.scraping(interval, 0.01)
    for _ in range(2):  # two points
        mon.reset()
        mon.start()
        time.sleep(FLOOR * (interval + 0.02) + 0.5)
        mon.stop_thread()
        calls, mon.gauge_calls = mon.gauge_calls, []
        assert len(calls) == FLOOR, calls  # the start's scrape, 3 at the interval, then >= 2 s
        gaps = [nxt - start for (start, _), (nxt, _) in zip(calls, calls[1:])]
        assert all(interval - 0.001 <= gap < 0.5 for gap in gaps), gaps


class FailsFiveTimes(SlowGauges):
    """Five scrapes in a row get no answer in their time (20 ms here, 2 s in a trial); then it
    answers in 5 ms."""

    def sample_gauges(self) -> bool:
        t0 = time.monotonic()
        failed = len(self.gauge_calls) < 5
        time.sleep(0.02 if failed else 0.005)
        self.gauge_calls.append((t0, time.monotonic()))
        return not failed


def test_a_failed_scrape_is_not_a_cost_and_failures_in_a_row_back_off():
    """A scrape with no answer is no measure of what a scrape costs: the next comes after the
    interval, not after its 20 ms / 1% = 2 s, and each further failure in a row doubles the wait
    (a server whose /metrics stopped answering is not asked every interval for the whole point)."""
    interval = 0.02
    mon = FailsFiveTimes.scraping(interval, 0.01)
    calls = scrapes_of(mon, 7)
    assert len(calls) >= 7
    gaps = [nxt - start for (start, _), (nxt, _) in zip(calls, calls[1:])]
    for k, gap in enumerate(gaps[:5]):  # after the k-th failure in a row: the interval, doubled k times
        assert gap >= interval * 2**k - 0.001, gaps
    assert sum(gaps[:5]) < 2.0, gaps  # not one wait of 2 s, the failed scrape's time over the budget
    # the first answer is one scrape's cost alone: the next after the interval, failures forgotten
    assert gaps[5] < 1.0, gaps


def test_no_gauges_means_no_scrape():
    mon = ResourceMonitor([os.getpid()], None, {}, interval_s=0.01)
    mon.start()
    time.sleep(0.2)
    assert mon.stop()["memory_peak_gb"] > 0 and mon.scrapes == 0


def test_engine_counters_join_the_gauges_on_the_timeline():
    """Each scrape puts the gauges and the preemption and prefix-cache counters on the trial's
    timeline; the hit rate of each interval is the ratio of the counters' deltas."""
    import http.server
    import threading

    from orchestrator.engines.vllm import METRICS
    from orchestrator.metrics.telemetry import Timeline, ratio_of_deltas, series

    pages = iter(
        [
            "vllm:num_requests_running 2\nvllm:num_preemptions_total 0\n"
            "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n",
            "vllm:num_requests_running 5\nvllm:num_preemptions_total 1\n"
            "vllm:prefix_cache_hits_total 30\nvllm:prefix_cache_queries_total 120\n",
        ]
    )

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(pages).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tl = Timeline()
        mon = ResourceMonitor(
            [os.getpid()], f"http://127.0.0.1:{server.server_address[1]}/metrics", METRICS, timeline=tl
        )
        mon.sample_gauges()
        mon.sample_gauges()
    finally:
        server.shutdown()
    assert series(tl.rows, "engine", "requests_running")[1] == [2.0, 5.0]
    assert series(tl.rows, "engine", "preemptions")[1] == [0.0, 1.0]
    assert ratio_of_deltas(tl.rows, "engine", "prefix_cache_hits", "prefix_cache_queries")[1] == [0.25]
    assert mon.gauge_max == {"requests_running": 5.0}  # counters are not gauges: no per-point maximum


def test_a_gpu_trial_whose_nvml_fails_has_no_memory_peak_not_the_hosts(monkeypatch, caplog):
    """On a GPU trial a failed NVML read was replaced by the server's host RSS: two quantities in
    one 'GPU peak'. A miss is a miss; with no GPU read at all the peak is left out, said in the log."""
    from orchestrator.metrics import monitor as mon

    readings = iter([None, 3_000_000_000, None])
    monkeypatch.setattr(mon, "gpu_used_bytes", lambda indices: next(readings))
    m = ResourceMonitor([os.getpid()], None, {}, gpu_indices=[0])
    m.sample_memory()
    m.sample_memory()
    assert m.stop()["memory_peak_gb"] == 3.0  # the GPU's reading alone (the third sample, by stop, missed)
    monkeypatch.setattr(mon, "gpu_used_bytes", lambda indices: None)
    m = ResourceMonitor([os.getpid()], None, {}, gpu_indices=[0])
    m.sample_memory()
    with caplog.at_level("WARNING"):
        assert "memory_peak_gb" not in m.stop()
    assert "GPU memory not measured: NVML could not be read in 2 sample(s)" in caplog.text
    cpu = ResourceMonitor([os.getpid()], None, {})
    assert cpu.stop()["memory_peak_gb"] > 0  # a CPU trial: its processes' resident memory
    assert ResourceMonitor([], None, {}).stop() == {}  # nothing to measure: nothing said
