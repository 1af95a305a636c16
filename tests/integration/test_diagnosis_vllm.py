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
                "workload.num_requests=30",  # enough gauge samples at c6: batch slots needs 3
                "engine.max_model_len=512",
                "engine.max_num_seqs=2",
            ]
        )
    )
    lines: list[str] = []
    result = run_trial(spec, tmp_path, progress=lines.append)
    assert result.status == "FINISHED", result.error
    one, six = result.points
    # On two cores the engine keeps both busy and the client shares them: now and then the client
    # is starved (a CI run: send lag p95 248 ms at c1). Such a point is INVALID, its diagnosis names
    # the client first with the validity check's own reasons, and the state the server was driven
    # into is still found beside it.
    for p in (one, six):
        if p.diagnosis["limiter"] == "client":
            said = p.diagnosis["findings"][0]["detail"].split("; ")
            assert said and all(r in p.invalid_reasons for r in said), (p.invalid_reasons, p.diagnosis["text"])
    one_ok = one.diagnosis["limiter"] != "client"
    # One stream has no queue; whether its TPOT is near the memory floor depends on this machine's
    # measured bandwidth (2.2x on a CI machine: weak decode bandwidth; over 2.5x on others: headroom),
    # so the answer must follow the ratio the point measured, by the documented threshold.
    near = _near_floor(one, Thresholds().floor_close)
    found = {f["cause"] for f in one.diagnosis["findings"]}
    assert found <= {"none", "decode_bandwidth", "client"}, one.diagnosis["text"]
    if one_ok:
        assert one.diagnosis["limiter"] == ("decode_bandwidth" if near else "none"), one.diagnosis["text"]
        assert one.metrics["decode_batch_mean"] == pytest.approx(1.0, abs=0.3)
    strong = {f["cause"] for f in six.diagnosis["findings"] if f["confidence"] == "strong"}
    # At the batch of 2 the engine ran, each step may also be near its memory floor: on one machine
    # a fresh-clone run measured TPOT p50 8.8 ms, 1.5x its floor of 6.01 ms, and the diagnosis rightly
    # said so beside batch slots (more slots is the lever: a memory-bound step amortises its weights
    # over a bigger batch). Whether it does depends on this machine's bandwidth, so the test follows
    # the ratio the point measured; batch slots stays the limiter either way (it is judged first).
    allowed = {"batch_slots", "client"} | ({"decode_bandwidth"} if _near_floor(six, Thresholds().floor_near) else set())
    assert "batch_slots" in strong and strong <= allowed, six.diagnosis["text"]
    slots = next(f for f in six.diagnosis["findings"] if f["cause"] == "batch_slots")
    assert "of max_num_seqs 2 running while up to" in slots["detail"]
    six_ok = six.diagnosis["limiter"] != "client"
    if six_ok:
        assert six.diagnosis["limiter"] == "batch_slots" and six.diagnosis["confidence"] == "strong"
    # the numbers behind it: the batch the engine ran, the TTFT in parts, the census
    assert six.metrics["decode_batch_mean"] == pytest.approx(2.0, abs=0.3)
    assert six.metrics["ttft_parts_queue_ms"] > six.metrics["ttft_parts_prefill_ms"]
    parts = sum(six.metrics[f"ttft_parts_{k}_ms"] for k in ("client", "api", "queue", "prefill"))
    assert parts == pytest.approx(six.metrics["ttft_parts_client_total_ms"], rel=0.05)
    assert six.metrics["limited_by_batch_slots"] == (1.0 if six_ok else 0.0) and six.metrics["foreign_cpu_cores"] < 0.25
    assert six.metrics["decode_floor_batch"] == 2.0  # the roofline at the batch the engine ran, not 6
    # said on the console at the end of each point
    c6 = "c6: limited by batch slots (strong)" if six_ok else "c6: limited by client (strong)"
    assert any(c6 in line for line in lines), lines
    c1 = (
        "c1: limited by client" if not one_ok else "c1: limited by decode bandwidth" if near else "c1: none: the server"
    )
    assert any(c1 in line for line in lines), lines


def _near_floor(point, within: float) -> bool:
    """Whether the point's TPOT was within ``within`` times its memory floor, the floor being the
    memory one: what the decode-bandwidth rule reads."""
    m = point.metrics
    memory_bound = m["decode_floor_memory_ms"] >= m.get("decode_floor_compute_ms", 0.0)
    return memory_bound and Thresholds().floor_below <= m["decode_floor_ratio"] <= within
