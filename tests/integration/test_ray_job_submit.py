"""Ray job submission: a sweep submitted to a running Ray cluster's job server runs there (the
job is the sweep's driver and only MLflow writer). The cluster here is a Ray head started
with its dashboard and token authentication, as on a cloud cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, search_runs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    d = tmp_path_factory.mktemp("rayhead")
    token = d / "token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
    )
    dash = _free_port()
    gcs = _free_port()
    head = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "ray"),
            "start",
            "--head",
            f"--port={gcs}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            "--num-cpus=2",
            "--num-gpus=0",
            "--disable-usage-stats",
            "--block",
        ],
        env=env,
        stdout=open(d / "head.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from ray.job_submission import JobSubmissionClient as C; C('{address}').list_jobs()",
            ],
            env=env,
            capture_output=True,
        )
        if p.returncode == 0:
            break
        assert head.poll() is None, (d / "head.log").read_text()[-3000:]
        time.sleep(2)
    else:
        pytest.fail("the Ray job server did not come up: " + (d / "head.log").read_text()[-3000:])
    yield address, env
    # `ray start --block` did not end within 20 s of a SIGTERM on these machines (it was killed
    # then, every run): its daemons share its process group, which is killed after 5 s instead
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=20)


def test_submitted_sweep_runs_on_the_cluster_and_logs_to_mlflow(ray_head, tmp_path):
    address, env = ray_head
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.scheduling.submit",
        "--address",
        address,
        "--",
        "engine=sleep",
        "engine.seconds=1",
        "seed=0,1,2",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "sweep validated locally" in p.stdout and "SUCCEEDED" in p.stdout
    assert "3 FINISHED" in p.stdout  # the job's own log, followed here
    trials = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]
    assert len(trials) == 3 and all(t.info.status == "FINISHED" for t in trials)


def _job_count(address: str, env: dict) -> int:
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from ray.job_submission import JobSubmissionClient as C; print(len(C('{address}').list_jobs()))",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return int(p.stdout.split()[-1])


def test_a_bad_sweep_is_refused_before_submission(ray_head, tmp_path):
    address, env = ray_head
    before = _job_count(address, env)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.scheduling.submit",
            "--address",
            address,
            "--",
            "workload.num_requests=-3",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "nothing was submitted" in p.stderr and "num_requests" in p.stderr, p.stderr
    assert _job_count(address, env) == before
