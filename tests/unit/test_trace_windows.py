"""Which windows of a trace this machine can replay as a valid point (perf.trace_windows): the
worst burst against the client's send time, the prefills against the server's prefill rate, the
window's ideal prefix reuse; and the command that prints them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.loadgen.traces import TraceRow, read_trace
from orchestrator.perf.sizing import EngineSpeed
from orchestrator.perf.trace_windows import SEND_MS_PER_REQUEST, judge, main, ranked, send_lags, windows, worst_burst
from tests.conftest import ROOT

MOONCAKE = ROOT / "conf" / "traces" / "mooncake_conversation_5min.jsonl"


def _speed(ms_per_token: float) -> EngineSpeed:
    return EngineSpeed(10.0, ms_per_token, 5.0, (128, 1024), "here", "vllm", "tiny", 0.0)


def test_bursts_are_sent_one_request_after_another():
    assert worst_burst([]) == 0 and send_lags([]) == []
    assert worst_burst([0.0, 1.0, 2.0]) == 1 and send_lags([0.0, 1.0, 2.0]) == [0.0, 0.0, 0.0]
    assert worst_burst([0.0, 0.0, 0.0, 1.0, 1.001, 5.0]) == 3
    assert send_lags([0.0, 0.0, 0.0, 1.0, 1.001]) == pytest.approx([0.0, 0.4, 0.8, 0.0, 0.4])
    assert worst_burst([0.0, 0.004, 0.008, 0.012], within_s=0.005) == 2  # a ramp, not one instant


def test_a_window_is_judged_by_its_bursts_its_prefills_and_its_reuse():
    shared = (1, 2)
    rows = [TraceRow(0.0, 256, 16, shared + (10 + i,)) for i in range(40)] + [TraceRow(30.0, 256, 16, shared)]
    w = judge(rows, 0.0, 1.0, 60.0, 128, _speed(0.5), max_send_lag_ms=10.0)
    assert w.burst == 40 and w.send_late_ms_p95 == pytest.approx(
        np.percentile([*range(40), 0], 95) * SEND_MS_PER_REQUEST
    )
    assert any(why.startswith("a burst of 40 requests at one instant") for why in w.why_not), w.why_not
    # 41 prompts of 256 tokens at 0.5 ms/token and 5 ms each, over 60 s
    assert w.prefill_load == pytest.approx(41 * (5 + 128) / 1e3 / 60)
    # every prompt after the first reuses the two shared blocks (256 tokens): the last wholly
    assert w.prefix_share == pytest.approx((39 * 256 + 256) / (41 * 256))
    # a burst of 10 (the trace-replay test's worst) is sent on time
    few = judge(rows[-11:], 0.0, 6.0, 60.0, 128, _speed(0.5), max_send_lag_ms=10.0)
    assert few.burst == 10 and not few.why_not
    # a server too slow for the prompts
    slow = judge(rows, 0.0, 1.0, 2.0, 128, _speed(0.5), max_send_lag_ms=100.0)
    assert slow.why_not == (f"its prefills take {slow.prefill_load:.0%} of the server's time (> 80%)",)
    # no speed known: the load is not judged; no blocks: no reuse
    plain = judge([TraceRow(0.0, 64, 8)], 0.0, 1.0, 60.0, None, None, 10.0)
    assert plain.prefill_load is None and plain.prefix_share is None and not plain.why_not


def test_the_labs_mooncake_slice_is_servable_and_the_most_reuse_comes_first():
    trace = read_trace(str(MOONCAKE), "mooncake")
    found = windows(trace, 72.0, (6.0,), step_s=30.0, length_scale=4, max_context=1024, speed=_speed(0.5))
    assert [w.start_s for w in found[:3]] == [0.0, 30.0, 60.0]
    at60 = next(w for w in found if w.start_s == 60.0)  # the workload's own window (trace_start_s 60)
    assert not at60.why_not and at60.burst <= 17 and at60.prefix_share is not None
    good = [w for w in ranked(found) if not w.why_not]
    assert good and [w.prefix_share for w in good] == sorted((w.prefix_share or 0.0 for w in good), reverse=True)
    # at its own speed, prompts of 1,024 tokens come faster than a 0.5 ms/token server prefills them
    fast = windows(trace, 72.0, (1.0,), length_scale=4, max_context=1024, speed=_speed(0.5))
    assert all(any("its prefills take" in why for why in w.why_not) for w in fast if w.requests > 100)


def test_the_command_prints_the_windows_and_refuses_a_missing_file(tmp_path, capsys):
    rows = [{"timestamp": t * 1000, "input_length": 600, "output_length": 20, "hash_ids": [0, t]} for t in range(40)]
    rows += [{"timestamp": 50_000, "input_length": 600, "output_length": 20, "hash_ids": [9, 10]}] * 60
    rows += [
        {"timestamp": 1000 * t, "input_length": 600, "output_length": 20, "hash_ids": [0, t]} for t in range(51, 70)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert main([str(path), "--duration", "10", "--prefill-ms-per-token", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "start_s  time_scale  requests  burst  late_ms_p95" in out and "a burst of 60 requests at one instant" in out
    assert "windows can be served as a valid point here" in out
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}))
    assert main([str(bad)]) == 2
    assert "line 1: field 'hash_ids'" in capsys.readouterr().err
