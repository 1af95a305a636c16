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


def _task_running(marker: str) -> bool:
    import psutil

    def is_task(cmdline: list[str]) -> bool:  # not srun, nor its owner: their argv hold the task's too
        return (
            bool(cmdline)
            and os.path.basename(cmdline[0]) != "srun"
            and f"time.sleep(600)  # {marker}" in " ".join(cmdline)
        )

    return any(is_task(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def _wait(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.3)
    return condition()


# A server's stand-in, started through srun (engine.launch_prefix) by an owner process.
OWNER = """
import os, sys, time
from pathlib import Path
from orchestrator.engines.process import ServerProcess
marker, log = sys.argv[1], Path(sys.argv[2])
server = ServerProcess(["srun", "-n1", sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"], dict(os.environ), log,
                       "http://127.0.0.1:9/health", stop_grace_s=2.0)
server.start()
print(server.pid, flush=True)
for line in sys.stdin:  # "stop": stop it as a trial does; EOF or a KILL: die without stopping it
    server.stop()
    print("stopped", flush=True)
"""


@pytest.mark.parametrize("owner_killed", [False, True], ids=["owner-stops-it", "owner-killed-too"])
def test_a_server_whose_srun_was_killed_has_its_slurm_step_cancelled(slurm_cluster, tmp_path, owner_killed):
    """``engine.launch_prefix=[srun, ...]``: the server runs in a Slurm step. A KILLed srun (Ray
    killing a dead worker's children, the OOM killer) left the step running, the engine holding the
    node's GPUs until the allocation ended. Now the step is cancelled by the owner's stop, or, with
    the owner KILLed too, by its watchdog; no task of it is left."""
    import psutil

    marker = f"il-srun-{os.getpid()}-{int(owner_killed)}"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, marker, str(tmp_path / "server.log")],
        cwd=ROOT,
        env=slurm_cluster,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        srun = psutil.Process(int(owner.stdout.readline()))
        assert _wait(lambda: _task_running(marker), 60), (tmp_path / "server.log").read_text()
        # Owner first, as when a Ray worker dies and then its children are KILLed. The watchdog may
        # cancel the step at once, so that the step outlived its srun is not asserted here, only in
        # the other case; without the cancel, both cases failed (2026-12-04).
        if owner_killed:
            owner.kill()
        for p in [*srun.children(recursive=True), srun]:  # every srun of the group
            if os.path.basename((p.cmdline() or [""])[0]) == "srun":
                p.kill()
        time.sleep(2)
        if not owner_killed:
            assert _task_running(marker), "the step ended with its srun: nothing left to test"
            owner.stdin.write("stop\n")
            owner.stdin.flush()
            assert owner.stdout.readline().strip() == "stopped"
        gone = _wait(lambda: not _task_running(marker), 30)
        queue = subprocess.run(["squeue", "-h", "-s"], capture_output=True, text=True, env=slurm_cluster).stdout
        assert gone, f"the Slurm step outlived its srun; squeue -s: {queue}"
    finally:
        owner.kill()
        owner.wait()
        for p in psutil.process_iter(["cmdline"]):  # what a failure left: not for the next test to find
            if f"# {marker}" in " ".join(p.info["cmdline"] or []):
                p.kill()
