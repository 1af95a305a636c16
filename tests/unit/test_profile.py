"""The profiler's window over one load point (against a small HTTP server that records the
calls), the traces collected as artifacts, the config's checks and the verdict's rule."""

from __future__ import annotations

import http.server
import threading
import time
from types import SimpleNamespace

import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.hashing import trial_hash
from orchestrator.config.schema import ObjectiveSpec, ProfileSpec
from orchestrator.decide.trials import Point, TrialData
from orchestrator.decide.verdict import decide
from orchestrator.engines.base import Profiler
from orchestrator.metrics.result import TrialResult, load_result, save_result
from orchestrator.trial.points import PointMeasurer
from orchestrator.trial.profile import ProfileWindow, collect_traces
from orchestrator.trial.servers import server_key

pytestmark = pytest.mark.measures


@pytest.fixture
def engine():
    calls: list[tuple[str, float, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            calls.append((self.path, time.perf_counter(), self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", calls
    server.shutdown()


def test_the_window_starts_after_the_delay_and_stops_after_its_duration(engine):
    url, calls = engine
    said = []
    t0 = time.perf_counter()
    window = ProfileWindow(
        ProfileSpec(point="c1", start_after_s=0.2, duration_s=0.3), Profiler(), [url], "k", said.append
    )
    window.start()
    time.sleep(0.8)
    out = window.finish()
    assert [c[0] for c in calls] == ["/start_profile", "/stop_profile"]
    assert calls[0][1] - t0 >= 0.2 and calls[1][1] - calls[0][1] >= 0.3  # lower bounds only: a busy machine is late
    assert calls[0][2] == "Bearer k"
    assert out["profiled"] == 1.0 and out["profiled_excluded"] == 1.0 and out["profile_window_s"] >= 0.3


def test_a_point_that_ends_early_stops_the_trace_then(engine):
    url, calls = engine
    window = ProfileWindow(
        ProfileSpec(point="c1", start_after_s=0.0, duration_s=60), Profiler(), [url, url], None, print
    )
    window.start()
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:  # started on both servers
        time.sleep(0.01)
    out = window.finish()
    assert [c[0] for c in calls] == ["/start_profile"] * 2 + ["/stop_profile"] * 2
    assert out["profile_window_s"] < 30


def test_a_point_shorter_than_the_delay_is_never_traced(engine):
    url, calls = engine
    window = ProfileWindow(ProfileSpec(point="c1", start_after_s=30, in_verdict=True), Profiler(), [url], None, print)
    window.start()
    assert window.finish() == {"profiled": 1.0} and calls == []


def test_a_failed_point_cancels_its_window_and_no_trace_starts_later(engine):
    """A point that raised: the measurer's exit cancels the window (a trace due later would start
    on whatever server then answers at that URL); its thread ends without being waited for."""
    url, calls = engine
    window = ProfileWindow(ProfileSpec(point="c1", start_after_s=0.5), Profiler(), [url], None, print)
    window.start()
    measurer = PointMeasurer.__new__(PointMeasurer)  # only what its exit reads: the point's helpers
    measurer.monitor, measurer.sampler, measurer.window = SimpleNamespace(stop=lambda: None), None, window
    measurer.__exit__(RuntimeError, RuntimeError("the load failed"), None)
    assert measurer.window is None
    window._thread.join(timeout=10)
    assert not window._thread.is_alive()
    time.sleep(0.6)
    assert calls == []


def test_traces_travel_with_the_result(tmp_path):
    (tmp_path / "work" / "profile").mkdir(parents=True)
    (tmp_path / "work" / "profile" / "EngineCore.123.pt.trace.json.gz").write_bytes(b"\x1f\x8bxyz")
    (tmp_path / "work" / "profile" / "notes.txt").write_text("not a trace")
    traces = collect_traces(tmp_path / "work")
    assert list(traces) == ["profile/EngineCore.123.pt.trace.json.gz"]
    result = TrialResult(
        trial_hash="0" * 16, experiment="x", spec={}, status="FINISHED", started_at=0, ended_at=1, artifacts=traces
    )
    out = save_result(result, tmp_path / "trial")
    assert load_result(out).artifacts == traces and "artifacts" not in (out / "result.json").read_text()
    bad = result.model_copy(update={"artifacts": {"../escape.json": b"{}"}})
    with pytest.raises(ValueError, match="outside"):
        save_result(bad, tmp_path / "trial2")


def test_profile_settings_are_checked_before_anything_starts(compose):
    with pytest.raises(ConfigError, match=r"profile.point 'c999' is not a load point"):
        to_specs(compose(["+profile={point:c999}"]))
    label = to_specs(compose([]))[0].workload.load_points[0].label
    with pytest.raises(ConfigError, match="no profiler"):
        to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:1", f"+profile={{point:{label}}}"]))
    with pytest.raises(ConfigError, match="duration_s"):
        to_specs(compose([f"+profile={{point:{label},duration_s:0}}"]))
    plain, _ = to_specs(compose([]))
    profiled, _ = to_specs(compose([f"+profile={{point:{label}}}"]))
    assert trial_hash(plain) != trial_hash(profiled)  # a profiled point is another measurement
    assert server_key(profiled) is None and server_key(plain) is not None  # never a shared server


def test_the_verdict_does_not_read_a_profiled_point():
    def trial(name, tps, excluded):
        m = {"tokens_per_second": tps, **({"profiled": 1.0, "profiled_excluded": 1.0} if excluded else {})}
        return TrialData(name, "FINISHED", {}, {}, [Point(0, "c4", {"concurrency": 4}, m, "")])

    v = decide(
        [trial("fast_profiled", 900.0, True), trial("slow", 500.0, False)], ObjectiveSpec(maximize="tokens_per_second")
    )
    assert v.best is not None and v.best.name == "slow"
    assert "profiled point" in dict((t.name, why) for t, why in v.excluded)["fast_profiled"]


def test_cost_per_token_as_the_objective_under_a_latency_constraint():
    """minimize cost_per_mtok_output subject to ttft_ms_p99: the cheapest trial that meets it."""

    def trial(name, cost, ttft):
        m = {"cost_per_mtok_output": cost, "ttft_ms_p99": ttft}
        return TrialData(name, "FINISHED", {}, {}, [Point(0, "r4", {"rate": 4}, m, "")])

    objective = ObjectiveSpec(minimize="cost_per_mtok_output", subject_to={"ttft_ms_p99": 2000})
    v = decide([trial("cheap_slow", 0.2, 2500.0), trial("mid", 0.4, 900.0), trial("dear", 0.9, 300.0)], objective)
    assert v.best is not None and v.best.name == "mid"
    assert [t.name for t, _ in v.excluded] == ["cheap_slow"]
    unpriced = TrialData("no_price", "FINISHED", {}, {}, [Point(0, "r4", {"rate": 4}, {"ttft_ms_p99": 100.0}, "")])
    assert "not measured" in dict((t.name, w) for t, w in decide([unpriced], objective).excluded)["no_price"]
