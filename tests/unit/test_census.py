"""The census of the machine's CPU over a point: a stranger's busy process is counted and named,
the trial's own processes (this one, its children, its servers) and the sweep's are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.metrics import census

pytestmark = pytest.mark.measures

BURN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"


def stranger() -> int:
    """A process burning a core that is not ours (double-forked: init adopts it)."""
    env = {k: v for k, v in os.environ.items() if k != census.DRIVER_ENV}  # not started by a sweep
    out = subprocess.run(
        ["sh", "-c", f"setsid {sys.executable} -c '{BURN}' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return int(out.stdout.strip())


@pytest.mark.parametrize("driver", [None, "1"])
def test_a_strangers_busy_process_is_foreign_and_named(monkeypatch, driver):
    if driver is None:
        monkeypatch.delenv(census.DRIVER_ENV, raising=False)
    else:  # a sweep's trial: the driver known, the stranger does not carry it
        monkeypatch.setenv(census.DRIVER_ENV, driver)
    pid = stranger()
    try:
        before = census.snapshot()
        time.sleep(1.5)
        out = census.foreign_cpu(before, census.snapshot(), 1.5, census.tree([os.getpid()]), top=100)
    finally:
        os.kill(pid, signal.SIGKILL)
    mine = [x for x in out["top"] if x[0] == pid]  # (the machine may be busy with more than the stranger)
    assert out["cores"] > 0.3 and mine and mine[0][2] > 0.3 and "while time.time()" in mine[0][1]


def test_the_trials_own_the_sweeps_and_the_drivers_processes_are_not_foreign(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", BURN])  # a child of the trial (a client process)
    pid = stranger()
    try:
        before = census.snapshot()
        time.sleep(1.5)
        after = census.snapshot()
        monkeypatch.setenv(census.DRIVER_ENV, str(pid))  # the stranger is the sweep's driver after all
        trial = census.tree([os.getpid()])
        as_driver = census.foreign_cpu(before, after, 1.5, trial, top=100)
        monkeypatch.delenv(census.DRIVER_ENV)
        claimed = census.foreign_cpu(before, after, 1.5, trial, lambda p, c: p == pid, top=100)
    finally:
        child.kill()
        child.wait()
        os.kill(pid, signal.SIGKILL)
    for out in (as_driver, claimed):  # neither the stranger (now the sweep's) nor our child is foreign
        assert out["sweep_cores"] > 0.3 and not [x for x in out["top"] if x[0] in (pid, child.pid)]


def test_no_window_no_census():
    assert census.foreign_cpu(census.snapshot(), census.snapshot(), 0.0, set()) == {
        "cores": 0.0,
        "sweep_cores": 0.0,
        "top": [],
    }
