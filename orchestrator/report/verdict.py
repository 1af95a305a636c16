"""The sweep's verdict: the best trial by the experiment's objective, under its constraints.

A value is read from a trial's own metrics (``slo_capacity_rps``), from a knob it was run with
(``engine.max_num_batched_tokens``), or at one load point (default: the heaviest fixed point;
probes of a capacity search are not fixed points). With repeats, each point metric carries a
95% confidence half-width (``<metric>_ci95``); trials whose intervals overlap the best one's
are called a tie, not a loss. Without repeats the verdict says that noise was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.objective import Value, check_constraint, constraint_text, fixed_points, show, value_of
from orchestrator.tracking.runs import TrialData


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


def decide(trials: list[TrialData], objective: ObjectiveSpec) -> Verdict:
    """The verdict over the finished trials (in sweep order)."""
    key, sign = objective.key, (1.0 if objective.maximize else -1.0)
    verdict = Verdict(objective, None)
    scored = _score(trials, objective, verdict)
    if not scored:
        verdict.lines = [f"**Verdict:** no trial meets the objective ({_goal(objective)})."]
        verdict.lines += [f"- {t.name}: {why}" for t, why in verdict.excluded]
        return verdict
    best, bv = max(scored, key=lambda tv: sign * tv[1].value)
    verdict.best = best
    for t, v in scored:  # overlapping 95% intervals: a tie, not a win
        if t is not best and bv.ci95 and v.ci95 and abs(v.value - bv.value) <= bv.ci95 + v.ci95:
            verdict.ties.append(t)
    verdict.lines = [_headline(verdict, bv, len(scored))]
    others = [(t, v) for t, v in sorted(scored, key=lambda tv: -sign * tv[1].value) if t is not best]
    if others:
        verdict.lines.append(
            "Also meeting the constraints: "
            + "; ".join(
                f"{t.name} {key} {show(v)}" + (f" ({q})" if (q := _quoted(t, objective)) else "") for t, v in others
            )
            + "."
        )
    flagged = [t.name for t, v in scored if _read_at(t, v, "invalid")]
    if flagged:
        verdict.lines.append(
            "Caution: the value of " + ", ".join(flagged) + " was read at a load point flagged "
            "INVALID (the client could not keep up, or the server failed): compare with care."
        )
    if verdict.excluded:
        verdict.lines.append("Not meeting them: " + "; ".join(f"{t.name} ({why})" for t, why in verdict.excluded) + ".")
    return verdict


def _goal(objective: ObjectiveSpec) -> str:
    where = f" at {objective.at}" if objective.at else ""
    goal = f"{'maximize' if objective.maximize else 'minimize'} {objective.key}{where}"
    return goal + (f" subject to {constraint_text(objective)}" if objective.subject_to else "")


def _score(trials: list[TrialData], objective: ObjectiveSpec, verdict: Verdict) -> list[tuple[TrialData, Value]]:
    """Each trial's objective value when it meets every constraint; the others go to
    ``verdict.excluded`` with the reasons, the scored ones to ``verdict.feasible``."""
    key = objective.key
    scored: list[tuple[TrialData, Value]] = []
    for t in trials:
        checks = [check_constraint(t, k, b, objective, trials) for k, b in objective.subject_to.items()]
        failed = [why for ok, why in checks if not ok]
        v = value_of(t, key, objective.at)
        if v is None:
            failed.append(f"{key} {'not set' if '.' in key and '/' not in key else 'not measured'}")
        elif _read_at(t, v, "profiled_excluded"):
            failed.append(f"{key} read at {v.where}, a profiled point (profile.in_verdict=true counts it)")
        if failed:
            verdict.excluded.append((t, "; ".join(failed)))
        else:
            assert v is not None
            scored.append((t, v))
            verdict.feasible.append(t)
    return scored


def _quoted(t: TrialData, objective: ObjectiveSpec) -> str:
    """The constraints' and ``show``'s values of a trial, quoted next to its objective value."""
    keys = [k for k in dict.fromkeys([*objective.subject_to, *objective.show]) if k != objective.key]
    values = {k: value_of(t, k, objective.at) for k in keys}
    return ", ".join(f"{k} {show(v)}" for k, v in values.items() if v is not None)


def _headline(verdict: Verdict, bv: Value, n_scored: int) -> str:
    objective, best = verdict.objective, verdict.best
    assert best is not None
    key, extra = objective.key, _quoted(best, objective)
    head = (
        f"**Verdict:** {best.name}: {key} {show(bv)}"
        + (f" ({extra})" if extra else "")
        + f"; objective: {_goal(objective)}."
    )
    if verdict.ties:
        head += (
            " Tied within the 95% intervals: "
            + ", ".join(f"{t.name} ({show(value_of(t, key, objective.at))})" for t in verdict.ties)  # type: ignore[arg-type]
            + "; the data cannot tell them apart."
        )
    elif bv.where != "knob" and bv.ci95 is None and n_scored > 1:
        head += " No repeats: run-to-run noise was not measured (workload.repeats >= 3 gives intervals)."
    return head


def _read_at(t: TrialData, v: Value, flag: str) -> bool:
    """The value was read at a fixed point that carries ``flag`` (invalid, profiled_excluded)."""
    point = next((p for p in fixed_points(t) if p.label == v.where), None)
    return point is not None and point.metrics.get(flag, 0.0) >= 1.0


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
            cells = [(lambda v: show(v) if v else "")(value_of(t, k, objective.at)) for k in keys]
            out.append("| " + " | ".join([str(t.param(knob)), t.name, *cells]) + " |")
        out.append("")
    return out
