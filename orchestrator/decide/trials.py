"""What the decisions read: a sweep's trials as data (:class:`TrialData`, each with its load
:class:`Point` s and a race's later runs), from the driver's results or from MLflow alone
(:mod:`orchestrator.tracking.runs` builds them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec
from orchestrator.metrics.diagnosis.findings import LoggedDiagnosis


@dataclass
class Point:
    """One load point of a trial: its setting ({"rate": 4} or {"concurrency": 8}, ...), its
    metrics, and per-class metrics as ``"<class>/<metric>"`` keys."""

    index: int
    label: str
    setting: dict[str, Any]
    metrics: dict[str, float]
    invalid_reasons: str = ""  # why the point is INVALID ("; "-joined), empty when valid
    diagnosis: LoggedDiagnosis = LoggedDiagnosis()  # what limited it (metrics.diagnosis), as logged

    @property
    def limiter(self) -> str:
        return self.diagnosis.limiter

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


NAMED_BY = ("engine.", "model.", "workload.", "platform.", "eval.")  # the params that tell configurations apart


def told_apart(trials: list[TrialData]) -> list[TrialData]:
    """The trials with names that tell them apart: configurations that share a variant's name (a
    sweep of knobs within one variant: ``variant=variable engine.max_num_seqs=1,32``) are named
    with the knobs that differ among them (``variable (max_num_seqs=32)``); a unique name, and a
    race's runs of one configuration (they differ in their seeds only), keep theirs."""
    groups: dict[str, list[TrialData]] = {}
    for t in trials:
        groups.setdefault(t.name, []).append(t)
    out = []
    for t in trials:
        group = groups[t.name]
        keys = sorted({k for g in group for k in g.params if k.startswith(NAMED_BY) and "seed" not in k})
        differ = [k for k in keys if len({g.params.get(k) for g in group}) > 1] if len(group) > 1 else []
        if not differ:
            out.append(t)
            continue
        knobs = ", ".join(f"{k.removeprefix('engine.')}={t.params.get(k)}" for k in differ)
        name = f"{t.name} ({knobs})"
        out.append(replace(t, name=name, runs=[replace(r, name=name) for r in t.runs]))
    return out


def named(trials: list[TrialData], name: str) -> list[TrialData]:
    """The trials a claim's ``name`` means: the one so named, else those told apart from it
    (:func:`told_apart`: ``variable`` -> ``variable (max_num_seqs=32)``, ...)."""
    exact = [t for t in trials if t.name == name]
    return exact or [t for t in trials if t.name.startswith(name + " (")]
