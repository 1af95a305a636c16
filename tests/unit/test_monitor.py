"""The resource monitor keeps each kind of sample within its share of wall time."""

from __future__ import annotations

import os
import time

from orchestrator.engines.base import EngineMetric
from orchestrator.metrics.monitor import ResourceMonitor


class SlowGauges(ResourceMonitor):
    """A monitor whose gauge scrape takes 20 ms (as vLLM's /metrics page costs its server ~10 ms)."""

    gauge_calls = 0

    def sample_gauges(self) -> None:
        self.gauge_calls += 1
        time.sleep(0.02)


def test_costly_samples_wait_for_their_budget():
    mon = SlowGauges(
        [os.getpid()], "http://127.0.0.1:9/metrics", {"kv": EngineMetric("x:kv", "gauge")}, interval_s=0.01, budget=0.1
    )  # a 20 ms scrape may run every 200 ms
    mon.start()
    time.sleep(1.0)
    mon.stop_thread()
    assert 3 <= mon.gauge_calls <= 8  # ~5 in 1 s; at the 10 ms interval it would be ~35
    assert mon.samples > 3 * mon.gauge_calls  # memory is cheap: it keeps the short interval
    assert mon.stop()["memory_peak_gb"] > 0  # the final sample covers both kinds


def test_no_gauges_means_no_scrape():
    mon = ResourceMonitor([os.getpid()], None, {}, interval_s=0.01)
    mon.start()
    time.sleep(0.2)
    assert mon.stop()["memory_peak_gb"] > 0 and mon.scrapes == 0
