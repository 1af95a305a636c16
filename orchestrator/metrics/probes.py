"""The telemetry probes (servers' processes, the machine, NVML GPUs, RAPL packages) and the
sampler that runs them beside a trial: :func:`start_telemetry`. What each records is described
in :mod:`orchestrator.metrics.telemetry` and docs/observability.md.

:class:`TelemetrySampler` runs the probes in a daemon thread every ``interval_s`` and within a
CPU budget (a sample that used ``c`` CPU seconds waits at least ``c / budget``); a failing probe
is dropped, never fatal.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from orchestrator.config.schema import PlatformSpec
from orchestrator.metrics import nvml
from orchestrator.metrics.monitor import process_tree
from orchestrator.metrics.nvml import visible_devices
from orchestrator.metrics.telemetry import Background, Timeline, now

log = logging.getLogger(__name__)

RAPL_ROOT = Path("/sys/class/powercap")


class ProcessProbe:
    """CPU and memory of the servers' process trees (``pids``: their roots) and of the machine.

    CPU is recorded twice: the seconds used so far (``cpu_s``, every sample; a window's mean
    comes from it) and the cores busy since the last rate (``cpu_cores``), written only once
    ``min_rate_s`` has passed: two samples a millisecond apart (a point's own sample next to
    the sampler's) give a rate that is mostly the jitter of the CPU accounting (3 cores seen on
    this 2-core machine)."""

    def __init__(self, pids: Sequence[int], min_rate_s: float = 0.1) -> None:
        self.pids = list(pids)
        self.min_rate_s = min_rate_s
        self._cpu: dict[int, float] = {}  # pid -> its CPU seconds at the previous sample
        self._cpu_total = 0.0  # the trees' CPU seconds since this probe's first sample (processes gone included)
        self._rate: dict[str, tuple[float, float]] = {}  # source -> (t, CPU seconds) of its last rate

    def sample(self, t: float, timeline: Timeline) -> None:
        cpu: dict[int, float] = {}
        rss = 0
        for root in self.pids:
            for p in process_tree(root):
                try:
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                    rss += p.memory_info().rss
                except psutil.Error:
                    continue
        if self._rate:  # a process new since the last sample counts from 0; one gone since counts no more
            self._cpu_total += max(sum(c - self._cpu.get(pid, 0.0) for pid, c in cpu.items()), 0.0)
        self._cpu = cpu
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
        for source, values, cpu_s in (
            ("servers", {"rss_gb": rss / 1e9}, self._cpu_total),
            ("machine", {"mem_used_gb": psutil.virtual_memory().used / 1e9}, busy),
        ):
            values["cpu_s"] = cpu_s
            last = self._rate.get(source)
            if last is None or t - last[0] >= self.min_rate_s:
                if last is not None:
                    values["cpu_cores"] = max(cpu_s - last[1], 0.0) / (t - last[0])
                self._rate[source] = (t, cpu_s)
            timeline.add(t, source, values)

    def close(self) -> None:
        pass


def rapl_counters(root: Path = RAPL_ROOT) -> list[tuple[str, Path, float]]:
    """The CPU packages' RAPL energy counters Linux exposes and we may read: (name, file, wrap
    in J). Empty in most VMs (and where ``energy_uj`` is readable by root only)."""
    out = []
    for zone in sorted(root.glob("intel-rapl:*")) if root.is_dir() else []:
        if zone.name.count(":") != 1:  # packages only (intel-rapl:0), not their sub-zones
            continue
        energy, wrap = zone / "energy_uj", zone / "max_energy_range_uj"
        try:
            int(energy.read_text())
            wrap_j = int(wrap.read_text()) / 1e6 if wrap.exists() else math.inf
        except (OSError, ValueError):
            continue
        out.append((f"cpu_package{zone.name.split(':')[1]}", energy, wrap_j))
    return out


class RaplProbe:
    """Energy of the CPU packages from RAPL counters (J, unwrapped)."""

    def __init__(self, counters: list[tuple[str, Path, float]]) -> None:
        self.counters = counters
        self._last: dict[str, tuple[float, float]] = {}  # name -> (raw J, unwrapped J)

    def sample(self, t: float, timeline: Timeline) -> None:
        for name, path, wrap in self.counters:
            try:
                raw = int(path.read_text()) / 1e6
            except (OSError, ValueError):
                continue
            prev = self._last.get(name)
            total = (
                raw if prev is None else prev[1] + ((raw - prev[0]) % wrap if math.isfinite(wrap) else raw - prev[0])
            )
            self._last[name] = (raw, total)
            timeline.add(t, name, {"energy_j": total})

    def close(self) -> None:
        pass


class NvmlProbe:
    """The trial's GPUs through NVML: one ``gpu<k>`` source per device, in the order given."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.nv = nv = nvml.open_session()
        try:
            self.handles = [nvml.handle(nv, d) for d in devices]
            self.uuids = [nvml.text(nv.nvmlDeviceGetUUID(h)) for h in self.handles]
        except Exception:
            nv.nvmlShutdown()
            raise
        self._energy_ok = [True] * len(self.handles)
        self._power_window_s = [nvml.power_window_s(nv, h) for h in self.handles]
        # "Clocks event reasons" is the newer name of the throttle reasons (same bitmask).
        self._reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def sample(self, t: float, timeline: Timeline) -> None:
        nv = self.nv
        for k, h in enumerate(self.handles):
            util = nv.nvmlDeviceGetUtilizationRates(h)
            values = {
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "power_window_s": self._power_window_s[k],
                "sm_util_pct": float(util.gpu),
                "mem_util_pct": float(util.memory),
                "mem_used_gb": nv.nvmlDeviceGetMemoryInfo(h).used / 1e9,
                "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "mem_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                "temp_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                "throttle_reasons": float(self._reasons(h)),
            }
            try:  # the cap power draws against (the compute rule of the diagnosis reads power / limit)
                values["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            except nv.NVMLError:
                pass
            if self._energy_ok[k]:
                try:  # mJ since the driver loaded; Volta and later
                    values["energy_j"] = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
                except nv.NVMLError:
                    self._energy_ok[k] = False
            timeline.add(t, f"gpu{k}", values)

    def close(self) -> None:
        self.nv.nvmlShutdown()


def open_probes(pids: Sequence[int], gpu_devices: Sequence[str]) -> tuple[list[Any], dict[str, str]]:
    """The probes this machine supports for these servers, and what each kind measures or why
    not (``gpu``, ``energy``): said plainly, never a 0."""
    probes: list[Any] = [ProcessProbe(pids)]
    notes: dict[str, str] = {}
    if gpu_devices:
        try:
            nvml = NvmlProbe(gpu_devices)
        except Exception as exc:  # no driver, no library: the trial still runs
            notes["gpu"] = f"not measured: NVML unavailable ({type(exc).__name__}: {exc})"
        else:
            probes.append(nvml)
            notes["gpu"] = "NVML: " + ", ".join(nvml.uuids)
    rapl = rapl_counters()
    if rapl:
        probes.append(RaplProbe(rapl))
    if any(isinstance(p, NvmlProbe) for p in probes):
        notes["energy"] = "GPU energy counters (NVML), else GPU power integrated"
        if rapl:
            notes["energy"] += "; CPU packages (RAPL) recorded beside them"
    elif rapl:
        notes["energy"] = "CPU packages' RAPL counters (" + ", ".join(n for n, _, _ in rapl) + ")"
    else:
        notes["energy"] = (
            "not measured: no GPU and no readable RAPL energy counter on this machine "
            "(/sys/class/powercap; VMs rarely expose it)"
        )
    return probes, notes


class TelemetrySampler:
    """Samples every probe into ``timeline`` in a daemon thread, every ``interval_s`` and within
    ``budget`` of CPU time; a failing probe is logged and dropped, never fatal.

    The budget counts the CPU the samples use (``time.thread_time``), not their wall time: in a
    trial's process whose event loop holds the GIL, a sample of a few milliseconds of CPU can
    take half a second of wall time, and a wall-time budget then stretched the interval past a
    whole load point (no sample inside it, no server CPU measured). :meth:`sample` may also be
    called from another thread (a point's start and end), so a window always has its ends."""

    EDGE_WAIT_S = 2.0  # a probe stuck in a driver call holds up a point no longer than this

    def __init__(self, probes: list[Any], timeline: Timeline, interval_s: float = 1.0, budget: float = 0.01) -> None:
        self.probes, self.timeline = probes, timeline
        self.interval_s, self.budget = interval_s, budget
        self.cost_s = 0.0  # the samples' own CPU time, for the observer-effect benchmark
        self.samples = 0
        self._lock = threading.Lock()  # one sample at a time: the probes keep the previous sample
        self._sampler = Background("telemetry")

    def sample(self, timeout: float = -1) -> float:
        """One sample of every probe, stamped with the instant it starts; returns the stamp.
        ``timeout``: how long to wait for a sample under way in another thread (-1: as long as
        it takes); past it, no sample, and the stamp is now (a probe stuck in a driver call
        must not hold up a load point)."""
        if not self._lock.acquire(timeout=timeout):
            log.warning("telemetry: a sample has been under way for %.0f s; not sampling", timeout)
            return now()
        try:
            t0, cpu0 = now(), time.thread_time()
            for probe in list(self.probes):
                try:
                    probe.sample(t0, self.timeline)
                except Exception as exc:
                    log.warning("telemetry: %s dropped after an error: %s", type(probe).__name__, exc)
                    self.probes.remove(probe)
            self.samples += 1
            self.cost_s += time.thread_time() - cpu0
            return t0
        finally:
            self._lock.release()

    def edge(self) -> float:
        """A load point's start or end, or the sampler's last sample: a sample now (waiting at
        most ``EDGE_WAIT_S`` for one under way) and its stamp
        (:attr:`orchestrator.trial.points.PointMeasurer.clock`)."""
        return self.sample(timeout=self.EDGE_WAIT_S)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0, cpu0 = now(), time.thread_time()
            self.sample()
            wait = max(self.interval_s, (time.thread_time() - cpu0) / self.budget) - (now() - t0)
            stop.wait(max(wait, 0.0))

    def start(self) -> None:
        self._sampler.start(self._loop)

    def stop(self) -> None:
        """Stop, take a last sample and close the probes. Idempotent."""
        if self._sampler.stop():
            self.edge()
        for probe in self.probes:
            try:
                probe.close()
            except Exception as exc:
                log.debug("telemetry: closing %s: %s", type(probe).__name__, exc)
        self.probes = []


def start_telemetry(
    platform: PlatformSpec, pids: Sequence[int], gpu_ids: Sequence[int], timeline: Timeline
) -> tuple[TelemetrySampler | None, dict[str, str]]:
    """A trial's sampler, started (None when ``platform.telemetry`` is off), and its notes: what
    is measured or why not (gpu, energy), the price and the interval."""
    if not platform.telemetry:
        return None, {"telemetry": "off (platform.telemetry=false)"}
    devices = visible_devices(gpu_ids) if platform.device == "cuda" else []
    probes, notes = open_probes(pids, devices)
    price, unit = platform.price_per_hour, "GPU-hour" if platform.device == "cuda" else "node-hour"
    notes["price"] = f"{price:g} per {unit}" if price is not None else "no price set (platform.price_per_hour)"
    notes["interval_s"] = f"{platform.telemetry_interval_s:g}"
    sampler = TelemetrySampler(probes, timeline, platform.telemetry_interval_s, platform.monitor_budget)
    sampler.start()
    return sampler, notes
