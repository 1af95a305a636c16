"""client_processes: auto: how many client processes a point gets, and why."""

from __future__ import annotations

import pytest

from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen import Endpoint, PromptFactory, run_each
from orchestrator.loadgen.plan import RequestPlanner, plan_point
from orchestrator.loadgen.sizing import (
    DEFAULT_CHUNK_COST_S,
    PROCESS_LOAD,
    ClientGauge,
    planned_chunk_rate,
    size_clients,
)
from testkit.fake_openai_server import IsolatedFakeServer, Script

pytestmark = pytest.mark.measures


@pytest.fixture(scope="module")
def factory(tiny_model_dir):
    return PromptFactory(str(tiny_model_dir))


def plan_of(factory, point, classes=None, **kw):
    w = WorkloadSpec.model_validate(
        {
            "name": "s",
            "classes": classes or {"a": {"input_tokens": 8, "output_tokens": 50}},
            "load_points": [point],
            "num_requests": 100,
            **kw,
        }
    )
    return plan_point(w, w.load_points[0], 0, RequestPlanner(w, factory), 0)


def test_chunk_rate_of_each_kind_of_point(factory):
    closed = plan_of(factory, {"concurrency": 64})
    assert planned_chunk_rate(closed, 100.0) == 6400.0  # streams x one stream's rate
    steady = plan_of(factory, {"rate": 20.0, "arrival": "constant"})
    assert planned_chunk_rate(steady, 100.0) == pytest.approx(100 * 50 / (99 / 20.0))  # tokens / span
    capped = plan_of(factory, {"rate": 1000.0, "arrival": "constant", "max_concurrency": 4})
    assert planned_chunk_rate(capped, 100.0) == 400.0  # at most 4 streams at a time
    burst = plan_of(factory, {"rate": float("inf")})
    assert planned_chunk_rate(burst, 100.0) == 100 * 100.0  # all at once: every request a stream
    classes = {
        "a": {"input_tokens": 8, "output_tokens": 50},
        "bg": {"input_tokens": 8, "output_tokens": 10, "rate": 5.0, "arrival": "constant"},
    }
    with_bg = plan_of(factory, {"concurrency": 2}, classes=classes, duration_s=10.0, num_requests=None)
    assert planned_chunk_rate(with_bg, 100.0) == pytest.approx(200.0 + 5.0 * 10, rel=0.05)


def test_processes_follow_the_load_and_stop_at_the_cores(factory):
    small = size_clients(plan_of(factory, {"concurrency": 8}), cores=4)
    assert small.processes == 1 and small.needed == 1
    big = plan_of(factory, {"concurrency": 512})
    need = -(-512 * 100 * DEFAULT_CHUNK_COST_S // PROCESS_LOAD)  # ceil(1.536 / 0.5) = 4
    four = size_clients(big, cores=8)
    assert four.processes == four.needed == need == 4
    two = size_clients(big, cores=2)
    assert (two.processes, two.needed) == (2, 4)
    assert "4 needed but the client has 2 cores" in two.why() and "1.54 cores" in two.why()
    assert size_clients(plan_of(factory, {"concurrency": 2}), cores=8, chunk_cost_s=1.0).processes == 2  # <= streams
    assert two.metrics()["client_processes"] == 2.0 and two.metrics()["client_processes_needed"] == 4.0


def test_the_gauge_learns_the_clients_cost_and_a_streams_rate():
    g = ClientGauge()
    g.learn(cpu_s=0.5, chunks=100, streams=4, window_s=1.0)  # too few chunks: start-up, not per chunk
    assert g.chunk_cost_s == DEFAULT_CHUNK_COST_S and g.stream_chunks_per_s == 25.0
    g.learn(cpu_s=0.2, chunks=10_000, streams=None, window_s=2.0)
    assert g.chunk_cost_s == pytest.approx(20e-6)  # measured replaces the default
    g.learn(cpu_s=0.1, chunks=10_000, streams=None, window_s=2.0)
    assert g.chunk_cost_s == pytest.approx(20e-6)  # the highest measured is kept
    g.learn(cpu_s=0.5, chunks=10_000, streams=None, window_s=2.0)
    assert g.chunk_cost_s == pytest.approx(50e-6)


def test_auto_runs_a_heavy_point_over_the_processes_it_needs(factory):
    """256 streams at the default 100 chunks/s each and 30 us per chunk need 2 processes: with
    2 cores the point runs on 2 (records merged, every request once); with 1 core on 1, and
    the stats say 2 were needed."""
    w = WorkloadSpec.model_validate(
        {
            "name": "auto",
            "warmup_requests": 0,
            "classes": {"a": {"input_tokens": 8, "output_tokens": 4}},
            "load_points": [{"concurrency": 256}],
            "num_requests": 256,
        }
    )
    assert w.client_processes == "auto"
    for cores, used in ((2, 2.0), (1, 1.0)):
        stats = {}
        with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.01)) as srv:
            runs = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0, client_cores=cores)
        records, stats = runs[0].records, {i: run.client for i, run in enumerate(runs)}
        assert len(records) == 256 and len({r.request_id for r in records}) == 256
        assert all(r.ok for r in records)
        st = stats[0]
        assert st["client_processes"] == used and st["client_processes_needed"] == 2.0
        assert st["client_planned_chunk_rate"] == 25600.0 and st["client_cpu_us_per_chunk"] > 0
