"""The diagnosis against a real vLLM CPU server driven into two known states on one server
start: one stream (headroom) and more streams than ``max_num_seqs`` (batch slots). The other
states are in benchmarks/diagnosis_validation.py (docs/diagnosis.md)."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.metrics.diagnosis import Thresholds
from orchestrator.trial import run_trial

pytestmark = pytest.mark.integration


def test_real_vllm_headroom_then_batch_slots(compose, tmp_path, tiny_model_dir):
    spec, _ = to_specs(
        compose(
            [
                "workload.classes={main:{input_tokens:64,output_tokens:32}}",
                "workload.load_points=[{concurrency:1},{concurrency:6}]",
                "workload.num_requests=18",
                "engine.max_model_len=512",
                "engine.max_num_seqs=2",
            ]
        )
    )
    lines: list[str] = []
    result = run_trial(spec, tmp_path, progress=lines.append)
    assert result.status == "FINISHED", result.error
    one, six = result.points
    # One stream has no queue; whether its TPOT is near the memory floor depends on this machine's
    # measured bandwidth (2.2x on a CI machine: weak decode bandwidth; over 2.5x on others: headroom), so
    # the answer must follow the ratio the point measured, by the documented threshold.
    ratio = one.metrics["decode_floor_ratio"]
    memory_bound = one.metrics["decode_floor_memory_ms"] >= one.metrics.get("decode_floor_compute_ms", 0.0)
    near = memory_bound and ratio <= Thresholds().floor_close
    assert one.diagnosis["limiter"] == ("decode_bandwidth" if near else "none"), one.diagnosis["text"]
    assert {f["cause"] for f in one.diagnosis["findings"]} <= {"none", "decode_bandwidth"}, one.diagnosis["text"]
    assert six.diagnosis["limiter"] == "batch_slots" and six.diagnosis["confidence"] == "strong", six.diagnosis["text"]
    assert "of max_num_seqs 2 running while up to" in six.diagnosis["headline"]
    assert not [f for f in six.diagnosis["findings"] if f["confidence"] == "strong" and f["cause"] != "batch_slots"]
    # the numbers behind it: the batch the engine ran, the TTFT in parts, the census
    assert one.metrics["decode_batch_mean"] == pytest.approx(1.0, abs=0.3)
    assert six.metrics["decode_batch_mean"] == pytest.approx(2.0, abs=0.3)
    assert six.metrics["ttft_parts_queue_ms"] > six.metrics["ttft_parts_prefill_ms"]
    parts = sum(six.metrics[f"ttft_parts_{k}_ms"] for k in ("client", "api", "queue", "prefill"))
    assert parts == pytest.approx(six.metrics["ttft_parts_client_total_ms"], rel=0.05)
    assert six.metrics["limited_by_batch_slots"] == 1.0 and six.metrics["foreign_cpu_cores"] < 0.25
    assert six.metrics["decode_floor_batch"] == 2.0  # the roofline at the batch the engine ran, not 6
    # said on the console at the end of each point
    assert any("c6: limited by batch slots (strong)" in line for line in lines)
    c1 = "c1: limited by decode bandwidth" if near else "c1: none: the server had headroom"
    assert any(c1 in line for line in lines), lines
