"""What a lever proposes from a configuration (:func:`propose` -> :class:`Proposal`): a move
changes one or more knobs (``{times: F}``, ``{plus: D}``, ``{to: V}``, the demand a batch-slots
finding saw, a prefill budget sized to the stalls a prefill-interference finding measured);
where the space lists a knob's values, the knob moves to the next listed value in the move's
direction. A move that cannot be proposed says why (:class:`Proposal` with ``skip``): it is
passed over, never started."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config.schema.engines import SGLangEngineSpec, VLLMEngineSpec
from orchestrator.metrics.diagnosis import Evidence
from orchestrator.tuning.levers import Change, Lever
from orchestrator.tuning.space import Space

MODEL_KNOB = "model.name"  # in a configuration's knobs beside the engine's: a lever's ``models`` reads it
# the smallest prefill token budget a stall move proposes: the course's sweep starts there, and
# below vLLM's default max_num_seqs vLLM refuses a budget
STALL_BUDGET_MIN = 256
ENGINE_FIELDS = {"vllm": set(VLLMEngineSpec.model_fields), "sglang": set(SGLangEngineSpec.model_fields)}


@dataclass(frozen=True)
class Start:
    """Where a move starts: the configuration's knobs (knob -> value; unset knobs absent or None;
    the model's name under :data:`MODEL_KNOB`), the space it may move in, the engine and the
    platform, and whether the objective constrains accuracy (a move that changes the model's
    numbers needs that)."""

    knobs: Mapping[str, Any]
    space: Space
    engine: str
    platform: str
    guards_accuracy: bool = False


@dataclass(frozen=True)
class Proposal:
    """A lever applied to a configuration for the causes it addresses (one; two for two moves made
    together): the knobs' new values, or why it is passed over."""

    causes: tuple[str, ...]
    lever: Lever
    values: dict[str, Any]  # knob -> new value (empty when skipped)
    skip: str = ""

    @property
    def cause(self) -> str:
        """The causes in one word: ``batch_slots``, ``over_capacity+prefix_reuse_missed``."""
        return "+".join(self.causes)

    def words(self, current: Mapping[str, Any]) -> str:
        """``max_num_seqs 2 -> 4``: each knob's move."""
        return ", ".join(f"{_short(k)} {_show(current.get(k))} -> {_show(v)}" for k, v in self.values.items())


def combined(a: Proposal | None, b: Proposal | None) -> Proposal | None:
    """Two moves for different causes on different knobs, made together: where both causes hold,
    neither move alone shows what both do (the tuner's third candidate of a step); None otherwise."""
    if a is None or b is None or a.skip or b.skip or set(a.causes) & set(b.causes) or set(a.values) & set(b.values):
        return None
    change = {**a.lever.change, **b.lever.change}
    lever = a.lever.model_copy(update={"name": f"{a.lever.name} with {b.lever.name}", "change": change})
    return Proposal((*a.causes, *b.causes), lever, {**a.values, **b.values})


def propose(cause: str, lever: Lever, start: Start, evidence: Evidence | None = None) -> Proposal:
    """What ``lever`` proposes for ``cause`` from ``start``; ``evidence``: the finding's (what a
    ``demand`` or a ``stall`` move reads)."""

    def skip(why: str) -> Proposal:
        return Proposal((cause,), lever, {}, why)

    why = _applies(lever, start)
    if why:
        return skip(why)
    current, space = start.knobs, start.space
    values: dict[str, Any] = {}
    for knob, need in lever.requires.items():  # a setting the move needs: set with it where the space allows
        if current.get(knob) == need:
            continue
        listed = space.lists.get(knob)
        if not space.allows(knob) or (listed is not None and need not in listed):
            return skip(f"needs {knob}={_show(need)}, which the search space does not allow")
        values[knob] = need
    for knob, change in lever.change.items():
        if not space.allows(knob):
            return skip(f"{knob} is not in the search space")
        new, why = _moved(knob, change, current.get(knob), space, evidence or Evidence())
        if why:
            return skip(why)
        values[knob] = new
    if all(current.get(k) == v for k, v in values.items()):
        return skip("changes nothing here")
    return Proposal((cause,), lever, values)


def _applies(lever: Lever, start: Start) -> str:
    """Why ``lever`` does not apply here at all (another engine, platform or model; a knob the
    engine lacks; the model's numbers changed without an accuracy constraint), or ''."""
    if lever.engine is not None and lever.engine != start.engine:
        return f"a {lever.engine} lever (the engine is {start.engine})"
    if lever.platform is not None and lever.platform != start.platform:
        return f"a {lever.platform} lever (the platform is {start.platform})"
    model = start.knobs.get(MODEL_KNOB)
    if lever.models and model not in lever.models:
        return f"a lever for {', '.join(lever.models)} (the model is {model})"
    fields = ENGINE_FIELDS.get(start.engine)
    if fields is not None:
        lacks = [k for k in lever.change if k.split(".")[1] not in fields]
        if lacks:
            return f"{start.engine} has no {', '.join(lacks)}"
    if lever.accuracy and not start.guards_accuracy:
        return "it changes the model's numbers, and the objective has no accuracy constraint (subject_to)"
    return ""


def _moved(knob: str, change: Change, value: Any, space: Space, evidence: Evidence) -> tuple[Any, str]:
    """The knob's value after ``change``, or why there is none."""
    listed = space.lists.get(knob)
    if change.demand:
        return _demanded(knob, value, space, evidence)
    if change.stall is not None:
        return _stall_sized(knob, value, space, evidence, change.stall)
    if listed is not None and change.direction != 0:
        if value not in listed:
            return None, f"{knob} is {_show(value)}, not one of the space's values {list(listed)}"
        numeric = all(_number(v) for v in listed)
        ordered = sorted(listed) if numeric else list(listed)  # up and down by value, whatever the list's order
        i = ordered.index(value) + change.direction
        if not 0 <= i < len(ordered):
            return None, f"{knob} is at the end of the space's values ({_show(value)})"
        return ordered[i], ""
    if change.direction == 0:
        if listed is not None and change.to not in listed:
            return None, f"{knob}: {_show(change.to)} is not one of the space's values {list(listed)}"
        return change.to, ""
    if not _number(value):
        return None, f"{knob} is unset (the engine's default): set it in the baseline or list its values in the space"
    new = value * change.times if change.times is not None else value + (change.plus or 0.0)
    if isinstance(value, int):
        new = max(1, int(round(new)))
    else:
        new = round(float(new), 6)
    lo, hi = space.ranges.get(knob, (-math.inf, math.inf))
    new = min(max(new, lo), hi)
    if new == value:
        return None, f"{knob} is at the space's bound ({_show(value)})"
    return new, ""


def _demanded(knob: str, value: Any, space: Space, evidence: Evidence) -> tuple[Any, str]:
    """The demand the finding saw (running plus waiting at the peak), as the space allows it:
    the smallest listed value that holds it (else the largest), or the demand within the range."""
    if evidence.running_max is None or evidence.waiting_max is None:
        return None, "the finding measured no demand (running and waiting requests)"
    need = int(math.ceil(evidence.running_max + evidence.waiting_max))
    listed = space.lists.get(knob)
    if listed is not None:
        numbers = sorted(v for v in listed if _number(v))
        new = next((v for v in numbers if v >= need), numbers[-1] if numbers else None)
    else:
        lo, hi = space.ranges.get(knob, (-math.inf, math.inf))
        new = int(min(max(need, lo), hi))
    if new is None or (isinstance(value, (int, float)) and new <= value):
        return None, f"{knob} already holds the demand the finding saw ({need})"
    return new, ""


def stall_budget(evidence: Evidence, steps: float) -> float | None:
    """The prefill tokens one step may take for its stall to last about ``steps`` decode steps:
    a stall is a decode step (``decode_step_ms``, the stalled streams' median gap) plus the
    chunk's prefill, ``prefill_stall_ms_per_token`` per token (the prefill-interference finding's
    evidence). None without that evidence."""
    step, per_token = evidence.decode_step_ms, evidence.prefill_stall_ms_per_token
    if not step or not per_token:
        return None
    return (steps - 1) * step / per_token


def _stall_sized(knob: str, value: Any, space: Space, evidence: Evidence, steps: float) -> tuple[Any, str]:
    """The token budget :func:`stall_budget` asks for, as the space allows it: the listed value
    nearest to it (by ratio), else a power of two within the range, at least
    :data:`STALL_BUDGET_MIN`; only ever lower than the budget now."""
    target = stall_budget(evidence, steps)
    if target is None:
        return None, "the finding measured no stall cost per prompt token"
    listed = space.lists.get(knob)
    if listed is not None:
        numbers = [v for v in listed if _number(v) and v > 0]
        new = min(numbers, key=lambda v: abs(math.log(v / max(target, 1.0)))) if numbers else None
    else:
        lo, hi = space.ranges.get(knob, (-math.inf, math.inf))
        new = int(min(max(2 ** round(math.log2(max(target, 1.0))), STALL_BUDGET_MIN, lo), hi))
    if new is None or (_number(value) and new >= value):
        return (
            None,
            f"{knob} {_show(value)} already keeps a chunk's stall within {steps:g} decode steps ({target:.0f} tokens)",
        )
    return new, ""


def _number(value: Any) -> bool:
    """A knob's number (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(knob: str) -> str:
    return knob.removeprefix("engine.")


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return str(value)
