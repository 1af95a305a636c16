"""Submitting a sweep to a remote Ray cluster with Ray's job submission API.

    python -m orchestrator.scheduling.submit --address http://HEAD:8265 \\
        -- +experiment=chunked_prefill platform=gpu tracking.uri=http://mlflow.internal:5000

The sweep's driver (``python -m orchestrator ... cluster.address=auto -m``) runs as a Ray job
on the cluster's head: it places the trials on the cluster's GPUs, gets every result back and
stays the sweep's only MLflow writer. This command

1. validates the sweep here first (a local dry run: every config, dataset and trace is
   checked and the plan printed) so a typo never reaches the cluster;
2. uploads the project (``runtime_env.working_dir``, without the virtualenv, results and
   local stores) unless ``--no-upload`` says the cluster has its own checkout;
3. submits, then follows the job's log until it ends (exit code 0 only if it SUCCEEDED);
   Ctrl-C stops the job (its driver stops its trials and their servers).

``tracking.uri`` is read on the head: a ``sqlite:///`` path means a file on the head node.
Ray's token authentication is honoured from the environment (``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN_PATH``), never passed on the command line.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.secrets import redact_override
from orchestrator.scheduling.precheck import local_check, plan_line, reserved_overrides

UPLOAD_EXCLUDES = [
    ".venv/",
    ".git/",
    "multirun/",
    "outputs/",
    "mlruns/",
    "mlartifacts/",
    "mlflow.db",
    ".scratch/",
    "slurm-logs/",
    ".pytest_cache/",
    "**/__pycache__/",
    "*.egg-info/",
]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def entrypoint(overrides: list[str], python: str = "python") -> str:
    """The job's command line. Ray takes a shell string: every part is quoted (shlex.join),
    so an override can never become shell code."""
    bad = reserved_overrides(overrides)
    if bad:
        raise ConfigError(f"submit: overrides may not contain {', '.join(bad)} (the job adds them)")
    return shlex.join([python, "-m", "orchestrator", *overrides, "cluster.address=auto", "-m"])


def runtime_env(upload: bool, pip: list[str] | None = None) -> dict[str, Any]:
    env: dict[str, Any] = {}
    if upload:
        env.update(working_dir=str(PROJECT_ROOT), excludes=UPLOAD_EXCLUDES)
    if pip:
        env["pip"] = list(pip)
    return env


def follow(client: Any, job_id: str, poll_s: float = 2.0, out: Any = sys.stdout) -> str:
    """Print the job's log as it grows; return its final status."""
    shown = 0
    while True:
        status = str(client.get_job_status(job_id)).split(".")[-1]
        logs = client.get_job_logs(job_id)
        if len(logs) > shown:
            out.write(logs[shown:])
            out.flush()
            shown = len(logs)
        if status in TERMINAL:
            return status
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="submit a sweep to a remote Ray cluster (Ray job submission)")
    ap.add_argument("--address", required=True, help="the cluster's job server, e.g. http://HEAD:8265")
    ap.add_argument("--job-id", help="submission id (default: Ray picks one)")
    ap.add_argument(
        "--python",
        default="python",
        help="the cluster's Python with Ray and this project's dependencies (default: python on the head's PATH)",
    )
    ap.add_argument("--no-upload", action="store_true", help="the cluster has this project installed; upload nothing")
    ap.add_argument("--pip", action="append", help="extra pip requirement for the job's environment (repeatable)")
    ap.add_argument("--skip-check", action="store_true", help="do not validate the sweep locally first")
    ap.add_argument("--no-wait", action="store_true", help="submit and return; do not follow the log")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the sweep, after --")
    a = ap.parse_args(argv)
    try:
        command = entrypoint(a.overrides, a.python)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not a.skip_check:
        check = local_check(a.overrides)
        if check.returncode != 0:
            print("error: the sweep does not validate (nothing was submitted):", file=sys.stderr)
            print(check.stderr.strip()[-4000:], file=sys.stderr)
            return 2
        plan = plan_line(check)
        if plan:
            print(f"sweep validated locally: {plan}")
    if any(o.startswith("tracking.uri=sqlite") for o in a.overrides):
        print("note: a sqlite tracking.uri is a file on the cluster's head node, written by the job there")

    import logging

    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.WARNING)  # packaging chatter about each ignored file
    client = JobSubmissionClient(a.address)
    job_id = client.submit_job(
        entrypoint=command, submission_id=a.job_id, runtime_env=runtime_env(not a.no_upload, a.pip)
    )
    print(f"submitted job {job_id} to {a.address}: {entrypoint([redact_override(o) for o in a.overrides], a.python)}")
    if a.no_wait:
        print(f"follow it with: ray job logs --address {a.address} -f {job_id}")
        return 0
    try:
        status = follow(client, job_id)
    except KeyboardInterrupt:
        print(f"\ninterrupted: stopping job {job_id}", file=sys.stderr)
        client.stop_job(job_id)
        return 130
    print(f"job {job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
