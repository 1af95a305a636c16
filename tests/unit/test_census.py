"""The census of the machine's CPU over a point: a stranger's busy process is counted and named,
the trial's own processes (this one, its children, its servers) and the sweep's are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator.metrics import census

BURN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"


def stranger() -> int:
    """A process burning a core that is not ours (double-forked: init adopts it)."""
    out = subprocess.run(
        ["sh", "-c", f"setsid {sys.executable} -c '{BURN}' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def test_a_strangers_busy_process_is_foreign_and_named():
    pid = stranger()
    try:
        before = census.snapshot()
        time.sleep(1.5)
        out = census.foreign_cpu(before, census.snapshot(), 1.5, census.tree([os.getpid()]))
    finally:
        os.kill(pid, signal.SIGKILL)
    assert out["cores"] > 0.3
    assert out["top"][0][0] == pid and "while time.time()" in out["top"][0][1]


def test_the_trials_own_the_sweeps_and_the_drivers_processes_are_not_foreign(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", BURN])  # a child of the trial (a client process)
    pid = stranger()
    try:
        before = census.snapshot()
        time.sleep(1.5)
        after = census.snapshot()
        monkeypatch.setenv(census.DRIVER_ENV, str(pid))  # the stranger is the sweep's driver after all
        as_driver = census.foreign_cpu(before, after, 1.5, census.tree([os.getpid()]))
        monkeypatch.delenv(census.DRIVER_ENV)
        claimed = census.foreign_cpu(before, after, 1.5, census.tree([os.getpid()]), lambda p, c: p == pid)
    finally:
        child.kill()
        child.wait()
        os.kill(pid, signal.SIGKILL)
    for out in (as_driver, claimed):
        assert out["cores"] < 0.2 and out["sweep_cores"] > 0.3 and out["top"] == []


def test_no_window_no_census():
    assert census.foreign_cpu(census.snapshot(), census.snapshot(), 0.0, set()) == {
        "cores": 0.0,
        "sweep_cores": 0.0,
        "top": [],
    }
