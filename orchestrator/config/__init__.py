"""Typed trial schema, conversion from Hydra, trial hash. Imports nothing else of ours.

Its names load on first use (PEP 562): ``orchestrator.config.errors`` alone (what GPU detection
needs) imports neither pydantic nor Hydra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.config.convert import to_specs
    from orchestrator.config.errors import (
        ConfigError,
        InfeasibleConfigError,
        LoadError,
        OrchestratorError,
        ServerCrashedError,
        ServerStartError,
        TrialError,
    )
    from orchestrator.config.hashing import trial_hash
    from orchestrator.config.schema import (
        ClusterSpec,
        EngineSpec,
        LoadPointSpec,
        ModelSpec,
        PlatformSpec,
        RequestClass,
        SLOSpec,
        SweepSettings,
        TrackingSpec,
        TrialSpec,
        WorkloadSpec,
    )

__all__ = [
    "ClusterSpec",
    "ConfigError",
    "EngineSpec",
    "InfeasibleConfigError",
    "LoadError",
    "LoadPointSpec",
    "ModelSpec",
    "OrchestratorError",
    "PlatformSpec",
    "RequestClass",
    "SLOSpec",
    "ServerCrashedError",
    "ServerStartError",
    "SweepSettings",
    "TrackingSpec",
    "TrialError",
    "TrialSpec",
    "WorkloadSpec",
    "to_specs",
    "trial_hash",
]

_HOME = {
    "to_specs": f"{__name__}.convert",
    "trial_hash": f"{__name__}.hashing",
    **dict.fromkeys(
        ["ConfigError", "InfeasibleConfigError", "LoadError", "OrchestratorError", "ServerCrashedError"]
        + ["ServerStartError", "TrialError"],
        f"{__name__}.errors",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME.get(name, f"{__name__}.schema")), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value
