"""Engine adapters (one module per engine) and the server process lifecycle."""

from __future__ import annotations

from types import ModuleType

from orchestrator.config.errors import ConfigError
from orchestrator.engines import vllm
from orchestrator.engines.base import EngineMetric, ServerLaunch
from orchestrator.engines.process import ServerProcess, free_port, port_is_free

ADAPTERS: dict[str, ModuleType] = {"vllm": vllm}


def adapter_for(name: str) -> ModuleType:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ConfigError(f"engine.name: unknown engine '{name}'; expected one of: {', '.join(ADAPTERS)}") from None


__all__ = ["ADAPTERS", "EngineMetric", "ServerLaunch", "ServerProcess", "adapter_for", "free_port", "port_is_free"]
