"""The diagnosis as pure functions: stalls and their causes, each rule of the limiting resource
on recorded numbers (fires, does not fire, strong or weak), the TTFT parts and the order in
which the limiter is named."""

from __future__ import annotations

import pytest

from orchestrator.metrics.diagnosis import PointEvidence, diagnose, engine_batch, ttft_parts
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.stalls import find_stalls, stall_metrics


def stream(rid, sent, first, gaps, cls="short", prompt=128, coalesced=()):
    """A record sent at ``sent`` whose first token came at ``first``, then chunks ``gaps`` (s) apart."""
    times = [first]
    for i, g in enumerate(gaps):
        times.append(times[-1] + (0.0 if i in coalesced else g))
    return RequestRecord(
        request_id=rid,
        point=0,
        request_class=cls,
        intended_send_s=sent,
        sent_s=sent,
        input_tokens_target=prompt,
        output_tokens_target=len(times),
        chunk_times_s=times,
        chunk_tokens=[1] * len(times),
        done_s=times[-1],
        prompt_tokens=prompt,
        output_tokens=len(times),
        coalesced_chunks=len(coalesced),
    )


def test_a_gap_during_another_requests_prefill_is_a_prefill_stall():
    gaps = [0.01] * 10 + [0.3] + [0.01] * 10
    a = stream(1, 0.0, 0.05, gaps)  # its stall spans 0.15 .. 0.45
    b = stream(2, 0.14, 0.45, [0.01], cls="long", prompt=1024)  # prefilled 0.14 .. 0.45
    stalls = find_stalls([a, b])
    assert [(s.request_id, s.cause, s.by_request, s.by_prompt_tokens) for s in stalls] == [(1, "prefill", 2, 1024)]
    assert stalls[0].gap_ms == pytest.approx(300.0) and stalls[0].median_ms == pytest.approx(10.0)
    m = stall_metrics(stalls, [a, b])
    assert m["stalls"] == 1 and m["stalls_prefill"] == 1 and m["stall_worst_ms_prefill"] == pytest.approx(300.0)
    assert m["stalls_per_prefill"] == 1.0


def test_gaps_under_five_medians_or_ten_ms_above_are_not_stalls():
    fine = stream(1, 0.0, 0.05, [0.01] * 10 + [0.045] + [0.01] * 5)  # 4.5x
    tiny = stream(2, 0.0, 0.05, [0.001] * 10 + [0.008] + [0.001] * 5)  # 8x, but only 7 ms above
    assert find_stalls([fine, tiny]) == []


def test_a_late_read_a_preemption_and_an_unattributed_gap():
    late = stream(1, 0.0, 0.05, [0.01] * 6 + [0.2, 0.01] + [0.01] * 6, coalesced=(7,))
    alone = stream(2, 10.0, 10.05, [0.01] * 6 + [0.3] + [0.01] * 6)
    other = stream(3, 20.0, 20.05, [0.01] * 6 + [0.3] + [0.01] * 6)
    counter = [(9.9, 0.0), (10.2, 1.0), (11.0, 1.0)]  # a preemption between 9.9 and 10.2
    causes = {s.request_id: s.cause for s in find_stalls([late, alone, other], counter)}
    assert causes == {1: "client_read", 2: "preemption", 3: "unattributed"}


def test_without_the_engines_prefill_time_only_a_prefill_ending_at_the_gap_counts():
    """A window from the send holds the queue wait: a request still queued is not the cause."""
    a = stream(1, 0.0, 0.05, [0.01] * 10 + [0.3] + [0.01] * 10)  # stall 0.15 .. 0.45
    queued = stream(2, 0.10, 2.0, [0.01], prompt=1024)  # sent before, first token long after
    ending = stream(3, 0.12, 0.46, [0.01], prompt=512)  # prefilled through the stall
    assert [(s.cause, s.by_request) for s in find_stalls([a, queued])] == [("unattributed", None)]
    assert [(s.cause, s.by_request) for s in find_stalls([a, queued, ending])] == [("prefill", 3)]


def test_a_short_prefill_inside_a_long_gap_is_not_its_cause():
    a = stream(1, 0.0, 0.05, [0.01] * 10 + [0.3] + [0.01] * 10)  # stall 0.15 .. 0.45
    b = stream(2, 0.20, 0.22, [0.01], prompt=16)  # a 20 ms prefill inside it
    assert [s.cause for s in find_stalls([a, b], prefill_ms_per_token=0.5)] == ["unattributed"]


def test_a_chunked_prefill_stalls_each_stream_once_per_chunk():
    gaps = [0.01] * 5 + [0.1, 0.01, 0.1, 0.01, 0.1] + [0.01] * 5
    a, c = stream(1, 0.0, 0.05, gaps), stream(3, 0.0, 0.051, gaps)
    b = stream(2, 0.09, 0.42, [0.01], cls="long", prompt=1024)
    m = stall_metrics(find_stalls([a, b, c], prefill_ms_per_token=0.3), [a, b, c])
    assert m["stalls_prefill"] == 6 and m["stalls_per_prefill"] == pytest.approx(3.0)


def engine(rows_of):
    """Timeline rows of the engine's gauges: {name: [(t, value), ...]}."""
    return [(t, "engine", name, v) for name, pts in rows_of.items() for t, v in pts]


def evidence(**kw):
    base = dict(
        metrics={"ttft_ms_mean": 100.0, "tpot_ms_p50": 20.0, "completed": 10.0},
        class_metrics={},
        records=[stream(i, i * 1.0, i * 1.0 + 0.05, [0.02] * 10) for i in range(10)],
        rows=[],
        window=(0.0, 10.0),
    )
    base.update(kw)
    return PointEvidence(**base)


def gauges(running, waiting, kv=None, n=10):
    out = {
        "requests_running": [(1.0 + i, running) for i in range(n)],
        "requests_waiting": [(1.0 + i, waiting) for i in range(n)],
    }
    out["kv_cache_usage"] = [(1.0 + i, kv if kv is not None else 0.1) for i in range(n)]
    return engine(out)


def test_headroom_when_nothing_fires():
    m = {
        "ttft_ms_mean": 50.0,
        "tpot_ms_p50": 20.0,
        "decode_floor_ms": 5.0,
        "decode_floor_ratio": 4.0,
        "telemetry_server_cpu_cores_mean": 0.5,
    }
    d = diagnose(evidence(metrics=m, rows=gauges(1, 0), slots=8, cores=2.0))
    assert d.limiter == "none" and d.confidence == "strong"
    assert d.headline.startswith("none: the server had headroom (a batch of 1.0 of 8 slots")
    assert d.metrics["decode_batch_mean"] == 1.0 and d.metrics["limited_by_none"] == 1.0


def test_batch_slots_strong_with_max_num_seqs_and_weak_without():
    d = diagnose(evidence(rows=gauges(4, 6), slots=4))
    assert (d.limiter, d.confidence) == ("batch_slots", "strong")
    assert "4 of max_num_seqs 4 running while up to 6 waited" in d.headline
    assert diagnose(evidence(rows=gauges(4, 6))).confidence == "weak"
    assert diagnose(evidence(rows=gauges(3, 6), slots=4)).limiter == "none"  # waiting, but slots free


def test_kv_capacity_from_preemptions_a_full_cache_with_waits_or_only_a_full_cache():
    m = {"ttft_ms_mean": 100.0, "server_preemptions": 3.0}
    assert diagnose(evidence(metrics=m, rows=gauges(2, 0))).limiter == "kv_capacity"
    full = diagnose(evidence(rows=gauges(2, 3, kv=0.97), slots=8))
    assert (full.limiter, full.confidence) == ("kv_capacity", "strong")
    assert all(f.cause != "batch_slots" for f in full.findings)  # the wait is the cache's
    weak = diagnose(evidence(rows=gauges(2, 0, kv=0.95)))
    assert (weak.limiter, weak.confidence) == ("kv_capacity", "weak")


def test_no_engine_gauges_is_said_not_guessed():
    d = diagnose(evidence())
    assert any("KV-cache capacity" in u for u in d.unmeasured) and any("batch slots" in u for u in d.unmeasured)
    assert d.limiter == "none" and d.confidence == "weak"  # what could not be checked may have limited it


def test_prefill_interference_strong_when_it_costs_time():
    gaps = [0.01] * 10 + [0.3] + [0.01] * 10
    recs = [stream(i, 0.0, 0.05 + 0.001 * i, gaps) for i in range(3)]
    recs.append(stream(9, 0.14, 0.45, [0.01], cls="long", prompt=1024))
    d = diagnose(evidence(records=recs, rows=gauges(4, 0), slots=8))
    assert (d.limiter, d.confidence) == ("prefill_interference", "strong")
    assert d.findings[0].evidence.stalls_prefill == 3 and d.metrics["stalls_per_prefill"] == 1.0
    # what the tuner sizes a chunk from: the decode step (the streams' 10 ms median gap) and the
    # stall's cost per token of the 1024-token prefill ((300 - 10) ms / 1024)
    said = d.findings[0].evidence
    assert said.decode_step_ms == pytest.approx(10.0)
    assert said.prefill_stall_ms_per_token == pytest.approx(290.0 / 1024, rel=0.01)


def test_over_capacity_on_a_rate_point_whose_queue_grows():
    # arrivals every 0.1 s; each waits longer than the last: the queue grows through the window
    recs = [stream(i, i * 0.1, i * 0.1 + 0.05 + 0.08 * i, [0.02] * 20) for i in range(30)]
    d = diagnose(evidence(records=recs, rate=10.0, rows=gauges(2, 5)))
    assert (d.limiter, d.confidence) == ("over_capacity", "strong")
    assert d.findings[0].evidence.ttft_growth > 2 and d.findings[0].evidence.completion_share < 0.8
    steady = [stream(i, i * 0.1, i * 0.1 + 0.05, [0.02] * 3) for i in range(30)]
    assert diagnose(evidence(records=steady, rate=10.0, rows=gauges(2, 0))).limiter == "none"
    # a closed loop cannot be over capacity
    assert diagnose(evidence(records=recs, rows=gauges(2, 0))).limiter != "over_capacity"


def test_a_healthy_open_loop_warming_up_is_not_over_capacity():
    """In flight climbs from 1 to rate x lifetime at the start of any open loop: not a queue."""
    import numpy as np

    rng = np.random.default_rng(0)
    sends = np.cumsum(rng.exponential(0.5, 40))  # 2 req/s
    for lifetime in (4.9, 9.6):
        n = int((lifetime - 0.1) / 0.05)
        recs = [stream(i, float(t), float(t) + 0.1, [0.05] * n) for i, t in enumerate(sends)]
        assert diagnose(evidence(records=recs, rate=2.0, rows=gauges(5, 0))).limiter == "none", lifetime


def test_a_point_shorter_than_two_lifetimes_cannot_tell_a_queue_and_says_so():
    # 8 req/s for 3 s, each request living 4 s: nothing completes before the last arrival on any server
    recs = [stream(i, i * 0.125, i * 0.125 + 0.05 + 0.01 * i, [0.04] * 100) for i in range(24)]
    d = diagnose(evidence(records=recs, rate=8.0, rows=gauges(2, 0)))
    assert d.limiter == "none"
    said = [u for u in d.unmeasured if u.startswith("over capacity:")]
    assert (
        said
        and "more than half the 2.9 s the arrivals spanned" in said[0]
        and "(at least 69 requests would tell)" in said[0]
    )


def shared_server(rate, n, out, capacity, per_stream, dt=0.002):
    """Records of an open loop (arrivals every 1/rate s) against a server that streams at most
    ``capacity`` tokens/s in all, shared by the requests in flight, each at most ``per_stream``."""
    recs = [stream(i, i / rate, 0.0, []) for i in range(n)]
    for r in recs:
        r.chunk_times_s, r.chunk_tokens, r.output_tokens_target = [], [], out
    got, t = [0.0] * n, 0.0
    while any(g < out for g in got):
        live = [i for i in range(n) if recs[i].sent_s <= t and got[i] < out]
        for i in live:
            before = got[i]
            got[i] += min(capacity / len(live), per_stream) * dt
            for _ in range(int(got[i]) - int(before)):
                if len(recs[i].chunk_times_s) < out:
                    recs[i].chunk_times_s.append(t)
                    recs[i].chunk_tokens.append(1)
            if got[i] >= out:
                recs[i].done_s = t
        t += dt
    return recs


def test_over_capacity_when_the_output_rate_stops_growing_with_the_batch_even_before_anything_completes():
    # 8 req/s of 100 tokens (800 tok/s asked) against 500 tok/s: the first requests live ~5 s, the
    # arrivals span 3 s: no completion to count, but the batch grows while the output rate is flat
    recs = shared_server(8.0, 25, 100, capacity=500.0, per_stream=40.0)
    d = diagnose(evidence(records=recs, rate=8.0, rows=gauges(2, 0)))
    assert (d.limiter, d.confidence) == ("over_capacity", "strong"), d.text()
    assert "the output rate stopped growing with the batch" in d.headline and "of the 800 tok/s" in d.headline
    assert d.findings[0].evidence.output_rate_share == pytest.approx(500 / 800, abs=0.05)
    # 200 tokens each on a server with room (each stream at 40 tok/s, 2000 in all): in flight climbs
    # for 5 s, longer than the arrivals, and the output rate climbs with it: too short to tell, said
    ok = shared_server(8.0, 25, 200, capacity=2000.0, per_stream=40.0)
    d = diagnose(evidence(records=ok, rate=8.0, rows=gauges(2, 0)))
    assert d.limiter == "none" and any(u.startswith("over capacity: the first arrivals lived") for u in d.unmeasured)
    # long enough to reach the steady state: keeps up
    ok = shared_server(8.0, 80, 20, capacity=2000.0, per_stream=40.0)
    d = diagnose(evidence(records=ok, rate=8.0, rows=gauges(2, 0)))
    assert d.limiter == "none" and not [u for u in d.unmeasured if u.startswith("over capacity")], d.text()


def test_over_capacity_is_judged_repeat_by_repeat():
    recs = []
    for rep in (0, 1):
        for i in range(30):
            r = stream(100 * rep + i, 50.0 * rep + i * 0.1, 50.0 * rep + i * 0.1 + 0.05 + 0.08 * i, [0.02] * 20)
            r.repeat = rep
            recs.append(r)
    d = diagnose(evidence(records=recs, rate=10.0, rows=gauges(2, 5)))
    assert (d.limiter, d.confidence) == ("over_capacity", "strong") and "(in 2 of 2 repeats)" in d.headline


def test_chunks_read_together_by_a_client_that_kept_up_are_the_servers_not_a_client_limit():
    reason = "27% of token chunks arrived in one read with an earlier one (> 0.2): their gaps are read times"
    m = {"ttft_ms_mean": 100.0, "tpot_ms_p50": 20.0, "coalesced_chunk_share": 0.27, "client_cpu_util": 0.01}
    d = diagnose(evidence(metrics={**m, "loop_lag_ms_p95": 0.6}, rows=gauges(1, 25), slots=1, client_reasons=[reason]))
    assert d.limiter == "batch_slots" and "client" not in {f.cause for f in d.findings}
    assert any(n.startswith("the client kept up (event-loop lag p95 0.6 ms <= 2.0") for n in d.notes)
    # a client whose loop woke late read them together itself
    d = diagnose(evidence(metrics={**m, "loop_lag_ms_p95": 40.0}, rows=gauges(1, 25), slots=1, client_reasons=[reason]))
    assert d.limiter == "client"
    # loop lag not measured: the check stands
    d = diagnose(evidence(metrics=m, rows=gauges(1, 25), slots=1, client_reasons=[reason]))
    assert d.limiter == "client"


def test_a_client_that_woke_well_inside_a_token_gap_did_not_make_the_servers_late_reads():
    # CI's case (a starved server front end): most chunks read together and the TTFT median past the
    # server's histogram, from a client whose loop woke within 4 ms while tokens came 20 ms apart
    clock = "server clock: the client's TTFT p50 2745.0 ms is 245.0 ms above the most the server's histogram allows"
    reasons = ["63% of token chunks arrived in one read with an earlier one (> 0.2): their gaps are read times", clock]
    m = {"ttft_ms_mean": 100.0, "tpot_ms_p50": 20.0, "coalesced_chunk_share": 0.63, "server_itl_s_mean": 0.02}
    d = diagnose(evidence(metrics={**m, "loop_lag_ms_p95": 4.0}, rows=gauges(1, 25), slots=1, client_reasons=reasons))
    assert d.limiter == "batch_slots" and "client" not in {f.cause for f in d.findings}, d.text()
    assert any(n.startswith("the client kept up (event-loop lag p95 4.0 ms <= 5.0") and clock in n for n in d.notes)
    # past a quarter of the token gap the client may have read late itself
    d = diagnose(evidence(metrics={**m, "loop_lag_ms_p95": 6.0}, rows=gauges(1, 25), slots=1, client_reasons=reasons))
    assert d.limiter == "client"
    # a late send is the client's own, whatever its loop says
    late = ["send lag p95 40.0 ms > 10", *reasons]
    d = diagnose(evidence(metrics={**m, "loop_lag_ms_p95": 0.5}, rows=gauges(1, 25), slots=1, client_reasons=late))
    assert d.limiter == "client"


def test_a_shared_machine_then_the_client_come_first():
    d = diagnose(
        evidence(
            rows=gauges(4, 6),
            slots=4,
            client_reasons=["event-loop lag p95 40.0 ms > 10"],
            foreign={"cores": 1.2, "top": [[123, "python burn.py", 1.1]]},
            foreign_limit=0.5,
        )
    )
    # a shared machine also starves the client: it is named first, the client's lag beside it
    assert [f.cause for f in d.findings] == ["shared_machine", "client", "batch_slots"]
    assert "pid 123 (python burn.py) 1.10" in d.findings[0].detail
    below = diagnose(evidence(foreign={"cores": 0.2, "top": []}, foreign_limit=0.5))
    assert below.limiter == "none" and below.metrics["foreign_cpu_cores"] == 0.2


def test_compute_on_gpus_reads_sm_power_and_throttling():
    def gpu(sm, power, limit=700.0, throttled=0.0):
        m = {
            "ttft_ms_mean": 50.0,
            "telemetry_gpu_sm_util_pct_mean": sm,
            "telemetry_gpu_power_w_mean": power,
            "telemetry_gpu_power_limit_w_mean": limit,
            "telemetry_gpu_throttled_share": throttled,
        }
        return diagnose(evidence(metrics=m, device="cuda", rows=gauges(8, 0)))

    assert (gpu(99, 680).limiter, gpu(99, 680).confidence) == ("compute", "strong")
    assert (gpu(99, 600).limiter, gpu(99, 600).confidence) == ("compute", "weak")
    assert gpu(99, 300, throttled=0.8).limiter == "compute"
    assert gpu(99, 300).limiter == "none"  # busy SMs at a third of the power: memory-bound kernels
    assert gpu(60, 690).limiter == "none"


def test_compute_on_the_cpu_needs_work_waiting_not_only_busy_cores():
    busy = {"ttft_ms_mean": 100.0, "telemetry_server_cpu_cores_mean": 1.95, "client_cpu_util": 0.02}
    spinning = diagnose(evidence(metrics=busy, cores=2.0, rows=gauges(2, 0)))
    assert spinning.limiter == "none" and any("busy cores alone" in n for n in spinning.notes)
    queued = {**busy, "server_queue_time_s_mean": 0.05, "server_ttft_s_mean": 0.1}
    d = diagnose(evidence(metrics=queued, cores=2.0, rows=gauges(2, 0)))
    assert (d.limiter, d.confidence) == ("compute", "strong") and "queue time 50 ms" in d.headline


def test_decode_bandwidth_near_the_memory_floor():
    def at(ratio, compute_ms=0.1):
        m = {
            "ttft_ms_mean": 50.0,
            "tpot_ms_p50": 8.0 * ratio,
            "decode_floor_ms": 8.0,
            "decode_floor_ratio": ratio,
            "decode_floor_memory_ms": 8.0,
            "decode_floor_compute_ms": compute_ms,
        }
        return diagnose(evidence(metrics=m, rows=gauges(1, 0)))

    assert (at(1.2).limiter, at(1.2).confidence) == ("decode_bandwidth", "strong")
    assert at(2.0).confidence == "weak" and at(4.0).limiter == "none"
    assert at(1.2, compute_ms=9.0).limiter == "none"  # the compute floor is the higher one
    below = at(0.9)  # faster than the floor: the floor does not hold there (a model in the CPU's caches)
    assert below.limiter == "none" and "below the floor, so the floor does not hold here" in below.text()


def test_prefix_reuse_missed_when_the_prompts_share_prefixes_the_server_did_not_reuse():
    def at(ideal, hits=None, cache=None):
        m = {"ttft_ms_mean": 50.0, "prefix_reuse_ideal_share": ideal}
        if hits is not None:
            m["server_prefix_cache_hit_rate"] = hits
        return diagnose(evidence(metrics=m, rows=gauges(1, 0), slots=8, prefix_cache=cache))

    missed = at(0.6, hits=0.1)
    assert (missed.limiter, missed.confidence) == ("prefix_reuse_missed", "strong")
    assert "share 60% of their tokens" in missed.headline and "served 10%" in missed.headline
    assert missed.metrics["limited_by_prefix_reuse_missed"] == 1.0
    assert at(0.6).confidence == "weak"  # no hits reported, the cache's setting unknown
    off = at(0.6, cache=False)  # vLLM with its cache off counts no queries
    assert off.confidence == "strong" and "the server's prefix cache is off" in off.headline
    assert at(0.6, hits=0.5).limiter == "none"  # the cache served most of what it could
    assert at(0.1).limiter == "none"  # little to reuse
    # beside a strong limiter it is a finding, not the limiter
    both = diagnose(
        evidence(metrics={"ttft_ms_mean": 50.0, "prefix_reuse_ideal_share": 0.6}, rows=gauges(4, 6), slots=4)
    )
    assert both.limiter == "batch_slots" and [f.cause for f in both.findings] == ["batch_slots", "prefix_reuse_missed"]


def test_ttft_parts_add_up_and_say_what_is_missing():
    m = {
        "ttft_ms_mean": 200.0,
        "server_ttft_s_mean": 0.19,
        "server_queue_time_s_mean": 0.05,
        "server_prefill_time_s_mean": 0.12,
    }
    cm = {"short": {"ttft_ms_mean": 150.0}, "long": {"ttft_ms_mean": 400.0}}
    out, classes, words, missing = ttft_parts(evidence(metrics=m, class_metrics=cm))
    assert out["ttft_parts_client_ms"] == pytest.approx(10.0) and out["ttft_parts_queue_ms"] == pytest.approx(50.0)
    assert out["ttft_parts_prefill_ms"] == pytest.approx(120.0) and out["ttft_parts_api_ms"] == pytest.approx(20.0)
    assert sum(out[f"ttft_parts_{k}_share"] for k in ("client", "queue", "prefill", "api")) == pytest.approx(1.0)
    assert classes["long"]["ttft_parts_server_ms"] == pytest.approx(390.0) and missing == []
    assert "pooled over classes" in words[0]
    _, _, _, missing = ttft_parts(evidence(metrics={"ttft_ms_mean": 200.0}))
    assert len(missing) == 3 and "queue-time" in missing[1]
    pd, _, _, _ = ttft_parts(
        evidence(metrics={"ttft_ms_mean": 300.0, "server_decode_ttft_s_mean": 0.05}, disaggregated=True)
    )
    # the engine's TTFT above the client's: its means are no parts of the client's TTFT, no sum is said
    fast = {"ttft_ms_mean": 6.0, "server_ttft_s_mean": 0.011, "server_queue_time_s_mean": 0.0}
    out, _, words, missing = ttft_parts(evidence(metrics={**fast, "server_prefill_time_s_mean": 0.009}))
    assert words == [] and "ttft_parts_client_ms" not in out and "ttft_parts_api_ms" not in out
    assert out["ttft_parts_prefill_ms"] == pytest.approx(9.0) and "is above the client's 6.0 ms" in missing[0]
    slow = {"ttft_ms_mean": 30.0, "server_ttft_s_mean": 0.02, "server_queue_time_s_mean": 0.01}
    _, _, words, missing = ttft_parts(evidence(metrics={**slow, "server_prefill_time_s_mean": 0.02}))
    assert words == [] and "queue + prefill means (30.0 ms) are above its mean TTFT (20.0 ms)" in missing[0]
    assert pd["ttft_parts_kv_transfer_ms"] == pytest.approx(50.0) and pd["ttft_parts_prefill_leg_ms"] == pytest.approx(
        250.0
    )


def test_a_failed_server_is_not_diagnosed():
    d = diagnose(evidence(server_failed=True))
    assert d.limiter == "" and d.headline.startswith("not diagnosed")


def test_a_point_where_nothing_completed_is_not_diagnosed():
    failed = [RequestRecord(i, 0, "main", 0.0, 0.0, 8, 4, status="error", error="HTTP 500") for i in range(3)]
    d = diagnose(evidence(records=failed))
    assert d.limiter == "" and "no request of the point completed" in d.headline


def test_sglang_pd_says_its_kv_transfer_is_not_measurable():
    m = {"ttft_ms_mean": 300.0, "server_decode_ttft_s_mean": 0.25}
    _, _, _, missing = ttft_parts(evidence(metrics=m, disaggregated=True, decode_ttft_holds_prefill=True))
    assert any("both servers at once" in u for u in missing)


def test_too_few_gauge_samples_judge_no_slots_and_no_batch():
    """One or two gauge samples (a short point, a starved monitor) can read an idle engine: batch
    slots and the decode batch are then not measurable, and busy cores with a queue are only a weak
    compute finding, since the wait's own cause could not be checked (a CI run named compute
    strong at a point whose max_num_seqs held 4 requests waiting, from a batch of 0.0)."""
    queued = {
        "ttft_ms_mean": 700.0,
        "tpot_ms_p50": 13.0,
        "telemetry_server_cpu_cores_mean": 1.92,
        "client_cpu_util": 0.02,
        "server_queue_time_s_mean": 0.69,
        "server_ttft_s_mean": 0.75,
    }
    thin = diagnose(evidence(metrics=queued, cores=2.0, rows=gauges(0, 0, n=2), slots=2))
    assert any(u.startswith("batch slots: 2 gauge sample(s)") for u in thin.unmeasured), thin.unmeasured
    assert (thin.limiter, thin.confidence) == ("compute", "weak") and "could not be checked" in thin.headline
    assert "decode_batch_mean" not in thin.metrics
    enough = diagnose(evidence(metrics=queued, cores=2.0, rows=gauges(2, 4, n=3), slots=2))
    assert (enough.limiter, enough.confidence) == ("batch_slots", "strong") and enough.metrics[
        "decode_batch_mean"
    ] == 2.0


def test_the_batch_the_engine_ran_leaves_out_the_gauges_zero_reads():
    """vLLM sets its running gauge after a step whose requests all finished and before the next
    step (the prefill of those waiting) ends: that zero is no batch, so a full batch of 2 reads 2."""
    rows = engine(
        {
            "requests_running": [(1.0 + i, 0.0 if i % 4 == 0 else 2.0) for i in range(12)],
            "requests_waiting": [(1.0 + i, 4.0) for i in range(12)],
        }
    )
    assert engine_batch({}, rows, (0.0, 14.0)) == pytest.approx(2.0)
    m = {"ttft_ms_mean": 100.0, "tpot_ms_p50": 20.0, "decode_floor_ms": 5.0}
    assert diagnose(evidence(metrics=m, rows=rows)).metrics["decode_batch_mean"] == pytest.approx(2.0)
    assert engine_batch({}, engine({"requests_running": [(1.0 + i, 0.0) for i in range(5)]}), (0.0, 10.0)) is None


def test_the_batch_the_engine_ran_comes_from_its_step_counter_before_its_gauge():
    """With the engine's steps counted (vLLM), the batch is its generation tokens over its steps,
    whatever its lagging gauge read: a gauge that read 1 after each finish does not pull a full
    batch of 2 down, and no gauge sample is needed at all."""
    lagging = engine({"requests_running": [(1.0 + i, 1.0 if i % 3 == 0 else 2.0) for i in range(6)]})
    counted = {"server_generation_tokens": 950.0, "server_engine_steps": 490.0}
    assert engine_batch(counted, lagging, (0.0, 8.0)) == pytest.approx(950 / 490)
    assert engine_batch({}, lagging, (0.0, 8.0)) == pytest.approx(10 / 6)
    assert engine_batch(counted, [], (0.0, 8.0)) == pytest.approx(950 / 490)
    assert engine_batch({"server_generation_tokens": 5.0, "server_engine_steps": 0.0}, [], (0.0, 8.0)) is None
    m = {"ttft_ms_mean": 100.0, "tpot_ms_p50": 20.0, "decode_floor_ms": 5.0, **counted}
    assert diagnose(evidence(metrics=m, rows=lagging)).metrics["decode_batch_mean"] == pytest.approx(950 / 490)


def test_every_reading_the_rules_take_is_a_metric_of_that_name():
    """The rules read typed fields (:class:`Readings`), each filled from the metric of its name: a
    field no metric bears would read None for ever, so a renamed metric must rename its field."""
    from dataclasses import fields

    from orchestrator.config.metric_keys import M
    from orchestrator.metrics.diagnosis import Readings

    keys = {v for k, v in vars(M).items() if k.isupper() and isinstance(v, str)}
    assert {f.name for f in fields(Readings)} - keys == set()
    read = Readings.of({M.TPOT_MS_P50: 12.5, M.STALLS: 3.0, "not_read": 1.0})
    assert (read.tpot_ms_p50, read.stalls, read.decode_floor_ms) == (12.5, 3.0, None)
