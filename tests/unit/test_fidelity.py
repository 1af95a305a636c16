"""Workload fidelity (issue 20): each rule on recorded points, the server's clock, pre-flight,
and the trial against a fake server whose tokenizer is not ours."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import ConfigError, to_specs
from orchestrator.config.schema import FidelitySpec, WorkloadSpec
from orchestrator.loadgen.preflight import check_counts
from orchestrator.metrics import prometheus
from orchestrator.metrics.fidelity import (
    clock_gap,
    expected_hit_rate,
    output_length,
    preemptions,
    prefix_hits,
    prompt_length,
    rejections,
    workload_fidelity,
)
from orchestrator.metrics.prometheus import histogram_quantile, server_latency
from orchestrator.metrics.records import RequestRecord
from orchestrator.trial import run_trial
from testkit.fake_openai_server import FakeOpenAIServer, Script

pytestmark = pytest.mark.measures

LIMITS = FidelitySpec()


def rec(
    i: int,
    planned_in: int = 128,
    served_in: int | None = 128,
    planned_out: int = 16,
    got_out: int = 16,
    status: str = "ok",
    http: int | None = 200,
    turn: int = 0,
) -> RequestRecord:
    ok = status == "ok"
    return RequestRecord(
        request_id=i,
        point=0,
        request_class="main",
        intended_send_s=0.0,
        sent_s=0.0,
        input_tokens_target=planned_in,
        output_tokens_target=planned_out,
        chunk_times_s=[0.1 + 0.01 * k for k in range(got_out)] if ok else [],
        chunk_tokens=[1] * got_out if ok else [],
        done_s=1.0,
        prompt_tokens=served_in if ok else None,
        output_tokens=got_out if ok else None,
        status=status,
        http_status=http,
        turn=turn,
        error=None if ok else "HTTP 400: too long",
    )


def workload(**cls) -> WorkloadSpec:
    return WorkloadSpec(
        name="w",
        classes={"main": {"input_tokens": 128, "output_tokens": 16, **cls}},
        load_points=[{"concurrency": 2}],
        num_requests=8,
    )


# -- prompt length ---------------------------------------------------------------------------


def test_prompt_length_twice_the_plan_is_flagged_with_the_ratio():
    # the run: planned 128, the server counted 205-269 (another tokenizer)
    records = [rec(i, served_in=n) for i, n in enumerate([205, 230, 240, 251, 269])]
    found, reasons = prompt_length(records, {}, LIMITS)
    assert found["prompt_tokens_gap_p50"] == 240 - 128
    assert found["prompt_tokens_server_over_plan"] == pytest.approx(240 / 128)
    assert len(reasons) == 1 and "128 planned" in reasons[0] and "model.tokenizer" in reasons[0]


def test_prompt_length_a_bos_or_a_template_is_not_a_mismatch():
    found, reasons = prompt_length([rec(i, served_in=128 + 1) for i in range(4)], {}, LIMITS)
    assert reasons == [] and found["prompt_tokens_gap_p50"] == 1
    # a chat template of 12 tokens on a short prompt: within the slack
    assert prompt_length([rec(i, planned_in=16, served_in=28) for i in range(4)], {}, LIMITS)[1] == []
    # 14 tokens more on a 128-token prompt: beyond 10% but within the 16 tokens of slack
    assert prompt_length([rec(i, served_in=142) for i in range(4)], {}, LIMITS)[1] == []
    assert len(prompt_length([rec(i, served_in=146) for i in range(4)], {}, LIMITS)[1]) == 1


def test_prompt_length_later_turns_are_not_judged():
    # a later turn's plan is built from the server's own counts of the earlier ones
    records = [rec(0), rec(1, planned_in=300, served_in=700, turn=1)]
    assert prompt_length(records, {}, LIMITS)[1] == []


def test_prompt_length_from_the_servers_counter_when_usage_has_no_count():
    records = [rec(i, served_in=None) for i in range(4)]
    assert prompt_length(records, {}, LIMITS) == ({}, [])  # nothing to judge by
    found, reasons = prompt_length(records, {"server_prompt_tokens": 4 * 256.0}, LIMITS)
    assert found["prompt_tokens_server_over_plan"] == pytest.approx(2.0) and "counter" in reasons[0]
    assert prompt_length(records, {"server_prompt_tokens": 4 * 129.0}, LIMITS)[1] == []


# -- output length ---------------------------------------------------------------------------


def test_outputs_cut_short_under_ignore_eos_are_flagged():
    records = [rec(i) for i in range(6)] + [rec(6, got_out=3), rec(7, got_out=9)]
    found, reasons = output_length(records, True, LIMITS)
    assert found["output_tokens_off_fraction"] == pytest.approx(2 / 8)
    assert "2 of 8" in reasons[0] and "stopped short" in reasons[0]


def test_outputs_shorter_than_planned_are_fine_without_ignore_eos_but_longer_ones_are_not():
    assert output_length([rec(i, got_out=4) for i in range(4)], False, LIMITS)[1] == []
    found, reasons = output_length([rec(i, got_out=40) for i in range(4)], False, LIMITS)
    assert "4 got more tokens than planned" in reasons[0]


def test_one_output_off_in_forty_is_within_the_default():
    records = [rec(i) for i in range(39)] + [rec(39, got_out=15)]
    assert output_length(records, True, LIMITS)[1] == []


# -- prefix-cache hits -----------------------------------------------------------------------


def test_hits_on_prompts_that_share_nothing_are_flagged():
    reasons = prefix_hits(workload(), {"server_prefix_cache_hit_rate": 0.5}, LIMITS)[1]
    assert "share no prefix" in reasons[0]
    assert prefix_hits(workload(), {"server_prefix_cache_hit_rate": 0.02}, LIMITS)[1] == []
    assert prefix_hits(workload(), {}, LIMITS) == ({}, [])  # the engine did not count


def test_too_few_hits_on_a_shared_prefix_are_flagged():
    w = workload(dataset="shared_prefix", num_groups=2, prefix_tokens=1024)
    expected = expected_hit_rate(w, requests=32)
    assert expected == pytest.approx((1 - 2 / 32) * 1024 / (1024 + 128))
    found, reasons = prefix_hits(w, {"server_prefix_cache_hit_rate": 0.05, "requests": 32}, LIMITS)
    assert found["prefix_cache_hit_rate_expected"] == pytest.approx(expected)
    assert "cache off or evicted" in reasons[0]
    # the prefix-caching lab measured 0.78 at 1024 shared tokens: fine
    assert prefix_hits(w, {"server_prefix_cache_hit_rate": 0.78, "requests": 32}, LIMITS)[1] == []


def test_multi_turn_implies_hits_from_the_history():
    w = workload(dataset="multi_turn", turns=3)
    per_turn = 128 + 16
    history = per_turn + 2 * per_turn
    assert expected_hit_rate(w, 8) == pytest.approx(history / (history + 3 * 128))


# -- preemptions, rejections -----------------------------------------------------------------


def test_preemptions_above_the_limit_are_flagged():
    records = [rec(i) for i in range(10)]
    assert preemptions(records, {"server_preemptions": 1.0}, LIMITS) == ({"preemptions_per_request": 0.1}, [])
    found, reasons = preemptions(records, {"server_preemptions": 5.0}, LIMITS)
    assert found["preemptions_per_request"] == 0.5 and "KV pressure" in reasons[0]


def test_rejected_requests_are_flagged_but_server_errors_are_a_load_outcome():
    records = [rec(0), rec(1, status="error", http=400)]
    found, reasons = rejections(records, LIMITS)
    assert found["rejected_fraction"] == 0.5 and "HTTP 400" in reasons[0] and "too long" in reasons[0]
    assert rejections([rec(0), rec(1, status="error", http=500)], LIMITS)[1] == []


def test_all_rules_together_on_a_faithful_point_say_nothing():
    found, reasons = workload_fidelity(
        [rec(i) for i in range(8)], {"server_prefix_cache_hit_rate": 0.0, "server_preemptions": 0.0}, workload()
    )
    assert reasons == [] and found["output_tokens_off_fraction"] == 0.0


def test_limits_come_from_the_workload():
    w = workload().model_copy(update={"fidelity": FidelitySpec(max_prompt_tokens_error=2.0, prompt_tokens_slack=0)})
    records = [rec(i, served_in=256) for i in range(4)]
    assert workload_fidelity(records, {}, w)[1] == []
    assert len(workload_fidelity(records, {}, workload())[1]) == 1


# -- the server's clock ----------------------------------------------------------------------


def test_histogram_quantile_interpolates_inside_its_bucket():
    buckets = [(0.1, 0.0), (0.25, 10.0), (0.5, 20.0), (math.inf, 20.0)]
    q = histogram_quantile(0.5, buckets)
    # the rank lands on the 0.25 edge: the 10th value is at most 0.25, the 11th above it, and
    # a client's median of the 20 (their mean) may be anywhere up to 0.5
    assert q is not None and q.value == pytest.approx(0.25) and (q.low, q.high) == (0.1, 0.5)
    q = histogram_quantile(0.75, buckets)
    assert q.value == pytest.approx(0.375) and (q.low, q.high) == (0.25, 0.5) and q.resolution == pytest.approx(0.25)
    # above the last finite bound: its lower bound, with an infinite resolution
    q = histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)])
    assert q.value == 1.0 and math.isinf(q.resolution)
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


VLLM_PAGE = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="tiny"}} {a}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.25",model_name="tiny"}} {b}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {b}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="tiny"}} {b}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="tiny"}} 1.0
"""


def test_bucket_deltas_of_a_point_give_the_servers_percentiles():
    from orchestrator.engines.vllm import METRICS

    before = prometheus.parse(VLLM_PAGE.format(a=4, b=4))  # the warm-up's requests, all under 100 ms
    after = prometheus.parse(VLLM_PAGE.format(a=4, b=14))  # the point's 10: between 100 and 250 ms
    buckets = prometheus.latency_buckets(before, after, METRICS)
    assert buckets["ttft"] == [(0.1, 0.0), (0.25, 10.0), (math.inf, 10.0)]
    m = server_latency(buckets)
    assert m["server_ttft_ms_p50"] == pytest.approx(175.0) and m["server_ttft_ms_p50_res_ms"] == pytest.approx(150.0)
    assert m["server_ttft_ms_p99_high"] == pytest.approx(250.0)
    assert "ttft" not in prometheus.latency_buckets(after, after, METRICS)  # nothing observed: left out
    # the scrape before the point failed: the counters since the server started are not the point's
    assert prometheus.latency_buckets({}, after, METRICS) == {}
    assert prometheus.deltas({}, after, METRICS) == {}


def test_a_client_far_above_the_servers_bucket_is_flagged():
    m = {"ttft_ms_p50": 200.0, "server_ttft_ms_p50": 175.0, "server_ttft_ms_p50_high": 250.0}
    found, reasons = clock_gap(m, LIMITS)
    assert found == {"ttft_gap_ms_p50": 25.0} and reasons == []
    found, reasons = clock_gap({**m, "ttft_ms_p50": 400.0}, LIMITS)
    assert "150.0 ms above" in reasons[0] and "not the engine" in reasons[0]
    assert clock_gap({**m, "ttft_ms_p50": 400.0}, FidelitySpec(max_gap_ms=None))[1] == []
    # behind a router the gap holds the router's hop too: logged, not judged
    found, reasons = clock_gap({**m, "ttft_ms_p50": 400.0}, LIMITS, via="router")
    assert found == {"ttft_gap_ms_p50": 225.0} and reasons == []


# -- pre-flight and the model-source trap ----------------------------------------------------


def test_preflight_counts_within_two_tokens_pass_and_twice_as_many_name_model_tokenizer():
    check_counts([128, 64], [128, 65], LIMITS, "tok")
    with pytest.raises(
        ConfigError, match="model.tokenizer: the server's tokenizer counts 256 tokens in a prompt of 128"
    ):
        check_counts([128], [256], LIMITS, "tok")


def test_model_path_with_a_tiny_source_is_an_error(compose):
    with pytest.raises(ConfigError, match="model.source=path"):
        to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:1", "model.path=/some/folder"]))


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "+workload.classes.main.prefix_tokens=256",
            r"workload.classes.main.*prefix_tokens: not used by dataset 'random'",
        ),
        ("+workload.classes.main.think_time_s=2", r"think_time_s: not used by dataset 'random' \(only by multi_turn\)"),
        ("+workload.classes.main.arrival=gamma", r"background traffic only"),
        (
            "workload.load_points=[{concurrency:4,arrival:constant}]",
            r"load_points.0.*'arrival' applies to 'rate' points",
        ),
        ("workload.load_points=[{rate:2,burstiness:0.5}]", r"load_points.0.*'burstiness' shapes gamma arrivals only"),
        ("workload.load_points=[{rate:2,time_scale:2}]", r"load_points.0.*'time_scale': apply to 'trace'"),
    ],
)
def test_a_key_the_chosen_config_makes_dead_is_an_error(compose, override, message):
    with pytest.raises(ConfigError, match=message):
        to_specs(compose([override]))


def test_the_keys_a_dataset_reads_are_accepted(compose):
    shared = to_specs(compose(["workload=shared_prefix"]))[0].workload.classes["main"]
    assert (shared.dataset, shared.num_groups, shared.prefix_tokens) == ("shared_prefix", 8, 1024)
    chat = to_specs(compose(["workload=multi_turn"]))[0].workload.classes["main"]
    assert (chat.dataset, chat.turns, chat.think_time_s) == ("multi_turn", 4, 1.0)
    point = to_specs(compose(["workload.load_points=[{rate:2,arrival:gamma,burstiness:0.5}]"]))[0].workload.load_points[
        0
    ]
    assert (point.rate, point.arrival, point.burstiness) == (2, "gamma", 0.5)


def test_model_tokenizer_is_refused_for_a_tiny_model_we_launch_and_passed_to_other_servers(compose, tmp_path):
    from orchestrator.engines import adapter_for

    with pytest.raises(ConfigError, match="cannot be served with another"):
        to_specs(compose([f"model.tokenizer={tmp_path}"]))
    to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:1", f"model.tokenizer={tmp_path}"]))
    # a model of its own: the server we launch gets the tokenizer the prompts are made with
    for engine, flag in (("vllm", "--tokenizer"), ("sglang", "--tokenizer-path")):
        spec, _ = to_specs(
            compose([f"engine={engine}", "model.source=hub", "model.path=org/model", "model.tokenizer=org/tok"])
        )
        argv = adapter_for(engine).launch(spec, "org/model", 8000).argv
        assert argv[argv.index(flag) + 1] == "org/tok", argv


# -- the trial against a fake server ---------------------------------------------------------


def external(compose, url, *extra):
    spec, _ = to_specs(
        compose(
            [
                "engine=external",
                f"engine.url={url}",
                "engine.metrics=none",
                "workload.load_points=[{concurrency:2}]",
                "workload.num_requests=4",
                "workload.classes={main:{input_tokens:64,output_tokens:8}}",
                *extra,
            ]
        )
    )
    return spec


def test_a_server_with_another_tokenizer_is_refused_before_any_load(compose, tmp_path, tiny_model_dir):
    lines: list[str] = []
    script = Script(
        ttft_s=0.01,
        itl_s=0.002,
        tokenizer=str(tiny_model_dir),
        token_scale=2.0,
        served=("tiny",),
        tokenize_endpoint=True,
    )
    with FakeOpenAIServer(script) as srv:
        result = run_trial(external(compose, srv.base_url, "model.name=tiny"), tmp_path, progress=lines.append)
        assert srv.truth.requests == 0  # not one completion was sent
    assert result.status == "FAILED" and "model.tokenizer" in result.error and not result.points


def test_a_wrong_served_name_is_refused_before_any_load(compose, tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(served=("llama",))) as srv:
        result = run_trial(external(compose, srv.base_url, "model.name=tiny"), tmp_path, progress=lambda _: None)
        assert srv.truth.requests == 0
    assert (
        result.status == "FAILED" and "model.name: 'tiny' is not served" in result.error and "'llama'" in result.error
    )


def test_without_a_tokenize_endpoint_the_point_is_invalid_with_the_ratio(compose, tmp_path, tiny_model_dir):
    lines: list[str] = []
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002, tokenizer=str(tiny_model_dir), token_scale=2.0)) as srv:
        result = run_trial(external(compose, srv.base_url), tmp_path, progress=lines.append)
    assert result.status == "FINISHED", result.error
    p = result.points[0]
    # the workload's verdict; client_invalid is not asserted: on 2 busy cores the client fell
    # behind too (client_invalid 1 in 1 of 8 runs beside two busy loops, 2026-12-03)
    assert p.metrics["invalid"] == 1.0 and p.metrics["workload_invalid"] == 1.0
    assert p.metrics["prompt_tokens_server_over_plan"] == pytest.approx(2.0, rel=0.05)
    assert any("prompt length" in r for r in p.invalid_reasons)
    assert any("INVALID (the server got another workload than planned)" in line for line in lines)
    assert any("no tokenize endpoint" in line for line in lines)


def test_the_right_tokenizer_makes_a_valid_point(compose, tmp_path, tiny_model_dir):
    script = Script(ttft_s=0.01, itl_s=0.002, tokenizer=str(tiny_model_dir), served=("tiny",), tokenize_endpoint=True)
    with FakeOpenAIServer(script) as srv:
        result = run_trial(external(compose, srv.base_url, "model.name=tiny"), tmp_path, progress=lambda _: None)
    assert result.status == "FINISHED", result.error
    p = result.points[0]
    assert p.metrics["invalid"] == 0.0 and p.invalid_reasons == [] and p.metrics["prompt_tokens_gap_p50"] == 0, (
        p.invalid_reasons
    )


def test_a_server_that_ignores_max_tokens_makes_the_point_invalid(compose, tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002, ignore_max_tokens=12)) as srv:
        result = run_trial(external(compose, srv.base_url), tmp_path, progress=lambda _: None)
    p = result.points[0]
    # the output-length reason, whichever else a busy machine adds first (CI, 2026-12-03, AVX2:
    # "achieved rate 80.55 < 0.98 x schedule 86.12" came before it)
    assert p.metrics["workload_invalid"] == 1.0
    assert any("output length" in r for r in p.invalid_reasons), p.invalid_reasons


def test_a_median_on_a_bucket_edge_is_bounded_by_the_next_edge():
    """make labs, chunked_prefill budget_256 c4: 8 of 16 first tokens within 500 ms, 8 more
    within 750 ms; the client's median (617.6 ms, the mean of the 8th and 9th) is no gap."""
    buckets = [(0.25, 0.0), (0.5, 8.0), (0.75, 16.0), (math.inf, 16.0)]
    m = server_latency({"ttft": buckets})
    assert m["server_ttft_ms_p50"] == pytest.approx(500.0) and m["server_ttft_ms_p50_high"] == pytest.approx(750.0)
    assert clock_gap({"ttft_ms_p50": 617.6, **m}, LIMITS)[1] == []
    assert clock_gap({"ttft_ms_p50": 850.0, **m}, LIMITS)[1]  # beyond the next edge by more than 50 ms


def test_preflight_asks_the_engines_not_the_router_or_proxy_in_front():
    """make labs, scheduling_policies: vLLM's router lists the model as 'unknown'."""
    from orchestrator.engines.base import ServerLaunch
    from orchestrator.trial import ServerGroup

    def launch(name, role, port, metrics="/metrics"):
        return ServerLaunch(name=name, role=role, argv=["x"], env={}, host="127.0.0.1", port=port, metrics_path=metrics)

    routed = ServerGroup(
        [launch("replica0", "replica", 1), launch("replica1", "replica", 2), launch("router", "router", 3, "")], []
    ).view()
    assert [name for name, _ in routed.engines] == ["replica0", "replica1"]
    assert routed.counter_urls == ("http://127.0.0.1:1/metrics", "http://127.0.0.1:2/metrics")  # summed
    assert routed.metrics_url == "http://127.0.0.1:2/metrics" and routed.front_url == "http://127.0.0.1:3"
    pd = ServerGroup(
        [launch("prefill", "prefill", 1), launch("decode", "decode", 2), launch("proxy", "proxy", 3, "")], []
    ).view()
    assert [name for name, _ in pd.engines] == ["prefill", "decode"]
    assert pd.metrics_url == "http://127.0.0.1:2/metrics" and pd.counter_urls == (pd.metrics_url,)  # the decode server
    assert pd.disaggregated and not routed.disaggregated  # P/D: the decode server's TTFT is not ours
    external = ServerGroup([launch("server", "server", 1, "")], []).view()  # engine=external without a metrics path
    assert [name for name, _ in external.engines] == ["server"]
    assert external.metrics_url is None and external.counter_urls == () and external.pids == ()
    # what the client talks to when it is not an engine: the clock gap then holds its hop
    assert routed.front == "router" and pd.front == "proxy" and external.front is None
    assert ServerGroup([launch("server", "server", 1)], []).view().front is None


def test_a_tokenize_answer_without_a_count_means_the_check_cannot_be_made():
    """A server whose POST /tokenize answered 200 with a body that was not a count was read as 0
    tokens and failed the trial; such an answer says nothing, and the pre-flight says so."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from orchestrator.loadgen.preflight import Preflight, server_counts

    answers = {"/a/tokenize": {"ok": True}, "/b/tokenize": {"count": 7}, "/c/tokenize": {"tokens": [1, 2, 3]}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path not in answers:
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps(answers[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        counted, why = server_counts(f"{url}/a", "m", None, ["one prompt"])
        assert counted is None and "answered without a token count" in why and '{"ok": true}' in why
        assert "prompt lengths are checked per point" in Preflight(["m"], [2], None, why).describe()
        assert server_counts(f"{url}/b", "m", None, ["x"]) == ([7], "")
        assert server_counts(f"{url}/c", "m", None, ["x"]) == ([3], "")
        assert server_counts(f"{url}/d", "m", None, ["x"]) == (None, "no tokenize endpoint")
    finally:
        srv.shutdown()
