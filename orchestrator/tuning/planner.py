"""What a step of the tuner tries, pure: the causes the incumbent's diagnosis names that a server's
configuration can act on, the limiter first (:func:`causes_of`), each cause's own levers in the
table's order, proposed from the incumbent within the space (:mod:`orchestrator.tuning.moves`),
each passed over with its reason where it cannot run or was raced already, and what the races so
far said (:meth:`Planner.remember`), which decides a second look at an undecided lead."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.decide.trials import Point
from orchestrator.metrics.diagnosis import SERVER_CAUSES, Finding, LoggedDiagnosis
from orchestrator.tuning.candidates import Candidate, RacedBefore, identity, name_of
from orchestrator.tuning.judging import Judged
from orchestrator.tuning.levers import LeverTable
from orchestrator.tuning.moves import Proposal, Start, combined, propose
from orchestrator.tuning.path import PassedOver, Step, TriedMove
from orchestrator.tuning.space import Space


def causes_of(diagnosis: LoggedDiagnosis) -> list[Finding]:
    """The findings to act on, in order: the diagnosis's limiter, then its other findings (prefix
    reuse missed among them), one per cause. Causes outside the server (the client, a shared
    machine) and ``none`` are never acted on (:data:`SERVER_CAUSES`)."""
    ordered = sorted(diagnosis.findings, key=lambda f: f.cause != diagnosis.limiter)
    out: list[Finding] = []
    for f in ordered:
        if f.cause in SERVER_CAUSES and all(c.cause != f.cause for c in out):
            out.append(f)
    return out


class Configurations(Protocol):
    """What the planner asks of a configuration (the incumbent's knobs with a move's on top)."""

    def knobs(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """Its knobs as the levers read them: every engine knob, and the model's name."""
        ...

    def refused(self, knobs: Mapping[str, Any]) -> str:
        """Why it cannot run (its config, the engine, the hardware), or ''."""
        ...


class Budget(Protocol):
    def over(self, trials: int) -> str:
        """Why ``trials`` more trial runs would pass the tuning's budget, or ''."""
        ...


@dataclass(frozen=True)
class Policy:
    """How a step chooses: its candidates at most, whether two causes' moves are also raced
    together, and what the moves may touch."""

    levers: LeverTable
    space: Space
    engine: str
    platform: str  # the lever table's words: cpu or gpu
    guards_accuracy: bool  # the objective constrains accuracy (a move may change the model's numbers)
    per_step: int = 2
    combine: bool = True

    def start(self, knobs: Mapping[str, Any]) -> Start:
        """Where a move starts from a configuration with these knobs (as the levers read them)."""
        return Start(knobs, self.space, self.engine, self.platform, self.guards_accuracy)


@dataclass
class Planner:
    """The steps' proposals, and the races they led to (by configuration)."""

    policy: Policy
    configs: Configurations
    budget: Budget
    tried: dict[str, RacedBefore] = field(default_factory=dict)  # a configuration's identity -> its race
    seen: dict[str, str] = field(default_factory=dict)  # a configuration's identity -> its name

    def next_step(self, k: int, incumbent: Candidate, point: Point | None) -> tuple[Step, list[Candidate]]:
        """Step ``k``: the incumbent's diagnosis at the objective's point and the candidates its
        causes' levers propose (a second look at an undecided lead runs alone in its step)."""
        diagnosis = point.diagnosis if point is not None else LoggedDiagnosis()
        causes = causes_of(diagnosis)
        headline = diagnosis.headline or ("not diagnosed" if point is not None else "measured no point")
        step = Step(k, incumbent.name, headline, [c.cause for c in causes], unjudged=list(diagnosis.unmeasured))
        p = self.policy
        start = p.start(self.configs.knobs(incumbent.knobs))
        chosen: list[Candidate] = []
        for finding in causes:
            for lever in p.levers.get(finding.cause, []):
                if len(chosen) >= p.per_step:
                    break
                proposal = propose(finding.cause, lever, start, finding.evidence)
                taken = self.consider(step, incumbent, proposal, chosen, start.knobs)
                if taken is not None and taken.earlier is not None:
                    return step, chosen  # a second look: its race continued, alone in its step
        both = combined(*(c.proposal for c in chosen)) if p.combine and len(chosen) == 2 else None
        if both is not None:  # two causes' moves on different knobs: also both together
            self.consider(step, incumbent, both, chosen, start.knobs)
        return step, chosen

    def consider(
        self, step: Step, incumbent: Candidate, p: Proposal, chosen: list[Candidate], current: Mapping[str, Any]
    ) -> Candidate | None:
        """The proposal as one of the step's candidates, or passed over with its reason (``current``:
        the incumbent's knobs, for the change in words)."""
        knobs = {**incumbent.knobs, **p.values}
        ident = identity(knobs)
        earlier = self.tried.get(ident)
        why = p.skip or self.passed(step, ident, earlier, chosen, incumbent) or self.configs.refused(knobs)
        if not why and earlier is not None and chosen:  # a second look continues its race alone
            why = f"its race (step {earlier.step}) is continued in a step of its own, after this one"
        if why:
            step.passed_over.append(PassedOver(p.cause, p.lever.name, why))
            return None
        taken = Candidate(self.seen.setdefault(ident, name_of(knobs)), knobs, p, earlier)
        chosen.append(taken)
        change = p.words(current)
        if earlier is not None:  # that step's race, continued
            change += (
                f" (a second look: step {earlier.step}'s race was undecided after {earlier.runs} runs each; "
                f"continued to {earlier.need}, the runs its noise asks for)"
            )
        step.tried.append(TriedMove(p.cause, p.lever.name, taken.name, change, earlier.step if earlier else None))
        return taken

    def passed(
        self, step: Step, ident: str, earlier: RacedBefore | None, chosen: list[Candidate], incumbent: Candidate
    ) -> str:
        """Why a configuration a lever proposes is not raced as tried already, or '': new, or a
        second look (its race was undecided with it in the lead, beside the same incumbent)."""
        if any(identity(c.knobs) == ident for c in chosen):
            return "proposed already in this step"
        if earlier is None:
            return ""
        if earlier.second_look(identity(incumbent.knobs)):
            if earlier.need is None:
                return (
                    f"tried already ({earlier.words()}); at the noise measured no practical number of runs decides it"
                )
            if stop := self.budget.over(2 * earlier.more()):
                return f"tried already ({earlier.words()}); deciding needs {earlier.need} runs each: {stop}"
            return ""
        step.passed_undecided |= earlier.undecided  # an undecided race is not a "no": the stop says so
        return f"tried already ({earlier.words()})"  # where it was tried and what that race said

    def remember(self, step: Step, incumbent: Candidate, candidates: list[Candidate], judged: Judged) -> None:
        """What the step's race said of each candidate: a later step passes it over, or gives an
        undecided lead a second look."""
        state, outcome = judged.state, judged.outcome
        for c in candidates:
            led = outcome.led_undecided == c.name
            self.tried[identity(c.knobs)] = RacedBefore(
                step.index,
                step.decision,
                identity(incumbent.knobs),
                outcome.undecided,
                led,
                c.earlier.looks + 1 if c.earlier is not None else 1,
                state.runs.get(c.name, 0) if state is not None else 0,
                state.runs_to_decide(incumbent.name) if state is not None and led else None,
            )
