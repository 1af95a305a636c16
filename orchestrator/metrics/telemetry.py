"""What the hardware did while a trial ran: a time series sampled beside the servers.

One :class:`Timeline` per trial holds long-format rows ``(t, source, name, value)`` on the
clock of the client's records (``time.perf_counter``, CLOCK_MONOTONIC on Linux, shared by
every process of the machine):

* ``servers``: CPU cores busy by the servers' process trees (CPU seconds over wall seconds
  between two rates at least 0.1 s apart), the same CPU seconds summed since the probe's first
  sample (``cpu_s``, from which a window's mean is taken) and their RSS;
* ``machine``: the machine's CPU cores busy (and its busy CPU seconds, ``cpu_s``) and memory used;
* ``gpu<k>``: the trial's GPUs through NVML (nvidia-ml-py), the fields of ``nvidia-smi dmon -s
  pucm``: power (W) and its enforced limit, the energy counter (J, Volta and later), SM and memory utilisation (%),
  memory used, SM and memory clocks, temperature and the throttle reasons bitmask;
* ``cpu_package<k>``: the CPU packages' energy counters (J) where Linux exposes RAPL
  (``/sys/class/powercap``); a VM usually does not, and then energy is *not measured*;
* ``engine``: the engine's gauges (running, waiting, KV-cache usage), added by the resource
  monitor as it scrapes them during load points.

The probes and the sampler that runs them are in :mod:`orchestrator.metrics.probes`. The
arithmetic over a point's window (:func:`window_metrics`, :func:`energy_in_window`,
:func:`cost_metrics`) is here, pure and tested on recorded streams.
"""

from __future__ import annotations

import bisect
import io
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from orchestrator.config.metric_keys import M

log = logging.getLogger(__name__)

now = time.perf_counter  # the clock of the client's records
Row = tuple[float, str, str, float]
RAPL_ROOT = Path("/sys/class/powercap")


class Background:
    """A daemon thread that runs ``loop(stop)`` until :meth:`stop`: how the samplers run beside a
    measurement. Each start has a fresh stop event, so a slow thread of an earlier start cannot be
    revived by a later one."""

    JOIN_S = 5.0

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: Callable[[threading.Event], None]) -> None:
        self.stop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=loop, args=(self._stop,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop the thread and wait for it (``JOIN_S`` at most); whether one was running. Idempotent."""
        self._stop.set()
        if self._thread is None:
            return False
        self._thread.join(timeout=self.JOIN_S)
        self._thread = None
        return True


class Timeline:
    """Rows ``(t, source, name, value)``, appended from several threads."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._lock = threading.Lock()

    def add(self, t: float, source: str, values: dict[str, float]) -> None:
        with self._lock:
            self.rows.extend((t, source, name, float(v)) for name, v in values.items())

    def snapshot(self) -> list[Row]:
        with self._lock:
            return list(self.rows)

    def to_parquet(self) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = self.snapshot()
        table = pa.table(
            {
                "t": pa.array([r[0] for r in rows], pa.float64()),
                "source": pa.array([r[1] for r in rows], pa.string()),
                "name": pa.array([r[2] for r in rows], pa.string()),
                "value": pa.array([r[3] for r in rows], pa.float64()),
            }
        )
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()


def rows_from_parquet(data: bytes) -> list[Row]:
    import pyarrow.parquet as pq

    if not data:
        return []
    t = pq.read_table(io.BytesIO(data)).to_pydict()
    return list(zip(t["t"], t["source"], t["name"], t["value"]))


# --------------------------------------------------------------------------- arithmetic


def series(rows: Iterable[Row], source: str, name: str) -> tuple[list[float], list[float]]:
    """(times, values) of one series, in time order."""
    pts = sorted((t, v) for t, s, n, v in rows if s == source and n == name)
    return [t for t, _ in pts], [v for _, v in pts]


def ratio_of_deltas(
    rows: Iterable[Row], source: str, numerator: str, denominator: str
) -> tuple[list[float], list[float]]:
    """Between consecutive samples of two counters: (time, delta numerator / delta denominator)
    where the denominator moved (e.g. the prefix-cache hit rate of each scrape interval). A
    counter that went down (the engine restarted) starts over."""
    num = dict(zip(*series(rows, source, numerator), strict=True))
    den = dict(zip(*series(rows, source, denominator), strict=True))
    times = sorted(set(num) & set(den))
    out_t, out_v = [], []
    for t0, t1 in zip(times, times[1:], strict=False):
        dd, dn = den[t1] - den[t0], num[t1] - num[t0]
        if dd > 0 and dn >= 0:
            out_t.append(t1)
            out_v.append(dn / dd)
    return out_t, out_v


def interp_at(ts: Sequence[float], vs: Sequence[float], t: float) -> float:
    """Linear interpolation inside the samples, the nearest sample outside them."""
    if t <= ts[0]:
        return vs[0]
    if t >= ts[-1]:
        return vs[-1]
    i = next(k for k in range(1, len(ts)) if ts[k] >= t)
    t0, t1 = ts[i - 1], ts[i]
    return vs[i - 1] + (vs[i] - vs[i - 1]) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)


def mean_rate(rows: Iterable[Row], source: str, counter: str, t0: float, t1: float) -> float | None:
    """A cumulative counter's mean rate over [t0, t1] (e.g. CPU seconds per second: cores busy),
    interpolated between its samples; None unless samples span the window (the counter is
    not extrapolated)."""
    ts, vs = series(rows, source, counter)
    if not ts or ts[0] > t0 or ts[-1] < t1 or t1 <= t0:
        return None
    return max(interp_at(ts, vs, t1) - interp_at(ts, vs, t0), 0.0) / (t1 - t0)


def integrate(ts: Sequence[float], vs: Sequence[float], t0: float, t1: float) -> float:
    """The integral of a sampled signal over [t0, t1] (trapezoids; held flat beyond the samples)."""
    if not ts or t1 <= t0:
        return 0.0
    knots = [t0, *(t for t in ts if t0 < t < t1), t1]
    vals = [interp_at(ts, vs, t) for t in knots]
    return sum((knots[i + 1] - knots[i]) * (vals[i] + vals[i + 1]) / 2 for i in range(len(knots) - 1))


def integrate_averaged(ts: Sequence[float], vs: Sequence[float], t0: float, t1: float, window_s: float = 1.0) -> float:
    """The integral over [t0, t1] of a signal sampled as means over the ``window_s`` seconds
    before each sample (NVML's power on Ampere, GA100 excepted, and later: the mean over the
    last second). Each sample fixes the energy of its own window exactly, so the running total
    is built from them: ``E(s) = E(s - window_s) + window_s * v(s)``, with ``E`` between known
    points read by interpolation. Samples closer than the window (the sampler's extra reads at a
    point's edges) then count each second once; where samples are further apart than the window,
    the uncovered time takes the mean of the two values beside it. Before the first sample and
    after the last the signal holds.

    On the lent H200 (1 s samples with reads at the edges) this read -0.3% on a steady load,
    +1.7% over the 6 s decay after it and +0.1% on a 1.5 s burst. Holding each value since the
    sample before read -3.5%, +18% and -13% there (the reads at the edges are half a second apart
    but each still averages the whole second before it), and trapezoids -9%, +49% and -34%."""
    pairs = [(t, v) for t, v in zip(ts, vs, strict=True) if math.isfinite(v)]  # a bad read spoils no window
    if not pairs or t1 <= t0:
        return 0.0
    ts, vs = [t for t, _ in pairs], [v for _, v in pairs]
    knots, total = _running_energy(ts, vs, window_s)
    return _energy_at(knots, total, vs[0], vs[-1], t1) - _energy_at(knots, total, vs[0], vs[-1], t0)


def _running_energy(ts: Sequence[float], vs: Sequence[float], w: float) -> tuple[list[float], list[float]]:
    """Knots and the running energy at them, for :func:`integrate_averaged` (``ts`` not empty)."""
    knots, total = [ts[0] - w, ts[0]], [0.0, w * vs[0]]
    before = vs[0]
    for t, v in zip(ts[1:], vs[1:], strict=True):
        if t <= knots[-1]:
            continue
        a = t - w
        if a >= knots[-1]:  # a gap longer than the window: its uncovered part, by the values beside it
            at_a = total[-1] + (a - knots[-1]) * (before + v) / 2
            if a > knots[-1]:
                knots.append(a)
                total.append(at_a)
        else:
            at_a = _energy_at(knots, total, vs[0], before, a)
        knots.append(t)
        total.append(max(at_a + w * v, total[-1]))  # never less energy than before: noise, not a negative draw
        before = v
    return knots, total


def _energy_at(knots: list[float], total: list[float], first: float, last: float, t: float) -> float:
    if t <= knots[0]:
        return total[0] - (knots[0] - t) * first
    if t >= knots[-1]:
        return total[-1] + (t - knots[-1]) * last
    i = bisect.bisect_right(knots, t) - 1
    return total[i] + (total[i + 1] - total[i]) * (t - knots[i]) / (knots[i + 1] - knots[i])


def power_window(rows: Sequence[Row], source: str) -> float:
    """Seconds ``source``'s power readings average over, as its probe recorded them
    (``power_window_s``: 0 for instant readings); 1 for a timeline from before it was recorded."""
    recorded = series(rows, source, "power_window_s")[1]
    return recorded[-1] if recorded else 1.0


def energy_in_window(
    counter: tuple[Sequence[float], Sequence[float]],
    power: tuple[Sequence[float], Sequence[float]],
    t0: float,
    t1: float,
    averaged_s: float = 1.0,
) -> tuple[float | None, str]:
    """Joules over [t0, t1] and how they were found: the energy counter's delta when two of its
    samples bracket the window (read at the window's edges by interpolation), else the power
    samples integrated: as means over the ``averaged_s`` seconds before each read
    (:func:`integrate_averaged`), or as instant readings (trapezoids, :func:`integrate`) where
    ``averaged_s`` is 0 (NVML on GA100 and older GPUs); (None, "none") without either."""
    ct, cv = counter
    if len(ct) >= 2 and ct[0] <= t0 and ct[-1] >= t1:
        return interp_at(ct, cv, t1) - interp_at(ct, cv, t0), "counter"
    pt, pv = power
    if len(pt) >= 2:
        if averaged_s > 0:
            return integrate_averaged(pt, pv, t0, t1, averaged_s), "power"
        return integrate(pt, pv, t0, t1), "power"
    return None, "none"


def window_metrics(rows: Sequence[Row], t0: float, t1: float) -> dict[str, float]:
    """A load point's telemetry over its window [t0, t1]: the servers' CPU cores (the mean from
    the cumulative ``cpu_s`` over the window, the max of the rates sampled inside it) and RSS
    (max), the machine's CPU, every GPU's power, utilisation, clocks and temperature (mean over
    the GPUs and samples; power summed over GPUs), and energy (J) where it was measured.

    A rate or an average stamped ``t`` (CPU cores, NVML's power and utilisation) covers the time
    before ``t``: the one stamped at the window's start is not the window's."""
    inside = [r for r in rows if t0 <= r[0] <= t1]
    after = [r for r in inside if r[0] > t0]
    out: dict[str, float] = {}

    def stat(among: Sequence[Row], source: str, name: str, key: str, how: Callable[[list[float]], float]) -> None:
        vals = [v for _, s, n, v in among if s == source and n == name]
        if vals:
            out[key] = how(vals)

    for source, key in (("servers", "server"), ("machine", "machine")):
        mean = mean_rate(rows, source, "cpu_s", t0, t1)
        if mean is not None:
            out[f"telemetry_{key}_cpu_cores_mean"] = mean
        else:  # a timeline without the cumulative counter: the mean of the samples
            stat(after, source, "cpu_cores", f"telemetry_{key}_cpu_cores_mean", _mean)
    stat(after, "servers", "cpu_cores", M.TELEMETRY_SERVER_CPU_CORES_MAX, max)
    stat(inside, "servers", "rss_gb", M.TELEMETRY_SERVER_RSS_GB_MAX, max)
    stat(inside, "machine", "mem_used_gb", M.TELEMETRY_MACHINE_MEM_USED_GB_MAX, max)
    gpus = sorted({s for _, s, _, _ in rows if s.startswith("gpu")})
    if gpus:
        _gpu_window(rows, inside, after, gpus, t0, t1, out)
    packages = sorted({s for _, s, _, _ in rows if s.startswith("cpu_package")})
    if packages and not gpus:
        joules = [energy_in_window(series(rows, p, "energy_j"), ([], []), t0, t1)[0] for p in packages]
        if all(j is not None for j in joules):
            out[M.ENERGY_J] = float(sum(j for j in joules if j is not None))
    return out


def _gpu_window(
    rows: Sequence[Row],
    inside: Sequence[Row],
    after: Sequence[Row],
    gpus: list[str],
    t0: float,
    t1: float,
    out: dict[str, float],
) -> None:
    """``after``: the samples inside the window but its start (power, utilisation, clocks and
    throttling are NVML's averages over the time before a sample); temperature: ``inside``."""
    times = sorted({t for t, s, n, _ in after if s in gpus and n == "power_w"})
    power_at = [sum(v for t2, s, n, v in after if t2 == t and s in gpus and n == "power_w") for t in times]
    if power_at:
        out[M.TELEMETRY_GPU_POWER_W_MEAN] = _mean(power_at)
        out[M.TELEMETRY_GPU_POWER_W_MAX] = max(power_at)
    limits = [sum(v for t2, s, n, v in after if t2 == t and s in gpus and n == "power_limit_w") for t in times]
    if any(limits):  # summed over the GPUs, as their power is
        out[M.TELEMETRY_GPU_POWER_LIMIT_W_MEAN] = _mean(limits)
    for name, key in (
        ("sm_util_pct", M.TELEMETRY_GPU_SM_UTIL_PCT_MEAN),
        ("mem_util_pct", M.TELEMETRY_GPU_MEM_UTIL_PCT_MEAN),
        ("sm_clock_mhz", M.TELEMETRY_GPU_SM_CLOCK_MHZ_MEAN),
    ):
        vals = [v for _, s, n, v in after if s in gpus and n == name]
        if vals:
            out[key] = _mean(vals)
    temps = [v for _, s, n, v in inside if s in gpus and n == "temp_c"]
    if temps:
        out[M.TELEMETRY_GPU_TEMP_C_MAX] = max(temps)
    throttled = [v for _, s, n, v in after if s in gpus and n == "throttle_reasons"]
    if throttled:  # bit 0 is "GPU idle": not a throttle
        out[M.TELEMETRY_GPU_THROTTLED_SHARE] = sum(1 for v in throttled if int(v) & ~1) / len(throttled)
    total, methods = 0.0, set()
    for g in gpus:
        averaged = power_window(rows, g)
        joules, method = energy_in_window(series(rows, g, "energy_j"), series(rows, g, "power_w"), t0, t1, averaged)
        if joules is None:
            return
        total += joules
        methods.add(method)
    out[M.ENERGY_J] = total
    out[M.ENERGY_FROM_COUNTER] = 1.0 if methods == {"counter"} else 0.0


def _mean(vals: Sequence[float]) -> float:
    return sum(vals) / len(vals)


def energy_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Joules per output token and per request, tokens per joule, from a point's ``energy_j``."""
    joules = metrics.get(M.ENERGY_J)
    if joules is None or joules <= 0:
        return {}
    out: dict[str, float] = {}
    tokens, requests = metrics.get(M.OUTPUT_TOKENS, 0.0), metrics.get(M.COMPLETED, 0.0)
    if tokens:
        out[M.JOULES_PER_OUTPUT_TOKEN] = joules / tokens
        out[M.OUTPUT_TOKENS_PER_JOULE] = tokens / joules
    if requests:
        out[M.JOULES_PER_REQUEST] = joules / requests
    return out


def cost_metrics(metrics: Mapping[str, float], price_per_hour: float | None, devices: float) -> dict[str, float]:
    """What a point's tokens cost: ``price_per_hour`` per device (GPU-hour, or node-hour on the
    CPU) for the ``devices`` the trial held, over the point's ``duration_s``. No price: nothing
    (the trial says "no price set"; never $0)."""
    duration, out_tokens = metrics.get(M.DURATION_S), metrics.get(M.OUTPUT_TOKENS, 0.0)
    if price_per_hour is None or not duration or not out_tokens:
        return {}
    cost = price_per_hour * devices * duration / 3600.0
    total_tokens = out_tokens + metrics.get(M.INPUT_TOKENS, 0.0)
    return {
        M.COST_USD: cost,
        M.COST_PER_MTOK_OUTPUT: cost / out_tokens * 1e6,
        M.COST_PER_MTOK_TOTAL: cost / total_tokens * 1e6,
    }


def hardware_metrics(
    rows: Sequence[Row],
    window: tuple[float, float],
    metrics: Mapping[str, float],
    price_per_hour: float | None,
    devices: float,
) -> dict[str, float]:
    """What the hardware did over a point's ``window``, the energy per token and request where
    energy was measured, and the cost of the point's tokens where a price is set (per hour of
    ``devices``: the trial's GPUs, or one CPU node)."""
    out = window_metrics(rows, *window)
    out.update(energy_metrics({**metrics, **out}))
    out.update(cost_metrics(metrics, price_per_hour, devices))
    return out
