"""The tuner's lever table, as data: for each cause the diagnosis names that a server's
configuration can act on (:data:`CAUSES`), the moves that address it, in the order to try them
(``conf/tuning/levers.yaml``; a user's file replaces a cause's rows). What a move proposes from a
configuration is :mod:`orchestrator.tuning.moves`'."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from orchestrator.config.convert import is_config_key
from orchestrator.config.errors import ConfigError
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.schema.base import StrictModel
from orchestrator.metrics.diagnosis import SERVER_CAUSES

LEVERS_FILE = PROJECT_ROOT / "conf" / "tuning" / "levers.yaml"
CAUSES = SERVER_CAUSES  # the causes a row may name: the server's (not the client's, not the machine's)
KINDS = ("times", "plus", "to", "demand", "stall")  # a change's kinds
LeverTable = dict[str, list["Lever"]]  # cause -> its moves, in the order to try them


class Change(StrictModel):
    """One knob's change: exactly one of ``times``, ``plus``, ``to``, ``demand`` (as many as
    the finding saw running plus waiting at its peak: its evidence ``running_max + waiting_max``),
    ``stall`` (a prefill token budget whose chunk stalls a decode for about this many decode
    steps, from the prefill-interference finding's cost per prompt token:
    :func:`orchestrator.tuning.moves.stall_budget`)."""

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


def load_levers(path: str | Path | None = None) -> LeverTable:
    """The lever table: ``conf/tuning/levers.yaml``, a cause's rows replaced by ``path``'s where
    it has that cause. Every knob must be a key of a trial's config and every cause a word of the
    vocabulary: a clear error names the file, the cause and the row otherwise."""
    table = _read(LEVERS_FILE)
    if path is not None:
        table.update(_read(Path(path).expanduser()))
    return table


def _read(path: Path) -> LeverTable:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"hydra.sweeper.levers: cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of cause -> list of moves, got {type(raw).__name__}")
    out: LeverTable = {}
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
