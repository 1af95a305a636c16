"""Prometheus parsing and deltas between scrapes, under neutral names."""

from __future__ import annotations

import pytest

from orchestrator.engines.vllm import METRICS
from orchestrator.metrics import prometheus

BEFORE = """
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.4
"""

AFTER = (
    BEFORE.replace('hits_total{engine="0",model_name="m"} 10.0', 'hits_total{engine="0",model_name="m"} 70.0')
    .replace('queries_total{engine="0",model_name="m"} 100.0', 'queries_total{engine="0",model_name="m"} 200.0')
    .replace('seconds_count{engine="0",model_name="m"} 4.0', 'seconds_count{engine="0",model_name="m"} 14.0')
    .replace('seconds_sum{engine="0",model_name="m"} 0.4', 'seconds_sum{engine="0",model_name="m"} 2.4')
)


def test_parse_sums_label_sets():
    text = 'vllm:x_total{engine="0"} 1\nvllm:x_total{engine="1"} 2\n'
    assert prometheus.parse(text)["vllm:x_total"] == 3.0


def test_deltas_neutral_names():
    d = prometheus.deltas(prometheus.parse(BEFORE), prometheus.parse(AFTER), METRICS)
    assert d["prefix_cache_hits"] == 60.0
    assert d["prefix_cache_queries"] == 100.0
    assert d["prefix_cache_hit_rate"] == pytest.approx(0.6)
    assert d["preemptions"] == 0.0
    assert d["queue_time_s_mean"] == pytest.approx(0.2)
    assert all(":" not in k for k in d)


def test_gauge():
    assert prometheus.gauge(prometheus.parse(BEFORE), "vllm:kv_cache_usage_perc") == pytest.approx(0.1)


def test_only_families_keeps_just_the_wanted_ones():
    text = BEFORE + "# TYPE vllm:num_preemptions_other gauge\nvllm:num_preemptions_other 5\n"
    kept = prometheus.parse(prometheus.only_families(text, ["vllm:kv_cache_usage_perc", "vllm:num_preemptions"]))
    assert kept == {"vllm:kv_cache_usage_perc": 0.1, "vllm:num_preemptions_total": 1.0}
