"""Hydra sweeper ``hydra/sweeper=tune``: a thin shell around :mod:`orchestrator.scheduling.tuning`.

    python -m orchestrator +experiment=continuous_batching engine.max_num_seqs=1 hydra/sweeper=tune -m
    python -m orchestrator +experiment=continuous_batching engine.max_num_seqs=1,2,4,8 hydra/sweeper=tune -m
    python -m orchestrator +experiment=continuous_batching hydra/sweeper=tune \
        '+hydra.sweeper.space.engine={max_num_seqs: [1, 2, 4, 8], max_num_batched_tokens: {min: 256, max: 4096}}' -m

A command line's list is a knob's space, its first value the baseline's; ``hydra.sweeper.space``
gives lists or ranges; with neither, every knob a lever names may move. From the baseline (the
experiment with the command line's overrides) it diagnoses, tries the
levers of what limited it (``conf/tuning/levers.yaml``), races them beside the incumbent and
adopts a candidate only when it wins with the verdict's confidence (docs/tuning.md).
"""

from dataclasses import dataclass, field  # no `from __future__ import annotations`: Hydra scans this module
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper


@dataclass
class TuneSweeperConf:
    _target_: str = "hydra_plugins.orchestrator_launcher.tune_sweeper.TuneSweeper"
    max_steps: int = 6  # diagnose-and-race steps at most
    max_trials: int = 40  # trial runs at most (the race's repeats and the incumbent's runs count)
    max_wall_s: float | None = None  # no new step after this many seconds
    candidates: int = 2  # candidates raced beside the incumbent in a step
    levers: str | None = None  # a YAML file of your own rows (a cause there replaces the default's list)
    space: dict[str, Any] = field(default_factory=dict)  # {engine: {knob: [values] or {min: a, max: b}}}
    params: dict[str, str] = field(default_factory=dict)  # an experiment's grid: not run by the tuner


ConfigStore.instance().store(group="hydra/sweeper", name="tune", node=TuneSweeperConf, provider="orchestrator")


class TuneSweeper(Sweeper):
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
        import sys

        from omegaconf import OmegaConf

        from orchestrator.config import ConfigError
        from orchestrator.config.resolvers import register
        from orchestrator.scheduling import outcome
        from orchestrator.scheduling.tuning import run_tuning

        outcome.reached()
        register()
        options = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in self.options.items()}
        try:
            return run_tuning(self.hydra_context, self.config, self.launcher, arguments, options)
        except ConfigError as exc:  # a config mistake: one clear line, exit code 2, as the launcher does
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
