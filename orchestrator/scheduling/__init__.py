"""Scheduling: trials as Ray tasks, the driver's sweep loop, and the Hydra launcher glue.

Its names load on first use (PEP 562): Hydra's plugin discovery imports the sweepers' option
classes (:mod:`orchestrator.scheduling.search_options`) at every start, without the sweep's
machinery."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "TrialJob": "orchestrator.scheduling.jobs",
    "prepare_jobs": "orchestrator.scheduling.jobs",
    "dry_run": "orchestrator.scheduling.preview",
    "run_sweep": "orchestrator.scheduling.sweep",
}

__all__ = ["TrialJob", "dry_run", "prepare_jobs", "run_sweep"]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
