"""A knob objective's verdict (``engine.max_num_batched_tokens`` under constraints): the knob is
exact, what is uncertain is whether each trial meets the constraints in every run. Which trials
are in doubt, which have a better knob than the best, the one-sided limits between runs that
say how sure the verdict is, and the error each look spends on them (docs/statistics.md)."""

from __future__ import annotations

from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.looks import look_share
from orchestrator.decide.objective import Limit, constraint_limits, show, value_of
from orchestrator.decide.trials import TrialData


def knob_doubts(
    trials: list[TrialData], objective: ObjectiveSpec, best: TrialData | None, uncertain: list[TrialData]
) -> list[TrialData]:
    """A knob objective is exact; what is uncertain is whether a trial meets the constraints.
    The trials with a better knob than the best's whose constraints held in some runs only
    (``uncertain``: the verdict's): the verdict is not decided while any is left (with no best
    yet, every uncertain one)."""
    sign = 1.0 if objective.maximize else -1.0
    bv = value_of(best, objective.key, objective.at) if best is not None else None
    names = {t.name for t in uncertain}
    out = []
    for t in trials:
        v = value_of(t, objective.key, objective.at)
        if t.name in names and v is not None and (bv is None or sign * v.value > sign * bv.value):
            out.append(t)
    return out


def knob_better(trials: list[TrialData], objective: ObjectiveSpec, best: TrialData) -> list[TrialData]:
    """The trials with a better knob than ``best``'s (they missed the constraints)."""
    sign = 1.0 if objective.maximize else -1.0
    bv = value_of(best, objective.key, objective.at)
    return [
        t
        for t in trials
        if t is not best
        and bv is not None
        and (v := value_of(t, objective.key, objective.at))
        and sign * v.value > sign * bv.value
    ]


def knob_limits(
    best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData], share: float
) -> list[tuple[str, Limit]]:
    """A knob verdict's statements: each of the best's constraints and, for each trial with a better
    knob, the constraint it misses most clearly, as one-sided limits between runs, the share
    ``share`` of the error ``1 - confidence`` (a look's, :func:`orchestrator.decide.looks.look_share`)
    split over these statements (Bonferroni). Empty without constraints, with one run, or at no share."""
    if not objective.subject_to or not best.runs or share <= 0.0:
        return []
    alpha = knob_alpha(best, better, objective, trials, share)
    statements = [(best.name, lim) for lim in constraint_limits(best, objective, trials, alpha)]
    for t in better:
        missed = constraint_limits(t, objective, trials, alpha, missed=True)
        if missed:  # the constraint it misses most clearly: its limit furthest past the bound
            statements.append(
                (
                    t.name,
                    max(missed, key=lambda x: (x.limit - x.bound) / (abs(x.bound) or 1.0) * (-1 if x.above else 1)),
                )
            )
    return statements


def knob_alpha(
    best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData], share: float
) -> float:
    """Each of a knob verdict's statements' error: the share ``share`` of ``1 - confidence`` split
    over the best's constraints and the trials with a better knob (Bonferroni)."""
    count = len(constraint_limits(best, objective, trials, 0.05)) + len(better)
    return (1.0 - objective.confidence) * share / max(count, 1)


def knob_share(best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData]) -> float:
    """The share of the error a knob verdict read from the runs alone spends, as the race spent it:
    the interim look's at the best's runs where its statements all held there (the race stopped on
    them), else the race's last look's (what the interim looks before it left)."""
    n = 1 + len(best.runs)
    interim = look_share(n, objective.most_runs, False)
    said = knob_limits(best, better, objective, trials, interim)
    if said and all(lim.holds for _, lim in said):
        return interim
    return look_share(n, objective.most_runs, True)


def knob_confidence(best: TrialData, better: list[TrialData], objective: ObjectiveSpec, trials: list[TrialData]) -> str:
    """How sure a knob verdict is (:func:`knob_limits` at :func:`knob_share`). Empty without
    constraints or with one run."""
    statements = knob_limits(best, better, objective, trials, knob_share(best, better, objective, trials))
    if not statements:
        return ""
    conf = f"{objective.confidence * 100:.4g}%"
    said = "; ".join(f"{'' if name == best.name else name + ': '}{lim.words()}" for name, lim in statements)
    if all(lim.holds for _, lim in statements):
        return f", with {conf} confidence for all these statements together (one-sided limits between runs: {said})"
    failing = "; ".join(f"{name}: {lim.words()}" for name, lim in statements if not lim.holds)
    return (
        f", but not yet with {conf} confidence (one-sided limits between runs: {failing}): more runs would tell "
        "(objective.max_repeats, objective.budget)"
    )


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
