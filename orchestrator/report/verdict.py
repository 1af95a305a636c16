"""The sweep's verdict: the best trial by the experiment's objective, under its constraints.

A value is read from a trial's own metrics (``slo_capacity_rps``), from a knob it was run with
(``engine.max_num_batched_tokens``), or at one load point (default: the heaviest fixed point;
probes of a capacity search are not fixed points). With repeats, each point metric carries a
95% confidence half-width (``<metric>_ci95``); trials whose intervals overlap the best one's
are called a tie, not a loss. Without repeats the verdict says that noise was not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.report.data import Point, TrialData


@dataclass
class Value:
    value: float
    ci95: float | None
    where: str  # "trial", "knob" or a point label


@dataclass
class Verdict:
    objective: ObjectiveSpec
    best: TrialData | None
    ties: list[TrialData] = field(default_factory=list)
    feasible: list[TrialData] = field(default_factory=list)
    excluded: list[tuple[TrialData, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def headline(self) -> str:
        return self.lines[0] if self.lines else ""


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


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _show(v: Value) -> str:
    return _fmt(v.value) + (f" ± {_fmt(v.ci95)}" if v.ci95 else "")


def _check(
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
        return False, f"{key} {_show(v)}, needs >= {_fmt(lo)}"
    if hi is not None and v.value > hi:
        return False, f"{key} {_show(v)}, needs <= {_fmt(hi)}"
    return True, f"{key} {_show(v)}"


def constraints_hold(t: TrialData, objective: ObjectiveSpec, trials: list[TrialData]) -> tuple[bool, str]:
    """Whether ``t`` meets every constraint of ``objective`` (``base-D`` against ``trials``)."""
    checks = [_check(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
    failed = [why for ok, why in checks if not ok]
    return not failed, "; ".join(failed)


def constraint_text(objective: ObjectiveSpec) -> str:
    parts = []
    for key, bound in objective.subject_to.items():
        if isinstance(bound, str):
            parts.append(f"{key} >= first trial's - {bound[5:]}")
        elif isinstance(bound, dict):
            parts += [f"{key} {'>=' if k == 'min' else '<='} {_fmt(v)}" for k, v in bound.items()]
        else:
            parts.append(f"{key} <= {_fmt(float(bound))}")
    return ", ".join(parts)


def decide(trials: list[TrialData], objective: ObjectiveSpec) -> Verdict:
    """The verdict over the finished trials (in sweep order)."""
    key, sign = objective.key, (1.0 if objective.maximize else -1.0)
    where = f" at {objective.at}" if objective.at else ""
    goal = f"{'maximize' if objective.maximize else 'minimize'} {key}{where}"
    if objective.subject_to:
        goal += f" subject to {constraint_text(objective)}"
    verdict = Verdict(objective, None)
    scored: list[tuple[TrialData, Value]] = []
    for t in trials:
        checks = [_check(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
        failed = [why for ok, why in checks if not ok]
        v = value_of(t, key, objective.at)
        if v is None:
            failed.append(f"{key} {'not set' if '.' in key and '/' not in key else 'not measured'}")
        if failed:
            verdict.excluded.append((t, "; ".join(failed)))
        else:
            assert v is not None
            scored.append((t, v))
            verdict.feasible.append(t)
    if not scored:
        verdict.lines = [f"**Verdict:** no trial meets the objective ({goal})."]
        verdict.lines += [f"- {t.name}: {why}" for t, why in verdict.excluded]
        return verdict
    best, bv = max(scored, key=lambda tv: sign * tv[1].value)
    verdict.best = best
    for t, v in scored:  # overlapping 95% intervals: a tie, not a win
        if t is not best and bv.ci95 and v.ci95 and abs(v.value - bv.value) <= bv.ci95 + v.ci95:
            verdict.ties.append(t)

    def quoted(t: TrialData) -> str:
        cons = {
            k: value_of(t, k, objective.at) for k in dict.fromkeys([*objective.subject_to, *objective.show]) if k != key
        }
        return ", ".join(f"{k} {_show(v)}" for k, v in cons.items() if v is not None)

    extra = quoted(best)
    head = f"**Verdict:** {best.name}: {key} {_show(bv)}" + (f" ({extra})" if extra else "") + f"; objective: {goal}."
    if verdict.ties:
        head += (
            " Tied within the 95% intervals: "
            + ", ".join(f"{t.name} ({_show(value_of(t, key, objective.at))})" for t in verdict.ties)  # type: ignore[arg-type]
            + "; the data cannot tell them apart."
        )
    elif bv.where != "knob" and bv.ci95 is None and len(scored) > 1:
        head += " No repeats: run-to-run noise was not measured (workload.repeats >= 3 gives intervals)."
    verdict.lines = [head]
    others = [(t, v) for t, v in sorted(scored, key=lambda tv: -sign * tv[1].value) if t is not best]
    if others:
        verdict.lines.append(
            "Also meeting the constraints: "
            + "; ".join(f"{t.name} {key} {_show(v)}" + (f" ({q})" if (q := quoted(t)) else "") for t, v in others)
            + "."
        )
    flagged = [t.name for t, v in scored if _read_at_invalid_point(t, v)]
    if flagged:
        verdict.lines.append(
            "Caution: the value of " + ", ".join(flagged) + " was read at a load point flagged "
            "INVALID (the client could not keep up, or the server failed): compare with care."
        )
    if verdict.excluded:
        verdict.lines.append("Not meeting them: " + "; ".join(f"{t.name} ({why})" for t, why in verdict.excluded) + ".")
    return verdict


def _read_at_invalid_point(t: TrialData, v: Value) -> bool:
    point = next((p for p in fixed_points(t) if p.label == v.where), None)
    return point is not None and point.metrics.get("invalid", 0.0) >= 1.0


def knob_effects(trials: list[TrialData], varied: list[str], objective: ObjectiveSpec) -> list[str]:
    """For each varied knob, a markdown table: its value per trial and what the objective's
    metric and constraints measured there."""
    keys = [
        k
        for k in dict.fromkeys([objective.key, *objective.subject_to, *objective.show])
        if not ("." in k and "/" not in k)
    ]
    out: list[str] = []
    for knob in varied:
        if knob in keys:
            continue
        rows = sorted(trials, key=lambda t: (t.num(knob) is None, t.num(knob) or 0.0, str(t.param(knob))))
        out += [
            f"What `{knob}` changed:",
            "",
            "| " + " | ".join([knob, "trial", *keys]) + " |",
            "|" + "---|" * (2 + len(keys)),
        ]
        for t in rows:
            cells = [(lambda v: _show(v) if v else "")(value_of(t, k, objective.at)) for k in keys]
            out.append("| " + " | ".join([str(t.param(knob)), t.name, *cells]) + " |")
        out.append("")
    return out
