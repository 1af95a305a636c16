"""Multi-turn conversations (history resent with the server's real replies) and scale-out
over several client processes (one schedule, one clock, one merged table)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen import Endpoint, PromptFactory, run_each, run_points
from orchestrator.loadgen.plan import RequestPlanner, plan_point
from orchestrator.metrics.records import records_to_table, table_to_records
from orchestrator.metrics.summary import summarize_point
from testkit.fake_openai_server import FakeOpenAIServer, IsolatedFakeServer, Script

pytestmark = pytest.mark.measures


@pytest.fixture(scope="module")
def factory(tiny_model_dir):
    return PromptFactory(str(tiny_model_dir))


def conversation_workload(api="completions", **kw):
    base = {
        "name": "mt",
        "api": api,
        "classes": {
            "chat": {"dataset": "multi_turn", "turns": 3, "input_tokens": 12, "output_tokens": 4, "think_time_s": 0.05}
        },
        "load_points": [{"concurrency": 2}],
        "num_requests": 4,
        "warmup_requests": 0,
    }
    base.update(kw)
    return WorkloadSpec.model_validate(base)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_turns_resend_history_with_actual_replies(factory, api):
    w = conversation_workload(api)
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), w, factory, seed=0)
        seen = srv.truth.by_request
    assert len(records) == 4 * 3 and all(r.ok for r in records)
    convs: dict[int, list] = {}
    for r in records:
        convs.setdefault(r.conversation_id, []).append(r)
    assert len(convs) == 4
    for cid, turns in convs.items():
        turns.sort(key=lambda r: r.turn)
        assert [t.turn for t in turns] == [0, 1, 2] and turns[0].request_id == cid
        for prev, cur in zip(turns, turns[1:]):
            # sent after the previous reply ended plus the think time
            assert cur.sent_s >= prev.done_s + 0.05 - 1e-3
            msgs = seen[f"lab-{cur.request_id}"]["messages"]
            reply = "".join(f"<lab-{prev.request_id}:{i}>" for i in range(4))
            if api == "chat":
                assert [m["role"] for m in msgs] == ["user", "assistant"] * cur.turn + ["user"]
                assert msgs[-2]["content"] == reply
            else:
                assert len(msgs) == 1 and reply in msgs[0]["content"]
            first_prompt = seen[f"lab-{cid}"]["messages"][0]["content"]
            assert first_prompt in (msgs[0]["content"])
            assert cur.input_tokens_target > prev.input_tokens_target
    # only first turns are arrivals; the record table keeps conversation and turn
    m = summarize_point(records)
    assert m["requests"] == 12 and m["later_turns_ttft_ms_p50"] > 0
    back = table_to_records(records_to_table(records))
    assert [(r.conversation_id, r.turn) for r in back] == [(r.conversation_id, r.turn) for r in records]


def test_multi_turn_needs_turns_and_fits_context():
    with pytest.raises(ValueError, match="needs .*turns"):
        WorkloadSpec.model_validate(
            {
                "name": "x",
                "classes": {"a": {"dataset": "multi_turn", "input_tokens": 4, "output_tokens": 4}},
                "load_points": [{"concurrency": 1}],
                "num_requests": 1,
            }
        )
    w = conversation_workload()
    assert w.max_request_tokens() == 3 * (12 + 4 + 2)


def test_split_shares_one_schedule(factory):
    w = WorkloadSpec.model_validate(
        {
            "name": "r",
            "classes": {"a": {"input_tokens": 8, "output_tokens": 2}},
            "load_points": [{"rate": 50.0, "max_concurrency": 5}, {"concurrency": 5}],
            "num_requests": 40,
        }
    )
    planner = RequestPlanner(w, factory)
    open_plan = plan_point(w, w.load_points[0], 0, planner, 0)
    shares = open_plan.split(3)
    assert sorted(o for s in shares for o in s.offsets) == sorted(open_plan.offsets)
    assert sorted(r.request_id for s in shares for r in s.foreground) == [r.request_id for r in open_plan.foreground]
    assert [s.max_concurrency for s in shares] == [2, 2, 1]
    assert all(s.min_gap_s == pytest.approx(3 / 50.0) for s in shares)
    closed = plan_point(w, w.load_points[1], 1, planner, 0)
    shares = closed.split(8)  # never more processes than streams
    assert [s.concurrency for s in shares] == [1] * 5
    assert sum(len(s.foreground) for s in shares) == 40


def test_fleet_merges_records_on_one_clock(factory):
    """Two client processes send one Poisson schedule: every request once, on time, and the
    server never saw more streams than the point allows."""
    w = WorkloadSpec.model_validate(
        {
            "name": "f",
            "client_processes": 2,
            "warmup_requests": 1,
            "classes": {"a": {"input_tokens": 16, "output_tokens": 4}},
            "load_points": [{"rate": 40.0, "arrival": "constant"}, {"concurrency": 4}],
            "num_requests": 40,
        }
    )
    with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        runs = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
        truth = srv.truth
    records, stats = [r for run in runs for r in run.records], {i: run.client for i, run in enumerate(runs)}
    assert len(records) == 80 and all(r.ok for r in records)
    assert len({r.request_id for r in records}) == 80
    assert truth.max_in_flight <= 4
    rate_point = [r for r in records if r.point == 0]
    m = summarize_point(rate_point, target_rate=40.0)
    assert m["achieved_rate"] == pytest.approx(m["schedule_rate"], rel=0.05)
    # on time, give or take 20 ms and how late the client processes said their loops woke (a stall
    # of one delays its sends by as much; the client's accuracy on a quiet machine is a benchmark's)
    assert m["send_lag_ms_p95"] < 20 + stats[0]["loop_lag_ms_max"], (m["send_lag_ms_p95"], stats[0])
    gaps = np.diff(sorted(r.intended_send_s for r in rate_point))
    assert gaps == pytest.approx(np.full(len(gaps), 1 / 40.0), abs=1e-6)  # one constant schedule, interleaved
    assert stats[0]["client_processes"] == 2 and "loop_lag_ms_p95" in stats[0]


def test_fleet_reports_unreachable_server_as_errors(factory):
    w = WorkloadSpec.model_validate(
        {
            "name": "f",
            "client_processes": 2,
            "warmup_requests": 0,
            "classes": {"a": {"input_tokens": 8, "output_tokens": 2}},
            "load_points": [{"concurrency": 2}],
            "num_requests": 4,
        }
    )
    records = run_points(Endpoint("http://127.0.0.1:9", "m"), w, factory, seed=0)
    assert len(records) == 4 and all(r.status == "error" for r in records)


def _outrunning_workload(duration_s=3.0, **kw):
    """A closed loop bounded by duration that outruns its plan: 2 streams plan 64 requests,
    and a request to the fake server takes a few ms, so the duration needs hundreds."""
    base = {
        "name": "long",
        "warmup_requests": 0,
        "classes": {"a": {"input_tokens": 8, "output_tokens": 1}},
        "load_points": [{"concurrency": 2, "duration_s": duration_s}],
    }
    base.update(kw)
    return WorkloadSpec.model_validate(base)


@pytest.mark.parametrize("processes", [1, 2], ids=["in-process", "two-processes"])
def test_a_closed_loop_that_outruns_its_plan_gets_more_requests(factory, processes):
    """Requests past the plan come from the one planner (the driver's, over each process's pipe):
    no stream ends before the duration, request ids stay unique."""
    w = _outrunning_workload(client_processes=processes)
    with IsolatedFakeServer(Script(ttft_s=0.001, itl_s=0.0)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
    records, stats = run.records, run.client
    planned = 32 * 2
    assert stats["client_requests_past_plan"] > 0, f"{len(records)} requests: the plan did not run out"
    assert len(records) == planned + stats["client_requests_past_plan"]
    assert all(r.ok for r in records)
    assert len({r.request_id for r in records}) == len(records)
    assert stats["client_streams_ended_early"] == 0
    assert stats["client_processes"] == processes
    span = max(r.intended_send_s for r in records) - min(r.intended_send_s for r in records)
    assert span > 2.0, f"the last request was sent {span:.2f} s in: streams stopped early"


def test_streams_that_run_out_of_requests_make_the_point_invalid(factory, monkeypatch):
    """Without a refill (it failed) the streams end early; the point says so and is invalid."""
    from orchestrator.loadgen import shares
    from orchestrator.metrics.fidelity import client_validity

    def broken(make, lock=None):
        async def refill(n):
            raise OSError("pipe closed")

        return refill

    monkeypatch.setattr(shares, "thread_refill", broken)
    w = _outrunning_workload(duration_s=60.0)  # the streams end long before
    with IsolatedFakeServer(Script(ttft_s=0.001, itl_s=0.0)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
    records, stats = run.records, run.client
    assert len(records) == 64  # the plan, then nothing
    assert stats["client_streams_ended_early"] == 2
    valid, reasons = client_validity(stats, w.validity)
    assert not valid
    assert any("2 stream(s) ran out of planned requests before the point's duration" in r for r in reasons)


def test_streams_waiting_for_requests_make_the_point_invalid():
    from orchestrator.config.schema.workload import ValiditySpec
    from orchestrator.metrics.fidelity import client_validity

    valid, reasons = client_validity({"client_stream_wait_share": 0.05}, ValiditySpec())
    assert not valid and "streams spent 5.0% of their time waiting for requests past the plan" in reasons[0]
    assert client_validity({"client_stream_wait_share": 0.005}, ValiditySpec())[0]


def test_a_fleet_stopped_mid_point_stops_sending_at_once(factory):
    """The driver stops its client processes while they send a 60 s point (an interrupted
    trial): each aborts the point on the driver's "stop" and exits, instead of sending on until
    it is killed."""
    import time

    from orchestrator.loadgen.client import now
    from orchestrator.loadgen.fleet import ClientFleet

    w = _outrunning_workload(duration_s=60.0, client_processes=2)
    plan = plan_point(w, w.load_points[0], 0, RequestPlanner(w, factory), 0)
    with IsolatedFakeServer(Script(ttft_s=0.001, itl_s=0.0)) as srv:
        fleet = ClientFleet(2, Endpoint(srv.base_url, "m"), w)
        procs = list(fleet.procs)
        fleet.prepare(plan.split(2), None)
        fleet.start(now())
        time.sleep(1.0)  # past the plan: they ask for more, and get no answer
        t0 = time.monotonic()
        fleet.close()
        took = time.monotonic() - t0
    assert took < 4, f"close took {took:.1f} s: the processes sent on until killed"
    assert [p.returncode for p in procs] == [0, 0]


def test_every_worker_answers_the_same_way_and_merges_in_one_place(caplog):
    """The share protocol's pieces that every channel uses: a worker's ask for more is answered by
    one function (a failing planner gives nothing and says so: the worker's streams end early),
    and one node's shares merge into records in send order with summed CPU."""
    from orchestrator.loadgen.shares import ShareDone, answer_more, merge_done
    from orchestrator.metrics.records import RequestRecord

    def broken(n: int) -> list:
        raise RuntimeError("tokenizer gone")

    assert answer_more(None, 4, 0) == [] and answer_more(lambda n: list(range(n)), 3, 0) == [0, 1, 2]
    assert answer_more(broken, 4, 7) == [] and "point 7: could not make more requests" in caplog.text

    def rec(i: int, at: float) -> RequestRecord:
        return RequestRecord(i, 0, "a", at, at, 1, 1)

    one = ShareDone([rec(1, 0.3), rec(2, 0.1)], {"client_cpu_s": 0.5, "client_cpu_util": 0.2})
    alone, _ = merge_done([one])
    assert [r.request_id for r in alone] == [1, 2]  # one worker's records stay as it sent them
    other = ShareDone([rec(3, 0.2)], {"client_cpu_s": 0.25, "client_cpu_util": 0.4})
    records, stats = merge_done([one, other])
    assert [r.request_id for r in records] == [2, 3, 1]
    assert stats["client_cpu_s"] == 0.75 and stats["client_cpu_util"] == 0.4 and stats["client_processes"] == 2
