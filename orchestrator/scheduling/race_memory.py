"""What a race learnt of this machine, kept for the next sweep of the same trials: the spread
between runs it measured, the runs each it made and deciding needed, and how long a round took
(``<cache>/race-noise.json``, keyed by the machine, the experiment, its objective and its trials'
hashes). With it a lab says before its first trial what its comparison costs here
(:func:`forecast`), not only after the budget ran out."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from typing import Any

from orchestrator.config.paths import cache_root, cached_entry, keep_entry
from orchestrator.decide.race import OPEN, RaceState
from orchestrator.metrics import host
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.outcome import minutes

FILE = "race-noise.json"
KEPT = 500  # races remembered (the latest): tests and one-off sweeps add their own


def memory_key(jobs: list[TrialJob]) -> str:
    """These trials' race on this machine."""
    objective = jobs[0].settings.objective
    parts = {
        "machine": host.describe([])["summary"],
        "experiment": jobs[0].spec.experiment,
        # what the race compares, not how long it may run: another budget reads the same memory
        "objective": objective.model_dump(mode="json", exclude={"budget", "max_repeats", "show"})
        if objective
        else None,
        "trials": sorted(j.trial_hash for j in jobs),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def remember(jobs: list[TrialJob], state: RaceState, runs: int, round_s: float, first_pass_s: float) -> None:
    """Keep how the race ended (best effort: a cache that cannot be written loses a forecast only)."""
    if state.sd <= 0 or not state.comparisons:
        return
    entry = {
        "when": dt.date.today().isoformat(),
        "answer": state.answer,
        "runs": runs,
        "sd": state.sd,
        "log_scale": state.comparisons[0].log_scale,
        "need": state.runs_to_decide_all() if state.answer == OPEN else None,
        "round_s": round_s,
        "first_pass_s": first_pass_s,
    }
    try:
        keep_entry(cache_root() / FILE, memory_key(jobs), entry, most=KEPT)
    except OSError:
        pass


def forecast(jobs: list[TrialJob]) -> str | None:
    """The line said before the sweep's first trial, from the last race of these trials here;
    None where there was none."""
    objective = jobs[0].settings.objective
    if objective is None:
        return None
    known: dict[str, Any] | None = cached_entry(cache_root() / FILE, memory_key(jobs))
    if not known:
        return None
    spread = f"{math.expm1(known['sd']):.0%} between runs" if known["log_scale"] else "its spread between runs"
    said = f"race: last time on this machine ({known['when']}) at {spread}"
    if known["answer"] != OPEN:
        return f"{said} it decided after {known['runs']} runs each ({known['answer']})"
    round_s, first = float(known["round_s"]), float(known["first_pass_s"])
    affords = 1 + int(objective.budget * first // round_s) if round_s > 0 else known["runs"]
    need = known["need"]
    if need is None:
        return f"{said} it ended undecided after {known['runs']} runs each, and no practical number of runs decides it here"
    budget = (need - 1) * round_s / first if first > 0 else objective.budget
    return (
        f"{said} it ended undecided after {known['runs']} runs each: deciding needs about {need} runs each "
        f"(~{minutes(first + (need - 1) * round_s)} here), this budget affords about {affords} "
        f"(objective.budget={objective.budget:g}; {budget:.1f} would afford {need})"
    )
