"""The tuning's path: one :class:`Step` a diagnosis (the incumbent, what limited it, the moves
tried and passed over, the race's decision and the gain it measured), as ``tuning.json`` keeps
it (:meth:`Step.as_json`) and in words, a line a step (:func:`path_lines`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TriedMove:
    """A move a step raced: for which cause(s), the lever, the configuration it made, the change
    in words; ``second_look_of``: the step whose undecided race it continues."""

    cause: str
    lever: str
    name: str
    change: str
    second_look_of: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cause": self.cause, "lever": self.lever, "name": self.name, "change": self.change}
        if self.second_look_of is not None:
            out["second_look_of"] = self.second_look_of
        return out


@dataclass(frozen=True)
class PassedOver:
    """A move a step did not race, and why."""

    cause: str
    lever: str
    why: str

    def as_json(self) -> dict[str, str]:
        return {"cause": self.cause, "lever": self.lever, "why": self.why}


@dataclass
class Step:
    """One step of the path: the incumbent's diagnosis, the moves tried, the race's decision."""

    index: int
    incumbent: str
    headline: str  # the incumbent's diagnosis at the objective's point
    causes: list[str]
    tried: list[TriedMove] = field(default_factory=list)
    passed_over: list[PassedOver] = field(default_factory=list)
    decision: str = ""
    adopted: str | None = None
    adopted_knobs: dict[str, Any] | None = None  # the adopted configuration's knobs over the baseline's
    gain: tuple[float, float, float] | None = None  # of the adopted candidate, against the incumbent
    log_scale: bool = True
    values: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, 95% half-width)
    unjudged: list[str] = field(default_factory=list)  # what the incumbent's diagnosis could not measure
    passed_undecided: bool = False  # a lever was passed over whose race (a second look included) was undecided
    trials: int = 0  # trial runs of the tuning so far, this step's included (a race's repeats count)

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.index,
            "incumbent": self.incumbent,
            "limited_by": self.headline,
            "causes": self.causes,
            "tried": [t.as_json() for t in self.tried],
            "passed_over": [p.as_json() for p in self.passed_over],
            "decision": self.decision,
            "adopted": self.adopted,
            "adopted_knobs": self.adopted_knobs,
            "gain": list(self.gain) if self.gain else None,
            "values": {k: list(v) for k, v in self.values.items()},
            "not_judged": self.unjudged,
            "trials": self.trials,
        }


def undecided_hint(step: Step) -> str:
    """Where a lever was passed over because its race was undecided, what would decide it."""
    if not step.passed_undecided:
        return ""
    return (
        " (a lever tried before was undecided, not worse: objective.max_repeats=auto lets a step's race run "
        "the repeats its noise asks for)"
    )


def path_lines(steps: list[Step]) -> list[str]:
    """The path, a line a step: ``step 1: baseline limited by batch slots (strong: ...) ->
    max_num_seqs 1 -> 2: tokens_per_second +61% [+48%, +74%]``."""
    out = []
    for s in steps:
        head = f"step {s.index}: {s.incumbent} {s.headline}"
        if not s.tried:
            out.append(f"{head} -> {s.decision or 'no lever left to try'}")
            continue
        tried = "; ".join(f"{t.cause.replace('_', ' ')}: {t.lever}, {t.change}" for t in s.tried)
        out.append(f"{head} -> {tried}: {s.decision}")
    return out
