"""Command-line flags as tables: an engine's argv builder lists one :class:`Flag` row per flag,
in argv order, and :func:`render` turns the rows into ``--name value`` words for one server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

A = TypeVar("A")

# value: --name VALUE; bool: --name / --no-name; switch: --name when true; json: --name '{...}' (sorted keys);
# list: --name V1 V2 ... (a flag of nargs '+'), nothing for an empty list.
# Every kind writes nothing for None: the engine's own default.
FlagKind = Literal["value", "bool", "switch", "json", "list"]


@dataclass(frozen=True)
class Flag(Generic[A]):
    """One flag of a server's argv: its name (without ``--``), where its value comes from in the
    builder's arguments ``A``, and how it is written."""

    name: str
    get: Callable[[A], object]
    kind: FlagKind = "value"

    def words(self, args: A) -> list[str]:
        value = self.get(args)
        if value is None:
            return []
        if self.kind == "bool":
            return [f"--{self.name}"] if value else [f"--no-{self.name}"]
        if self.kind == "switch":
            return [f"--{self.name}"] if value else []
        if self.kind == "list":
            items = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
            return [f"--{self.name}", *items] if items else []
        if self.kind == "json":
            return [f"--{self.name}", json.dumps(value, sort_keys=True)]
        return [f"--{self.name}", str(value)]


def render(flags: Iterable[Flag[A]], args: A) -> list[str]:
    """The words of every row, in the table's order."""
    return [word for flag in flags for word in flag.words(args)]
