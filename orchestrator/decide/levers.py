"""The tuner's levers, as data: for each cause the diagnosis names, the moves that address it,
in the order to try them (``conf/tuning/levers.yaml``; a user's file replaces a cause's rows),
and what a move proposes from a configuration within a search space (:func:`propose`).

A move changes one or more knobs (``{times: F}``, ``{plus: D}``, ``{to: V}``); where the space
lists a knob's values, the knob moves to the next listed value in the move's direction. A move
that cannot be proposed says why (:class:`Proposal` with ``skip``): it is passed over, never
started."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from orchestrator.config.convert import is_config_key
from orchestrator.config.errors import ConfigError
from orchestrator.config.metric_keys import LIMITERS
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.config.schema.base import StrictModel
from orchestrator.config.schema.engines import SGLangEngineSpec, VLLMEngineSpec

LEVERS_FILE = PROJECT_ROOT / "conf" / "tuning" / "levers.yaml"
MODEL_KNOB = "model.name"  # in a configuration's knobs beside the engine's: a lever's ``models`` reads it
CAUSES = tuple(c for c in LIMITERS if c not in ("none", "client", "shared_machine"))  # the server's causes
KINDS = ("times", "plus", "to", "demand", "stall")  # a change's kinds
# the smallest prefill token budget a stall move proposes: the course's sweep starts there, and
# below vLLM's default max_num_seqs vLLM refuses a budget
STALL_BUDGET_MIN = 256
ENGINE_FIELDS = {"vllm": set(VLLMEngineSpec.model_fields), "sglang": set(SGLangEngineSpec.model_fields)}


class Change(StrictModel):
    """One knob's change: exactly one of ``times``, ``plus``, ``to``, ``demand`` (as many as
    the finding saw running plus waiting at its peak: its evidence ``running_max + waiting_max``),
    ``stall`` (a prefill token budget whose chunk stalls a decode for about this many decode
    steps, from the prefill-interference finding's cost per prompt token: :func:`stall_budget`)."""

    times: float | None = Field(default=None, gt=0)
    plus: float | None = None
    to: Any = None
    demand: bool | None = None
    stall: float | None = Field(default=None, gt=1)

    @model_validator(mode="after")
    def _one(self) -> Change:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {', '.join(given) or 'none'})")
        return self

    @property
    def direction(self) -> int:
        """+1 raises the knob, -1 lowers it, 0 sets it."""
        if self.times is not None:
            return 1 if self.times > 1 else -1
        if self.plus is not None:
            return 1 if self.plus > 0 else -1
        if self.stall is not None:
            return -1
        return 1 if self.demand else 0


class Lever(StrictModel):
    """A move: a change of one or more knobs, tried for one cause."""

    name: str
    change: dict[str, Change] = Field(min_length=1)
    engine: Literal["vllm", "sglang"] | None = None
    platform: Literal["cpu", "gpu"] | None = None
    requires: dict[str, Any] = Field(default_factory=dict)
    models: list[str] = Field(
        default_factory=list, description="the models it applies to (a draft head trained for them)"
    )
    accuracy: bool = Field(default=False, description="changes the model's numbers: needs an accuracy constraint")
    why: str = ""


def load_levers(path: str | Path | None = None) -> dict[str, list[Lever]]:
    """The lever table: ``conf/tuning/levers.yaml``, a cause's rows replaced by ``path``'s where
    it has that cause. Every knob must be a key of a trial's config and every cause a word of the
    vocabulary: a clear error names the file, the cause and the row otherwise."""
    table = _read(LEVERS_FILE)
    if path is not None:
        table.update(_read(Path(path).expanduser()))
    return table


def _read(path: Path) -> dict[str, list[Lever]]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"hydra.sweeper.levers: cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of cause -> list of moves, got {type(raw).__name__}")
    out: dict[str, list[Lever]] = {}
    for cause, rows in raw.items():
        if cause not in CAUSES:
            raise ConfigError(f"{path}: '{cause}' is no cause the tuner acts on (one of: {', '.join(CAUSES)})")
        if not isinstance(rows, list):
            raise ConfigError(f"{path}: {cause}: expected a list of moves, got {type(rows).__name__}")
        levers = []
        for i, row in enumerate(rows):
            try:
                lever = Lever.model_validate(row)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ConfigError(f"{path}: {cause}[{i}] {where}: {first['msg']}") from None
            for knob in [*lever.change, *lever.requires]:
                if not knob.startswith("engine.") or not is_config_key(knob):
                    raise ConfigError(
                        f"{path}: {cause}[{i}] ({lever.name}): {knob} is no engine knob of a trial's config"
                    )
            levers.append(lever)
        out[str(cause)] = levers
    return out


@dataclass(frozen=True)
class Space:
    """The knobs the tuner may move: ``lists`` (knob -> the values allowed, in order) and
    ``ranges`` (knob -> (lowest, highest)); ``only``: the knobs named by either are all it may
    move (False: every knob a lever names, within what the engine and the hardware accept)."""

    lists: Mapping[str, tuple[Any, ...]]
    ranges: Mapping[str, tuple[float, float]]
    only: bool

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None, lists: Mapping[str, list[Any]] | None = None) -> Space:
        """From ``hydra.sweeper.space`` (knob -> [values] or {min, max}) and the command line's
        lists (``engine.max_num_seqs=1,2,4,8``)."""
        out_lists: dict[str, tuple[Any, ...]] = {}
        ranges: dict[str, tuple[float, float]] = {}
        given = [("the command line", k, list(v)) for k, v in (lists or {}).items()]
        given += [("hydra.sweeper.space", k, v) for k, v in _leaves(raw or {}).items()]
        for where, knob, value in given:
            if not is_config_key(str(knob)):
                raise ConfigError(f"{where}: {knob} is no key of a trial's config")
            if isinstance(value, (list, tuple)):
                out_lists[str(knob)] = tuple(value)
            elif isinstance(value, Mapping) and set(value) <= {"min", "max"} and value:
                lo, hi = float(value.get("min", -math.inf)), float(value.get("max", math.inf))
                if lo > hi:
                    raise ConfigError(f"hydra.sweeper.space.{knob}: min {lo:g} is above max {hi:g}")
                ranges[str(knob)] = (lo, hi)
            else:
                raise ConfigError(
                    f"hydra.sweeper.space.{knob}: expected a list of values or {{min: a, max: b}}, got {value!r}"
                )
        return cls(out_lists, ranges, bool(out_lists or ranges))

    def allows(self, knob: str) -> bool:
        return not self.only or knob in self.lists or knob in self.ranges


def _leaves(raw: Mapping[str, Any], head: str = "") -> dict[str, Any]:
    """A space written nested (``{engine: {max_num_seqs: [1, 2]}}``, as Hydra's command line
    needs it) or with dotted keys, as knob -> its list or range."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{head}.{key}" if head else str(key)
        if isinstance(value, Mapping) and not (value and set(value) <= {"min", "max"}):
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


@dataclass(frozen=True)
class Proposal:
    """A lever applied to a configuration: the knobs' new values, or why it is passed over."""

    cause: str
    lever: Lever
    values: dict[str, Any]  # knob -> new value (empty when skipped)
    skip: str = ""

    def words(self, current: Mapping[str, Any]) -> str:
        """``max_num_seqs 2 -> 4``: each knob's move."""
        return ", ".join(f"{_short(k)} {_show(current.get(k))} -> {_show(v)}" for k, v in self.values.items())


def combined(a: Proposal | None, b: Proposal | None) -> Proposal | None:
    """Two moves for different causes on different knobs, made together: where both causes hold,
    neither move alone shows what both do (the tuner's third candidate of a step); None otherwise."""
    if a is None or b is None or a.skip or b.skip or a.cause == b.cause or set(a.values) & set(b.values):
        return None
    change = {**a.lever.change, **b.lever.change}
    lever = a.lever.model_copy(update={"name": f"{a.lever.name} with {b.lever.name}", "change": change})
    return Proposal(f"{a.cause}+{b.cause}", lever, {**a.values, **b.values})


def propose(
    cause: str,
    lever: Lever,
    current: Mapping[str, Any],
    space: Space,
    engine: str,
    platform: str,
    objective: ObjectiveSpec,
    evidence: Mapping[str, float] | None = None,
) -> Proposal:
    """What ``lever`` proposes from the configuration whose knobs are ``current`` (knob -> value;
    unset knobs absent or None); ``evidence``: the finding's (for ``demand``)."""

    def skip(why: str) -> Proposal:
        return Proposal(cause, lever, {}, why)

    if lever.engine is not None and lever.engine != engine:
        return skip(f"a {lever.engine} lever (the engine is {engine})")
    if lever.platform is not None and lever.platform != platform:
        return skip(f"a {lever.platform} lever (the platform is {platform})")
    model = current.get(MODEL_KNOB)
    if lever.models and model not in lever.models:
        return skip(f"a lever for {', '.join(lever.models)} (the model is {model})")
    fields = ENGINE_FIELDS.get(engine)
    if fields is not None:
        lacks = [k for k in lever.change if k.split(".")[1] not in fields]
        if lacks:
            return skip(f"{engine} has no {', '.join(lacks)}")
    if lever.accuracy and not any("accura" in k or "exact_match" in k for k in objective.subject_to):
        return skip("it changes the model's numbers, and the objective has no accuracy constraint (subject_to)")
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
        new, why = _moved(knob, change, current.get(knob), space, evidence or {})
        if why:
            return skip(why)
        values[knob] = new
    if all(current.get(k) == v for k, v in values.items()):
        return skip("changes nothing here")
    return Proposal(cause, lever, values)


def _moved(knob: str, change: Change, value: Any, space: Space, evidence: Mapping[str, float]) -> tuple[Any, str]:
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


def _demanded(knob: str, value: Any, space: Space, evidence: Mapping[str, float]) -> tuple[Any, str]:
    """The demand the finding saw (running plus waiting at the peak), as the space allows it:
    the smallest listed value that holds it (else the largest), or the demand within the range."""
    if "running_max" not in evidence or "waiting_max" not in evidence:
        return None, "the finding measured no demand (running and waiting requests)"
    need = int(math.ceil(evidence["running_max"] + evidence["waiting_max"]))
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


def stall_budget(evidence: Mapping[str, float], steps: float) -> float | None:
    """The prefill tokens one step may take for its stall to last about ``steps`` decode steps:
    a stall is a decode step (``decode_step_ms``, the stalled streams' median gap) plus the
    chunk's prefill, ``prefill_stall_ms_per_token`` per token (the prefill-interference finding's
    evidence). None without that evidence."""
    step, per_token = evidence.get("decode_step_ms"), evidence.get("prefill_stall_ms_per_token")
    if not step or not per_token:
        return None
    return (steps - 1) * step / per_token


def _stall_sized(knob: str, value: Any, space: Space, evidence: Mapping[str, float], steps: float) -> tuple[Any, str]:
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
