"""The external "engine" (:class:`ExternalAdapter`): a server somebody else runs. Nothing is
launched or stopped.

:class:`ExternalServer` has the interface of :class:`ServerProcess` that a trial uses
(context manager, ``wait_healthy``, ``check_alive``, ``pid``), backed by HTTP checks only.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from types import TracebackType
from urllib.parse import urlparse

from orchestrator.config.errors import ServerCrashedError, ServerStartError
from orchestrator.config.schema import ExternalEngineSpec, TrialSpec
from orchestrator.engines import vllm
from orchestrator.engines.base import EngineAdapter, EngineMetric, LaunchContext, ServerLaunch, key_from_env, register

METRICS_BY_FLAVOR: dict[str, dict[str, EngineMetric]] = {"vllm": vllm.METRICS, "none": {}}


@register
class ExternalAdapter(EngineAdapter[ExternalEngineSpec]):
    """A server somebody else runs, at ``engine.url``: measured, never started or profiled."""

    spec_type = ExternalEngineSpec

    def launches(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        engine = self.narrow(spec)
        u = urlparse(engine.url)
        server = ServerLaunch(
            name="external",
            role="server",
            argv=[],
            env={},
            host=u.hostname or "",
            port=u.port or (443 if u.scheme == "https" else 80),
            health_path=engine.health_path or "",
            metrics_path=engine.metrics_path or "",
            startup_timeout_s=engine.startup_timeout_s,
            scheme=u.scheme,
        )
        return [server]

    def metrics_for(self, spec: TrialSpec) -> dict[str, EngineMetric]:
        engine = self.narrow(spec)
        return METRICS_BY_FLAVOR[engine.metrics] if engine.metrics_path else {}

    def api_key(self, spec: TrialSpec) -> str | None:
        return key_from_env(self.narrow(spec).api_key_env)


class ExternalServer:
    """Health checks against a running server; never starts or stops anything."""

    def __init__(self, launch: ServerLaunch) -> None:
        self.launch = launch
        self.pid: int | None = None
        self.startup_s: float | None = 0.0

    def _healthy(self) -> bool:
        if not self.launch.health_path:
            return True
        try:
            with urllib.request.urlopen(self.launch.health_url, timeout=5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while not self._healthy():
            if time.monotonic() - t0 > timeout_s:
                raise ServerStartError(f"external server {self.launch.base_url} not healthy after {timeout_s:.0f} s")
            time.sleep(1.0)
        return 0.0  # nothing was started here

    def check_alive(self) -> None:
        """Raise :class:`ServerCrashedError` when its health check fails three times in a row."""
        for attempt in range(3):
            if self._healthy():
                return
            if attempt < 2:
                time.sleep(1.0)
        raise ServerCrashedError(
            f"external server {self.launch.base_url}: its health check "
            f"{self.launch.health_path} fails (the engine behind it may have died)"
        )

    def __enter__(self) -> ExternalServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None
