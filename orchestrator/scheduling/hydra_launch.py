"""Glue between Hydra and the sweep runner: multirun launches and single-run mode."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.config.convert import config_to_dict
from orchestrator.config.logs import print_progress
from orchestrator.config.secrets import redact_override, scrub_file, secret_values
from orchestrator.scheduling.compose import SweepComposer
from orchestrator.scheduling.jobs import prepare_jobs
from orchestrator.scheduling.launched import OutcomeStatus, TrialOutcome
from orchestrator.scheduling.sizing import size_sweep
from orchestrator.scheduling.sweep import absolute_dir, run_sweep

log = logging.getLogger(__name__)


def _exit_on_config_error(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A config mistake ends the command with one clear message and exit code 2; any other
    error the orchestrator raises on purpose (a full results disk) with its message and exit
    code 1. No traceback: the message says what to do."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from orchestrator.config import ConfigError
        from orchestrator.config.errors import OrchestratorError

        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        except OrchestratorError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)

    wrapper.__doc__ = fn.__doc__
    return wrapper


def _unresolved(cfg: Any) -> Any:
    """The config as plain data, its interpolations left as written (resolving one may fail)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # not an OmegaConf node: taken as it is
        return cfg


def shared_part_problems(choices: Any) -> list[str]:
    """A config group's option whose file name begins with ``_`` (``workload=_common``) is a part
    the group's files share (its keys at their defaults), not a choice: named, with the group's
    real options, before validation, which would only say that the keys it lacks are missing."""
    from hydra.core.global_hydra import GlobalHydra

    problems = []
    for group, choice in dict(choices or {}).items():
        if str(group).startswith("hydra/") or not isinstance(choice, str):
            continue
        if choice.rsplit("/", 1)[-1].startswith("_"):
            options = GlobalHydra.instance().config_loader().get_group_options(str(group))
            real = [o for o in options if not o.rsplit("/", 1)[-1].startswith("_")]
            problems.append(
                f"{group}={choice}: a file whose name begins with '_' holds the keys every {group} file "
                f"shares; it is not one to choose. Choose one of: {', '.join(real)}"
            )
    return problems


def _refuse_shared_parts(job_choices: Sequence[Any]) -> None:
    from orchestrator.config import ConfigError

    problems = sorted({p for choices in job_choices for p in shared_part_problems(choices)})
    if problems:
        raise ConfigError("\n".join(problems))


@_exit_on_config_error
def launch_multirun(
    hydra_context: Any, config: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[Any]:
    """Hydra launcher body: validate all jobs, run them as one sweep, return JobReturns."""
    from hydra.core.utils import JobReturn, JobStatus, configure_log

    from orchestrator.scheduling.outcome import reached

    reached()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = absolute_dir(str(config.hydra.sweep.dir))
    # Hydra saved the sweep's config (with the command's overrides) before it called us: its
    # secrets are hidden first (a job that does not compose ends the command), then those only a
    # composed job shows
    scrub_file(sweep_dir / "multirun.yaml", secret_values(_unresolved(config)))  # its overrides included
    configs: list[tuple[list[str], Any]] = []
    job_cfgs = []  # Hydra's config of each job's config groups (shared by jobs that differ in values only)
    composer = SweepComposer(hydra_context.config_loader, config)
    for i, overrides in enumerate(job_overrides):
        data, cfg = composer.compose(list(overrides), initial_job_idx + i)
        configs.append((list(overrides), data))
        job_cfgs.append(cfg)
    log.debug("composed %d jobs: %s", len(configs), composer.counts)
    scrub_file(
        sweep_dir / "multirun.yaml", secret_values([list(config.hydra.overrides.task), *(d for _, d in configs)])
    )
    # a knob search chooses its own next trials: its batches do not race, and hold some of its
    # trials; a tuning's step is a race of its candidates beside the incumbent (a batch, raced)
    sweeper = str(config.hydra.sweeper.get("_target_", "")).lower()
    searching, tuning = "optuna" in sweeper, "tune" in sweeper
    _refuse_shared_parts([cfg.hydra.runtime.choices for cfg in job_cfgs])
    configs, sized = size_sweep(configs, sweep_dir, print_progress)  # the lab's workload sized to this machine
    jobs = prepare_jobs(configs, initial_job_idx, whole_sweep=not (searching or tuning))
    sweep_params: dict[str, Any] = {"sweep_overrides": [redact_override(o) for o in config.hydra.overrides.task]}
    sweep_params |= sized
    results = run_sweep(
        jobs, sweep_dir, sweep_dir.name, sweep_params, continuing=initial_job_idx > 0, race=not searching
    )
    outcomes = trial_outcomes(jobs, results)
    returns = []
    for job, cfg, outcome in zip(jobs, job_cfgs, outcomes):
        ret = JobReturn(
            overrides=job.overrides,
            cfg=cfg,
            hydra_cfg=cfg,
            working_dir=str(sweep_dir),
            task_name=str(cfg.hydra.job.name),
            status=JobStatus.COMPLETED,
        )
        ret.return_value = outcome
        returns.append(ret)
    return returns


def trial_outcomes(jobs: list[Any], results: list[Any]) -> list[TrialOutcome]:
    """Per job, its :class:`TrialOutcome`: the status (FINISHED, SKIPPED, FAILED; DRY_RUN; NOT_RUN),
    and when the sweep declares an objective, the values of its metric and its frontier's, and
    whether its constraints hold. A trial FINISHED in an earlier sweep (resume) is read back from
    MLflow: a search is told its numbers again."""
    from orchestrator.decide.objective import constraints_hold, value_of
    from orchestrator.tracking.runs import finished_trial_data, from_results

    settings = jobs[0].settings if jobs else None
    by_hash = {r.trial_hash: r for r in results}
    data = {t.trial_hash: t for t in from_results(results, "").trials}
    missing = [j.trial_hash for j in jobs if j.trial_hash not in by_hash]
    if missing and settings is not None and settings.tracking.enabled and not settings.dry_run:
        try:
            data.update(
                finished_trial_data(
                    settings.tracking.uri, settings.tracking.experiment_name or jobs[0].spec.experiment, missing
                )
            )
        except Exception as exc:  # no store: those trials have no numbers to tell
            log.warning("could not read finished trials back from MLflow: %s", exc)
    out = []
    for job in jobs:
        t = data.get(job.trial_hash)
        status: OutcomeStatus = (
            by_hash[job.trial_hash].status
            if job.trial_hash in by_hash
            else ("FINISHED" if t is not None else "DRY_RUN" if job.settings.dry_run else "NOT_RUN")
        )
        goal = job.settings.objective
        if goal is None or t is None or status != "FINISHED":
            out.append(TrialOutcome(status, job.trial_hash, t))
            continue
        keys = dict.fromkeys([goal.key, *(goal.frontier.values() if goal.frontier else [])])
        values = {k: (v.value if (v := value_of(t, k, goal.at)) else None) for k in keys}
        feasible, why = constraints_hold(t, goal, list(data.values()))
        out.append(TrialOutcome(status, job.trial_hash, t, values, feasible, why))
    return out


@_exit_on_config_error
def run_single(cfg: Any) -> str:
    """Single-run mode (no ``-m``): one trial, logged the same way as a sweep of one."""
    from hydra.core.hydra_config import HydraConfig

    from orchestrator.scheduling import outcome

    outcome.reached()
    hc = HydraConfig.get()
    out_dir = absolute_dir(str(hc.runtime.output_dir))
    if hc.output_subdir is not None:  # Hydra saved the config and the overrides there before calling us
        hidden = secret_values([_unresolved(hc.overrides.task), _unresolved(cfg)])  # before resolving, which may fail
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            scrub_file(out_dir / str(hc.output_subdir) / name, hidden)
    overrides = list(hc.overrides.task)
    _refuse_shared_parts([hc.runtime.choices])
    data = config_to_dict(cfg)
    variants = data.get("variants") or {}
    if variants and data.get("variant") is None:
        print(
            f"note: experiment '{data.get('experiment')}' is a sweep of {len(variants)} variants "
            f"({', '.join(list(variants)[:6])}{', ...' if len(variants) > 6 else ''}): add -m to run it; "
            "without it this is one trial of the experiment's defaults (variant=NAME picks one)",
            file=sys.stderr,
            flush=True,
        )
    configs, sized = size_sweep([(overrides, data)], out_dir, print_progress)
    jobs = prepare_jobs(configs)
    params: dict[str, Any] = {"sweep_overrides": [redact_override(o) for o in overrides], **sized}
    results = run_sweep(jobs, out_dir, out_dir.name, params)
    return results[0].status if results else "DRY_RUN"
