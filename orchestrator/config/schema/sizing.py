"""A lab's workload sized to the machine it runs on (``sizing``; :mod:`orchestrator.scheduling.sizing`).

Before the sweep, the lab's baseline server is calibrated (its decode step and its prefill time
per prompt token, measured in seconds and cached per machine, engine and model), and each rule
sets one key of every trial from those numbers. A rule is one of:

* ``prefill_steps: K``: prompt tokens whose prefill takes about K decode steps here (the chunked
  prefill lab: a long prompt must stall a decode long enough to see beside the noise);
* ``busy_share: S`` with ``tokens: KEY``: an arrival rate (req/s) at which prompts of KEY's
  length keep the server prefilling about S of the time (a rate the server sustains);
* ``fits: [KEY, ...]``: at least the sum of those keys plus ``margin`` (``engine.max_model_len``
  that holds the sized prompt and its output).

Rules run in order; a later one reads what an earlier one chose. ``min``/``max`` bound the value
and ``round_to`` rounds it (a recalibration that moves a length by a few tokens keeps the trials'
hashes). A key the command line sets is the user's and is not sized."""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from .base import PositiveShare, StrictModel


class SizeRule(StrictModel):
    set: str = Field(pattern=r"^(workload|engine)\.[A-Za-z0-9_.]+$", description="the dotted key this rule sets")
    prefill_steps: PositiveFloat | None = Field(default=None, description="prompt tokens prefilled in ~K decode steps")
    busy_share: PositiveShare | None = Field(default=None, description="a rate keeping prefill busy this share")
    tokens: str | None = Field(default=None, description="busy_share: the key holding the prompt length")
    fits: list[str] | None = Field(default=None, description="at least the sum of these keys plus margin")
    margin: int = Field(default=0, ge=0)
    min: float | None = None
    max: float | None = None
    round_to: PositiveFloat = 1
    why: str | None = Field(default=None, description="words for the printed line: what the size is for")

    @model_validator(mode="after")
    def _one_kind(self) -> SizeRule:
        kinds = [k for k in ("prefill_steps", "busy_share", "fits") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"{self.set}: set exactly one of prefill_steps, busy_share, fits (got {kinds or 'none'})")
        if self.busy_share is not None and not self.tokens:
            raise ValueError(f"{self.set}: busy_share needs 'tokens' (the key holding the prompt length)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{self.set}: min {self.min} is above max {self.max}")
        return self


class SizingSpec(StrictModel):
    rules: list[SizeRule] = Field(min_length=1)
    probe_tokens: tuple[PositiveInt, PositiveInt] = Field(
        default=(128, 1024), description="the two prompt lengths whose TTFTs give the prefill time per token"
    )
