"""Trials lost with their Ray worker are run again (each attempt recorded); trials that fail
by themselves are not. The worker really dies (``os._exit``) inside a local Ray."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.config import to_specs

pytestmark = pytest.mark.timeout(300)
PLANTED = "hf_PLANTEDtoken0123456789"  # a lost worker could not scrub its raw logs: the driver does


def _result(spec_json: str, status: str, error: str | None = None) -> dict:
    from orchestrator.config.schema import TrialSpec
    from orchestrator.metrics.result import TrialResult

    spec = TrialSpec.model_validate_json(spec_json)
    now = time.time()
    return TrialResult(
        trial_hash="x" * 16,
        experiment=spec.experiment,
        spec={},
        status=status,
        error=error,
        started_at=now,
        ended_at=now,
        hardware={"ray_node_id": "n" * 56},
    ).model_dump()


def crash_once(spec_json: str, workdir: str, overrides: list[str]) -> dict:
    """First attempt: writes a partial result, then the worker process dies. Later: finishes."""
    import ray

    from orchestrator.scheduling.attempts import note_attempt

    note_attempt(workdir, ray.get_runtime_context().get_node_id())
    if not (Path(workdir) / "partial.json").exists() and not list(Path(workdir).glob("attempt-*")):
        (Path(workdir) / "partial.json").write_text('{"points": 1}')
        (Path(workdir) / "server.live.log").write_text(f"token {PLANTED}\n")  # a server echoed it
        os._exit(1)
    return _result(spec_json, "FINISHED")


def always_crash(spec_json: str, workdir: str, overrides: list[str]) -> dict:
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "server.live.log").write_text(f"token {PLANTED}\n")
    os._exit(1)


def raises(spec_json: str, workdir: str, overrides: list[str]) -> dict:
    raise ValueError("a bug in the trial body")


def server_exits_at_start(spec_json: str, workdir: str, overrides: list[str]) -> dict:
    Path(workdir).mkdir(parents=True, exist_ok=True)
    with open(Path(workdir) / "calls", "a") as f:
        f.write("x")
    return _result(spec_json, "FAILED", "server exited during start-up (exit code 1): unrecognized argument")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    # address="local": a Ray of its own, as the product starts one (a plain ray.init() joins a
    # cluster another test process started)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


def _jobs(compose, n=1):
    from orchestrator.scheduling.jobs import TrialJob

    jobs = []
    for i in range(n):
        overrides = ["engine=sleep", f"seed={i}", "platform.cpus_per_trial=1"]
        spec, settings = to_specs(compose(overrides))
        jobs.append(TrialJob(i, overrides, spec, settings))
    return jobs


def _run(jobs, tmp_path, task, max_attempts=3):
    from orchestrator.scheduling.ray_exec import run_jobs

    lines: list[str] = []
    out = list(run_jobs(jobs, lambda j: str(tmp_path / str(j.index)), None, task, max_attempts, lines.append))
    return [r for _, r in out], lines


def test_a_lost_worker_is_retried_and_both_attempts_are_recorded(local_ray, compose, tmp_path):
    (result,), lines = _run(_jobs(compose), tmp_path, crash_once)
    assert result.status == "FINISHED"
    first, second = result.attempts
    assert first["outcome"] == "LOST" and "WorkerCrashedError" in first["error"]
    assert first["node_id"] == local_ray.get_runtime_context().get_node_id()
    assert second["outcome"] == "FINISHED" and second["attempt"] == 2
    # what the lost attempt wrote is kept aside, not overwritten by the next attempt
    assert json.loads((tmp_path / "0" / "attempt-1" / "partial.json").read_text()) == {"points": 1}
    assert first["kept_in"] == str(tmp_path / "0" / "attempt-1")
    assert len((tmp_path / "0" / "attempts.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "0" / "attempt-1" / "server.live.log").read_text() == "token ***\n"
    assert any("attempt 1 lost (WorkerCrashedError" in line and "(2/3)" in line for line in lines), lines


def test_attempts_are_bounded(local_ray, compose, tmp_path):
    (result,), lines = _run(_jobs(compose), tmp_path, always_crash, max_attempts=2)
    assert result.status == "FAILED" and "WorkerCrashedError" in result.error
    assert [a["outcome"] for a in result.attempts] == ["LOST", "FAILED"]
    logs = sorted(tmp_path.rglob("server.live.log"))
    assert len(logs) == 2 and all(p.read_text() == "token ***\n" for p in logs), logs
    assert len(lines) == 1


def test_deterministic_failures_are_not_retried(local_ray, compose, tmp_path):
    jobs = _jobs(compose, 2)
    from orchestrator.scheduling.ray_exec import run_jobs

    bug = list(run_jobs(jobs[:1], lambda j: str(tmp_path / str(j.index)), None, raises, 3, print))[0][1]
    assert bug.status == "FAILED" and "a bug in the trial body" in bug.error
    assert [a["outcome"] for a in bug.attempts] == ["FAILED"]
    bad_flag = list(run_jobs(jobs[1:], lambda j: str(tmp_path / str(j.index)), None, server_exits_at_start, 3, print))[
        0
    ][1]
    assert bad_flag.status == "FAILED" and len(bad_flag.attempts) == 1
    assert (tmp_path / "1" / "calls").read_text() == "x", "a server that fails at start ran exactly once"


def test_attempts_reach_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.metrics.result import TrialResult
    from orchestrator.tracking import MlflowTracker

    now = time.time()
    result = TrialResult(
        trial_hash="a" * 16,
        experiment="e",
        spec={},
        status="FINISHED",
        started_at=now,
        ended_at=now,
        attempts=[
            {"attempt": 1, "outcome": "LOST", "error": "NodeDiedError: node abc died", "node_id": "abc"},
            {"attempt": 2, "outcome": "FINISHED", "node_id": "def"},
        ],
    )
    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = MlflowTracker(uri, "e")
    run_id = tracker.log_trial(result, tmp_path)
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.metrics["attempts"] == 2
    assert "#1 node abc: NodeDiedError" in run.data.tags["lost_attempts"]


def test_a_local_ray_ignores_a_stale_cluster_address():
    """A killed `ray start` leaves /tmp/ray/ray_current_cluster (or RAY_ADDRESS) behind; a
    plain ray.init() would try to join that dead cluster for minutes. The driver's local Ray
    does not."""
    import subprocess
    import sys

    code = (
        "from orchestrator.config.schema import ClusterSpec\n"
        "from orchestrator.scheduling.ray_exec import init_ray\n"
        "import ray\n"
        "ctx = init_ray(ClusterSpec(num_cpus=1))\n"
        "print('cpus', ray.cluster_resources()['CPU'])\n"
        "ctx.shutdown()\n"
    )
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:9")  # nothing listens there
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "cpus 1.0" in p.stdout, p.stderr[-2000:]


def test_a_dead_tasks_error_hides_the_servers_api_key(compose, monkeypatch):
    """A task that died is reported by the driver with the error Ray gave; a key the server was
    started with (read from ``engine.api_key_env``) is hidden in it like the config's secrets."""
    from orchestrator.scheduling.jobs import TrialJob
    from orchestrator.scheduling.ray_exec import _results_of

    monkeypatch.setenv("LAB_TEST_SERVER_KEY", "zebra-orchard-42")  # a passphrase: no token's look
    overrides = ["engine.api_key_env=LAB_TEST_SERVER_KEY", f"+engine.env.HF_TOKEN={PLANTED}"]
    spec, settings = to_specs(compose(overrides))
    job = TrialJob(0, overrides, spec, settings)
    error = RuntimeError("worker died; its environment held zebra-orchard-42 and " + PLANTED)
    (result,) = _results_of([job], None, error)
    assert result.status == "FAILED" and "worker died" in result.error
    assert "zebra-orchard-42" not in result.error and PLANTED not in result.error
