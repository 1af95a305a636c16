"""Before a trial runs: can it run here (:func:`check_feasible`), what it would do (a dry
run's :func:`plan_trial`), are its inputs readable (:func:`check_inputs`), and the result of
one found infeasible before it was submitted (:func:`skipped_result`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError, InfeasibleConfigError
from orchestrator.config.hashing import trial_hash
from orchestrator.config.schema import TraceReplay, TrialSpec
from orchestrator.config.secrets import redact_mapping, redact_override
from orchestrator.engines import adapter_for, envs
from orchestrator.evaluation import task_problem
from orchestrator.feasibility import assess, describe
from orchestrator.loadgen.datasets import load_sharegpt
from orchestrator.loadgen.traces import read_trace, replay_slice
from orchestrator.metrics import host
from orchestrator.metrics.nvml import visible_devices
from orchestrator.metrics.result import TrialResult
from orchestrator.models import check_hub_tokenizer, resolve_model
from orchestrator.perf.gpus import gpu_mismatch
from orchestrator.perf.sizing import latest_speed
from orchestrator.perf.trace_windows import slice_warning
from orchestrator.trial.servers import planned_launches


def check_feasible(spec: TrialSpec, gpu_ids: list[int]) -> None:
    """Raise :class:`InfeasibleConfigError` when this trial cannot run on this platform or on
    the GPUs it was given."""
    reason = assess(spec)
    if reason:
        raise InfeasibleConfigError(reason)
    need = spec.engine.num_gpus
    if spec.platform.device == "cuda" and len(gpu_ids) < need:
        raise InfeasibleConfigError(
            f"needs {need} GPU(s) (tensor_parallel_size x pipeline_parallel_size) but {len(gpu_ids)} were assigned"
        )
    if spec.platform.device == "cuda" and gpu_ids and spec.platform.gpu_name_check == "error":
        mismatch = gpu_mismatch(spec, visible_devices(list(gpu_ids)))  # the GPUs of this trial's node
        if mismatch:
            raise ConfigError(mismatch)


def plan_trial(spec: TrialSpec, cluster_gpus: int | None = None, node_cpus: float | None = None) -> dict[str, Any]:
    """What the trial would do, without starting or building anything (for dry runs)."""
    reason = assess(spec, cluster_gpus, node_cpus)
    plan: dict[str, Any] = {"feasible": reason is None, "reason": reason, **describe(spec)}
    plan["servers"] = [x.redacted() for x in planned_launches(spec)]
    plan["client_processes"] = client_processes_plan(spec)
    missing_env = envs.missing(spec)
    if missing_env:
        plan["engine_environment"] = missing_env
    return plan


def client_cores(spec: TrialSpec) -> int:
    """The cores the trial's client processes may use: the CPUs the trial holds in Ray."""
    return max(1, int(spec.platform.cpus_per_trial))


def client_processes_plan(spec: TrialSpec) -> str:
    """The client processes a plan shows: a number, or auto's rule and its ceiling."""
    n = spec.workload.client_processes
    if n != "auto":
        return str(n)
    cores = client_cores(spec)
    return f"auto: per point, from its planned chunk rate x the client's CPU per chunk, at most {cores} (platform.cpus_per_trial)"


def skipped_result(spec: TrialSpec, overrides: list[str], reason: str) -> TrialResult:
    """The result of a trial found infeasible before it was submitted."""
    now = time.time()
    return TrialResult(
        trial_hash=trial_hash(spec),
        experiment=spec.experiment,
        variant=spec.variant,
        overrides=[redact_override(o) for o in overrides],
        spec=redact_mapping(spec.model_dump(mode="json")),
        status="SKIPPED",
        error=reason,
        started_at=now,
        ended_at=now,
        engine_version=adapter_for(spec.engine.name).version(spec),
    )


def check_inputs(spec: TrialSpec) -> list[str]:
    """Read every file the workload names (datasets, traces); raise ConfigError if one is bad.

    Returns notes for the user (e.g. malformed entries skipped). Runs before anything starts.
    """
    notes = []
    if spec.model.source == "path":
        resolve_model(spec.model)  # a ConfigError naming model.path when it is not a model folder
    if spec.model.tokenizer and not Path(spec.model.tokenizer).expanduser().exists():
        check_hub_tokenizer(spec.model.tokenizer)
    adapter_for(spec.engine.name).api_key(spec)  # a ConfigError naming engine.api_key_env when it is not set
    problem = task_problem(spec.eval)
    if problem:
        raise ConfigError(problem)
    for name, c in spec.workload.classes.items():
        if c.dataset == "sharegpt" and c.path:
            try:
                data = load_sharegpt(c.path)
            except ConfigError as exc:
                raise ConfigError(f"workload.classes.{name}.path: {exc}") from None
            notes.append(
                f"workload.classes.{name}: {len(data.conversations)} conversations from {c.path}"
                + (f", {data.malformed} malformed entries skipped" if data.malformed else "")
            )
    for i, p in enumerate(spec.workload.load_points):
        if isinstance(replay := p.load, TraceReplay):
            where = "workload.replay" if spec.workload.replay is not None else f"workload.load_points.{i}"
            try:
                trace = read_trace(replay.path, replay.format, replay.block_tokens)
            except ConfigError as exc:
                raise ConfigError(f"{where}.trace: {exc}") from None
            cut = replay_slice(
                trace,
                replay.start_s,
                replay.length_scale,
                replay.max_context_tokens,
                replay.over_context,
                time_scale=replay.time_scale,
            )
            if not cut.rows:
                last = trace.rows[-1].timestamp_s
                why = (
                    f"trace_start_s {replay.start_s:g} is after the trace's last request ({last:.0f} s)"
                    if replay.start_s > last
                    else f"all {cut.dropped} of its requests are over max_context_tokens {replay.max_context_tokens}"
                )
                raise ConfigError(f"{where}: the slice it replays has no request ({why})")
            blocks = f", prefix blocks of {trace.block_tokens} tokens" if trace.block_tokens else ""
            turns = trace.conversations
            chats = f" in {turns} conversations" if turns < len(trace.rows) else ""
            notes.append(
                f"{where}: trace {trace.path} ({trace.format}, {len(trace.rows)} requests{chats} "
                f"over {trace.rows[-1].timestamp_s:.0f} s{blocks}, sha256 {trace.sha256[:12]})"
            )
            limit = spec.workload.validity.max_send_lag_ms_p95
            speed = latest_speed(host.describe([])["summary"], spec.model.name)  # the last calibration here, if any
            if warning := slice_warning(trace, replay, *spec.workload.stop_of(p), speed, limit):
                notes.append(f"{where}: {warning}")
    return notes
