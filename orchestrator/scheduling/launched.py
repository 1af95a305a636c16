"""What the launcher gives a sweeper back for each job it ran (the tuner, the Optuna search):
one :class:`TrialOutcome`, typed, on the job's Hydra ``JobReturn`` (its ``return_value``), and
:func:`launch_batch`, which launches a batch of overrides and reads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from orchestrator.decide.trials import TrialData

# FINISHED, FAILED, SKIPPED: a trial's status; DRY_RUN: planned, nothing measured; NOT_RUN: no
# result (the sweep stopped before it, or its result could not be read back)
OutcomeStatus = Literal["FINISHED", "FAILED", "SKIPPED", "DRY_RUN", "NOT_RUN"]


@dataclass(frozen=True)
class TrialOutcome:
    """One job of a launch: its status and trial hash; with an objective, the values of its metric
    (and its frontier's), whether its constraints hold (``why`` not); and the trial as the
    decisions read it, a race's runs folded in (None where nothing was measured or read back)."""

    status: OutcomeStatus
    trial_hash: str
    trial: TrialData | None = None
    values: Mapping[str, float | None] = field(default_factory=dict)
    feasible: bool = False
    why: str = ""


class Launcher(Protocol):
    """Hydra's launcher as a sweeper holds it (``hydra/launcher=ray``: the Ray trial launcher)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]: ...


@dataclass(frozen=True)
class Batch:
    """A launch's Hydra returns (what the sweeper returns to Hydra) and each job's outcome."""

    returns: list[Any]
    outcomes: list[TrialOutcome]


def launch_batch(launcher: Launcher, overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Batch:
    """Launch the batch with Hydra's launcher; each job's :class:`TrialOutcome`, in order."""
    returns = list(launcher.launch(overrides, initial_job_idx=initial_job_idx))
    outcomes = []
    for ret in returns:
        value = ret.return_value
        outcomes.append(
            value
            if isinstance(value, TrialOutcome)
            else TrialOutcome("NOT_RUN", "", why=f"the launcher returned no outcome ({value!r})")
        )
    return Batch(returns, outcomes)
