"""The tuner's configurations: a :class:`Candidate` (the knobs it sets on top of the baseline,
the proposal that made it), what its race said (:class:`RacedBefore`), its identity and name, a
value as Hydra's override grammar reads it; and the objective checked before anything starts
(:func:`tunable`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.metric_keys import is_knob
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.tuning.moves import Proposal

BASELINE = "baseline"


@dataclasses.dataclass
class Candidate:
    """A configuration the tuner runs: its name, its knobs that differ from the baseline's
    overrides, and the lever that made it."""

    name: str
    knobs: dict[str, Any]  # knob -> value, set on top of the baseline
    proposal: Proposal | None = None
    earlier: RacedBefore | None = None  # a second look: its first race, which this step continues


@dataclasses.dataclass(frozen=True)
class RacedBefore:
    """A configuration the tuner raced: the step, what its race said, against which incumbent."""

    step: int
    decision: str
    incumbent: str  # the incumbent's identity
    undecided: bool = False  # its race against the incumbent was undecided (not a tie, not worse)
    led: bool = False  # ... and it led that race: a later diagnosis naming it again gets a second look
    looks: int = 1  # its races (a second look continues the first)
    runs: int = 0  # the runs each its race made
    need: int | None = None  # the runs each that would decide it, at the noise and lead measured (None: none do)

    def second_look(self, incumbent: str) -> bool:
        """Whether its race is continued beside ``incumbent`` (its identity): it led, undecided."""
        return self.undecided and self.led and self.looks == 1 and self.incumbent == incumbent

    def words(self) -> str:
        return f"step {self.step}: {self.decision}"

    def more(self) -> int:
        """The runs each a second look adds to its race: to the runs that decide it."""
        return max((self.need or 0) - self.runs, 1)

    def continued(self) -> tuple[int, list[str]]:
        """A second look's launch: the step whose requests it takes (the first race's: its trial
        hashes, so the runs made are read back, not measured again) and the race's overrides: its
        cap raised to the runs that decide it, the budget in first passes for the rounds added."""
        more = self.more()
        return self.step, [f"++objective.max_repeats={self.runs + more}", f"++objective.budget={more + 0.5:g}"]


def continued_race(candidates: Sequence[Candidate]) -> RacedBefore | None:
    """The first race a step continues (a second look, alone in its step), or None."""
    return next((c.earlier for c in candidates if c.earlier is not None and c.earlier.need), None)


def identity(knobs: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(knobs.items())), sort_keys=True, default=str)


def name_of(knobs: Mapping[str, Any]) -> str:
    return knob_words(knobs).replace(" ", "") or BASELINE


def knob_words(knobs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('engine.')}={hydra_value(v)}" for k, v in knobs.items())


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def parsed(value: str) -> Any:
    """A command line's choice as a value (``8`` an int, ``true`` a bool)."""
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    return text if text.replace("_", "").replace("-", "").replace(".", "").isalnum() else json.dumps(text)


def tunable(objective: ObjectiveSpec) -> ObjectiveSpec:
    if is_knob(objective.key):
        raise ConfigError(
            f"hydra/sweeper=tune: the objective {objective.key} is a knob; the tuner needs a measured metric: "
            "replace it, e.g. '~objective' '+objective={maximize: tokens_per_second}'"
        )
    return objective
