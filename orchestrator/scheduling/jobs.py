"""Trial jobs of a sweep: every job's config validated up front, before anything starts."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from orchestrator.config import ConfigError, SweepSettings, TrialSpec, to_specs, trial_hash
from orchestrator.config.convert import is_config_key
from orchestrator.config.hashing import first_run_hash
from orchestrator.config.metric_keys import is_knob
from orchestrator.config.secrets import redact_override


@dataclass(frozen=True)
class TrialJob:
    """One trial to run: its position in the sweep, the overrides that made it, its typed spec."""

    index: int
    overrides: list[str]
    spec: TrialSpec
    settings: SweepSettings

    @cached_property
    def trial_hash(self) -> str:
        return trial_hash(self.spec)

    @cached_property
    def server_key(self) -> str | None:
        """``trial.server_key`` of its spec: trials with the same key can share one server start."""
        from orchestrator.trial import server_key

        return server_key(self.spec)

    @property
    def label(self) -> str:
        """Its variant, else its index and hash (a race's repeat: its first run's hash)."""
        return self.spec.variant or f"trial{self.index}-{(first_run_hash(self.spec) or self.trial_hash)[:8]}"

    @property
    def num_gpus(self) -> int:
        return self.spec.engine.num_gpus if self.spec.platform.device == "cuda" else 0


def prepare_jobs(
    configs: list[tuple[list[str], Any]], first_index: int = 0, whole_sweep: bool = True
) -> list[TrialJob]:
    """Validate every job's config; one :class:`ConfigError` lists the problems of all jobs.
    ``whole_sweep`` False: the jobs are one batch of a search, not all of its trials."""
    jobs: list[TrialJob] = []
    problems: list[str] = []
    for i, (overrides, cfg) in enumerate(configs):
        try:
            spec, settings = to_specs(cfg, overrides)
        except ConfigError as exc:
            where = " ".join(redact_override(o) for o in overrides) or "(no overrides)"
            problems.append(f"job {first_index + i} [{where}]: {exc}")
            continue
        try:
            spec = with_served_name(spec)
        except ConfigError as exc:
            problems.append(f"job {first_index + i}: {exc}")
            continue
        jobs.append(TrialJob(first_index + i, list(overrides), spec, settings))
    if not problems and jobs:
        problems += _shared_settings_problems(jobs)
    if not problems and jobs and whole_sweep:  # a search's batch may ask a configuration again
        problems += _same_configuration_problems(jobs)
    if not problems and jobs:
        problems += _verdict_problems(jobs, whole_sweep)
    if not problems:
        problems += _input_file_problems(jobs) + _engine_environment_problems(jobs) + _gpu_problems(jobs)
    if not problems:  # the hub last: it may take seconds to answer (or not to)
        problems += _hub_model_problems(jobs)
    if problems:
        # Most sweeps share one mistake: show it once when every job reports the same text.
        bodies = {p.split("]: ", 1)[-1] for p in problems}
        if len(bodies) == 1 and len(problems) > 1:
            raise ConfigError(f"{bodies.pop()}\n(in all {len(problems)} jobs of the sweep)")
        raise ConfigError("\n".join(problems))
    return jobs


def with_served_name(spec: TrialSpec) -> TrialSpec:
    """``model.name=auto`` against a running server (``engine=external``): the name it serves, read
    from its ``/v1/models`` now, before the trial is hashed; one name, or an error listing them."""
    if spec.model.name != "auto" or spec.engine.name != "external":
        return spec
    from orchestrator.config.errors import TrialError
    from orchestrator.engines import adapter_for
    from orchestrator.loadgen.preflight import served_models

    url = getattr(spec.engine, "url", "")
    try:
        names = served_models(url, adapter_for("external").api_key(spec))
    except TrialError as exc:
        raise ConfigError(f"model.name=auto: {exc}") from None
    if len(names) != 1:
        listed = ", ".join(names) if names else "none (no model listing)"
        raise ConfigError(f"model.name=auto: {url}/v1/models serves {listed}; set model.name to the one to measure")
    return spec.model_copy(update={"model": spec.model.model_copy(update={"name": names[0]})})


def _input_file_problems(jobs: list[TrialJob]) -> list[str]:
    """Every dataset and trace file is read once here, before any server starts."""
    from orchestrator.trial import check_inputs

    problems, seen = [], set()
    for job in jobs:
        try:
            for note in check_inputs(job.spec):
                if note not in seen:
                    seen.add(note)
                    print(note, flush=True)
        except ConfigError as exc:
            problems.append(f"job {job.index}: {exc}")
    return problems


def _gpu_problems(jobs: list[TrialJob]) -> list[str]:
    """A configured platform.gpu_name that is not this node's GPU: an error before anything
    starts (``gpu_name_check: warn``: said once, and planned as configured)."""
    from orchestrator.perf.gpus import gpu_mismatch

    problems: list[str] = []
    said: set[str] = set()
    for job in jobs:
        mismatch = gpu_mismatch(job.spec)
        if mismatch is None or mismatch in said:
            continue
        said.add(mismatch)
        if job.spec.platform.gpu_name_check == "error":
            problems.append(f"job {job.index}: {mismatch}")
        else:
            print(f"warning: {mismatch}", flush=True)
    return problems


def _hub_model_problems(jobs: list[TrialJob]) -> list[str]:
    """Each hub model without a tokenizer of its own has its tokenizer cached or reachable
    (:func:`~orchestrator.models.check_hub_model`), once per model. Not in a dry run: a plan may
    be made on a machine without the hub or the cache the run will have (the GPU labs' plans here)."""
    from orchestrator.feasibility import assess
    from orchestrator.models import check_hub_model

    if jobs[0].settings.dry_run:
        return []
    problems: dict[tuple[str, str, str | None], str] = {}
    for job in jobs:
        model = job.spec.model
        key = (model.source, str(model.path), model.tokenizer)
        if key in problems or job.spec.engine.hold_s is not None:  # a trial that sends no request
            continue
        if assess(job.spec) is not None:  # SKIPPED before it starts (the CPU quantization lab's fp8)
            continue
        try:
            check_hub_model(model)
            problems[key] = ""
        except ConfigError as exc:
            problems[key] = f"job {job.index}: {exc}"
    return [p for p in problems.values() if p]


def _engine_environment_problems(jobs: list[TrialJob]) -> list[str]:
    """Each engine's interpreter (its GPU environment, engine.python) exists before anything
    starts. A dry run only reports it, per trial (see ``plan_trial``)."""
    from orchestrator.engines import envs

    if jobs[0].settings.dry_run:
        return []
    problems: dict[str, int] = {}
    for job in jobs:
        reason = envs.missing(job.spec)
        if reason and reason not in problems:
            problems[reason] = job.index
    return [f"job {index}: {reason}" for reason, index in problems.items()]


def _keys_under(data: Any, path: str) -> list[str]:
    for part in path.split(".") if path else []:
        data = data.get(part) if isinstance(data, dict) else None
    return list(data) if isinstance(data, dict) else []


def _verdict_problems(jobs: list[TrialJob], whole_sweep: bool = True) -> list[str]:
    """The knobs the objective and the claims name are keys of a trial's config (the schema's,
    any engine's), and their load points are the sweep's: a misspelt knob (``engine.max_num_seqz``)
    or an ``at`` no trial has (``c999``) would otherwise leave the verdict or the claim empty after
    the whole sweep ran. A metric's name is checked with the settings. ``at`` is checked only
    against a whole sweep (a search's batch holds some of its trials) that does not search
    capacity (its probes are named as it goes)."""
    settings = jobs[0].settings
    knobs: list[tuple[str, str]] = []
    points: list[tuple[str, str]] = []
    goal = settings.objective
    if goal is not None:
        knobs += [(f"objective.{where}", k) for where, k in goal.named() if is_knob(k)]
        if goal.at is not None:
            points.append(("objective.at", goal.at))
    for i, claim in enumerate(settings.expect):
        if claim.along is not None:
            knobs.append((f"expect[{i}].along", claim.along))
        if claim.at is not None and claim.at not in ("lightest", "heaviest"):
            points.append((f"expect[{i}].at", claim.at))
    problems = []
    for where, knob in knobs:
        if not is_config_key(knob):
            head, _, tail = knob.rpartition(".")
            near = sorted({k for j in jobs for k in _keys_under(j.spec.model_dump(mode="json"), head)})
            close = difflib.get_close_matches(tail, near, n=3)
            hint = f"closest: {', '.join(f'{head}.{c}' for c in close)}" if close else f"{head} keys: {', '.join(near)}"
            problems.append(f"{where}: {knob} is no key of a trial's config ({hint})")
    if points and whole_sweep and not any(j.spec.workload.capacity is not None for j in jobs):
        labels = list(dict.fromkeys(p.label for j in jobs for p in j.spec.workload.load_points))
        for where, at in points:
            if at not in labels:
                also = "; or lightest / heaviest" if where.startswith("expect") else ""
                problems.append(
                    f"{where}: no load point '{at}' in this sweep (its points: {', '.join(labels) or 'none'}{also})"
                )
    return problems


def _shared_settings_problems(jobs: list[TrialJob]) -> list[str]:
    """Settings of the sweep as a whole may not vary between its jobs."""
    first = jobs[0]
    shared = {
        "tracking": lambda j: j.settings.tracking,
        "cluster": lambda j: j.settings.cluster,
        "dry_run": lambda j: j.settings.dry_run,
        "resume": lambda j: j.settings.resume,
        "reuse_servers": lambda j: j.settings.reuse_servers,
        "experiment": lambda j: j.spec.experiment,
        "platform.max_concurrent_trials": lambda j: j.spec.platform.max_concurrent_trials,
    }
    problems = []
    for key, get in shared.items():
        other = next((j for j in jobs[1:] if get(j) != get(first)), None)
        if other is not None:
            problems.append(
                f"{key}: must be the same for every trial of a sweep (job {first.index} and job {other.index} differ)"
            )
    return problems


def _same_configuration_problems(jobs: list[TrialJob]) -> list[str]:
    """Two jobs of one sweep with one trial hash are one configuration under two names: they would
    share one identity (result, MLflow run, resume, a race's runs), each one's runs counted as the
    other's. Refused, naming the overrides that differ (none of them changes a measurement)."""
    by_hash: dict[str, list[TrialJob]] = {}
    for job in jobs:
        by_hash.setdefault(job.trial_hash, []).append(job)
    problems = []
    for h, same in by_hash.items():
        if len(same) < 2:
            continue
        first = same[0]
        for other in same[1:]:
            mine = " ".join(redact_override(o) for o in first.overrides if o not in other.overrides)
            theirs = " ".join(redact_override(o) for o in other.overrides if o not in first.overrides)
            what = (
                f"they differ only in {mine or '(none)'} vs {theirs or '(none)'}, which changes nothing measured "
                "(names, where and how the server is launched and watched, and how the client is sized are "
                "not part of a trial's identity: config.hashing)"
                if mine or theirs
                else "their overrides are the same"
            )
            problems.append(
                f"job {first.index} ({first.label}) and job {other.index} ({other.label}) are one configuration "
                f"(trial hash {h}): {what}. "
                "A sweep measures each configuration once: drop one, or race it against run-to-run noise "
                "with objective.max_repeats"
            )
    return problems
