"""The driver-signal faults, repeated on a busy machine (`make stress-faults`, not in CI: it is
long): SIGTERM, SIGINT and SIGKILL to the driver of a sweep in the middle of a load point,
``STRESS_REPEATS`` times each (default 10), while a CPU burner keeps every core busy. Each
time, every engine process of the run must be gone within 10 s; a leftover fails with its
parent, process group, session and state (tests.conftest.wait_no_engines). The time each run
took to leave nothing behind is printed and appended to ``$STRESS_LOG`` (default
test-artifacts/stress-faults.tsv) for docs/reliability.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, engine_processes, wait_no_engines
from tests.faults.test_faults import _finish, _read_until, _start

pytestmark = [pytest.mark.stress, pytest.mark.timeout(900)]

REPEATS = int(os.environ.get("STRESS_REPEATS", "10"))
LOG = Path(os.environ.get("STRESS_LOG", str(ROOT / "test-artifacts" / "stress-faults.tsv")))
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}


@pytest.fixture(scope="module")
def busy_machine():
    """One spinning process per core for the whole module (the machine a CI run shares)."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]
    yield len(burners)
    for b in burners:
        b.kill()
        b.wait()


@pytest.mark.parametrize("round_", range(REPEATS))
@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_to_the_driver_leaves_nothing_on_a_busy_machine(tmp_path, busy_machine, name, round_):
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "workload.classes={main:{input_tokens:64,output_tokens:32}}",
        "engine.max_model_len=512",
        "workload.load_points=[{concurrency:2},{concurrency:2,num_requests:400}]",
        "workload.num_requests=4",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "-m",
    ]
    proc, lines = _start(cmd), []
    try:
        _read_until(proc, lines, lambda s: "point 2/2" in s and "running" in s, timeout=600)
        time.sleep(2)
        assert engine_processes(), "no engine process to stop"
        proc.send_signal(SIGNALS[name])  # the driver only, as a scheduler or `kill` does
        gone_after = wait_no_engines(10)
    finally:
        _finish(proc, lines, timeout=120)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as f:
        f.write(f"{name}\t{round_}\t{busy_machine}\t{gone_after:.2f}\n")
    print(f"{name} round {round_}: engine processes gone {gone_after:.1f} s after the signal")
