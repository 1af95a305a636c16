"""Telemetry: the arithmetic over recorded sample streams (energy from a counter and from power,
windows, cost and energy per token), the NVML probe's calls against the real nvidia-ml-py module
with a fake device layer, the CPU probe on this machine, and the config's bad inputs."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.hashing import trial_hash
from orchestrator.metrics import probes, telemetry
from orchestrator.metrics.probes import ProcessProbe, RaplProbe, TelemetrySampler, rapl_counters, visible_devices
from orchestrator.metrics.telemetry import (
    Timeline,
    cost_metrics,
    energy_in_window,
    energy_metrics,
    integrate,
    integrate_averaged,
    ratio_of_deltas,
    rows_from_parquet,
    window_metrics,
)

pytestmark = pytest.mark.measures


def test_the_ratio_of_two_counters_deltas_per_interval():
    tl = Timeline()
    for t, hits, queries in ((1.0, 0, 0), (2.0, 10, 40), (3.0, 10, 40), (4.0, 2, 8), (5.0, 3, 12)):
        tl.add(t, "engine", {"hits": float(hits), "queries": float(queries)})
    # no queries in (2, 3]; the engine restarted before 4 (counters went down): that interval is skipped
    assert ratio_of_deltas(tl.rows, "engine", "hits", "queries") == ([2.0, 5.0], [0.25, 0.25])


def test_integrate_holds_the_edges_and_interpolates_inside():
    ts, vs = [1.0, 2.0, 3.0], [100.0, 200.0, 100.0]
    assert integrate(ts, vs, 1.0, 3.0) == pytest.approx(300.0)  # two trapezoids of 150
    assert integrate(ts, vs, 1.5, 2.5) == pytest.approx(175.0)  # 150..200..150 over 1 s
    assert integrate(ts, vs, 0.0, 1.0) == pytest.approx(100.0)  # before the first sample: held flat
    assert integrate([], [], 0.0, 1.0) == 0.0 and integrate(ts, vs, 2.0, 2.0) == 0.0


def test_power_read_as_averages_over_the_second_before_each_sample_integrates_exactly():
    """NVML's power on Ampere and later is the mean over the second before the read: a load of
    700 W from 2 s to 5 s on 70 W idle, read each second, integrates to its true energy over the
    decay after it (the trapezoids' half-second lag read +53% there on an H100)."""

    def true_power(t: float) -> float:
        return 700.0 if 2.0 <= t < 5.0 else 70.0

    ts = [float(i) for i in range(1, 12)]
    vs = [sum(true_power(t - 1 + k / 1000) for k in range(1000)) / 1000 for t in ts]  # boxcar of 1 s
    decay = 70.0 * 6.0  # [5, 11]
    assert integrate_averaged(ts, vs, 5.0, 11.0) == pytest.approx(decay, rel=1e-3)
    assert integrate(ts, vs, 5.0, 11.0) > 1.5 * decay  # what the trapezoids made of it
    assert integrate_averaged(ts, vs, 2.0, 5.0) == pytest.approx(2100.0, rel=1e-3)
    assert integrate_averaged(ts, vs, 2.5, 3.5) == pytest.approx(700.0, rel=1e-3)  # inside: partial intervals
    assert integrate_averaged(ts, vs, 11.0, 13.0) == pytest.approx(140.0)  # past the last: held
    assert integrate_averaged(ts, vs, 0.0, 1.0) == pytest.approx(70.0)  # before the first: its value
    assert integrate_averaged([], [], 0.0, 1.0) == 0.0 and integrate_averaged(ts, vs, 3.0, 3.0) == 0.0


def test_power_averages_read_closer_than_their_window_count_each_second_once():
    """The sampler reads at a point's edges as well as every second, so two reads can be half a
    second apart while each averages the whole second before it. Holding each value since the read
    before counted the load's first half second twice: +18% over a decay, -13% on a burst on the
    lent H200; the running energy counts it once."""

    def true_power(t: float) -> float:
        return 700.0 if 3.5 <= t < 5.0 else 100.0

    def read(t: float) -> float:  # NVML: the mean over the second before
        return sum(true_power(t - 1 + k / 1000) for k in range(1000)) / 1000

    ts = sorted([float(i) for i in range(1, 12)] + [3.5, 5.0])  # the edges of a 1.5 s burst
    vs = [read(t) for t in ts]
    burst, decay = 700.0 * 1.5, 100.0 * 6.0
    assert integrate_averaged(ts, vs, 3.5, 5.0) == pytest.approx(burst, rel=0.02)
    assert integrate_averaged(ts, vs, 5.0, 11.0) == pytest.approx(decay, rel=0.02)
    assert integrate_averaged(ts, vs, 1.0, 11.0) == pytest.approx(burst + 100.0 * 8.5, rel=0.01)
    # a gap of 3 s between reads of 1 s windows: the uncovered 2 s take the mean of the values beside them
    assert integrate_averaged([1.0, 4.0], [100.0, 300.0], 1.0, 4.0) == pytest.approx(2 * 200.0 + 300.0)


def test_instant_power_integrates_as_trapezoids():
    """On GA100 (the A100) and older GPUs NVML's power is an instant reading: the probe says so
    (power_window_s 0) and the fallback integrates trapezoids."""
    counter: tuple[list[float], list[float]] = ([], [])
    power = ([0.0, 1.0, 2.0], [100.0, 300.0, 300.0])
    assert energy_in_window(counter, power, 0.0, 2.0, averaged_s=0.0) == (pytest.approx(500.0), "power")
    assert energy_in_window(counter, power, 0.0, 2.0) == (pytest.approx(600.0), "power")  # as 1 s averages
    # the probe's word reaches a point's window: no counter, instant readings, trapezoids
    rows = [(t, "gpu0", "power_w", v) for t, v in zip(*power)]
    instant = rows + [(t, "gpu0", "power_window_s", 0.0) for t in power[0]]
    assert window_metrics(instant, 0.0, 2.0)["energy_j"] == pytest.approx(500.0)
    averaged = rows + [(t, "gpu0", "power_window_s", 1.0) for t in power[0]]
    assert window_metrics(averaged, 0.0, 2.0)["energy_j"] == pytest.approx(600.0)
    assert window_metrics(rows, 0.0, 2.0)["energy_j"] == pytest.approx(600.0)  # an older timeline: averages


def test_a_bad_power_read_spoils_no_window():
    ts, vs = [0.0, 1.0, 2.0, 3.0], [100.0, float("nan"), 100.0, 100.0]
    assert integrate_averaged(ts, vs, 2.0, 3.0) == pytest.approx(100.0)
    assert integrate_averaged(ts, vs, 0.0, 3.0) == pytest.approx(300.0)


def test_nvml_power_window_by_compute_capability():
    from orchestrator.metrics.nvml import power_window_s

    class FakeNvml:
        def __init__(self, cc: tuple[int, int] | None) -> None:
            self.cc = cc

        def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:  # noqa: N802 (NVML's name)
            if self.cc is None:
                raise RuntimeError("not supported")
            return self.cc

    assert power_window_s(FakeNvml((9, 0)), None) == 1.0  # H100, H200
    assert power_window_s(FakeNvml((8, 6)), None) == 1.0  # A10, A40
    assert power_window_s(FakeNvml((8, 0)), None) == 0.0  # A100 (GA100): instant
    assert power_window_s(FakeNvml((7, 0)), None) == 0.0  # V100
    assert power_window_s(FakeNvml(None), None) == 1.0


def test_energy_prefers_the_counter_when_it_brackets_the_window():
    counter = ([0.0, 1.0, 2.0, 3.0], [1000.0, 1300.0, 1600.0, 1900.0])  # 300 W, as a counter
    power = ([0.0, 1.0, 2.0, 3.0], [50.0, 50.0, 50.0, 50.0])  # a sensor that disagrees
    assert energy_in_window(counter, power, 0.5, 2.5) == (pytest.approx(600.0), "counter")
    # The counter does not reach the window's end: power integrated instead.
    assert energy_in_window(counter, power, 0.5, 3.5) == (pytest.approx(150.0), "power")
    assert energy_in_window(([], []), ([1.0], [5.0]), 0.0, 1.0) == (None, "none")


def _gpu_stream(with_counter: bool) -> list[telemetry.Row]:
    rows: list[telemetry.Row] = []
    for i in range(11):  # 0..10 s, two GPUs at 200 and 100 W
        t = float(i)
        for g, watts in (("gpu0", 200.0), ("gpu1", 100.0)):
            rows += [(t, g, "power_w", watts), (t, g, "sm_util_pct", 50.0), (t, g, "temp_c", 60.0 + i)]
            rows.append((t, g, "throttle_reasons", 1.0 if i < 5 else 4.0))  # idle bit, then SW power cap
            if with_counter:
                rows.append((t, g, "energy_j", watts * t * 1.1))  # the counter says 10% more than the sensor
        rows += [(t, "servers", "cpu_cores", 1.5), (t, "servers", "rss_gb", 2.0 + t / 10)]
    return rows


@pytest.mark.parametrize("with_counter", [True, False])
def test_a_points_window_over_two_gpus(with_counter):
    m = window_metrics(_gpu_stream(with_counter), 2.0, 6.0)
    assert m["telemetry_gpu_power_w_mean"] == pytest.approx(300.0) and m["telemetry_gpu_power_w_max"] == 300.0
    assert m["telemetry_gpu_sm_util_pct_mean"] == 50.0 and m["telemetry_gpu_temp_c_max"] == 66.0
    # t=5,6 of 3..6 carry a real reason (the sample at the window's start describes the time before it)
    assert m["telemetry_gpu_throttled_share"] == pytest.approx(2 / 4)
    assert m["energy_j"] == pytest.approx(300.0 * 4 * (1.1 if with_counter else 1.0))
    assert m["energy_from_counter"] == (1.0 if with_counter else 0.0)
    assert m["telemetry_server_cpu_cores_mean"] == 1.5 and m["telemetry_server_rss_gb_max"] == pytest.approx(2.6)


def test_cpu_only_windows_say_nothing_of_energy():
    rows = [(float(t), "servers", "cpu_cores", 1.0) for t in range(5)]
    m = window_metrics(rows, 0.0, 4.0)
    assert "energy_j" not in m and energy_metrics(m) == {}
    # RAPL counters (CPU packages) give energy where there is no GPU.
    rows += [(float(t), "cpu_package0", "energy_j", 40.0 * t) for t in range(5)]
    assert window_metrics(rows, 1.0, 3.0)["energy_j"] == pytest.approx(80.0)


def test_energy_and_cost_per_token():
    point = {"energy_j": 600.0, "output_tokens": 3000.0, "input_tokens": 1000.0, "completed": 30.0, "duration_s": 10.0}
    e = energy_metrics(point)
    assert e == {"joules_per_output_token": 0.2, "output_tokens_per_joule": 5.0, "joules_per_request": 20.0}
    c = cost_metrics(point, price_per_hour=3.6, devices=2)  # $7.2/h for 10 s = $0.02
    assert c["cost_usd"] == pytest.approx(0.02)
    assert c["cost_per_mtok_output"] == pytest.approx(0.02 / 3000 * 1e6)
    assert c["cost_per_mtok_total"] == pytest.approx(0.02 / 4000 * 1e6)
    assert cost_metrics(point, None, 2) == {}  # no price: no cost, never $0


def test_rapl_counters_unwrap(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (tmp_path / "intel-rapl:0:0").mkdir()  # a sub-zone (core): not a package
    (zone / "energy_uj").write_text("900000000\n")
    (zone / "max_energy_range_uj").write_text("1000000000\n")
    counters = rapl_counters(tmp_path)
    assert [(n, w) for n, _, w in counters] == [("cpu_package0", 1000.0)]
    probe, tl = RaplProbe(counters), Timeline()
    probe.sample(0.0, tl)
    (zone / "energy_uj").write_text("50000000\n")  # wrapped: 900 J -> 1000 J -> 50 J
    probe.sample(1.0, tl)
    assert [v for _, _, _, v in tl.rows] == [900.0, pytest.approx(1050.0)]
    assert rapl_counters(tmp_path / "absent") == []


def test_visible_devices_from_the_environment_or_ray():
    assert visible_devices([0, 1], {"CUDA_VISIBLE_DEVICES": "GPU-aa, 3"}) == ["GPU-aa", "3"]
    assert visible_devices([2, 5], {}) == ["2", "5"]


def test_the_nvml_probe_reads_the_dmon_fields(monkeypatch):
    """The real nvidia-ml-py module with a fake device layer: our calls and units."""
    import pynvml

    class Util:
        gpu, memory = 87, 40

    class Mem:
        used = 30e9

    calls = []
    fake = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetHandleByUUID": lambda u: f"h-{u}",
        "nvmlDeviceGetUUID": lambda h: b"GPU-" + h.encode(),
        "nvmlDeviceGetUtilizationRates": lambda h: Util(),
        "nvmlDeviceGetPowerUsage": lambda h: 251_500,  # mW
        "nvmlDeviceGetMemoryInfo": lambda h: Mem(),
        "nvmlDeviceGetClockInfo": lambda h, kind: 1980 if kind == pynvml.NVML_CLOCK_SM else 2619,
        "nvmlDeviceGetTemperature": lambda h, sensor: 71,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 4,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123_456_789,  # mJ
    }
    for name, fn in fake.items():
        monkeypatch.setattr(pynvml, name, fn)
    probe = probes.NvmlProbe(["1", "GPU-x"])
    assert probe.uuids == ["GPU-h1", "GPU-h-GPU-x"]
    tl = Timeline()
    probe.sample(5.0, tl)
    got = {(s, n): v for _, s, n, v in tl.rows}
    assert got[("gpu0", "power_w")] == 251.5 and got[("gpu0", "energy_j")] == pytest.approx(123456.789)
    assert got[("gpu1", "sm_util_pct")] == 87 and got[("gpu1", "mem_used_gb")] == 30.0
    assert got[("gpu0", "sm_clock_mhz")] == 1980 and got[("gpu0", "mem_clock_mhz")] == 2619
    assert got[("gpu0", "temp_c")] == 71 and got[("gpu0", "throttle_reasons")] == 4

    def no_counter(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", no_counter)  # pre-Volta
    tl2 = Timeline()
    probe.sample(6.0, tl2)
    assert not any(n == "energy_j" for _, _, n, _ in tl2.rows) and any(n == "power_w" for _, _, n, _ in tl2.rows)
    probe.close()
    assert calls == ["init", "shutdown"]


def test_without_nvml_the_gpu_is_said_not_measured(monkeypatch):
    monkeypatch.setattr(probes, "rapl_counters", lambda: [])
    opened, notes = probes.open_probes([os.getpid()], ["0"])  # no NVML library on this machine
    assert [type(p).__name__ for p in opened] == ["ProcessProbe"]
    assert notes["gpu"].startswith("not measured") and notes["energy"].startswith("not measured")


def test_the_process_probe_on_this_machine():
    probe, tl = ProcessProbe([os.getpid()]), Timeline()
    probe.sample(time.perf_counter(), tl)
    end = time.process_time() + 0.2
    while time.process_time() < end:  # busy: about one core
        pass
    probe.sample(time.perf_counter(), tl)
    got = {(s, n): v for _, s, n, v in tl.rows}
    assert 0.3 < got[("servers", "cpu_cores")] <= (os.cpu_count() or 1) + 0.1
    assert got[("servers", "rss_gb")] > 0.01 and got[("machine", "mem_used_gb")] > 0.1
    assert 0.0 <= got[("machine", "cpu_cores")] <= (os.cpu_count() or 1) + 0.1


def test_the_sampler_stops_with_a_last_sample_and_the_series_round_trips():
    tl = Timeline()
    sampler = TelemetrySampler([ProcessProbe([os.getpid()])], tl, interval_s=0.05)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    sampler.stop()  # idempotent
    assert sampler.samples >= 2 and sampler.probes == []
    rows = rows_from_parquet(tl.to_parquet())
    assert rows == tl.rows and {s for _, s, _, _ in rows} == {"servers", "machine"}
    assert all(math.isfinite(v) for _, _, _, v in rows)


def test_a_failing_probe_is_dropped_not_fatal():
    class Broken:
        def sample(self, t, timeline):
            raise RuntimeError("sensor gone")

        def close(self):
            pass

    sampler = TelemetrySampler([Broken(), ProcessProbe([os.getpid()])], Timeline())
    sampler.sample()
    assert [type(p).__name__ for p in sampler.probes] == ["ProcessProbe"]


@pytest.mark.parametrize(
    "override, key",
    [("platform.telemetry_interval_s=0.01", "telemetry_interval_s"), ("platform.price_per_hour=-1", "price_per_hour")],
)
def test_bad_telemetry_settings_name_the_key(compose, override, key):
    with pytest.raises(ConfigError, match=key):
        to_specs(compose([override]))


def test_a_price_changes_the_trial_identity_only_when_set(compose):
    base, _ = to_specs(compose([]))
    priced, _ = to_specs(compose(["platform.price_per_hour=0.5"]))
    quiet, _ = to_specs(compose(["platform.telemetry=false", "platform.telemetry_interval_s=0.5"]))
    assert trial_hash(base) != trial_hash(priced) and trial_hash(base) == trial_hash(quiet)


def test_the_timeline_figure_of_a_trial(tmp_path):
    from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
    from orchestrator.metrics.result import PointResult, TrialResult
    from orchestrator.report.timeline import timeline_figure

    records, tl = [], Timeline()
    for i in range(40):
        sent = 100.0 + i * 0.25
        chunks = [sent + 0.05 + k * 0.01 for k in range(16)]
        records.append(
            RequestRecord(
                request_id=i,
                point=i // 20,
                request_class="default",
                intended_send_s=sent,
                sent_s=sent,
                input_tokens_target=32,
                output_tokens_target=16,
                chunk_times_s=chunks,
                chunk_tokens=[1] * 16,
                done_s=chunks[-1],
            )
        )
    for k in range(12):
        t = 100.0 + k
        tl.add(t, "servers", {"cpu_cores": 1.2, "rss_gb": 1.5})
        tl.add(t, "engine", {"requests_running": 3.0, "requests_waiting": 1.0, "kv_cache_usage": 0.2})
        tl.add(
            t, "engine", {"preemptions": float(k // 4), "prefix_cache_hits": 5.0 * k, "prefix_cache_queries": 20.0 * k}
        )
    points = [
        PointResult(index=j, label=f"c{j + 1}", setting={}, window=(100.0 + 5 * j, 105.0 + 5 * j)) for j in range(2)
    ]
    result = TrialResult(
        trial_hash="ab" * 8,
        experiment="x",
        spec={},
        status="FINISHED",
        started_at=0.0,
        ended_at=1.0,
        points=points,
        records_parquet=records_to_parquet_bytes(records),
        telemetry_parquet=tl.to_parquet(),
    )
    path = timeline_figure(result, tmp_path)
    assert path is not None and path.name == "timeline.png" and path.stat().st_size > 20_000
    assert timeline_figure(result.model_copy(update={"points": []}), tmp_path) is None


def test_a_windows_cpu_mean_comes_from_the_cumulative_counter():
    # 1 core busy for 0..4 s, 3 cores for 4..10 s; samples only at 0, 4, 10: none inside [5, 8]
    rows = [
        (0.0, "servers", "cpu_s", 0.0),
        (4.0, "servers", "cpu_s", 4.0),
        (4.0, "servers", "cpu_cores", 1.0),
        (10.0, "servers", "cpu_s", 22.0),
        (10.0, "servers", "cpu_cores", 3.0),
    ]
    assert window_metrics(rows, 5.0, 8.0)["telemetry_server_cpu_cores_mean"] == pytest.approx(3.0)
    assert window_metrics(rows, 2.0, 6.0)["telemetry_server_cpu_cores_mean"] == pytest.approx(2.0)
    # the rate stamped at the window's start covers the time before it: not the window's max
    assert window_metrics(rows, 4.0, 10.0)["telemetry_server_cpu_cores_max"] == 3.0
    # a counter that does not span the window is not extrapolated: the rates sampled inside it are used
    assert window_metrics(rows[:3], 2.0, 6.0)["telemetry_server_cpu_cores_mean"] == 1.0
    assert "telemetry_server_cpu_cores_mean" not in window_metrics(rows[:3], 5.0, 6.0)


def test_a_window_stamped_by_the_sampler_has_its_cpu_whatever_the_interval():
    """A point's start and end are samples (PointMeasurer.clock is the sampler's edge), so a
    point shorter than the interval still has its servers' CPU."""
    tl = Timeline()
    sampler = TelemetrySampler([ProcessProbe([os.getpid()])], tl, interval_s=60.0)
    sampler.start()
    t0 = sampler.edge()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # busy: about one core
        pass
    t1 = sampler.edge()
    sampler.stop()
    m = window_metrics(tl.rows, t0, t1)
    assert 0.3 < m["telemetry_server_cpu_cores_mean"] <= (os.cpu_count() or 1) + 0.1
    assert 0.3 < m["telemetry_machine_cpu_cores_mean"] <= (os.cpu_count() or 1) + 0.1


class _SlowProbe:
    """A probe that waits (wall time, no CPU): a GIL held by the trial's event loop looks like this."""

    def __init__(self) -> None:
        self.calls = 0

    def sample(self, t, timeline):
        self.calls += 1
        time.sleep(0.05)

    def close(self):
        pass


def test_the_samplers_budget_counts_its_cpu_not_its_waits():
    probe = _SlowProbe()
    sampler = TelemetrySampler([probe], Timeline(), interval_s=0.02, budget=0.01)
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    # a wall-time budget would wait 0.05 / 0.01 = 5 s after the first sample
    assert probe.calls >= 4 and sampler.cost_s < 0.05


def test_a_rate_needs_its_interval_the_counter_does_not():
    """Two samples a millisecond apart (a point's edge next to the sampler's own) add to the CPU
    counter but give no rate: over so short a time it is the accounting's jitter."""
    probe, tl = ProcessProbe([os.getpid()]), Timeline()
    t = time.perf_counter()
    probe.sample(t, tl)
    probe.sample(t + 0.001, tl)
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    probe.sample(time.perf_counter(), tl)
    rates = [(s, t2) for t2, s, n, _ in tl.rows if n == "cpu_cores"]
    assert len(rates) == 2 and all(t2 > t + 0.1 for _, t2 in rates)  # servers and machine, third sample only
    assert len([1 for _, s, n, _ in tl.rows if n == "cpu_s"]) == 6


def test_a_stuck_sample_does_not_hold_up_a_point():
    class Stuck:
        def __init__(self):
            self.release = threading.Event()

        def sample(self, t, timeline):
            self.release.wait(10)

        def close(self):
            pass

    stuck = Stuck()
    sampler = TelemetrySampler([stuck], Timeline(), interval_s=60.0)
    sampler.start()
    time.sleep(0.1)  # the sampler's first sample is now stuck
    t = time.perf_counter()
    stamp = sampler.edge()
    assert 1.9 < time.perf_counter() - t < 5 and stamp >= t
    stuck.release.set()
    sampler.stop()
