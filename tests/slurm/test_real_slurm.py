"""A real SLURM on localhost (`make test-slurm`): Debian's slurm-wlm and munge, one
controller and one node daemon started by ``slurm/local-cluster.sh``. The rendered sbatch
script of a tiny sweep is submitted with ``python -m orchestrator.scheduling.slurm --submit``;
the job starts a Ray head inside the allocation, runs the sweep against it, stops Ray; the
sweep's runs must land in MLflow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, search_runs

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    missing = [
        b
        for b in ("slurmctld", "slurmd", "munged", "sbatch")
        if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}")
    ]
    if missing or os.geteuid() != 0:
        pytest.skip(
            f"needs root and Debian's slurm-wlm + munge (`make test-slurm` installs them); missing: {missing or 'root'}"
        )
    state = tmp_path_factory.mktemp("slurm")
    script = str(ROOT / "slurm" / "local-cluster.sh")
    start = subprocess.run([script, "start", str(state)], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stdout + start.stderr
    env = dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
    yield env
    subprocess.run([script, "stop", str(state)], timeout=60)


def _wait_for_job(job_id: str, env: dict, timeout_s: float) -> str:
    """The job's final state, from scontrol (no accounting database here)."""
    deadline = time.monotonic() + timeout_s
    state = "?"
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env)
        m = re.search(r"JobState=(\w+)", out.stdout)
        state = m.group(1) if m else "GONE"
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(2)
    subprocess.run(["scancel", job_id], env=env)
    return f"TIMEOUT (last state {state})"


def test_sbatch_sweep_lands_in_mlflow(slurm_cluster, tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.scheduling.slurm",
        "--job-name",
        "slurm-test",
        "--nodes",
        "1",
        "--gpus-per-node",
        "0",
        "--cpus-per-node",
        str(os.cpu_count()),
        "--mem",
        "4G",
        "--time",
        "00:10:00",
        "--activate",
        f"source {ROOT}/.venv/bin/activate",
        "--log-dir",
        str(logs),
        "--ray-port",
        "6391",
        "--head-wait-s",
        "5",
        "--out",
        str(tmp_path / "sweep.sbatch"),
        "--submit",
        "--",
        "engine=sleep",
        "engine.seconds=1",
        "seed=0,1,2",
        "platform=gpu",
        "platform.cpus_per_trial=1",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    sub = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=slurm_cluster, timeout=60)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job_id = re.search(r"Submitted batch job (\d+)", sub.stdout).group(1)

    state = _wait_for_job(job_id, slurm_cluster, timeout_s=600)
    out = "\n".join(p.read_text(errors="replace") for p in logs.glob("slurm-test-*.out"))
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{out[-4000:]}"
    assert "all 1 Ray nodes up" in out and "3 FINISHED" in out, out[-4000:]

    runs = search_runs(store, "default")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 3 and all(r.info.status == "FINISHED" for r in children)
    assert not list(logs.glob(".ray-auth-*")), "the job's Ray token file should be removed at the end"
    # Ray was stopped by the job: nothing of it is left on this machine.
    left = subprocess.run(["pgrep", "-f", "gcs_server.*6391"], capture_output=True, text=True).stdout
    assert not left.strip(), left
