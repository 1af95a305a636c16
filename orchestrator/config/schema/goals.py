"""What a sweep's report judges its trials by: the objective its verdict optimises, with the
race's stopping rules (:class:`ObjectiveSpec`), and the phenomena a lab expects to observe, as
checkable claims (:class:`ExpectationSpec`). Both are part of :class:`.trial.SweepSettings`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from orchestrator.config.metric_keys import check_cause, check_name, is_accuracy

from .base import StrictModel

AUTO_MAX_RUNS = 60  # objective.max_repeats=auto plans at most this many runs of a trial


class ObjectiveSpec(StrictModel):
    """What the sweep's verdict optimises: one metric of each trial (or a knob, e.g.
    ``engine.max_num_batched_tokens``), among the trials that meet ``subject_to``.

    A metric is read from the trial's own metrics when it has one by that name (e.g.
    ``slo_capacity_rps``), else at load point ``at`` (a label such as ``c4``; default the
    trial's heaviest fixed point); ``<class>/<metric>`` reads a request class's metric.
    ``subject_to`` maps a metric to its highest allowed value, to ``{min: x}`` / ``{max: x}``,
    or to ``base-D``: at least the first trial's value minus D (e.g. ``accuracy: base-0.01``).
    ``frontier`` names two metrics, ``{maximize: a, minimize: b}``, for a Pareto plot; ``show``
    lists more metrics to quote next to the verdict and in its per-knob tables.
    """

    maximize: str | None = None
    minimize: str | None = None
    at: str | None = None
    subject_to: dict[str, float | str | dict[Literal["min", "max"], float]] = Field(default_factory=dict)
    show: list[str] = Field(default_factory=list)
    frontier: dict[Literal["maximize", "minimize"], str] | None = None
    # The race (docs/statistics.md): after the first pass, the trials that cannot be told apart
    # from the leader run again (fresh requests) until it is separated, they are equivalent
    # within ``margin``, a trial has run ``max_repeats`` times, or ``budget`` is spent (``stretch``
    # past it, where that is what deciding takes).
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1.0,
        description="chance that every statement of the verdict (X better than Y, X and Y equivalent) is right, "
        "over all its comparisons and rounds together",
    )
    max_repeats: PositiveInt | Literal["auto"] = Field(
        default="auto",
        description="runs of a trial at most, the first included; 1: no race (one run each); auto: planned "
        "after the third run, from the noise measured between runs and what the budget allows "
        f"(at most {AUTO_MAX_RUNS})",
    )
    margin: float = Field(
        default=0.1,
        ge=0.0,
        description="relative difference too small to matter: contenders whose interval lies within it tie",
    )
    budget: float = Field(
        default=1.0,
        ge=0.0,
        description="time the race may add, in multiples of the first pass's wall time (1.0: about twice as long)",
    )
    stretch: float = Field(
        default=2.0,
        ge=0.0,
        description="time the race may add past its budget, in first passes, once, when the runs that would "
        "decide it (at the noise and the difference measured) fit in it: said, then run; 0: stop at the budget",
    )

    @property
    def most_runs(self) -> int:
        """The runs a trial may have: ``max_repeats``, or with ``auto`` the most the race may plan
        (the race replaces ``auto`` with its plan: :func:`orchestrator.scheduling.rounds.run_race`)."""
        return AUTO_MAX_RUNS if self.max_repeats == "auto" else self.max_repeats

    @model_validator(mode="after")
    def _one_direction(self) -> ObjectiveSpec:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("objective: set exactly one of maximize / minimize (a metric or a knob)")
        for key, bound in self.subject_to.items():
            if isinstance(bound, str) and not re.fullmatch(r"base-\d+(\.\d+)?", bound):
                raise ValueError(
                    f"objective.subject_to.{key}: expected a number, {{min: x}}, {{max: x}} or "
                    f"'base-D' (at least the baseline minus D), got {bound!r}"
                )
        if self.frontier is not None and len(self.frontier) != 2:
            raise ValueError("objective.frontier: expected {maximize: metric, minimize: metric}")
        return self

    @property
    def key(self) -> str:
        return self.maximize or self.minimize  # type: ignore[return-value]

    @property
    def guards_accuracy(self) -> bool:
        """Whether a constraint scores the model's answers (:func:`is_accuracy`)."""
        return any(is_accuracy(k) for k in self.subject_to)

    def named(self) -> list[tuple[str, str]]:
        """Every metric or knob the objective names, with where (``subject_to.ttft_ms_p99``)."""
        named = [("maximize", self.maximize), ("minimize", self.minimize)]
        named += [(f"subject_to.{k}", k) for k in self.subject_to]
        named += [(f"show[{i}]", k) for i, k in enumerate(self.show)]
        named += [(f"frontier.{d}", k) for d, k in (self.frontier or {}).items()]
        return [(where, name) for where, name in named if name is not None]

    def check_names(self) -> None:
        """Raise ``ValueError`` at the first name that is neither a metric a trial can carry nor a
        knob (a typo would read "not measured" in every trial); the sweep's config is checked."""
        for where, name in self.named():
            check_name(f"objective.{where}", name)


class ExpectationSpec(StrictModel):
    """A phenomenon an experiment's lab expects to observe, as a checkable claim (the report says
    for each: observed, not observed with the numbers, or not measurable here and why).

    ``metric`` is read as the objective's: a trial's own metric, else at load point ``at`` (a
    label, or ``lightest`` / ``heaviest``: each trial's first / last fixed point; default the
    heaviest); ``<class>/<metric>`` reads a request class's, ``a / b`` the ratio of two metrics.
    Exactly one form:

    * ``lower`` / ``higher`` + ``than``: the named trials' value is below / above every one of
      ``than``'s by more than ``margin`` (relative);
    * ``along`` + ``trend``: ordered by the knob ``along`` (e.g. ``engine.max_num_batched_tokens``),
      the value ``increases`` / ``decreases`` (end to end by more than ``margin``, and no step back
      by more than ``margin`` of the largest value) over the trials ``in`` (default every trial
      with that knob set);
    * ``across_points``: within each trial ``in`` (default all), over its fixed load points in order;
    * ``above`` / ``below``: a bound every trial ``in`` meets;
    * ``within`` + ``of``: every trial ``in`` is within ``within`` (absolute) of trial ``of``;
    * ``limiter``: each trial ``in`` was limited at ``at`` by one of these causes (the diagnosis's
      vocabulary).

    ``needs: gpu`` says the phenomenon exists only on GPUs: on the CPU the claim is "not
    measurable here". ``claim`` quotes the course's own words.
    """

    claim: str = Field(min_length=1)
    metric: str | None = None
    at: str | None = None
    lower: list[str] | None = None
    higher: list[str] | None = None
    than: list[str] | None = None
    along: str | None = None
    trend: Literal["increases", "decreases"] | None = None
    across_points: Literal["increases", "decreases"] | None = None
    above: float | None = None
    below: float | None = None
    within: float | None = Field(default=None, ge=0)
    of: str | None = None
    limiter: list[str] | None = None
    in_: list[str] | None = Field(default=None, alias="in")
    margin: float = Field(default=0.05, ge=0, description="relative difference below which two values tie")
    needs: Literal["gpu"] | None = None

    model_config = ConfigDict(**StrictModel.model_config, populate_by_name=True)

    @field_validator("lower", "higher", "than", "in_", "limiter", mode="before")
    @classmethod
    def _listed(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @property
    def form(self) -> str:
        forms = {
            "pair": self.lower is not None or self.higher is not None,
            "along": self.along is not None,
            "across_points": self.across_points is not None,
            "bound": self.above is not None or self.below is not None,
            "within": self.within is not None,
            "limiter": self.limiter is not None,
        }
        chosen = [k for k, on in forms.items() if on]
        return chosen[0] if len(chosen) == 1 else ""

    @model_validator(mode="after")
    def _one_form(self) -> ExpectationSpec:
        forms = "lower/higher + than, along + trend, across_points, above/below, within + of, limiter"
        if not self.form:
            raise ValueError(f"expect: set exactly one form of claim ({forms}): {self.claim!r}")
        if self.form == "pair" and (not self.than or (self.lower is not None) == (self.higher is not None)):
            raise ValueError(f"expect: 'lower' or 'higher' (one of them) needs 'than': {self.claim!r}")
        if self.form == "along" and self.trend is None:
            raise ValueError(f"expect: 'along' needs 'trend: increases|decreases': {self.claim!r}")
        if self.form == "within" and self.of is None:
            raise ValueError(f"expect: 'within' needs 'of' (the trial to compare with): {self.claim!r}")
        if self.form != "limiter" and self.metric is None:
            raise ValueError(f"expect: this claim needs a 'metric': {self.claim!r}")
        return self

    def check_names(self, where: str = "expect") -> None:
        """Raise ``ValueError`` at an unknown metric (each side of ``a / b``) or limiter."""
        for part in self.metric.split(" / ") if self.metric else []:
            check_name(f"{where}.metric ({self.claim[:60]!r})", part)
        for cause in self.limiter or []:
            check_cause(f"{where}.limiter ({self.claim[:60]!r})", cause)
