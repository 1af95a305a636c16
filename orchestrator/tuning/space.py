"""The knobs the tuner may move (:class:`Space`: lists of values, ranges, or every knob a lever
names), from ``hydra.sweeper.space`` and the command line's lists, checked against the lever
table before anything starts (:func:`check_space`), and said in words (:func:`space_words`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config.convert import is_config_key
from orchestrator.config.errors import ConfigError
from orchestrator.tuning.levers import LeverTable


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


def space_words(space: Space) -> str:
    if not space.only:
        return "every knob a lever names"
    parts = [f"{k} in {list(v)}" for k, v in space.lists.items()]
    parts += [f"{k} in [{lo:g}, {hi:g}]" for k, (lo, hi) in space.ranges.items()]
    return ", ".join(parts)


def check_space(space: Space, levers: LeverTable) -> None:
    """A space that names knobs (lists, ranges) must name one some lever moves."""
    if not space.only:
        return
    named = {k for rows in levers.values() for lever in rows for k in lever.change}
    if not named & ({*space.lists, *space.ranges}):
        raise ConfigError(
            "hydra.sweeper.space: no lever moves any of its knobs ("
            + ", ".join([*space.lists, *space.ranges])
            + "); the levers move: "
            + ", ".join(sorted(named))
        )
