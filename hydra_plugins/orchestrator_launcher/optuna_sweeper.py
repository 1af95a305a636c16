"""Hydra sweeper ``hydra/sweeper=optuna``: a thin shell around :mod:`orchestrator.scheduling.search`.

    python -m orchestrator +experiment=chunked_prefill hydra/sweeper=optuna -m
    python -m orchestrator +experiment=chunked_prefill hydra/sweeper=optuna hydra.sweeper.n_trials=6 -m

It searches the same parameter spaces as the grid (``hydra.sweeper.params`` and sweep
overrides such as ``engine.block_size=16,32``) for the experiment's ``objective``.
"""

from dataclasses import dataclass  # no `from __future__ import annotations`: Hydra scans this module

from hydra.core.config_store import ConfigStore

from hydra_plugins.orchestrator_launcher.sweeper_shell import OrchestratorSweeper
from orchestrator.scheduling.search_options import SearchOptions


@dataclass
class OptunaTrialSweeperConf(SearchOptions):  # the options, their defaults: scheduling/search_options.py
    _target_: str = "hydra_plugins.orchestrator_launcher.optuna_sweeper.OptunaTrialSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaTrialSweeperConf, provider="orchestrator")


class OptunaTrialSweeper(OrchestratorSweeper):
    BODY = "orchestrator.scheduling.search:run_search"
    OPTIONS = SearchOptions
