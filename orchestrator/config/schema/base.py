"""The base of every schema model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

ArrivalKind = Literal["poisson", "gamma", "constant"]


class StrictModel(BaseModel):
    """Base model: unknown keys are errors, instances are immutable."""

    # inf (rate: inf) must survive JSON (Ray ships specs as JSON): "Infinity", not null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
