"""The Optuna search's options (``hydra.sweeper.*`` under ``hydra/sweeper=optuna``), declared
once: the Hydra plugin's config is this class with its target added, and the search gets it as
itself. Imported by Hydra's plugin discovery at every start: nothing heavy here."""

from dataclasses import dataclass, field  # no `from __future__ import annotations`: OmegaConf reads the types


@dataclass
class SearchOptions:
    n_trials: int = 10  # trials of the study in all (a resumed study counts its earlier ones)
    batch_size: int = 1  # trials asked at once; they run in parallel on Ray, sharing servers
    sampler: str = "tpe"  # tpe | random | nsga2 (nsga2 for a frontier)
    seed: int = 0
    multi_objective: bool = False  # true: two objectives, the experiment's objective.frontier
    storage: str | None = None  # default: sqlite:///optuna.db in the working directory
    study_name: str | None = None  # default: the experiment's name and its search space
    params: dict[str, str] = field(default_factory=dict)
