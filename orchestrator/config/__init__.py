"""Typed trial schema, conversion from Hydra, trial hash. Imports nothing else of ours."""

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
