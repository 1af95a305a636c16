"""Engine adapters (one :class:`EngineAdapter` class per engine, a module each) and the server
process lifecycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.engines import external, sglang, sleep, vllm  # noqa: F401 (their adapters register)
from orchestrator.engines.base import ADAPTERS, EngineAdapter, EngineMetric, LaunchContext, ServerLaunch
from orchestrator.engines.external import ExternalServer
from orchestrator.engines.ports import free_port, port_is_free
from orchestrator.engines.process import ServerProcess


def server_for(
    launch: ServerLaunch, env: dict[str, str], log_path: Path, nice: int = 0
) -> ServerProcess | ExternalServer:
    """A context manager that runs the launched server (at niceness ``nice``), or only watches
    an external one."""
    if not launch.argv:
        return ExternalServer(launch)
    grace = {"stop_grace_s": launch.stop_grace_s} if launch.stop_grace_s is not None else {}
    return ServerProcess(
        launch.argv,
        env,
        log_path,
        launch.health_url,
        name=launch.name,
        fatal_log_markers=launch.fatal_log_markers,
        nice=nice,
        **grace,
    )


def adapter_for(name: str) -> EngineAdapter[Any]:
    """The adapter registered for the engine ``name`` (``engine.name``)."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ConfigError(f"engine.name: unknown engine '{name}'; expected one of: {', '.join(ADAPTERS)}") from None


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "LaunchContext",
    "EngineMetric",
    "ExternalServer",
    "ServerLaunch",
    "ServerProcess",
    "adapter_for",
    "free_port",
    "port_is_free",
    "server_for",
]
