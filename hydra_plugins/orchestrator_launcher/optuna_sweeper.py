"""Hydra sweeper ``hydra/sweeper=optuna``: a thin shell around :mod:`orchestrator.scheduling.search`.

    python -m orchestrator +experiment=chunked_prefill hydra/sweeper=optuna -m
    python -m orchestrator +experiment=chunked_prefill hydra/sweeper=optuna hydra.sweeper.n_trials=6 -m

It searches the same parameter spaces as the grid (``hydra.sweeper.params`` and sweep
overrides such as ``engine.block_size=16,32``) for the experiment's ``objective``.
"""

from dataclasses import dataclass, field  # no `from __future__ import annotations`: Hydra scans this module

from hydra.core.config_store import ConfigStore

from hydra_plugins.orchestrator_launcher.sweeper_shell import OrchestratorSweeper


@dataclass
class OptunaTrialSweeperConf:
    _target_: str = "hydra_plugins.orchestrator_launcher.optuna_sweeper.OptunaTrialSweeper"
    n_trials: int = 10  # trials of the study in all (a resumed study counts its earlier ones)
    batch_size: int = 1  # trials asked at once; they run in parallel on Ray, sharing servers
    sampler: str = "tpe"  # tpe | random | nsga2 (nsga2 for a frontier)
    seed: int = 0
    multi_objective: bool = False  # true: two objectives, the experiment's objective.frontier
    storage: str | None = None  # default: sqlite:///optuna.db in the working directory
    study_name: str | None = None  # default: the experiment's name and its search space
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaTrialSweeperConf, provider="orchestrator")


class OptunaTrialSweeper(OrchestratorSweeper):
    BODY = "orchestrator.scheduling.search:run_search"
