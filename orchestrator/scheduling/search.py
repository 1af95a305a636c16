"""Knob search across trials with Optuna (``hydra/sweeper=optuna``).

The space is the grid's: every choice list of ``hydra.sweeper.params`` and of the command
line's sweep overrides (``engine.block_size=16,32``) is a categorical parameter. One Optuna
study per experiment and space, stored (sqlite by default) so a search interrupted with
Ctrl-C resumes where it stopped: trials that were running are asked again first. Each batch
of asked trials is one ordinary launch (Ray, server reuse, resume by trial hash, MLflow):

* a trial that cannot run here (SKIPPED before launch) or misses the objective's constraints
  is told to the study as failed, with the reason as a user attribute;
* a trial whose hash already FINISHED (this study or any earlier sweep) is not measured
  again: its numbers are read back from MLflow and told.

The objective is the experiment's ``objective`` (maximize or minimize one metric or knob);
with ``hydra.sweeper.multi_objective=true`` the study is two-objective on its ``frontier``
(``{maximize: a, minimize: b}``) and ends with the Pareto set.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.config.secrets import redact_text
from orchestrator.scheduling.launched import Launcher, TrialOutcome, launch_batch
from orchestrator.scheduling.ray_exec import ray_kept_between_sweeps
from orchestrator.scheduling.search_options import SearchOptions
from orchestrator.tracking import sqlite_file

if TYPE_CHECKING:
    from hydra.types import HydraContext
    from omegaconf import DictConfig

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "nsga2")


def search_space(
    hydra_context: Any, params: dict[str, Any], arguments: list[str], sweeper: str = "optuna"
) -> tuple[list[str], dict[str, list[str]]]:
    """(fixed overrides, {key: choices}) from the sweeper's params and the command line; the
    optuna sweeper needs choices, the tuner (``sweeper="tune"``) may have none."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in params.items()] + list(arguments)
    parser = OverridesParser.create(config_loader=hydra_context.config_loader)
    fixed: list[str] = []
    space: dict[str, list[str]] = {}
    for o in parser.parse_overrides(lines):
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise ConfigError(f"{key}: the {sweeper} sweeper takes lists of choices (a,b,c); got {o.input_line!r}")
            space[key] = [str(v) for v in o.sweep_string_iterator()]
        else:
            fixed.append(o.input_line or f"{key}={o.value()}")
    if not space and sweeper == "optuna":
        raise ConfigError(
            "hydra/sweeper=optuna: nothing to search; give choice lists (e.g. engine.block_size=32,64) "
            "or an experiment with hydra.sweeper.params"
        )
    return fixed, space


def objective_of(config: Any, sweeper: str = "optuna") -> ObjectiveSpec:
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(config.objective, resolve=True) if config.get("objective") is not None else None
    if raw is None:
        raise ConfigError(
            f"hydra/sweeper={sweeper} needs an objective: set `objective` (e.g. "
            "'+objective={maximize:tokens_per_second}') or use an experiment that declares one"
        )
    try:
        objective = ObjectiveSpec.model_validate(raw)
        objective.check_names()
        return objective
    except ValueError as exc:
        raise ConfigError(f"objective: {exc}") from None


def targets(goal: ObjectiveSpec, multi: bool) -> list[tuple[str, Literal["maximize", "minimize"]]]:
    """(metric, direction) pairs the study optimises."""
    if not multi:
        return [(goal.key, "maximize" if goal.maximize else "minimize")]
    if goal.frontier is None:
        raise ConfigError("hydra.sweeper.multi_objective=true needs objective.frontier: {maximize: a, minimize: b}")
    return [(goal.frontier["maximize"], "maximize"), (goal.frontier["minimize"], "minimize")]


def run_search(
    hydra_context: HydraContext, config: DictConfig, launcher: Launcher, arguments: list[str], options: SearchOptions
) -> Any:
    """Ask the study for trials in batches, launch each batch, tell it what they measured."""
    fixed, space = search_space(hydra_context, dict(options.params), arguments)
    multi = options.multi_objective
    goals = targets(objective_of(config), multi)
    dry = bool(config.get("dry_run"))
    study, done, where, stale = _open_study(config, options, fixed, space, goals, dry)
    n_trials = options.n_trials
    batch_size = max(1, options.batch_size)
    print(
        f"optuna: {where}: {len(done)} of {n_trials} trial(s) done"
        + (f", {stale} interrupted one(s) asked again" if stale else "")
        + "; searching "
        + ", ".join(f"{k} ({len(v)})" for k, v in space.items())
        + " for "
        + ", ".join(f"{d} {m}" for m, d in goals),
        flush=True,
    )
    returns = []
    job_idx = 0
    with ray_kept_between_sweeps():  # each batch is a sweep: one Ray for all of them
        while len(done) < n_trials:
            asked = [study.ask() for _ in range(min(batch_size, n_trials - len(done)))]
            overrides = [fixed + [f"{k}={t.suggest_categorical(k, v)}" for k, v in space.items()] for t in asked]
            batch = launch_batch(launcher, overrides, job_idx)
            job_idx += len(overrides)
            for trial, outcome in zip(asked, batch.outcomes):
                _tell(study, trial, outcome, goals)
                done.append(study.trials[trial.number])
            returns.append(batch.returns)
    if dry:
        print(f"optuna: dry run: nothing measured; {where}", flush=True)
    else:
        _print_best(study, goals, multi)
    return returns


def _open_study(
    config: Any,
    options: SearchOptions,
    fixed: list[str],
    space: dict[str, list[str]],
    goals: list[tuple[str, Literal["maximize", "minimize"]]],
    dry: bool,
) -> tuple[Any, list[Any], str, int]:
    """The study of this experiment and space (created, or loaded to resume) and its trials
    already told, where it is stored and how many were interrupted. Trials asked before a Ctrl-C and never told are failed and asked again first."""
    import optuna
    from optuna.trial import TrialState

    sampler_name = options.sampler
    if sampler_name not in SAMPLERS:
        raise ConfigError(f"hydra.sweeper.sampler: expected one of {', '.join(SAMPLERS)}, got {sampler_name!r}")
    seed = options.seed
    sampler = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }[sampler_name]()
    identity = json.dumps({"fixed": sorted(fixed), "space": space, "goals": goals}, sort_keys=True)
    name = options.study_name or f"{config.experiment}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"
    storage = options.storage or "sqlite:///optuna.db"
    db = sqlite_file(storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if dry:
        # a plan reads the stored study and writes nothing: its trials, asked and told DRY_RUN,
        # would otherwise count as done and the real search after it would run none
        memory = optuna.storages.InMemoryStorage()
        stored = db is None or db.exists()  # a sqlite file not made yet holds no study, and is not made
        if stored and name in optuna.get_all_study_names(storage):
            optuna.copy_study(from_study_name=name, from_storage=storage, to_storage=memory)
        storage_used: Any = memory
        where = f"study '{name}' in {redact_text(storage)} (dry run: read, not written)"
    else:
        if db is not None:  # as MLflow's store: a study in a folder not made yet is made there
            try:
                db.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"hydra.sweeper.storage: cannot create the folder of {db}: {exc}") from None
        storage_used, where = storage, f"study '{name}' in {redact_text(storage)}"
    study = optuna.create_study(
        study_name=name, storage=storage_used, load_if_exists=True, sampler=sampler, directions=[d for _, d in goals]
    )
    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        study.set_user_attr(f"interrupted_{t.number}", True)
        study.enqueue_trial(t.params, skip_if_exists=False)
    interrupted = {int(k.split("_")[1]) for k in study.user_attrs if k.startswith("interrupted_")}
    done = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.FAIL) and t.number not in interrupted
    ]
    return study, done, where, len(stale)


def _tell(study: Any, trial: Any, outcome: TrialOutcome, goals: Sequence[tuple[str, str]]) -> None:
    """Tell the study a launched trial's values, or that it failed and why (SKIPPED, failed,
    the objective's constraints missed, a goal not measured)."""
    from optuna.trial import TrialState

    if outcome.status == "DRY_RUN":  # planned, not measured: told to the in-memory copy only
        study.tell(trial, state=TrialState.FAIL)
        print(f"optuna: trial {trial.number} {trial.params}: planned (dry run)", flush=True)
        return
    values = outcome.values
    trial.set_user_attr("status", outcome.status)
    trial.set_user_attr("trial_hash", outcome.trial_hash)
    told = {m: v for m, _ in goals if (v := values.get(m)) is not None}
    missing = [m for m, _ in goals if m not in told]
    if outcome.status == "FINISHED" and outcome.feasible and not missing:
        study.tell(trial, [told[m] for m, _ in goals])
        print(
            f"optuna: trial {trial.number} {trial.params}: " + ", ".join(f"{m} {told[m]:.4g}" for m, _ in goals),
            flush=True,
        )
        return
    why = outcome.why or (
        f"{', '.join(missing)}: not measured or not set" if missing and outcome.status == "FINISHED" else outcome.status
    )
    trial.set_user_attr("reason", str(why))
    study.tell(trial, state=TrialState.FAIL)
    print(f"optuna: trial {trial.number} {trial.params}: not counted ({why})", flush=True)


def _print_best(study: Any, goals: Sequence[tuple[str, str]], multi: bool) -> None:
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        print("optuna: no trial met the objective's constraints", flush=True)
    elif multi:
        for t in study.best_trials:
            print(
                f"optuna: Pareto trial {t.number} {t.params}: "
                + ", ".join(f"{m} {v:.4g}" for (m, _), v in zip(goals, t.values)),
                flush=True,
            )
    else:
        best = study.best_trial
        print(
            f"optuna: best trial {best.number} {best.params}: {goals[0][0]} {best.value:.4g} "
            f"({len(complete)} counted of {len(study.trials)} asked)",
            flush=True,
        )
