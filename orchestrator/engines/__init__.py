"""Engine adapters (one module per engine) and the server process lifecycle."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.engines import external, sglang, sleep, vllm
from orchestrator.engines.base import EngineAdapter, EngineMetric, ServerLaunch
from orchestrator.engines.external import ExternalServer
from orchestrator.engines.process import ServerProcess, free_port, port_is_free

# Each adapter module implements :class:`EngineAdapter` (checked by mypy: a module satisfies
# a protocol when its functions do).
ADAPTERS: dict[str, EngineAdapter] = {"vllm": vllm, "sglang": sglang, "external": external, "sleep": sleep}


def server_for(launch: ServerLaunch, env: dict[str, str], log_path: Path) -> ServerProcess | ExternalServer:
    """A context manager that runs the launched server, or only watches an external one."""
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
        **grace,
    )


def adapter_for(name: str) -> EngineAdapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ConfigError(f"engine.name: unknown engine '{name}'; expected one of: {', '.join(ADAPTERS)}") from None


__all__ = [
    "ADAPTERS",
    "EngineMetric",
    "ExternalServer",
    "ServerLaunch",
    "ServerProcess",
    "adapter_for",
    "free_port",
    "port_is_free",
    "server_for",
]
