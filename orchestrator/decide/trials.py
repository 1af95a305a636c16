"""What the decisions read: a sweep's trials as data (:class:`TrialData`, each with its load
:class:`Point` s and a race's later runs), from the driver's results or from MLflow alone
(:mod:`orchestrator.tracking.runs` builds them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec


@dataclass
class Point:
    """One load point of a trial: its setting ({"rate": 4} or {"concurrency": 8}, ...), its
    metrics, and per-class metrics as ``"<class>/<metric>"`` keys."""

    index: int
    label: str
    setting: dict[str, Any]
    metrics: dict[str, float]
    invalid_reasons: str = ""  # why the point is INVALID ("; "-joined), empty when valid
    diagnosis: dict[str, Any] = field(default_factory=dict)  # what limited it (metrics.diagnosis), as logged

    @property
    def limiter(self) -> str:
        return str(self.diagnosis.get("limiter", ""))

    def x(self) -> float | None:
        """The point's offered load: its rate (req/s, may be inf) or concurrency."""
        for key in ("rate", "concurrency"):
            if key in self.setting and self.setting[key] is not None:
                return float(self.setting[key])
        return None


@dataclass
class TrialData:
    name: str
    status: str
    params: dict[str, str]
    metrics: dict[str, float]
    points: list[Point]
    run_id: str | None = None
    trial_hash: str = ""
    records: Callable[[], Any] = field(default=lambda: None, repr=False)  # () -> pyarrow.Table | None
    telemetry: dict[str, str] = field(default_factory=dict)  # what the telemetry measured or why not
    timeline: Callable[[], bytes | None] = field(default=lambda: None, repr=False)  # () -> timeline.png
    error: str = ""  # why the trial was SKIPPED or FAILED
    runs: list[TrialData] = field(default_factory=list)  # a race's later runs of this configuration, in order
    round: int | None = None  # the race's round this run was measured in (0: the first pass; None: not known)

    def param(self, key: str, default: str | None = None) -> str | None:
        value = self.params.get(key, default)
        return None if value in (None, "None", "null") else value

    def num(self, key: str, default: float | None = None) -> float | None:
        value = self.param(key)
        try:
            return float(value) if value is not None else default
        except ValueError:
            return default


@dataclass
class SweepData:
    experiment: str
    trials: list[TrialData]
    source: str  # "results" or "mlflow:<uri> run <id>"
    sweep_run_id: str | None = None
    objective: ObjectiveSpec | None = None  # the experiment's verdict rule (from its config or the sweep run)
    expect: list[ExpectationSpec] = field(
        default_factory=list
    )  # the lab's claims (config, or the sweep run's expect.json)

    @property
    def finished(self) -> list[TrialData]:
        return [t for t in self.trials if t.status == "FINISHED"]

    def varied_params(self) -> list[str]:
        """Parameters whose value differs between the sweep's finished trials."""
        trials = self.finished
        keys = sorted({k for t in trials for k in t.params})
        skip = {"overrides", "variant", "seed"}
        return [k for k in keys if k not in skip and len({t.params.get(k) for t in trials}) > 1]
