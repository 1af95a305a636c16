"""A load point's metrics and verdict as pure functions of what was gathered around it, and
points fed forward: a schedule is sent each point's result and chooses (or stops) from it."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.engines.vllm import METRICS
from orchestrator.loadgen import Endpoint, PromptFactory
from orchestrator.metrics import prometheus
from orchestrator.metrics.fidelity import judge_point
from orchestrator.metrics.records import RequestRecord
from orchestrator.trial import RawPoint, measured_stage
from testkit.compose import compose_config
from testkit.fake_openai_server import FakeOpenAIServer, Script
from tests.unit.test_fidelity import VLLM_PAGE

pytestmark = pytest.mark.measures


def rec(i: int, served_in: int = 128, ttft: float = 0.2) -> RequestRecord:
    return RequestRecord(
        request_id=i,
        point=0,
        request_class="main",
        intended_send_s=i * 0.1,
        sent_s=i * 0.1,
        input_tokens_target=128,
        output_tokens_target=4,
        chunk_times_s=[i * 0.1 + ttft + 0.01 * k for k in range(4)],
        chunk_tokens=[1] * 4,
        done_s=i * 0.1 + ttft + 0.04,
        prompt_tokens=served_in,
        output_tokens=4,
        status="ok",
        http_status=200,
    )


@pytest.fixture
def spec(compose):
    spec, _ = to_specs(
        compose(
            [
                "workload.classes={main:{input_tokens:128,output_tokens:4}}",
                "workload.load_points=[{concurrency:2}]",
                "workload.num_requests=10",
            ]
        )
    )
    return spec


def raw(records, ttft_a=4, ttft_b=14):
    before = prometheus.parse(VLLM_PAGE.format(a=4, b=4))
    after = prometheus.parse(VLLM_PAGE.format(a=ttft_a, b=ttft_b))
    return RawPoint(
        records, {"client_cpu_cores": 0.2}, {"memory_peak_gb": 1.5, "kv_cache_usage_max": 0.3}, before, after
    )


def test_a_points_first_stage_is_made_from_the_raw_inputs_alone(spec):
    point = spec.workload.load_points[0]
    m = measured_stage(spec, point, raw([rec(i) for i in range(10)]), METRICS).metrics()
    assert m["completed"] == 10 and m["ttft_ms_p50"] == pytest.approx(200.0)
    assert m["memory_peak_gb"] == 1.5 and m["server_kv_cache_usage_max"] == 0.3  # gauges are the server's
    assert m["client_cpu_cores"] == 0.2
    assert m["server_ttft_ms_p50"] == pytest.approx(175.0) and m["server_ttft_ms_p50_high"] == 250.0
    # under P/D the decode server's TTFT is its own, not set against ours
    pd = measured_stage(spec, point, raw([rec(i) for i in range(10)]), METRICS, disaggregated=True).metrics()
    assert "server_ttft_ms_p50" not in pd and pd["server_decode_ttft_ms_p50"] == pytest.approx(175.0)


def test_prefix_reuse_is_the_servers_hits_over_what_the_prompts_could_reuse(spec):
    """A replayed slice's ideal share is the plan's (it rides with the client's stats); a synthetic
    workload's is what its prompts share; the efficiency is the server's hit rate over it."""
    point = spec.workload.load_points[0]
    cache = 'vllm:prefix_cache_queries_total{{engine="0"}} {q}\nvllm:prefix_cache_hits_total{{engine="0"}} {h}\n'
    sliced = raw([rec(i) for i in range(10)])
    sliced.before.update(prometheus.parse(cache.format(q=1000, h=100)))
    sliced.after.update(prometheus.parse(cache.format(q=2000, h=400)))  # 300 of the point's 1000 tokens hit
    sliced.client["trace_ideal_prefix_share"] = 0.4
    stage = measured_stage(spec, point, sliced, METRICS)
    assert stage.prefix.ideal == 0.4 and stage.prefix.efficiency == pytest.approx(0.3 / 0.4)
    m = stage.metrics()
    assert m["prefix_reuse_ideal_share"] == 0.4 and m["prefix_reuse_efficiency"] == pytest.approx(0.75)
    assert m["server_prefix_cache_hit_rate"] == pytest.approx(0.3)  # the counters' own rate, the server's
    shared, _ = to_specs(compose_config(["workload=shared_prefix", "workload.load_points=[{concurrency:2}]"]))
    ideal = measured_stage(shared, shared.workload.load_points[0], raw([rec(i) for i in range(10)]), METRICS).prefix
    # 8 groups of 1024 shared tokens in 1088: 2 of the 10 requests come after their group's first
    assert ideal.ideal == pytest.approx(2 / 10 * 1024 / 1088) and ideal.efficiency is None  # no hits counted


def test_judge_point_a_valid_point_and_two_kinds_of_invalid(spec):
    point = spec.workload.load_points[0]
    good = [rec(i) for i in range(10)]
    m = measured_stage(spec, point, raw(good), METRICS).metrics()
    v = judge_point(spec.workload, good, m)
    assert v.reasons == [] and v.metrics["invalid"] == 0.0
    # another tokenizer: the server counted twice the planned prompt
    twice = [rec(i, served_in=256) for i in range(10)]
    v = judge_point(spec.workload, twice, measured_stage(spec, point, raw(twice), METRICS).metrics())
    assert v.metrics["workload_invalid"] == 1.0 and v.client == [] and "model.tokenizer" in v.workload[0]
    # our TTFT far above the server's histogram: the client or the network...
    slow = [rec(i, ttft=0.6) for i in range(10)]
    m = measured_stage(spec, point, raw(slow), METRICS).metrics()
    v = judge_point(spec.workload, slow, m)
    assert v.metrics["client_invalid"] == 1.0 and "server clock" in v.client[0]
    # ...unless a router sits between them: its hop is part of what is measured
    v = judge_point(spec.workload, slow, m, front="router")
    assert v.reasons == [] and v.metrics["ttft_gap_ms_p50"] == pytest.approx(600.0 - 175.0)


def test_the_caller_drives_the_points(tiny_model_dir):
    """A load session runs the points its caller chooses, one at a time (prepare, then go): the
    next can be chosen from what the last gave, as the trial chooses its capacity probes."""
    from orchestrator.config.errors import LoadError
    from orchestrator.config.schema import LoadPointSpec, WorkloadSpec
    from orchestrator.loadgen import LoadSession

    w = WorkloadSpec.model_validate(
        {
            "name": "f",
            "warmup_requests": 0,
            "num_requests": 3,
            "classes": {"a": {"input_tokens": 8, "output_tokens": 2}},
            "load_points": [{"concurrency": 1}],
        }
    )
    with FakeOpenAIServer(Script(ttft_s=0.005, itl_s=0.001)) as srv:
        with LoadSession(Endpoint(srv.base_url, "m"), w, PromptFactory(str(tiny_model_dir)), 0) as load:
            load.warm_up()
            with pytest.raises(LoadError, match="without prepare"):
                load.go()
            load.prepare(LoadPointSpec(concurrency=1), 0)
            first = load.go()
            load.prepare(LoadPointSpec(concurrency=len(first.records) - 1), 1)  # chosen from the first
            second = load.go()
    assert [r.point for r in first.records] == [0, 0, 0] and [r.point for r in second.records] == [1, 1, 1]
    assert all(r.ok for r in first.records + second.records)
    assert first.client["client_processes"] == 1.0 and "client_cpu_s" in second.client
