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
    },
}


def canonical_json(spec: TrialSpec) -> str:
    """Sorted-key, compact JSON of everything in the spec that changes the measurement."""
    data = spec.model_dump(mode="json", exclude=_EXCLUDE)
    if data.get("profile", 0) is None:  # not profiled: same identity as before profiles existed
        data.pop("profile")
    if not spec.eval.tasks:  # no evaluation: same identity as before evaluations existed
        data.pop("eval", None)
    if "router" in data.get("engine", {}) and data["engine"]["router"] is None:  # knobs added later: unset = as before
        data["engine"].pop("router")
    if data.get("platform", {}).get("price_per_hour", 0) is None:  # no price: same identity as before prices
        data["platform"].pop("price_per_hour")
    tiny = (data.get("model") or {}).get("tiny")
    if tiny and tiny.get("quantization") is None:  # unquantized: same identity as before the knob existed
        tiny.pop("quantization", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def trial_hash(spec: TrialSpec) -> str:
    """First 16 hex digits of the SHA-256 of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()[:16]
