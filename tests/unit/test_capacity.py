"""SLO capacity search on scripted latency curves: bracketing, bisection, stop rules."""

from __future__ import annotations

import pytest

from orchestrator.decide.capacity import CapacitySearch, Judgement, judge


def curve(capacity: float):
    """A server whose p99 TTFT is 100 ms below ``capacity`` req/s and explodes above it."""

    def metrics(rate: float) -> dict[str, float]:
        ttft = 100.0 if rate <= capacity else 100.0 * (1 + 50 * (rate - capacity))
        return {"ttft_ms_p99": ttft, "qps": rate, "schedule_rate": rate, "goodput": rate, "errors": 0.0}

    return metrics


def run(search: CapacitySearch, server, slo=None, knob="rate") -> CapacitySearch:
    while (v := search.next_value()) is not None:
        search.observe(v, f"r{v:g}", judge(server(v), {}, slo or {"ttft_ms_p99": 500.0}, knob))
    return search


@pytest.mark.parametrize("true_capacity", [0.7, 3.3, 11.0, 40.0])
def test_finds_capacity_within_precision(true_capacity):
    s = run(CapacitySearch(start=2.0, low=0.1, high=256.0, precision=0.05, max_probes=12), curve(true_capacity))
    out = s.summary()
    # the limit is where 100 * (1 + 50 (r - c)) = 500, i.e. c + 0.08
    assert out["capacity"] <= true_capacity + 0.08 < out["capacity_hi"]
    assert (out["capacity_hi"] - out["capacity"]) / out["capacity_hi"] <= 0.05
    assert "within 5%" in s.stop_reason
    assert out["capacity_censored"] == 0.0


def test_never_meets_the_slo_is_capacity_zero_said_plainly():
    s = run(
        CapacitySearch(start=2.0, low=0.25, high=64.0), lambda r: {"ttft_ms_p99": 9e9, "qps": r, "schedule_rate": r}
    )
    assert s.summary()["capacity"] == 0.0 and "capacity_hi" in s.summary()
    assert [p.value for p in s.probes] == [2.0, 1.0, 0.5, 0.25]
    assert s.explanation("req/s").startswith("capacity 0 req/s: no probe met the SLOs (lowest tried 0.25 req/s)")
    assert "even at the lowest load searched" in s.stop_reason


def test_meets_the_slo_everywhere_is_a_lower_bound_said_plainly():
    s = run(CapacitySearch(start=2.0, low=0.25, high=16.0), curve(1e9))
    out = s.summary()
    assert out["capacity"] == 16.0 and out["capacity_censored"] == 1.0 and "capacity_hi" not in out
    assert s.explanation("req/s").startswith("capacity >= 16 req/s")
    assert "highest load searched" in s.stop_reason


def test_max_probes_stops_with_the_bracket_so_far():
    s = run(CapacitySearch(start=1.0, low=0.1, high=1000.0, precision=0.001, max_probes=5), curve(9.0))
    assert len(s.probes) == 5 and s.stop_reason == "5 probes spent"
    assert s.summary()["capacity"] == 8.0 and s.summary()["capacity_hi"] == 16.0


def test_time_budget_stops():
    s = CapacitySearch(start=1.0, low=0.1, high=100.0)
    s.observe(1.0, "r1", Judgement("pass"))
    assert s.next_value(out_of_time=True) is None and s.stop_reason == "time budget spent"


def test_a_probe_the_client_could_not_drive_decides_nothing():
    s = CapacitySearch(start=1.0, low=0.1, high=100.0)
    s.observe(1.0, "r1", Judgement("pass"))
    s.observe(2.0, "r2", judge({"invalid": 1.0, "ttft_ms_p99": 1.0}, {}, {"ttft_ms_p99": 500.0}, "rate"))
    assert s.next_value() is None and "probe r2 decides nothing (the client could not drive this load)" in s.stop_reason
    assert s.summary()["capacity"] == 1.0 and "capacity_hi" not in s.summary()  # r2 is not a failure


def test_a_search_whose_every_probe_was_invalid_measured_no_capacity_not_zero():
    """Seen on 2 busy cores: c2 met its SLO by numbers, but the machine was shared, so the
    search stopped; it said 'capacity 0 streams: no probe met the SLOs' and logged 0."""
    s = CapacitySearch(start=2.0, low=1.0, high=32.0, integer=True)
    shared = judge(
        {"invalid": 1.0, "machine_invalid": 1.0, "ttft_ms_p99": 55.0}, {}, {"ttft_ms_p99": 250.0}, "concurrency"
    )
    s.observe(2.0, "c2", shared)
    assert s.next_value() is None and not s.decided
    assert s.summary() == {"capacity_probes": 1.0, "capacity_runs": 1.0, "capacity_undecided": 1.0}
    said = s.explanation("streams")
    assert said.startswith("capacity not measured: no probe decided anything; stopped: probe c2 decides nothing (")
    assert "the machine was shared" in said and "capacity 0" not in said
    s = CapacitySearch(start=2.0, low=1.0, high=32.0, integer=True)  # a failure before it: capacity 0 stands
    s.observe(2.0, "c2", Judgement("fail", ("ttft_ms_p99 300 > 250",)))
    s.observe(1.0, "c1", shared)
    assert s.decided and s.summary()["capacity"] == 0.0 and s.summary()["capacity_undecided"] == 0.0
    assert s.explanation("streams").startswith("capacity 0 streams: no probe met the SLOs")


def test_a_probe_stops_the_search_in_its_own_words():
    """A probe made INVALID by workload fidelity or a shared machine says so, not 'the client'."""
    for metrics, words in (
        ({"invalid": 1.0, "workload_invalid": 1.0}, "the server got another workload than planned"),
        ({"invalid": 1.0, "machine_invalid": 1.0}, "the machine was shared"),
    ):
        s = CapacitySearch(start=1.0, low=0.1, high=100.0)
        s.observe(1.0, "r1", judge(metrics, {}, {"ttft_ms_p99": 500.0}, "rate"))
        assert s.next_value() is None and words in s.stop_reason and "client" not in s.stop_reason


def test_concurrency_probes_are_whole_numbers():
    def server(c: float) -> dict[str, float]:
        return {"itl_ms_p99": 50.0 * c, "qps": 1.0}

    s = run(
        CapacitySearch(start=1, low=1, high=64, integer=True, max_probes=12),
        server,
        {"itl_ms_p99": 275.0},
        knob="concurrency",
    )
    assert all(p.value == int(p.value) for p in s.probes)
    assert s.summary()["capacity"] == 5.0 and s.summary()["capacity_hi"] == 6.0


def test_judge_reads_class_metrics_saturation_and_goodput():
    base = {"qps": 1.0, "schedule_rate": 2.0, "goodput": 0.5, "errors": 1.0}
    j = judge(
        base,
        {"long": {"ttft_ms_p99": 3000.0}},
        {"long/ttft_ms_p99": 2000.0, "itl_ms_p99": 10.0},
        "rate",
        min_goodput_fraction=0.9,
    )
    text = "; ".join(j.reasons)
    assert j.verdict == "fail"
    assert "long/ttft_ms_p99 3000 > 2000" in text and "itl_ms_p99 not measured" in text
    assert "1 request(s) failed" in text and "goodput 0.5 < 0.9" in text and "saturated" in text
    assert judge(base, {}, {}, "concurrency").reasons == ("1 request(s) failed",)  # no schedule in a closed loop


# ---------------------------------------------------------------- a probe too close to tell


def probe_records(index: int, ttft_ms, cls="main"):
    """One request per TTFT (ms), each with four tokens 20 ms apart."""
    from orchestrator.metrics.records import RequestRecord

    out = []
    for i, t in enumerate(ttft_ms):
        first = i * 0.5 + t / 1e3
        times = [first + 0.02 * k for k in range(4)]
        out.append(
            RequestRecord(
                request_id=1000 * index + i,
                point=index,
                request_class=cls,
                intended_send_s=i * 0.5,
                sent_s=i * 0.5,
                input_tokens_target=16,
                output_tokens_target=4,
                chunk_times_s=times,
                chunk_tokens=[1] * 4,
                done_s=times[-1],
                prompt_tokens=16,
                output_tokens=4,
            )
        )
    return out


def drive(probes, ttfts_of_run, invalid_reasons=()):
    """Run the probes the search asks for: run k of the search gets ``ttfts_of_run(k)``."""
    from orchestrator.metrics.result import PointResult
    from orchestrator.metrics.summary import summarize_point

    labels = []
    while (probe := probes.next()) is not None:
        point, label = probe
        k = len(labels)
        records = probe_records(k, ttfts_of_run(k))
        metrics = summarize_point(records)
        if invalid_reasons:
            metrics.update({"invalid": 1.0, "workload_invalid": 1.0})
        labels.append(label)
        result = PointResult(
            index=k,
            label=label,
            setting=point.model_dump(exclude_none=True),
            metrics=metrics,
            invalid_reasons=list(invalid_reasons),
        )
        probes.observe(result, records)
    return labels


def test_a_probe_whose_interval_holds_the_limit_runs_again_then_decides_on_all_its_runs():
    import numpy as np

    from orchestrator.config.schema import CapacitySpec
    from orchestrator.trial.capacity_probes import CapacityProbes

    rng = np.random.default_rng(0)
    said: list[str] = []
    cap = CapacitySpec(knob="concurrency", slo={"ttft_ms_p50": 100.0}, start=4, high=4, max_probes=1)
    # a TTFT median right at the limit, 40 requests a run: each run's interval holds 100 ms
    probes = CapacityProbes(cap, ["main"], said.append)
    labels = drive(probes, lambda k: rng.normal(100.0, 20.0, 40))
    assert labels == ["c4", "c4#2", "c4#3"]
    assert sum("indeterminate (ttft_ms_p50" in s for s in said) == 2 and "holds its limit 100" in said[0]
    metrics, account = probes.outcome()
    (probe,) = account["probes"]
    assert probe["runs"] == 3 and probe["label"] == "c4#3" and "still too close to tell after 3 run(s)" in probe["note"]
    assert metrics["slo_capacity_concurrency_runs"] == 3.0 and metrics["slo_capacity_concurrency_probes"] == 1.0

    # far from the limit: one run decides
    probes = CapacityProbes(cap, ["main"], said.append)
    assert drive(probes, lambda k: rng.normal(40.0, 5.0, 40)) == ["c4"]
    assert probes.outcome()[1]["probes"][0]["verdict"] == "pass"

    # capacity.runs=1: the first run decides, whatever its interval
    once = CapacityProbes(cap.model_copy(update={"runs": 1}), ["main"], said.append)
    assert drive(once, lambda k: rng.normal(100.0, 20.0, 40)) == ["c4"]


def test_a_goodput_share_too_close_to_its_floor_runs_again_and_is_judged_on_all_the_requests():
    """min_goodput_fraction is judged like a latency SLO: a 95% interval (Wilson) of the share of
    requests that met the SLOs, over the probe's requests; one holding the floor is indeterminate."""
    from orchestrator.config.schema import CapacitySpec
    from orchestrator.decide.capacity import share_interval
    from orchestrator.metrics.result import PointResult
    from orchestrator.trial.capacity_probes import CapacityProbes

    lo, hi = share_interval(36, 40) or (0.0, 0.0)
    assert 0.76 < lo < 0.77 and 0.96 < hi < 0.97  # Wilson, 95%: 0.9 of 40 requests
    assert share_interval(40, 40) is not None and share_interval(40, 40)[0] > 0.9 and share_interval(0, 0) is None

    def drive_goodput(probes, good_of_run, n=40):
        labels = []
        while (probe := probes.next()) is not None:
            point, label = probe
            k = len(labels)
            good = good_of_run(k)
            metrics = {"requests": n, "completed": n, "qps": n / 10.0, "duration_s": 10.0, "goodput": good / 10.0}
            labels.append(label)
            result = PointResult(index=k, label=label, setting=point.model_dump(exclude_none=True), metrics=metrics)
            probes.observe(result, probe_records(k, [50.0] * n))
        return labels

    said: list[str] = []
    cap = CapacitySpec(knob="concurrency", min_goodput_fraction=0.9, start=4, high=4, max_probes=1)
    # 36 of 40 good each run (0.9, the floor): indeterminate twice, then decided on 108 of 120
    probes = CapacityProbes(cap, ["main"], said.append)
    assert drive_goodput(probes, lambda k: 36) == ["c4", "c4#2", "c4#3"]
    assert "indeterminate (goodput share 0.9, 95% interval 0.769..0.96 over 40 requests holds 0.9)" in said[0]
    (probe,) = probes.outcome()[1]["probes"]
    assert probe["verdict"] == "pass" and "still too close to tell after 3 run(s)" in probe["note"]
    # 30 of 40 (0.75, interval 0.6..0.86): clearly below the floor, one run decides
    probes = CapacityProbes(cap, ["main"], said.append)
    assert drive_goodput(probes, lambda k: 30) == ["c4"]
    (probe,) = probes.outcome()[1]["probes"]
    assert probe["verdict"] == "fail" and probe["reasons"] == ["goodput share 0.75 < 0.9 (30 of 40 requests)"]
    # every request good (40 of 40: at least 0.912): passes at once; 8 requests give no interval
    probes = CapacityProbes(cap, ["main"], said.append)
    assert drive_goodput(probes, lambda k: 40) == ["c4"]
    probes = CapacityProbes(cap, ["main"], said.append)
    assert drive_goodput(probes, lambda k: 7, n=8) == ["c4"]
    assert probes.outcome()[1]["probes"][0]["verdict"] == "fail"


def test_an_invalid_probe_stops_the_search_in_the_points_own_reasons():
    from orchestrator.config.schema import CapacitySpec
    from orchestrator.trial.capacity_probes import CapacityProbes

    said: list[str] = []
    cap = CapacitySpec(knob="concurrency", slo={"ttft_ms_p50": 100.0}, start=2, high=8)
    probes = CapacityProbes(cap, ["main"], said.append)
    why = "the server counted 31 prompt tokens where 16 were planned"
    assert drive(probes, lambda k: [50.0] * 20, invalid_reasons=[why]) == ["c2"]
    assert f"probe c2 decides nothing ({why})" in probes.search.stop_reason
    assert any(f"probe c2: not counted: {why}" in s for s in said)


def test_a_trials_points_run_in_order_then_the_probes_each_chosen_from_the_result_told():
    """LoadPoints: the fixed points (numbered from ``first``), then the capacity search's probes;
    it is told each result (it reads no trial state), and a next point before that is a bug."""
    from orchestrator.config.schema import CapacitySpec, LoadPointSpec
    from orchestrator.metrics.result import PointResult
    from orchestrator.metrics.summary import summarize_point
    from orchestrator.trial.load_points import LoadPoints

    said: list[str] = []
    fixed = [LoadPointSpec(concurrency=1), LoadPointSpec(concurrency=2)]
    cap = CapacitySpec(knob="concurrency", slo={"ttft_ms_p50": 100.0}, start=4, high=4, max_probes=1)
    points = LoadPoints(fixed, 3, cap, ["main"], said.append)
    seen = []
    while (step := points.next()) is not None:
        point, index, label = step
        with pytest.raises(AssertionError, match="was not told"):
            points.next()
        seen.append((point.concurrency, index, label))
        records = probe_records(index, [40.0] * 40)  # far under the SLO: the probe passes at once
        setting = point.model_dump(exclude_none=True)
        result = PointResult(index=index, label=label or point.label, setting=setting, metrics=summarize_point(records))
        points.done(result, records)
    assert seen == [(1, 3, None), (2, 4, None), (4, 5, "c4")]
    assert points.capacity is not None and points.capacity.outcome()[1]["probes"][0]["verdict"] == "pass"
    assert [s for s in LoadPoints(fixed, 0, None, ["main"], said.append)._fixed] == fixed
    only = LoadPoints(fixed[:1], 0, None, ["main"], said.append)
    assert only.next() == (fixed[0], 0, None)
    only.done(PointResult(index=0, label="c1", setting={}), [])
    assert only.next() is None and only.capacity is None
