"""Hydra launcher ``hydra/launcher=ray``: a thin shell around :mod:`orchestrator.scheduling`.

Hydra only loads launchers from the ``hydra_plugins`` namespace package and imports every
plugin at start, so heavy imports (ray) happen inside :meth:`launch`.
"""

from collections.abc import (
    Sequence,  # no `from __future__ import annotations`: Hydra scans this module before it is in sys.modules
)
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class RayTrialLauncherConf:
    _target_: str = "hydra_plugins.orchestrator_launcher.ray_launcher.RayTrialLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayTrialLauncherConf, provider="orchestrator")


class RayTrialLauncher(Launcher):
    def __init__(self, **kwargs: Any) -> None:
        self.hydra_context: Any = None
        self.task_function: Any = None
        self.config: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from orchestrator.config.resolvers import register
        from orchestrator.scheduling.hydra_launch import launch_multirun

        register()
        return launch_multirun(self.hydra_context, self.config, job_overrides, initial_job_idx)
