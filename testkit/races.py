"""Races for tests and benchmarks: the race's procedure on a simulated machine (:func:`simulate`),
and the command line of a sweep of two trials measured alike (:func:`two_names_sweep`)."""

from __future__ import annotations

import math
import random
import sys

from orchestrator.config.schema.goals import AUTO_MAX_RUNS
from orchestrator.decide.looks import Schedule
from orchestrator.decide.race import OPEN, RaceState, planned_runs, race_state


def simulate(
    truth: dict[str, float],
    cv: float,
    seed: int,
    max_repeats: int | str = 3,
    margin: float = 0.1,
    affordable: int = 99,
    shared: float = 0.0,
    runs_out: list[int] | None = None,
) -> str:
    """The race's procedure on a simulated machine (log-normal noise of ``cv`` each run, and of
    ``shared`` each round, common to the trials of the round: its requests, its server start, the
    machine's moment), round by round as scheduling.rounds runs it (its :class:`Schedule`): every
    trial runs twice, then at each look the leader and the undecided go on, up to ``max_repeats``
    runs (``auto``: as planned after the third run and at each later look, with ``affordable``
    runs in the budget); the verdict's answer (and the runs made, into ``runs_out``)."""
    rng = random.Random(seed)
    runs: dict[str, dict[int, float]] = {k: {} for k in truth}
    auto = max_repeats == "auto"
    schedule = Schedule(AUTO_MAX_RUNS if auto else int(max_repeats), auto)

    def play(names: list[str], r: int) -> None:
        common = rng.gauss(0, shared)
        for k in names:
            runs[k][r] = truth[k] * math.exp(common + rng.gauss(0, cv))

    def judge(final: bool | None = False) -> RaceState:
        return race_state(runs, True, 0.95, margin, schedule.limit, final)

    play(list(truth), 0)
    names, r = list(truth), 1
    while True:
        play(names, r)
        r += 1
        if not (schedule.looks_at(r) or schedule.last(r)):
            continue  # between looks the same trials run again (the race's standing is not read)
        state = judge()
        if schedule.plans_at(r):
            schedule.replan(planned_runs(state, affordable, AUTO_MAX_RUNS))
        if schedule.last(r) or state.answer != OPEN:
            break
        names = state.to_repeat()
    if runs_out is not None:
        runs_out.append(r)
    return judge(None).answer


def two_names_sweep(url: str, store: str, folder: str, objective: str, num_requests: int = 40) -> list[str]:
    """The CLI of a sweep of two trials measured alike (a request's timeout of 300 or 301 s, which
    no request comes near: the same requests, warm-up and server) against the (fake) server at
    ``url``, racing with ``objective``. (Two empty variants are one trial: the sweep refuses them.
    Warm-up 0 or 1 request, as before, differs in the client's first request.)"""
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=external",
        f"engine.url={url}",
        "engine.metrics=none",
        "workload.load_points=[{concurrency:4}]",
        f"workload.num_requests={num_requests}",
        "workload.request_timeout_s=300,301",
        f"objective={objective}",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={folder}",
        "-m",
    ]
