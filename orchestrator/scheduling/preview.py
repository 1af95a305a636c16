"""A sweep's plan without running it (``dry_run=true``): per trial its feasibility and every
server command, and the whole at a glance (trials, GPUs, an estimated duration from MLflow
history or a rough estimate, GPU-hours, server starts)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from orchestrator.config.logs import Progress, print_progress
from orchestrator.config.schema import LaunchedEngineSpec
from orchestrator.config.secrets import redact_override
from orchestrator.feasibility import estimate_seconds
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.tracking import MlflowTracker

log = logging.getLogger(__name__)


def dry_run(jobs: list[TrialJob], progress: Progress = print_progress) -> list[dict[str, Any]]:
    """One JSON line per trial: hash, overrides, ``feasible`` or ``skipped`` with the reason,
    GPUs, every server command (argv + env). Starts nothing, not even Ray: the cluster's GPUs
    are ``cluster.num_gpus`` when set (0 on the CPU platform), else unknown. Returns per trial
    its hash, index, status, ``feasible``, GPUs and reason (the commands are only printed)."""
    from orchestrator.trial import plan_trial  # the trial's stack: imported by dry runs, not by every driver

    lines = []  # what the summary needs: a plan of 10,000 trials keeps no server commands
    for job in jobs:
        plan = plan_trial(job.spec, known_gpus(job))
        line = {
            "trial_hash": job.trial_hash,
            "index": job.index,
            "variant": job.spec.variant,
            "overrides": [redact_override(o) for o in job.overrides],
            "status": "feasible" if plan["feasible"] else "skipped",
            **plan,
        }
        progress(json.dumps(line, sort_keys=True))
        lines.append({k: line[k] for k in ("trial_hash", "index", "status", "feasible", "gpus", "reason")})
    progress(json.dumps({"plan": plan_summary(jobs, lines, _history(jobs))}, sort_keys=True))
    return lines


def plan_summary(jobs: list[TrialJob], lines: list[dict[str, Any]], history: dict[str, float]) -> dict[str, Any]:
    """The whole sweep at a glance: trials, GPUs, an estimated duration and GPU-hours.

    A trial's duration is that of its last FINISHED run when MLflow has one (same trial
    hash), else a rough estimate (``feasibility.estimate_seconds``). Wall time assumes the
    cluster's GPUs (or ``platform.max_concurrent_trials``) are kept busy.
    """
    feasible = [(job, line) for job, line in zip(jobs, lines) if line["feasible"]]
    est = {job.trial_hash: history.get(job.trial_hash, estimate_seconds(job.spec)) for job, _ in feasible}
    serial_s = sum(est.values())
    gpu_s = sum(line["gpus"] * est[job.trial_hash] for job, line in feasible)
    wall_s = serial_s
    cap = jobs[0].spec.platform.max_concurrent_trials if jobs else None
    gpus = known_gpus(jobs[0]) if jobs else None
    if gpus and gpu_s:
        wall_s = max(gpu_s / gpus, max(est.values()))
    elif cap and cap > 1:
        wall_s = serial_s / cap
    launched = [job for job, _ in feasible if isinstance(job.spec.engine, LaunchedEngineSpec)]  # not sleep/external
    keys = [share_key(job) if job.settings.reuse_servers else None for job in launched]
    starts = len({k for k in keys if k is not None}) + sum(k is None for k in keys)
    return {
        "trials": len(jobs),
        "feasible": len(feasible),
        "skipped": len(jobs) - len(feasible),
        "server_starts": starts,
        "gpus_per_trial": sorted({line["gpus"] for _, line in feasible}),
        "estimated_s": round(wall_s),
        "estimated_serial_s": round(serial_s),
        "gpu_hours": round(gpu_s / 3600, 2),
        "from_history": sum(h in history for h in est),
    }


def _history(jobs: list[TrialJob]) -> dict[str, float]:
    """Durations of FINISHED runs of these trials in MLflow (read only; empty if unreachable)."""
    if not jobs or not jobs[0].settings.tracking.enabled:
        return {}
    settings = jobs[0].settings
    uri = settings.tracking.uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        return {}  # a dry run creates no store
    try:
        from orchestrator.tracking.runs import experiment_exists

        name = settings.tracking.experiment_name or jobs[0].spec.experiment
        if not experiment_exists(uri, name):
            return {}
        return MlflowTracker(uri, name).finished_durations(j.trial_hash for j in jobs)
    except Exception as exc:  # a plan without history is still a plan
        log.debug("no MLflow history for the plan: %s", exc)
        return {}


def share_key(job: TrialJob) -> str | None:
    return job.server_key


def known_gpus(job: TrialJob) -> int | None:
    if job.settings.cluster.num_gpus is not None:
        return job.settings.cluster.num_gpus
    return 0 if job.spec.platform.device == "cpu" and job.settings.cluster.address is None else None
