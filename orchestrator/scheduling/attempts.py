"""The attempts of a trial on Ray: each worker notes where its attempt runs (:func:`note_attempt`);
an attempt lost with its worker or node (:data:`LOST`) is run again while attempts are left, what
it wrote set aside in ``attempt-N/``; every attempt is listed in the trial's result
(:class:`Attempts`). The tasks themselves are :mod:`orchestrator.scheduling.ray_exec`'s."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling.jobs import TrialJob

ATTEMPTS_FILE = "attempts.jsonl"
# The worker process or its node went away: the trial itself did not fail, so it is run again
# (on another node when the node is gone). Anything else (an exception in the trial body,
# a server that exits at start, a cancelled task) is deterministic or wanted: not retried.
LOST = (
    "WorkerCrashedError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "OwnerDiedError",
    "ObjectLostError",
    "OutOfMemoryError",
)


def note_attempt(workdir: str, node_id: str) -> None:
    """The worker's first act: where this attempt runs (read by the driver if it is lost)."""
    d = Path(workdir)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps({"node_id": node_id, "pid": os.getpid(), "started_at": time.time()}) + "\n")


@dataclass
class Attempts:
    """What happened to each attempt of one trial, for its result."""

    history: list[dict[str, Any]] = field(default_factory=list)

    def lost(self, workdir: str, error: str, secrets: set[str]) -> None:
        n = len(self.history) + 1
        started = _last_attempt_note(workdir)
        self.history.append(
            {
                "attempt": n,
                "outcome": "LOST",
                "error": error,
                "node_id": started.get("node_id"),
                "started_at": started.get("started_at"),
                "ended_at": time.time(),
                "kept_in": _set_aside(workdir, n, secrets),
            }
        )

    def final(self, result: TrialResult) -> TrialResult:
        self.history.append(
            {
                "attempt": len(self.history) + 1,
                "outcome": result.status,
                "node_id": result.hardware.get("ray_node_id"),
                "started_at": result.started_at,
                "ended_at": result.ended_at,
            }
        )
        result.attempts = self.history
        return result


def _last_attempt_note(workdir: str) -> dict[str, Any]:
    try:
        return json.loads((Path(workdir) / ATTEMPTS_FILE).read_text().splitlines()[-1])
    except (OSError, IndexError, ValueError):  # the worker died before writing it, or no shared disk
        return {}


def _set_aside(workdir: str, n: int, secrets: set[str]) -> str | None:
    """Move what a lost attempt wrote (points measured so far, server logs) to attempt-N/, so
    the next attempt starts clean and nothing measured is lost; its raw logs, which the lost
    worker could not scrub, with ``secrets`` hidden."""
    d = Path(workdir)
    entries = (
        [e for e in d.glob("*") if e.name != ATTEMPTS_FILE and not e.name.startswith("attempt-")] if d.is_dir() else []
    )
    if not entries:
        return None
    keep = d / f"attempt-{n}"
    keep.mkdir(exist_ok=True)
    for e in entries:
        shutil.move(str(e), keep / e.name)
    from orchestrator.trial.scrub import scrub_logs

    scrub_logs(keep, secrets)
    return str(keep)


def retried(
    unit: list[TrialJob],
    error: Exception | None,
    attempts: dict[int, Attempts],
    max_attempts: int,
    workdir_of: Callable[[TrialJob], str],
    progress: Callable[[str], None],
) -> bool:
    """Whether the unit is to run again: lost with its worker or node (:data:`LOST`) with
    attempts left; each job's lost attempt is then noted and set aside, and said."""
    lost = f"{type(error).__name__}: {error}" if type(error).__name__ in LOST else None
    tries = attempts[unit[0].index]
    if lost is None or len(tries.history) + 1 >= max_attempts:
        return False
    from orchestrator.trial.scrub import trial_secrets

    for job in unit:
        attempts[job.index].lost(workdir_of(job), lost, trial_secrets(job.spec))
    progress(
        f"{unit[0].label}{f' (+{len(unit) - 1} sharing its server)' if len(unit) > 1 else ''}: "
        f"attempt {len(tries.history)} lost ({lost.splitlines()[0][:160]}); "
        f"running it again ({len(tries.history) + 1}/{max_attempts})"
    )
    return True
