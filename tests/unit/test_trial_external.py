"""The trial layer end to end against an external server (the in-repo fake): no launch, same metrics."""

from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, to_specs
from orchestrator.metrics.result import load_result
from orchestrator.trial import run_trial
from testkit.fake_openai_server import FakeOpenAIServer, IsolatedFakeServer, Script

pytestmark = pytest.mark.measures


def external_spec(compose, url, *extra):
    spec, _ = to_specs(
        compose(
            [
                "engine=external",
                f"engine.url={url}",
                "engine.metrics=none",
                "workload.load_points=[{concurrency:2},{rate:20,num_requests:10}]",
                "workload.num_requests=6",
                *extra,
            ]
        )
    )
    return spec


def test_external_trial_measures_without_launching(compose, tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.03, itl_s=0.005)) as srv:
        result = run_trial(external_spec(compose, srv.base_url), tmp_path, progress=lambda _: None)
    assert result.status == "FINISHED", result.error
    assert result.servers[0]["argv"] == [] and result.engine_version == "external"
    assert [p.label for p in result.points] == ["c2", "r20"]
    m = result.points[1].metrics
    assert m["completed"] == 10 and 25 <= m["ttft_ms_p50"] <= 150
    assert "memory_peak_gb" not in m  # nothing of ours to measure
    assert result.metrics["startup_s"] == 0.0
    # the result saved after the last point is complete and reloadable
    assert len(load_result(tmp_path).points) == 2


def test_external_unreachable_fails_with_reason(compose, tmp_path, tiny_model_dir):
    spec = external_spec(compose, "http://127.0.0.1:9", "engine.startup_timeout_s=1")
    result = run_trial(spec, tmp_path, progress=lambda _: None)
    assert result.status == "FAILED" and "not healthy" in result.error
    assert [s["name"] for s in result.servers] == ["external"]  # described before it was started


def test_external_needs_url(compose):
    with pytest.raises(ConfigError, match="engine.url"):
        to_specs(compose(["engine=external"]))


def test_external_api_key_from_environment(compose, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("LAB_TEST_KEY", raising=False)
    with FakeOpenAIServer() as srv:
        result = run_trial(
            external_spec(compose, srv.base_url, "engine.api_key_env=LAB_TEST_KEY"), tmp_path, progress=lambda _: None
        )
    assert result.status == "FAILED" and "LAB_TEST_KEY is not set" in result.error


def test_points_carry_client_validity(compose, tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        result = run_trial(external_spec(compose, srv.base_url), tmp_path, progress=lambda _: None)
    m = result.points[0].metrics
    assert m["invalid"] == 0.0
    assert 0 <= m["client_cpu_util"] < 1.5 and m["loop_lag_ms_p50"] < 10


def test_repeats_give_fresh_requests_and_confidence_intervals(compose, tmp_path, tiny_model_dir):
    from orchestrator.metrics.records import parquet_bytes_to_table

    with FakeOpenAIServer(Script(ttft_s=0.02, itl_s=0.002)) as srv:
        spec = external_spec(compose, srv.base_url, "workload.repeats=3", "workload.load_points=[{concurrency:2}]")
        result = run_trial(spec, tmp_path, progress=lambda _: None)
    assert result.status == "FINISHED", result.error
    m = result.points[0].metrics
    assert m["repeats"] == 3 and "ttft_ms_p50_ci95" in m and m["ci_wide"] in (0.0, 1.0)
    assert 15 < m["ttft_ms_p50"] < 100
    table = parquet_bytes_to_table(result.records_parquet)
    assert sorted(set(table.column("repeat").to_pylist())) == [0, 1, 2]
    assert table.num_rows == 18  # 6 requests x 3 repeats


def test_capacity_search_on_a_scripted_latency_curve(compose, tmp_path, tiny_model_dir):
    # TTFT = 2 ms + 100 ms per other request in flight: the p99 SLO of 500 ms holds up to 5 streams
    # (402 ms: 98 ms of room for a loaded machine's overhead, which only adds; c6 is 502 ms: fails).
    # The p99 of 12 requests is their slowest, and this machine stalls a process 35-60 ms about once
    # a run: with 20 ms a stream and an SLO of 100 ms (18 ms of room) c5 read over it on 2 cores
    # (2026-12-03, a unit run with nothing else running); with 10 ms base (c5 at 90 ms, 10 ms of
    # room), once on a busy machine before that; 50 ms a stream (48 ms of room) until 2026-12-04.
    progress: list[str] = []
    with IsolatedFakeServer(Script(ttft_s=0.002, itl_s=0.001, ttft_per_in_flight_s=0.1)) as srv:
        spec = external_spec(
            compose,
            srv.base_url,
            "workload.load_points=[{concurrency:1}]",
            "workload.num_requests=12",
            # one run per probe: the bracket is what this checks (reruns of a probe too close to call: test_capacity)
            "workload.capacity={knob:concurrency,start:2,high:32,runs:1,slo:{ttft_ms_p99:500}}",
        )
        result = run_trial(spec, tmp_path, progress=progress.append)
    assert result.status == "FINISHED", result.error
    labels = [p.label for p in result.points]
    assert labels[0] == "c1" and labels[1:4] == ["c2", "c4", "c8"]  # the fixed point, then the bracket
    m = result.metrics
    assert m["slo_capacity_concurrency"] == 5 and m["slo_capacity_concurrency_hi"] == 6
    assert m["slo_capacity_concurrency_probes"] == len(labels) - 1 == 5
    assert [p.metrics["slo_met"] for p in result.points[1:]] == [1.0, 1.0, 0.0, 0.0, 1.0]  # c2 c4 c8 c6 c5
    cap = result.capacity
    assert cap["explanation"].startswith(
        "capacity 5 streams (probe c5 met the SLOs; probe c6 at 6 did not: ttft_ms_p99"
    )
    assert [p["verdict"] for p in cap["probes"]] == ["pass", "pass", "fail", "fail", "pass"]
    assert any("probe 3 c8: running" in line for line in progress)
    assert any(line.endswith("stopped: bracket 5..6 within 10%") for line in progress)
    assert load_result(tmp_path).capacity == cap  # on disk with the result


def test_capacity_search_config_errors_name_the_key(compose):
    with pytest.raises(ConfigError, match="capacity.slo: ttft_p99: expected"):
        to_specs(compose(["workload.capacity={slo:{ttft_p99:100}}"]))
    with pytest.raises(ConfigError, match="no request class 'long'"):
        to_specs(compose(["workload.capacity={slo:{long/ttft_ms_p99:100}}"]))
    with pytest.raises(ConfigError, match="nothing to measure"):
        to_specs(compose(["workload.load_points=[]"]))


def test_an_engine_that_dies_fails_the_trial_with_no_accuracy_run(compose, tmp_path, tiny_model_dir):
    """The engine dies mid-point under a live API server (500s, health 503): the trial is FAILED
    naming it, the point is not judged as the client's fault, lm-eval never starts, and the
    points after it are not run."""
    lines: list[str] = []
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002, die_after=5)) as srv:
        result = run_trial(external_spec(compose, srv.base_url, "eval=addition"), tmp_path, progress=lines.append)
    assert result.status == "FAILED", result.error
    first = result.error.splitlines()[0]
    assert "ServerCrashedError" in first and "health check" in first, first
    assert [p.label for p in result.points] == ["c2"]  # measured, kept, not followed by r20
    m = result.points[0].metrics
    assert m["server_failed"] == 1.0 and m["invalid"] == 1.0 and 0 < m["completed"] < 6
    assert not any("client was the bottleneck" in x for x in lines), lines
    assert not any("evaluating accuracy" in x for x in lines) and not (tmp_path / "eval.log").exists()


def test_an_engine_dead_after_warmup_measures_nothing(compose, tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002, die_after=1)) as srv:
        result = run_trial(external_spec(compose, srv.base_url), tmp_path, progress=lambda _: None)
        requests = srv.truth.requests
    assert result.status == "FAILED" and "health check" in result.error.splitlines()[0], result.error
    assert result.points == [] and requests == 2  # the warm-up's two requests, then nothing


def test_a_server_that_answers_every_request_with_500_fails_the_trial(compose, tmp_path, tiny_model_dir):
    """Health stays 200 but no request succeeds: not a measurement, and not the client's fault."""
    with FakeOpenAIServer(Script(fail_every=1)) as srv:
        result = run_trial(external_spec(compose, srv.base_url), tmp_path, progress=lambda _: None)
    assert result.status == "FAILED", result.error
    first = result.error.splitlines()[0]
    assert "answered no request" in first and "every request failed (6 of 6)" in first and "HTTP 500" in first, first
    assert len(result.points) == 1 and result.points[0].metrics["server_failed"] == 1.0


def test_model_name_auto_is_the_name_the_running_server_serves(compose):
    """engine=external model.name=auto: the name is read from the server's /v1/models before the
    trial is hashed; a server serving several names (or none listed) is an error listing them."""
    from orchestrator.scheduling import prepare_jobs

    def jobs_for(url: str):
        over = ["engine=external", f"engine.url={url}", "engine.metrics=none", "model.name=auto"]
        return prepare_jobs([(over, compose(over))])

    with FakeOpenAIServer(Script(served=("org/served-model",))) as srv:
        (job,) = jobs_for(srv.base_url)
        assert job.spec.model.name == "org/served-model"
    with FakeOpenAIServer(Script(served=("a", "b"))) as srv:
        with pytest.raises(ConfigError, match=r"model.name=auto: .*/v1/models serves a, b; set model.name"):
            jobs_for(srv.base_url)
