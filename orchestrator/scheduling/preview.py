"""A sweep's plan without running it: ``dry_run=true`` a table a person reads (per trial its
status, GPUs and their model, weights and KV capacity against the GPU's memory, load points,
estimated time, the reason it cannot run), ``dry_run=json`` a JSON line per trial with every
server command; both end with the whole at a glance (trials, GPUs, an estimated duration from
MLflow history or a rough estimate, GPU-hours, server starts) and say how many GPUs they
assumed and why."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from orchestrator.config.logs import Progress, print_progress
from orchestrator.config.secrets import redact_override, redact_text
from orchestrator.feasibility import estimate_seconds
from orchestrator.perf.gpus import gpu_memory_gb
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.tracking import MlflowTracker, server_answers, sqlite_file

log = logging.getLogger(__name__)


PORTS_NOTE = "ports in argv and URLs are placeholders (0, 1, 2, ... per trial): free ones are picked at start"


def dry_run(jobs: list[TrialJob], progress: Progress = print_progress) -> list[dict[str, Any]]:
    """The sweep's plan (see the module): per trial its hash, overrides, status (``feasible``,
    ``skipped`` with the reason, ``blocked`` when its engine environment is missing here), GPUs
    and every server command. Starts nothing, not even Ray: the cluster's GPUs are
    ``cluster.num_gpus`` when set, 0 on the CPU platform, the GPUs NVML reads on this machine,
    else unknown. Returns per trial its hash, index, status, ``feasible``, GPUs and reason."""
    from orchestrator.trial import plan_trial  # the trial's stack: imported by dry runs, not by every driver

    as_json = jobs[0].settings.dry_run == "json" if jobs else True
    gpus, why = cluster_gpus(jobs[0]) if jobs else (None, "")
    # the local Ray a CPU sweep starts offers this machine's CPUs (or cluster.num_cpus); a GPU sweep is
    # often planned here for another machine, and a cluster's CPUs are not read
    local = bool(jobs) and jobs[0].settings.cluster.address is None
    cpus = jobs[0].settings.cluster.num_cpus if local else None
    if local and cpus is None and jobs[0].spec.platform.device == "cpu":
        cpus = os.cpu_count()
    lines, rows = [], []  # what the summary needs: a plan of 10,000 trials keeps no server commands
    model_from = roofs = ""
    for job in jobs:
        plan = plan_trial(job.spec, gpus, cpus)
        status = "feasible" if plan["feasible"] else "skipped"
        if status == "feasible" and plan.get("engine_environment"):
            status, plan["reason"] = "blocked", plan["engine_environment"]
        line = {
            "trial_hash": job.trial_hash,
            "index": job.index,
            "variant": job.spec.variant,
            "overrides": [redact_override(o) for o in job.overrides],
            "status": status,
            **plan,
        }
        model_from = model_from or str(plan.get("gpu_model_from") or "")
        roofs = roofs or str(plan.get("roofs") or "")
        if as_json:
            progress(json.dumps({**line, "ports": PORTS_NOTE} if plan.get("servers") else line, sort_keys=True))
        else:
            rows.append(_row(job, line))
        lines.append({k: line[k] for k in ("trial_hash", "index", "status", "feasible", "gpus", "reason")})
    summary = plan_summary(jobs, lines, _history(jobs))
    if as_json:
        progress(json.dumps({"plan": summary}, sort_keys=True))
        return lines
    said = why + (f"; GPU model: {model_from}" if model_from else "") + (f"; roofline roofs: {roofs}" if roofs else "")
    for text in plan_table(rows, summary, said):
        progress(text)
    return lines


def cluster_gpus(job: TrialJob) -> tuple[int | None, str]:
    """The GPUs the plan assumes the cluster has, and why."""
    known = known_gpus(job)
    if job.settings.cluster.num_gpus is not None:
        return known, f"cluster.num_gpus={known}"
    if known == 0:
        return 0, "the CPU platform"
    if job.settings.cluster.address is None:
        from orchestrator.perf.roofs import detect_gpus

        found, trouble = detect_gpus()
        if found:
            return len(found), f"read on this machine through NVML ({found[0].name})"
        return None, (
            f"unknown: no GPU readable here ({trouble or 'none'}) and no cluster.num_gpus; "
            "each trial is planned as if its GPUs exist"
        )
    return None, "unknown: a Ray cluster's GPUs are not read by a dry run; set cluster.num_gpus to plan for them"


def _row(job: TrialJob, line: dict[str, Any]) -> dict[str, str]:
    """One trial of the table, in words."""
    spec = job.spec
    cuda = spec.platform.device == "cuda"
    memory = gpu_memory_gb(spec) if cuda else None
    classes = spec.workload.classes.values()
    longest = max(((c.input_tokens or 0) + (c.output_tokens or 0) for c in classes), default=0)
    kv = line.get("kv_capacity_tokens")
    points = ", ".join(p.label for p in spec.workload.load_points) or "-"
    if spec.workload.capacity is not None:
        points += f" + capacity search ({spec.workload.capacity.knob})"
    return {
        "trial": spec.variant or job.trial_hash[:8],
        "status": line["status"].upper() if line["status"] != "feasible" else "feasible",
        "GPUs": str(line["gpus"]) + (f" x {line['gpu_model']}" if cuda and line.get("gpu_model") else ""),
        "weights / GPU": f"{line['weights_gib_per_gpu']:.1f} of {memory:.0f} GB"
        if memory and "weights_gib_per_gpu" in line
        else "-",
        "KV capacity": (f"{kv:,} tokens" + (f" ({kv // longest:,} requests)" if longest else "")) if kv else "-",
        "load points": points,
        "est.": _duration(estimate_seconds(spec)),
        "reason": (line.get("reason") or "").replace("\n", " "),
    }


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_table(rows: list[dict[str, str]], summary: dict[str, Any], why: str) -> list[str]:
    """The plan as text: the table, the GPUs assumed and why, the sweep at a glance."""
    out = []
    if rows:
        heads = list(rows[0])
        width = {h: max(len(h), *(len(r[h]) for r in rows)) for h in heads[:-1]}
        out.append("  ".join(h.ljust(width[h]) for h in heads[:-1]) + "  reason")
        out += ["  ".join(r[h].ljust(width[h]) for h in heads[:-1]) + "  " + r["reason"] for r in rows]
    s = summary
    out.append(f"GPUs assumed: {why}")
    out.append(
        f"Plan: {s['trials']} trial(s): {s['feasible']} feasible, {s['blocked']} blocked, {s['skipped']} skipped; "
        f"{s['server_starts']} server start(s); about {_duration(s['estimated_s'])}"
        + (f", {s['gpu_hours']} GPU-hours" if s["gpu_hours"] else "")
        + f" ({s['from_history']} trial(s) timed from MLflow). Nothing was started; dry_run=json prints every command."
    )
    return out


def plan_summary(jobs: list[TrialJob], lines: list[dict[str, Any]], history: dict[str, float]) -> dict[str, Any]:
    """The whole sweep at a glance: trials, GPUs, an estimated duration and GPU-hours.

    A trial's duration is that of its last FINISHED run when MLflow has one (same trial
    hash), else a rough estimate (``feasibility.estimate_seconds``). Wall time assumes the
    cluster's GPUs (or ``platform.max_concurrent_trials``) are kept busy.
    """
    # a blocked trial (its engine environment missing here) runs once that is made: planned for
    feasible = [(job, line) for job, line in zip(jobs, lines) if line["status"] in ("feasible", "blocked")]
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
    launched = [job for job, _ in feasible if job.spec.engine.launched is not None]  # not sleep/external
    keys = [share_key(job) if job.settings.reuse_servers else None for job in launched]
    starts = len({k for k in keys if k is not None}) + sum(k is None for k in keys)
    return {
        "trials": len(jobs),
        "feasible": sum(line["status"] == "feasible" for line in lines),
        "blocked": sum(line["status"] == "blocked" for line in lines),
        "skipped": sum(line["status"] == "skipped" for line in lines),
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
    db = sqlite_file(uri)
    if db is not None and not db.exists():
        return {}  # a dry run creates no store
    if not server_answers(uri):  # MLflow's client would retry it for minutes
        log.warning("MLflow at %s does not answer: the plan has no durations of earlier runs", redact_text(uri))
        return {}
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
