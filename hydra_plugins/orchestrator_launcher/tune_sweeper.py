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

from hydra_plugins.orchestrator_launcher.sweeper_shell import OrchestratorSweeper


@dataclass
class TuneSweeperConf:
    _target_: str = "hydra_plugins.orchestrator_launcher.tune_sweeper.TuneSweeper"
    max_steps: int = 6  # diagnose-and-race steps at most
    max_trials: int = 40  # trial runs at most (the race's repeats and the incumbent's runs count)
    max_wall_s: float | None = None  # no new step after this many seconds
    candidates: int = 2  # candidates raced beside the incumbent in a step
    combine: bool = True  # where a step's two moves are for different causes on different knobs, both together too
    levers: str | None = None  # a YAML file of your own rows (a cause there replaces the default's list)
    space: dict[str, Any] = field(default_factory=dict)  # {engine: {knob: [values] or {min: a, max: b}}}
    params: dict[str, str] = field(default_factory=dict)  # an experiment's grid: not run by the tuner


ConfigStore.instance().store(group="hydra/sweeper", name="tune", node=TuneSweeperConf, provider="orchestrator")


class TuneSweeper(OrchestratorSweeper):
    BODY = "orchestrator.scheduling.tuning:run_tuning"
