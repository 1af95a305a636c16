"""Hydra sweeper ``hydra/sweeper=tune``: a thin shell around :mod:`orchestrator.tuning`.

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

from dataclasses import dataclass  # no `from __future__ import annotations`: Hydra scans this module

from hydra.core.config_store import ConfigStore

from hydra_plugins.orchestrator_launcher.sweeper_shell import OrchestratorSweeper
from orchestrator.tuning.options import TuneOptions


@dataclass
class TuneSweeperConf(TuneOptions):  # the options and their defaults: orchestrator/tuning/options.py
    _target_: str = "hydra_plugins.orchestrator_launcher.tune_sweeper.TuneSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="tune", node=TuneSweeperConf, provider="orchestrator")


class TuneSweeper(OrchestratorSweeper):
    BODY = "orchestrator.tuning.loop:run_tuning"
    OPTIONS = TuneOptions
