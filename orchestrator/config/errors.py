"""The exception tree of the orchestrator. It lives in the lowest layer so every package may raise it."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of every error the orchestrator raises on purpose."""


class ConfigError(OrchestratorError):
    """A config key or value is wrong; raised before anything starts."""


class TrialError(OrchestratorError):
    """A trial could not be measured."""


class ServerStartError(TrialError):
    """The engine server exited or never became healthy during start-up."""


class ServerCrashedError(TrialError):
    """The engine server died while it was being measured."""


class InfeasibleConfigError(TrialError):
    """The trial cannot run on the hardware at hand (it is SKIPPED, not FAILED)."""


class LoadError(TrialError):
    """The load generator could not run a load point."""
