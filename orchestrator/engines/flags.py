"""Command-line flags as tables: an engine lists one :class:`Flag` row per flag, in argv order,
each read from the :class:`ServerArgs` of one server, and :func:`render` turns the rows into
``--name value`` words."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from orchestrator.config.schema import ModelSpec
from orchestrator.engines.base import LaunchContext

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


def engine_flags(*names: str, kind: FlagKind = "value") -> tuple[Flag[Any], ...]:
    """Flags each read from the engine spec's field of its name: ``--page-size`` is
    ``engine.page_size`` (the rule of most rows; a unit test parses every experiment's argv)."""
    return tuple(Flag(n, attrgetter("engine." + n.replace("-", "_")), kind) for n in names)


def lora_flags(*names: str) -> tuple[Flag[Any], ...]:
    """:func:`engine_flags` written only when the server serves LoRA adapters."""

    def read(attr: str) -> Callable[[Any], object]:
        return lambda a: getattr(a.engine, attr) if a.lora else None

    return tuple(Flag(n, read(n.replace("-", "_"))) for n in names)


def render(flags: Iterable[Flag[A]], args: A) -> list[str]:
    """The words of every row, in the table's order."""
    return [word for flag in flags for word in flag.words(args)]


class _EngineFields(Protocol):
    """What :class:`ServerArgs` reads of any engine's spec."""

    @property
    def enable_lora(self) -> bool | None: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def extra_args(self) -> list[Any]: ...


E = TypeVar("E", bound=_EngineFields)


@dataclass(frozen=True)
class ServerArgs(Generic[E]):
    """What one server's flags are read from: the engine spec, the model as served (its local
    folder, served name, tokenizer and LoRA adapters), and this server's port and TP size. An
    engine's subclass adds its own per-server values."""

    engine: E
    model_path: str
    served_name: str
    tokenizer: str | None  # model.tokenizer: the server tokenizes with the one our prompts are made with
    adapters: tuple[tuple[str, str], ...]  # (served name, folder) of each LoRA adapter
    port: int
    tp: int

    @classmethod
    def of(cls, engine: E, model: ModelSpec, at: LaunchContext, port: int, tp: int | None = None, **more: Any) -> Self:
        """The arguments of a server of ``model`` launched ``at``; ``tp``: this server's, else the engine's."""
        tp = tp or engine.tensor_parallel_size
        return cls(engine, at.model_path, model.name, model.tokenizer, at.adapters, port, tp, **more)

    @property
    def lora(self) -> bool:
        return self.engine.enable_lora if self.engine.enable_lora is not None else bool(self.adapters)

    def argv(self, head: list[str], flags: Iterable[Flag[Self]]) -> list[str]:
        """The server's command line as an argv list (never a shell string): ``head`` (the launch
        prefix, interpreter and ``-m MODULE``: :func:`orchestrator.engines.envs.command`), the
        ``flags``' words, then ``engine.extra_args``."""
        return [*head, *render(flags, self), *(str(a) for a in self.engine.extra_args)]
