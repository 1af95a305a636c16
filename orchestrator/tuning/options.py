"""The tuner's options (``hydra.sweeper.*`` under ``hydra/sweeper=tune``), declared once: the
Hydra plugin's config is this class with its target added, and the tuner gets it as itself.
Imported by Hydra's plugin discovery at every start: nothing heavy here."""

from dataclasses import dataclass, field  # no `from __future__ import annotations`: OmegaConf reads the types
from typing import Any


@dataclass
class TuneOptions:
    max_steps: int = 6  # diagnose-and-race steps at most
    max_trials: int = 40  # trial runs at most (the race's repeats and the incumbent's runs count)
    max_wall_s: float | None = None  # no new step after this many seconds
    candidates: int = 2  # candidates raced beside the incumbent in a step
    combine: bool = True  # where a step's two moves are for different causes on different knobs, both together too
    levers: str | None = None  # a YAML file of your own rows (a cause there replaces the default's list)
    space: dict[str, Any] = field(default_factory=dict)  # {engine: {knob: [values] or {min: a, max: b}}}
    params: dict[str, str] = field(default_factory=dict)  # an experiment's grid: not run by the tuner
