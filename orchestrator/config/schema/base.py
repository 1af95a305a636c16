"""The base of every schema model."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ArrivalKind = Literal["poisson", "gamma", "constant"]
Share = Annotated[float, Field(ge=0, le=1)]  # a share of a whole: 0 to 1
PositiveShare = Annotated[float, Field(gt=0, le=1)]  # a share that must be above 0 (a bar, a budget)


class StrictModel(BaseModel):
    """Base model: unknown keys are errors, instances are immutable."""

    # inf (rate: inf) must survive JSON (Ray ships specs as JSON): "Infinity", not null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


def all_match(values: list[str], pattern: str, expected: str) -> list[str]:
    """``values`` when each matches ``pattern`` whole; otherwise a ValueError saying what was
    ``expected`` and naming the ones that do not."""
    bad = [v for v in values if not re.fullmatch(pattern, v)]
    if bad:
        raise ValueError(f"{expected}: {bad}")
    return values
