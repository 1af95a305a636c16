"""The report's *why*: what limited each trial (from each point's diagnosis) and why the
verdict's winner wins, explained through the diagnoses of the trials it is compared with.

The explanation is generated from the data, never written per experiment: for each varied knob
the winner is set against the trial closest to it that differs in that knob, and the report
says which limiter each ran into, what measured mechanism changed between them and by how much
(stalls, queue and prefill time, batch, cache hits, ...), and what the change cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ObjectiveSpec
from orchestrator.decide.objective import fixed_points, point_at, short
from orchestrator.decide.race import OPEN, TIED, WIN, Answer
from orchestrator.decide.trials import Point, TrialData


def _cause(key: str) -> str:
    return key.replace("_", " ") if key else "?"


def limits_section(trials: list[TrialData]) -> list[str]:
    """``## What limited each trial``: every diagnosed point's limiter, confidence and evidence."""
    rows = [(t, p) for t in trials for p in fixed_points(t) if p.diagnosis.limiter or p.diagnosis.headline]
    if not rows:
        return []
    out = [
        "## What limited each trial",
        "",
        "The limiter of each load point, from what it measured (docs/diagnosis.md has the vocabulary and the "
        "rules); `strong` findings rest on a direct measurement, `weak` ones on a coarser or indirect one.",
        "",
        "| trial | point | limited by | confidence | evidence | also |",
        "|---|---|---|---|---|---|",
    ]
    for t, p in rows:
        d = p.diagnosis
        main = d.finding(d.limiter)
        also = "; ".join(f"{_cause(f.cause)} ({f.confidence})" for f in d.findings if f.cause != d.limiter)
        detail = main.detail if main is not None else d.headline
        out.append(
            f"| {t.name} | {p.label} | {_cause(d.limiter)} | {d.confidence} | {detail.replace('|', '/')} | {also} |"
        )
    return out + [""]


@dataclass(frozen=True)
class Mechanism:
    key: str  # a point metric; "<class>/<metric>" keys are found per class
    words: str
    better: str | None  # "lower", "higher", or None (a change, neither gain nor cost)
    floor: float = 1.0  # the smallest absolute change worth naming (1 ms, 1 stall, ...)


MECHANISMS = (
    Mechanism(M.STALL_WORST_MS, "worst stall (ms)", "lower"),
    Mechanism(M.STALLS, "stalls", "lower", 2.0),
    Mechanism(M.STALLS_PER_PREFILL, "stalled steps per interfering prefill", None, 0.5),
    Mechanism(M.STALL_TIME_SHARE, "share of inter-token time stalled", "lower", 0.02),
    Mechanism(M.ITL_WORST_MS_P50, "the stall a typical request saw (ms)", "lower"),
    Mechanism(M.ITL_MS_P99, "ITL p99 (ms)", "lower"),
    Mechanism(M.TTFT_PARTS_QUEUE_MS, "queue wait in TTFT (ms)", "lower", 5.0),
    Mechanism(M.TTFT_PARTS_PREFILL_MS, "prefill time in TTFT (ms)", "lower", 5.0),
    Mechanism(M.TTFT_MS_P50, "TTFT p50 (ms)", "lower"),
    Mechanism(M.TTFT_MS_P99, "TTFT p99 (ms)", "lower"),
    Mechanism(M.TPOT_MS_P50, "TPOT p50 (ms)", "lower", 0.2),
    Mechanism(M.DECODE_BATCH_MEAN, "batch the engine ran", None, 0.5),
    Mechanism(M.DECODE_FLOOR_RATIO, "TPOT over its roofline floor", "lower", 0.2),
    Mechanism(M.SERVER_PREFIX_CACHE_HIT_RATE, "prefix-cache hit rate", "higher", 0.02),
    Mechanism(M.SERVER_SPEC_DECODE_ACCEPTANCE_RATE, "draft acceptance rate", "higher", 0.02),
    Mechanism(M.SERVER_PREEMPTIONS, "preemptions", "lower"),
    Mechanism(M.SERVER_REQUESTS_WAITING_MAX, "requests waiting (max)", "lower"),
    Mechanism(M.SERVER_KV_CACHE_USAGE_MAX, "KV-cache usage (max)", None, 0.1),
    Mechanism(M.TOKENS_PER_SECOND, "output tok/s", "higher"),
    Mechanism(M.GOODPUT, "goodput (req/s)", "higher", 0.05),
    Mechanism(M.E2E_MS_P50, "E2E p50 (ms)", "lower"),
    Mechanism(M.MEMORY_PEAK_GB, "memory peak (GB)", "lower", 0.05),
)
CLASS_MECHANISMS = (M.ITL_WORST_MS_P50, M.ITL_MS_P99, M.TTFT_MS_P50, M.TTFT_MS_P99, M.TPOT_MS_P50)
MIN_CHANGE = 0.2  # a mechanism that moved less than this (relative) is not named
MIN_COST = 0.05  # a cost smaller than this is not named


def _classes(p: Point) -> list[str]:
    return sorted({k.split("/", 1)[0] for k in p.metrics if "/" in k})


def _changes(a: Point, b: Point) -> list[tuple[str, float, float, float, str | None]]:
    """(words, a's value, b's value, relative change, better) of every mechanism that moved by
    at least its floor; a class's metric that moved as the whole point's did is not repeated."""
    keys = [(m.key, m.words, m.better, m.floor) for m in MECHANISMS]
    for cls in _classes(b):
        keys += [(f"{cls}/{k}", f"{cls}/{k}", "lower", 1.0) for k in CLASS_MECHANISMS]
    out: list[tuple[str, float, float, float, str | None]] = []
    pooled: dict[str, tuple[float, float]] = {}
    for key, words, better, floor in keys:
        va, vb = a.metrics.get(key), b.metrics.get(key)
        if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)) or abs(vb - va) < floor:
            continue
        cls, _, base = key.rpartition("/")
        if not cls:
            pooled[key] = (va, vb)
        elif base in pooled and all(math.isclose(u, v, rel_tol=0.02) for u, v in zip(pooled[base], (va, vb))):
            continue  # the class moved exactly as the whole point: said once
        out.append((words, va, vb, (vb - va) / abs(va) if va else math.copysign(math.inf, vb - va), better))
    return out


def _diff(a: TrialData, b: TrialData, varied: list[str]) -> list[str]:
    return [k for k in varied if a.params.get(k) != b.params.get(k)]


def _opponents(winner: TrialData, trials: list[TrialData], varied: list[str]) -> dict[str, list[str]]:
    """For each varied knob, the trial closest to the winner (fewest other knobs differ; then the
    nearest value of that knob) among those that differ in it: {trial name: [knobs]}."""
    chosen: dict[str, list[str]] = {}
    others = [t for t in trials if t is not winner and t.points]
    for knob in varied:
        differ = [t for t in others if t.params.get(knob) != winner.params.get(knob)]
        if not differ:
            continue
        w = winner.num(knob)

        def distance(t: TrialData, w: float | None = w, knob: str = knob) -> tuple[int, float]:
            v = t.num(knob)
            near = abs(v - w) if v is not None and w is not None else math.inf
            return len(_diff(t, winner, varied)), near

        best = min(differ, key=distance)
        chosen.setdefault(best.name, [])
        for k in _diff(best, winner, varied):
            if k not in chosen[best.name]:
                chosen[best.name].append(k)
    return chosen


def _phrase(words: str, va: float, vb: float, rel: float) -> str:
    change = f"{rel:+.0%}" if abs(rel) < 10 else f"{vb / va:.0f}x" if va else "from 0"
    return f"{words} {short(va)} -> {short(vb)} ({change})"


def knob_changes(a: TrialData, b: TrialData, knobs: list[str]) -> str:
    """``knob a's value -> b's`` for each knob; a section set in one trial and null in the other
    is said once, as the section (``{...}`` where its keys are set), not key by key."""
    shown = [k for k in knobs if not any(k.startswith(p + ".") for p in knobs if p != k)]

    def value(t: TrialData, k: str) -> str:
        v = t.params.get(k)
        if v is None and any(p.startswith(k + ".") for p in t.params):
            return "{...}"
        return "unset" if v is None else str(v)

    return ", ".join(f"{k} {value(a, k)} -> {value(b, k)}" for k in shown)


def compare(winner: TrialData, other: TrialData, knobs: list[str], label: str | None) -> str | None:
    """One sentence set: the winner against ``other`` at ``label``."""
    pw, po = point_at(winner, label), point_at(other, label)
    if pw is None or po is None:
        return None
    knob_words = knob_changes(other, winner, knobs)
    lw, lo = pw.diagnosis, po.diagnosis
    lines = [f"Against {other.name} ({knob_words}), at {pw.label}:"]
    if lw.limiter and lo.limiter:
        if lw.limiter == lo.limiter:
            lines.append(f"both were limited by {_cause(lw.limiter)} ({lo.confidence} -> {lw.confidence});")
        else:
            lines.append(
                f"{other.name} was limited by {_cause(lo.limiter)} ({lo.confidence}), "
                f"{winner.name} by {_cause(lw.limiter)} ({lw.confidence});"
            )
    changes = _changes(po, pw)
    moved = sorted((c for c in changes if abs(c[3]) >= MIN_CHANGE), key=lambda c: -abs(c[3]))
    gains = [c for c in moved if c[4] is not None and (c[3] < 0) == (c[4] == "lower")][:4]
    neutral = [c for c in moved if c[4] is None][:2]
    costs = sorted(
        (c for c in changes if c[4] is not None and abs(c[3]) >= MIN_COST and (c[3] > 0) == (c[4] == "lower")),
        key=lambda c: -abs(c[3]),
    )[:3]
    if gains or neutral:
        lines.append("what changed: " + "; ".join(_phrase(*c[:4]) for c in gains + neutral) + ".")
    else:
        lines.append(f"no mechanism moved by {MIN_CHANGE:.0%} or more.")
    if costs:
        lines.append("The cost: " + "; ".join(_phrase(*c[:4]) for c in costs) + ".")
    else:
        lines.append(f"It cost nothing measured here (nothing worse by {MIN_COST:.0%} or more).")
    return " ".join(lines)


def why_winner(
    winner: TrialData | None,
    trials: list[TrialData],
    varied: list[str],
    objective: ObjectiveSpec,
    decision: Answer = WIN,
) -> list[str]:
    """``Why <winner> wins``: one paragraph per trial it is compared with (see the module). With a
    ``decision`` other than a win (a tie, an undecided race) the heading says the trial only leads."""
    if winner is None:
        return []
    knobs = [k for k in varied if k not in ("variant", "overrides")]
    paragraphs = []
    for name, changed in _opponents(winner, trials, knobs).items():
        other = next(t for t in trials if t.name == name)
        text = compare(winner, other, changed, objective.at)
        if text:
            paragraphs.append(f"- {text}")
    if not paragraphs:
        return []
    heading = {
        TIED: f"**Where {winner.name} differs** (it leads, but the verdict is a tie: these differences are within the margin)",
        OPEN: f"**Where {winner.name} differs** (it leads, but the race is undecided: these may be noise)",
    }.get(decision, f"**Why {winner.name} wins**")
    return [
        f"{heading} (its diagnosis against the trials closest to it in each varied knob):",
        "",
        *paragraphs,
    ]
