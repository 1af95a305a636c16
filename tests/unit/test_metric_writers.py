"""The registry is complete: every name the real writers produce (a point's summary, the engines'
deltas and histograms, the verdict, the hardware, the roofline, the diagnosis, the capacity
search, the trial's own numbers, lm-eval's scores, the client's stats) is a known metric."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import to_specs
from orchestrator.config.metric_keys import M, is_known
from orchestrator.config.schema import CapacitySpec, SLOSpec
from orchestrator.engines import sglang, vllm
from orchestrator.metrics.diagnosis import PointEvidence, diagnose
from orchestrator.metrics.fidelity import judge_point
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult
from orchestrator.metrics.summary import summarize_by_class, summarize_point, summarize_repeats
from orchestrator.metrics.telemetry import hardware_metrics
from orchestrator.perf.floors import floor_metrics
from orchestrator.trial import RawPoint, measured_stage
from orchestrator.trial.points import trial_metrics


def unknown(metrics: dict[str, float]) -> list[str]:
    return sorted(k for k in metrics if not is_known(k))


def record(i: int, cls: str, gaps: list[float], turn: int = 0, ok: bool = True, repeat: int = 0) -> RequestRecord:
    sent = i * 0.25
    times = [sent + 0.05]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestRecord(
        request_id=i,
        point=0,
        request_class=cls,
        intended_send_s=sent - 0.001,
        sent_s=sent,
        input_tokens_target=64 if cls == "short" else 512,
        output_tokens_target=len(times),
        chunk_times_s=times if ok else [],
        chunk_tokens=[1] * len(times) if ok else [],
        done_s=times[-1],
        prompt_tokens=64 if cls == "short" else 512,
        output_tokens=len(times) if ok else None,
        status="ok" if ok else "error",
        error=None if ok else "HTTPError: 500",
        http_status=200 if ok else 500,
        turn=turn,
        repeat=repeat,
        coalesced_chunks=1 if i % 5 == 0 else 0,
    )


def records(repeat: int = 0) -> list[RequestRecord]:
    out = []
    for i in range(24):
        gaps = [0.01] * 12
        if i % 6 == 0:
            gaps[6] = 0.3  # a stall during another request's prefill
        out.append(record(i, "short" if i % 3 else "long", gaps, turn=i % 2, ok=i != 7, repeat=repeat))
    return out


def sample(table: dict, scale: float) -> dict[str, float]:
    """A scrape of every family of an engine's map (counters, gauges, histograms with buckets)."""
    out: dict[str, float] = {}
    for ref in table.values():
        if ref.kind == "counter":
            out[ref.family + "_total"] = 10.0 * scale
        elif ref.kind == "gauge":
            out[ref.family] = 0.5
        else:
            out[ref.family + "_sum"], out[ref.family + "_count"] = 1.0 * scale, 10.0 * scale
            for le, n in (("0.1", 4.0), ("0.25", 9.0), ("+Inf", 10.0)):
                out[f'{ref.family}_bucket{{le="{le}"}}'] = n * scale
    return out


@pytest.fixture
def spec(compose):
    spec, _ = to_specs(
        compose(
            [
                "workload=mixed_long_short",
                "workload.classes.short.input_tokens=64",
                "workload.classes.short.output_tokens=13",
                "workload.classes.long.input_tokens=512",
                "workload.classes.long.output_tokens=13",
                "workload.load_points=[{rate:4}]",
                "workload.num_requests=24",
                "platform.price_per_hour=0.34",
            ]
        )
    )
    return spec


def gpu_rows() -> list[tuple[float, str, str, float]]:
    rows = []
    for t in range(11):
        for name, v in (("power_w", 200.0), ("power_limit_w", 300.0), ("energy_j", 220.0 * t)):
            rows.append((float(t), "gpu0", name, v))
        for name, v in (("sm_util_pct", 50.0), ("mem_util_pct", 20.0), ("sm_clock_mhz", 1400.0)):
            rows.append((float(t), "gpu0", name, v))
        rows += [(float(t), "gpu0", "temp_c", 60.0), (float(t), "gpu0", "throttle_reasons", 4.0)]
        rows += [(float(t), "servers", "cpu_cores", 1.5), (float(t), "servers", "cpu_s", 1.5 * t)]
        rows += [(float(t), "servers", "rss_gb", 2.0), (float(t), "machine", "cpu_cores", 1.8)]
        rows += [(float(t), "machine", "cpu_s", 1.8 * t), (float(t), "machine", "mem_used_gb", 8.0)]
        for name, v in (("requests_running", 4.0), ("requests_waiting", 2.0), ("kv_cache_usage", 0.95)):
            rows.append((float(t), "engine", name, v))
        rows.append((float(t), "engine", "preemptions", float(t // 3)))
    return rows


@pytest.mark.parametrize("table", [vllm.METRICS, sglang.METRICS], ids=["vllm", "sglang"])
@pytest.mark.parametrize("disaggregated", [False, True])
def test_a_points_metrics_are_all_known(spec, table, disaggregated):
    point = spec.workload.load_points[0]
    recs = records()
    client = {M.CLIENT_CPU_S: 0.2, M.CLIENT_PROCESSES: 1.0}
    resources = {M.MEMORY_PEAK_GB: 1.5, **{f"{k}_max": 0.5 for k, v in table.items() if v.kind == "gauge"}}
    raw = RawPoint(recs, client, resources, sample(table, 1.0), sample(table, 2.0))
    metrics = measured_stage(spec, point, raw, table, disaggregated=disaggregated).metrics()
    assert M.SERVER_PROMPT_TOKENS in metrics and M.TTFT_MS_P99 in metrics  # the inputs reached every writer
    metrics.update(judge_point(spec.workload, recs, metrics).metrics)
    metrics.update(hardware_metrics(gpu_rows(), (1.0, 9.0), metrics, spec.platform.price_per_hour, 1.0))
    assert M.COST_PER_MTOK_OUTPUT in metrics and M.JOULES_PER_OUTPUT_TOKEN in metrics
    metrics.update(floor_metrics(spec, metrics, batch=4.0, concurrency=point.concurrency))
    classes = summarize_by_class(recs)
    evidence = PointEvidence(
        metrics=metrics,
        class_metrics=classes,
        records=recs,
        rows=gpu_rows(),
        window=(0.0, 10.0),
        rate=4.0,
        slots=4,
        cores=2.0,
        foreign={"cores": 0.1, "top": []},
        disaggregated=disaggregated,
    )
    d = diagnose(evidence)
    metrics.update(d.metrics)
    assert unknown(metrics) == []
    assert [f"{c}/{k}" for c, m in classes.items() for k in m if not is_known(f"{c}/{k}")] == []
    assert [f"{c}/{k}" for c, m in d.class_metrics.items() for k in m if not is_known(f"{c}/{k}")] == []


def test_repeats_multi_turn_and_slo_summaries_are_known():
    per_repeat = [summarize_point(records(r), SLOSpec(ttft_ms=100.0), 4.0, ["short", "long"]) for r in range(3)]
    assert "first_turn_ttft_ms_p50" in per_repeat[0]
    out = summarize_repeats(per_repeat, 0.1)
    assert M.CI_WIDE in out and unknown(out) == []


def test_a_capacity_search_and_the_trials_own_numbers_are_known():
    from orchestrator.trial.capacity_probes import CapacityProbes

    cap = CapacitySpec(slo={"ttft_ms_p99": 100.0}, start=2.0, max_probes=2)
    probes = CapacityProbes(cap, ["main"], lambda _: None)
    results = []
    for i, ttft in enumerate((50.0, 500.0)):
        probe = probes.next()
        assert probe is not None
        point, label = probe
        m = {M.TTFT_MS_P99: ttft, M.QPS: 2.0, M.COST_PER_MTOK_OUTPUT: 1.0, M.JOULES_PER_OUTPUT_TOKEN: 0.1}
        setting = point.model_dump(exclude_none=True)
        result = PointResult(index=i, label=label, setting=setting, metrics={**m, M.MEMORY_PEAK_GB: 1.0})
        probes.observe(result, [])
        results.append(result)
    metrics, _ = probes.outcome()
    assert M.SLO_CAPACITY_RPS in metrics and "slo_capacity_cost_per_mtok_output" in metrics
    assert unknown(metrics) == [] and all(unknown(r.metrics) == [] for r in results)
    assert unknown(trial_metrics(results, 12.0)) == []


def test_lm_evals_scores_are_known(tmp_path):
    from orchestrator.evaluation import parse_results

    scores = {"exact_match,strict-match": 0.5, "exact_match_stderr,strict-match": 0.1, "alias": "gsm8k"}
    (tmp_path / "results_1.json").write_text(json.dumps({"results": {"gsm8k": scores, "arc_easy": {"acc,none": 0.7}}}))
    metrics = parse_results(tmp_path, ["gsm8k", "arc_easy"])
    assert M.ACCURACY in metrics and "eval_arc_easy_acc" in metrics and unknown(metrics) == []


@pytest.mark.measures
def test_the_clients_stats_are_known(tiny_model_dir):
    """A real load session's client stats (sender, shares merged, sizing), on a fake server."""
    from orchestrator.config.schema import LoadPointSpec, WorkloadSpec
    from orchestrator.loadgen import Endpoint, LoadSession, PromptFactory
    from orchestrator.loadgen.shares import clock_stats
    from orchestrator.loadgen.sizing import ClientSizing
    from testkit.fake_openai_server import FakeOpenAIServer, Script

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
            load.prepare(LoadPointSpec(concurrency=1), 0)
            got = load.go()
    assert M.CLIENT_CPU_UTIL in got.client and unknown(got.client) == []
    assert unknown(ClientSizing(2, 3, 100.0, 30e-6, 2).metrics()) == []
    assert unknown(clock_stats(2, [0.001, -0.002], [0.0005])) == []
