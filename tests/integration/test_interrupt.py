"""Ctrl-C during a sweep: servers stop, measured points are kept and logged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, search_runs, wait_no_engines

pytestmark = pytest.mark.integration


@pytest.mark.long  # in CI another way: SIGTERM to the driver mid-point (faults/test_faults.py), the same stop
def test_ctrl_c_mid_trial_stops_everything_and_keeps_measured_points(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine.max_num_seqs=4,8",
        "workload.classes={main:{input_tokens:64,output_tokens:32}}",
        "workload.load_points=[{concurrency:2},{concurrency:2,num_requests:400}]",
        "workload.num_requests=6",
        "engine.max_model_len=512",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "-m",
    ]
    # Its own process group, like a terminal's foreground job: Ctrl-C reaches the whole group.
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "point 2/2" in line and "running" in line:
                break
        else:
            pytest.fail("the first load point never finished:\n" + "".join(lines[-30:]))
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        lines.append(out)
        exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(lines)
    assert proc.returncode == 130, text[-3000:]
    wait_no_engines(10)  # fails with every leftover's parent, group and state
    assert exit_s < 60, f"the driver took {exit_s:.0f} s to stop"
    assert "kept 1 measured load point" in text
    trials = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]
    assert len(trials) == 1 and trials[0].info.status == "FAILED"
    assert "interrupted after 1 of 2 load points" in trials[0].data.tags["error"]
    assert "c2/ttft_ms_p50" in trials[0].data.metrics
