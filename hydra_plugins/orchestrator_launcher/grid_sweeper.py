"""Hydra sweeper ``hydra/sweeper=grid`` (the default of conf/config.yaml): Hydra's basic sweeper
(the same grid, the same ``hydra.sweeper.params``, the same batches) without its up-front check,
which composed every job's whole config once more before the launcher composed it again (0.1-0.2 s
a job). The launcher composes and validates every job of a batch before anything starts
(``orchestrator.scheduling.compose.SweepComposer``), with Hydra's error messages.
"""

from dataclasses import dataclass  # no `from __future__ import annotations`: Hydra scans this module
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore


@dataclass
class GridSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.orchestrator_launcher.grid_sweeper.GridSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="grid", node=GridSweeperConf, provider="orchestrator")


class GridSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Any) -> None:
        """Left to the launcher, which composes each job once (see the module's docstring)."""
