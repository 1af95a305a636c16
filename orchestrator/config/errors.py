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


class DiskFullError(OrchestratorError):
    """A result could not be written: its filesystem is full. The sweep stops; what was written
    before is whole, and a re-run after space is freed resumes."""

    def __init__(self, path: str, needed_bytes: int, free_bytes: int | None) -> None:
        free = f"{free_bytes} bytes free" if free_bytes is not None else "free space unknown"
        super().__init__(
            f"no space left to write {path}: it needs {needed_bytes} bytes, {free} on its filesystem. "
            "Free space (or point hydra.sweep.dir elsewhere) and run the same command again: trials "
            "already FINISHED are not run twice"
        )
        self.path, self.needed_bytes, self.free_bytes = path, needed_bytes, free_bytes
