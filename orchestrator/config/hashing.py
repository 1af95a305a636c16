"""The trial hash: identity of a trial (result file name, MLflow tag, resume key)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.config.schema import TrialSpec

# Fields that do not change what is measured: names, where the server listens, patience.
_EXCLUDE: dict[str, Any] = {
    "experiment": True,
    "variant": True,
    "engine": {"host": True, "port": True, "startup_timeout_s": True, "python": True, "launch_prefix": True},
    "platform": {
        "max_concurrent_trials": True,
        "monitor_interval_s": True,
        "monitor_budget": True,
        "telemetry": True,
        "telemetry_interval_s": True,
        "engine_envs": True,
        "slate": True,
    },
    # The limits of coalesced reads and of foreign CPU, added later, judge a point; they do not change
    # the measurement.
    # The client's nodes, like its processes, are how we measure.
    "workload": {"client_nodes": True, "validity": {"max_coalesced_share": True, "max_foreign_cpu_cores": True}},
}


# Knobs added after trials were first hashed: left unset, a trial keeps the identity it had before.
_UNSET_AS_BEFORE: tuple[tuple[str, ...], ...] = (
    ("profile",),
    ("engine", "router"),
    ("platform", "price_per_hour"),
    ("model", "tiny", "quantization"),
)


def _drop_unset(data: dict[str, Any], path: tuple[str, ...]) -> None:
    """Remove the key at ``path`` when it is present and None."""
    parent: Any = data
    for key in path[:-1]:
        parent = parent.get(key) if isinstance(parent, dict) else None
    if isinstance(parent, dict) and path[-1] in parent and parent[path[-1]] is None:
        del parent[path[-1]]


def canonical_json(spec: TrialSpec) -> str:
    """Sorted-key, compact JSON of everything in the spec that changes the measurement."""
    data = spec.model_dump(mode="json", exclude=_EXCLUDE)
    if not spec.eval.tasks:  # no evaluation: same identity as before evaluations existed
        data.pop("eval", None)
    for path in _UNSET_AS_BEFORE:
        _drop_unset(data, path)
    # How many client processes read the streams is how we measure, not what: a trial keeps its
    # identity whatever the client's size, written as 1 (every trial's value before ``auto``), so
    # sweeps finished before keep their trials.
    data["workload"]["client_processes"] = 1
    if not data.get("run"):  # the first run of a configuration: the identity it had before races
        data.pop("run", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def trial_hash(spec: TrialSpec) -> str:
    """First 16 hex digits of the SHA-256 of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()[:16]


def first_run_hash(spec: TrialSpec) -> str | None:
    """For a race's later run (``run`` > 0): the trial hash of its configuration's first run."""
    return trial_hash(spec.model_copy(update={"run": 0})) if spec.run else None
