"""Metric math on scripted timestamps."""

from __future__ import annotations

import math

import pytest

from orchestrator.config.schema import SLOSpec
from orchestrator.metrics.records import (
    RequestRecord,
    parquet_bytes_to_table,
    records_to_parquet_bytes,
    table_to_records,
)
from orchestrator.metrics.summary import latency_of, summarize_by_class, summarize_point


def rec(i, sent, chunks, tokens=None, cls="a", status="ok", usage=None, intended=None, prompt=10):
    return RequestRecord(
        request_id=i,
        point=0,
        request_class=cls,
        intended_send_s=sent if intended is None else intended,
        sent_s=sent,
        input_tokens_target=prompt,
        output_tokens_target=len(chunks),
        chunk_times_s=list(chunks),
        chunk_tokens=list(tokens or [1] * len(chunks)),
        done_s=(chunks[-1] + 0.001) if chunks else sent + 0.01,
        prompt_tokens=prompt,
        output_tokens=usage,
        status=status,
        error=None if status == "ok" else "boom",
    )


def test_e2e_minus_ttft_equals_sum_itl():
    r = rec(0, 10.0, [10.050, 10.060, 10.075, 10.100, 10.130])
    lat = latency_of(r)
    assert lat is not None
    assert lat.ttft_ms == pytest.approx(50.0)
    assert lat.e2e_ms == pytest.approx(130.0)
    assert lat.e2e_ms - lat.ttft_ms == pytest.approx(sum(lat.itl_ms))
    assert lat.itl_ms == pytest.approx((10.0, 15.0, 25.0, 30.0))
    assert lat.tpot_ms == pytest.approx(80.0 / 4)


def test_multi_token_chunks_count_tokens_for_tpot():
    # two chunks carrying 1 and 3 tokens (e.g. speculative decoding): 4 output tokens
    r = rec(0, 0.0, [0.1, 0.4], tokens=[1, 3])
    lat = latency_of(r)
    assert lat.output_tokens == 4
    assert lat.tpot_ms == pytest.approx(300.0 / 3)
    assert lat.itl_ms == pytest.approx((300.0,))


def test_server_usage_wins_over_chunk_count():
    r = rec(0, 0.0, [0.1, 0.2], tokens=[1, 1], usage=5)
    assert latency_of(r).output_tokens == 5


def test_failed_request_has_no_latency():
    assert latency_of(rec(0, 0.0, [], status="error")) is None


def test_point_summary_throughput_percentiles_and_errors():
    records = [rec(i, float(i), [i + 0.1 * (k + 1) for k in range(10)]) for i in range(4)]
    records.append(rec(9, 1.5, [], status="error"))
    m = summarize_point(records)
    assert m["requests"] == 5 and m["completed"] == 4 and m["errors"] == 1
    # first send at 0.0, last token of request 3 at 3.0 + 10 x 0.1 = 4.0 (+1 ms done)
    assert m["duration_s"] == pytest.approx(4.001, abs=1e-6)
    assert m["qps"] == pytest.approx(4 / 4.001)
    assert m["tokens_per_second"] == pytest.approx(40 / 4.001)
    assert m["total_tokens_per_second"] == pytest.approx((40 + 40) / 4.001)
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for suffix in ("mean", "p50", "p90", "p95", "p99", "max"):
            assert math.isfinite(m[f"{name}_{suffix}"])
    assert m["ttft_ms_p50"] == pytest.approx(100.0)
    assert m["itl_ms_p99"] == pytest.approx(100.0)
    assert m["e2e_ms_max"] == pytest.approx(1000.0)


def test_goodput_counts_requests_meeting_slo():
    fast = rec(0, 0.0, [0.05, 0.06])
    slow = rec(1, 0.0, [0.5, 0.51])
    m = summarize_point([fast, slow], SLOSpec(ttft_ms=100))
    assert m["slo_attainment"] == pytest.approx(0.5)
    assert m["goodput"] == pytest.approx(1 / m["duration_s"])


def test_send_lag_and_achieved_rate():
    records = [rec(i, i * 0.5 + 0.002, [i * 0.5 + 0.1], intended=i * 0.5) for i in range(5)]
    m = summarize_point(records, target_rate=2.0)
    assert m["send_lag_ms_p50"] == pytest.approx(2.0)
    assert m["achieved_rate"] == pytest.approx(2.0) and m["schedule_rate"] == pytest.approx(2.0)
    assert m["target_rate"] == 2.0


def test_achieved_rate_uses_actual_sends_of_arrival_classes_only():
    # the client fell behind: intended every 0.5 s, actually sent every 1 s; plus background noise
    fg = [rec(i, float(i), [i + 0.1], intended=i * 0.5, cls="fg") for i in range(5)]
    bg = [rec(10 + i, 0.05 + i * 0.1, [0.2 + i * 0.1], cls="bg") for i in range(20)]
    m = summarize_point(fg + bg, target_rate=2.0, arrival_classes=["fg"])
    assert m["achieved_rate"] == pytest.approx(1.0)


def test_by_class():
    out = summarize_by_class([rec(0, 0, [0.1, 0.2], cls="long"), rec(1, 0, [0.01, 0.02], cls="short")])
    assert out["long"]["ttft_ms_p50"] == pytest.approx(100.0)
    assert out["short"]["ttft_ms_p50"] == pytest.approx(10.0)


def test_records_roundtrip_parquet():
    records = [rec(0, 0.0, [0.1, 0.2], tokens=[1, 2], usage=3), rec(1, 0.0, [], status="error")]
    table = parquet_bytes_to_table(records_to_parquet_bytes(records))
    assert table.num_rows == 2
    assert table_to_records(table) == records


def test_worst_itl_per_request():
    stalled = rec(0, 0.0, [0.1, 0.11, 0.61, 0.62])  # one 500 ms stall
    smooth = rec(1, 0.0, [0.1, 0.11, 0.12, 0.13])
    m = summarize_point([stalled, smooth])
    assert m["itl_worst_ms_max"] == pytest.approx(500.0)
    assert m["itl_worst_ms_p50"] == pytest.approx((500.0 + 10.0) / 2)


def test_client_validity():
    from orchestrator.config.schema import ValiditySpec
    from orchestrator.metrics.fidelity import client_validity

    ok, reasons = client_validity(
        {
            "send_lag_ms_p95": 1.0,
            "send_lag_ms_p99": 80.0,
            "loop_lag_ms_p95": 2.0,
            "client_cpu_util": 0.3,
            "target_rate": 10.0,
            "schedule_rate": 11.0,
            "achieved_rate": 10.9,
        },
        ValiditySpec(),
    )
    assert ok and not reasons
    ok, reasons = client_validity(
        {
            "send_lag_ms_p95": 50.0,
            "client_cpu_util": 0.99,
            "target_rate": 10.0,
            "schedule_rate": 10.0,
            "achieved_rate": 8.0,
        },
        ValiditySpec(),
    )
    assert not ok and len(reasons) == 3 and "send lag" in reasons[0]


def test_capped_points_are_not_blamed_for_waiting_on_the_cap():
    from orchestrator.config.schema import ValiditySpec
    from orchestrator.metrics.fidelity import client_validity

    m = {
        "send_lag_ms_p95": 500.0,
        "target_rate": 10.0,
        "schedule_rate": 10.0,
        "achieved_rate": 4.0,
        "client_cpu_util": 0.2,
    }
    assert client_validity(m, ValiditySpec(), capped=True) == (True, [])
    assert client_validity(m, ValiditySpec())[0] is False


def test_summarize_repeats_mean_ci_and_flag():
    from orchestrator.metrics.summary import summarize_repeats

    reps = [{"ttft_ms_p50": 10.0, "qps": 5.0}, {"ttft_ms_p50": 12.0, "qps": 5.0}, {"ttft_ms_p50": 14.0, "qps": 5.0}]
    out = summarize_repeats(reps, max_ci_rel_width=0.2)
    assert out["ttft_ms_p50"] == pytest.approx(12.0) and out["repeats"] == 3
    # sd 2, n 3, t(0.975, 2 dof) = 4.303: half-width 4.303 * 2 / sqrt(3) = 4.97 -> 41% of the mean
    assert out["ttft_ms_p50_ci95"] == pytest.approx(4.303 * 2 / 3**0.5)
    assert out["qps_ci95"] == 0.0
    assert out["ci_wide"] == 1.0
    assert summarize_repeats(reps, max_ci_rel_width=0.5)["ci_wide"] == 0.0


def test_rate_inf_burst_is_not_judged_on_send_lag():
    from orchestrator.config.schema import ValiditySpec
    from orchestrator.metrics.fidelity import client_validity

    m = {"send_lag_ms_p95": 25.0, "target_rate": float("inf"), "loop_lag_ms_p95": 1.0, "client_cpu_util": 0.3}
    assert client_validity(m, ValiditySpec()) == (True, [])
    assert client_validity({**m, "loop_lag_ms_p95": 40.0}, ValiditySpec())[0] is False


def test_server_failure_only_when_every_request_failed_on_the_servers_side():
    from orchestrator.metrics.summary import server_failure

    def failed(error, status=None):
        r = RequestRecord(1, 0, "main", 0.0, 0.0, 8, 8, done_s=0.1)
        r.status, r.error, r.http_status = "error", error, status
        return r

    dead = [failed("HTTP 500: EngineDeadError", 500)] * 3 + [failed("ClientConnectorError: refused")]
    reason = server_failure(dead)
    assert reason == "every request failed (4 of 4); most often (3x): HTTP 500: EngineDeadError"
    ok = RequestRecord(2, 0, "main", 0.0, 0.0, 8, 8, chunk_times_s=[0.05], chunk_tokens=[1], done_s=0.05)
    assert server_failure([*dead, ok]) is None  # the server answered something
    assert server_failure([failed("HTTP 400: prompt too long", 400)] * 2) is None  # the workload's problem
    assert server_failure([failed("TimeoutError: ")] * 2) is None  # overload, not death
    assert server_failure([failed("SocketTimeoutError: read")] + dead) is None
    assert server_failure([]) is None
