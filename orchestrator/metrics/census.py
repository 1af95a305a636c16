"""Who used the machine's CPU over a load point: a census of every process's CPU time at the
point's start and end, split into the trial (its servers, its client), the sweep's own
processes (Ray, the driver, concurrent trials' servers) and everything else, the *foreign* CPU
that a shared machine takes from the measurement (issue 33: a point measured beside somebody
else's busy process is named, not measured silently)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

# The sweep's driver sets this to its pid: trials on this machine (Ray workers inherit the
# driver's environment) count it as the sweep's, whatever its command line (e.g. pytest).
DRIVER_ENV = "INFERENCE_LAB_SWEEP_DRIVER"
# Command lines of the sweep's own machinery: Ray's daemons and workers, our driver.
SWEEP_MARKERS = ("raylet", "gcs_server", "ray::", "ray/dashboard", "ray/_private", "-m orchestrator", "log_monitor")


@dataclass(frozen=True)
class Snapshot:
    """Every process's CPU seconds (user + system) at one instant, keyed by (pid, start time)."""

    cpu_s: dict[tuple[int, float], float]


def snapshot() -> Snapshot:
    out: dict[tuple[int, float], float] = {}
    for proc in psutil.process_iter(["create_time", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None or info.get("create_time") is None:
            continue
        out[(proc.pid, float(info["create_time"]))] = float(times.user + times.system)
    return Snapshot(out)


def tree(pids: Iterable[int]) -> set[int]:
    """The processes and all their descendants that are alive now."""
    out: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            out.add(pid)
            out.update(c.pid for c in root.children(recursive=True))
        except psutil.Error:
            continue
    return out


def _command(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return " ".join(proc.cmdline()) or f"[{proc.name()}]"
    except psutil.Error:
        return "?"


def _carries(pid: int, driver: str) -> bool:
    """The process's environment names this sweep's driver (Ray's daemons and workers it started)."""
    try:
        return bool(psutil.Process(pid).environ().get(DRIVER_ENV) == driver)
    except psutil.Error:
        return False


def foreign_cpu(
    before: Snapshot,
    after: Snapshot,
    seconds: float,
    trial: set[int],
    is_sweep: Callable[[int, str], bool] | None = None,
    top: int = 3,
) -> dict[str, object]:
    """CPU cores used over ``seconds`` by processes outside ``trial`` (pids) and outside the
    sweep (Ray, the driver, and whatever ``is_sweep(pid, command)`` claims, e.g. concurrent
    trials' servers): ``cores``, ``sweep_cores`` and the ``top`` foreign processes as
    ``[pid, command, cores]``. A process started during the window counts all its CPU time."""
    if seconds <= 0:
        return {"cores": 0.0, "sweep_cores": 0.0, "top": []}
    used: dict[int, float] = {}
    for (pid, started), cpu in after.cpu_s.items():
        if pid in trial or pid == os.getpid():
            continue
        delta = cpu - before.cpu_s.get((pid, started), 0.0)
        if delta > 0:
            used[pid] = used.get(pid, 0.0) + delta
    # With the driver known (a local Ray inherits its environment), the sweep's processes are
    # the driver and what carries its mark (``is_sweep``): another sweep's Ray and servers on this
    # machine are foreign. Without it (a cluster started by `ray start`), Ray's by their names.
    driver = os.environ.get(DRIVER_ENV, "")
    foreign, sweep = 0.0, 0.0
    named: list[tuple[int, str, float]] = []
    for pid, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        cores = cpu / seconds
        if cores < 0.01:  # a blip: not worth a look at its command line
            foreign += cores
            continue
        command = _command(pid)
        ours = (str(pid) == driver or _carries(pid, driver)) if driver else any(m in command for m in SWEEP_MARKERS)
        if ours or (is_sweep is not None and is_sweep(pid, command)):
            sweep += cores
            continue
        foreign += cores
        named.append((pid, command[:160], round(cores, 3)))
    return {"cores": round(foreign, 3), "sweep_cores": round(sweep, 3), "top": [list(x) for x in named[:top]]}
