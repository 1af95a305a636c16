"""The objective's arithmetic, shared by the report's verdict and the knob search: a trial's
value of a metric or knob (:func:`value_of`) and whether it meets the constraints
(:func:`constraints_hold`). Below both ``report`` and ``scheduling``: a search reads the same
numbers the verdict does without importing the report."""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.tracking.runs import Point, TrialData


@dataclass
class Value:
    value: float
    ci95: float | None
    where: str  # "trial", "knob" or a point label


def fixed_points(t: TrialData) -> list[Point]:
    return [p for p in t.points if "slo_met" not in p.metrics]


def value_of(t: TrialData, key: str, at: str | None = None) -> Value | None:
    """A trial's value of ``key``: its own metric, else a knob, else the metric at a point."""
    if at is None and key in t.metrics and math.isfinite(t.metrics[key]):
        return Value(t.metrics[key], t.metrics.get(f"{key}_ci95"), "trial")
    if "." in key and "/" not in key:
        knob = t.num(key)
        return Value(knob, None, "knob") if knob is not None else None
    points = fixed_points(t)
    point = next((p for p in points if p.label == at), None) if at else (points[-1] if points else None)
    if point is None or key not in point.metrics or not math.isfinite(point.metrics[key]):
        return None
    return Value(point.metrics[key], point.metrics.get(f"{key}_ci95"), point.label)


def fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def short(v: float) -> str:
    """Three significant digits (a value in a sentence, not a table)."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def show(v: Value) -> str:
    return fmt(v.value) + (f" ± {fmt(v.ci95)}" if v.ci95 else "")


def check_constraint(
    t: TrialData, key: str, bound: object, objective: ObjectiveSpec, trials: list[TrialData]
) -> tuple[bool, str]:
    """Does ``t`` meet one constraint? Returns (ok, "<key> <value>[, needs <= limit]")."""
    lo: float | None = None
    hi: float | None = None
    if isinstance(bound, str):  # base-D: at least the first measured trial's value minus D
        base = next((v for b in trials if (v := value_of(b, key, objective.at)) is not None), None)
        if base is None:
            return False, f"{key} not measured in any trial"
        lo = base.value - float(bound.split("-", 1)[1])
    elif isinstance(bound, dict):
        lo, hi = bound.get("min"), bound.get("max")
    else:
        hi = float(bound)  # type: ignore[arg-type]
    v = value_of(t, key, objective.at)
    if v is None:
        return False, f"{key} not measured"
    if lo is not None and v.value < lo:
        return False, f"{key} {show(v)}, needs >= {fmt(lo)}"
    if hi is not None and v.value > hi:
        return False, f"{key} {show(v)}, needs <= {fmt(hi)}"
    return True, f"{key} {show(v)}"


def constraints_hold(t: TrialData, objective: ObjectiveSpec, trials: list[TrialData]) -> tuple[bool, str]:
    """Whether ``t`` meets every constraint of ``objective`` (``base-D`` against ``trials``)."""
    checks = [check_constraint(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
    failed = [why for ok, why in checks if not ok]
    return not failed, "; ".join(failed)


def constraint_text(objective: ObjectiveSpec) -> str:
    parts = []
    for key, bound in objective.subject_to.items():
        if isinstance(bound, str):
            parts.append(f"{key} >= first trial's - {bound[5:]}")
        elif isinstance(bound, dict):
            parts += [f"{key} {'>=' if k == 'min' else '<='} {fmt(v)}" for k, v in bound.items()]
        else:
            parts.append(f"{key} <= {fmt(float(bound))}")
    return ", ".join(parts)
