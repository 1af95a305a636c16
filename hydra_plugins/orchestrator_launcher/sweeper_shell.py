"""The shell the orchestrator's own sweepers share (``optuna``, ``tune``): Hydra hands the sweeper
its context and the configured launcher; the sweeper hands both to a body in
:mod:`orchestrator.scheduling` that launches its batches. A config mistake ends the command with
one clear line and exit code 2, as the launcher does. Heavy imports happen in :meth:`sweep`:
Hydra imports every plugin module at start."""

from typing import Any  # no `from __future__ import annotations`: Hydra scans this module

from hydra.plugins.sweeper import Sweeper


class OrchestratorSweeper(Sweeper):
    """Subclasses name their body, ``BODY = "module:function"``, and their options' class,
    ``OPTIONS`` (the dataclass their config extends); the body is called as
    ``function(hydra_context, config, launcher, arguments, options)``, ``options`` an ``OPTIONS``."""

    BODY = ""
    OPTIONS: Any = None

    def __init__(self, **kwargs: Any) -> None:
        self.options = kwargs
        self.hydra_context: Any = None
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        import importlib
        import sys

        from omegaconf import OmegaConf

        from orchestrator.config import ConfigError
        from orchestrator.config.resolvers import register
        from orchestrator.scheduling import outcome

        outcome.reached()
        register()
        module, name = self.BODY.split(":")
        body = getattr(importlib.import_module(module), name)
        given = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in self.options.items()}
        options = self.OPTIONS(**given)
        try:
            return body(self.hydra_context, self.config, self.launcher, arguments, options)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
