"""What every engine adapter produces: a server launch description and a metric-name map.

The rest of the orchestrator sees only :class:`ServerLaunch` (argv, env, URLs) and the
neutral metric map; engine specifics stay in their adapter module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from orchestrator.config.schema import TrialSpec
from orchestrator.config.secrets import REDACTED, is_secret_name, redact_argv

# "latency": a histogram in seconds whose buckets give the point's server-side percentiles
MetricKind = Literal["counter", "gauge", "histogram", "latency"]


@dataclass(frozen=True)
class EngineMetric:
    """A neutral metric (e.g. ``prefix_cache_hits``) and the engine's Prometheus family for it."""

    family: str
    kind: MetricKind


@dataclass(frozen=True)
class ServerLaunch:
    """Everything needed to start one engine server and talk to it."""

    name: str  # "server", or "prefill"/"decode" for multi-server topologies
    argv: list[str]
    env: dict[str, str]  # variables set on top of the inherited environment
    host: str
    port: int
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    startup_timeout_s: float = 600.0
    unset_env: tuple[str, ...] = field(default_factory=tuple)
    scheme: str = "http"
    # Which of the trial's assigned GPUs this server gets (indexes into that list); None = all.
    gpus: tuple[int, ...] | None = None
    files: dict[str, str] = field(default_factory=dict)  # path -> content, written before start (configs)
    scratch: tuple[str, ...] = ()  # folders the server fills (a KV store): removed after it stops
    # Log lines that mean the engine died while its API process lives on (it then answers 5xx):
    # the adapter's words for it, e.g. vLLM's "EngineCore encountered a fatal error".
    fatal_log_markers: tuple[str, ...] = ()
    stop_grace_s: float | None = None  # TERM-to-KILL wait at stop; None = the process default (15 s)

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.base_url + self.health_path

    @property
    def metrics_url(self) -> str:
        return self.base_url + self.metrics_path

    def redacted(self) -> dict[str, object]:
        """argv and env for logs, params and dry runs, with secret-looking values hidden."""
        out: dict[str, object] = {
            "name": self.name,
            "argv": redact_argv(self.argv),
            "env": redact_env(self.env),
            "url": self.base_url,
        }
        if self.gpus is not None:
            out["gpu_slots"] = list(self.gpus)
        if self.files:
            out["files"] = dict(self.files)
        return out


def opt(name: str, value: object) -> list[str]:
    """``--name value`` for a set knob, nothing for ``None`` (the engine's own default)."""
    return [] if value is None else [f"--{name}", str(value)]


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


@dataclass(frozen=True)
class Profiler:
    """How an engine's servers are profiled (``profile``): what each engine server's launch gains
    (``argv``, ``env``) and the endpoints that start and stop a trace, with their JSON bodies."""

    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    start: tuple[str, dict[str, Any] | None] = ("/start_profile", None)
    stop: tuple[str, dict[str, Any] | None] = ("/stop_profile", None)
    # argv put in front of a server's interpreter (inside its launch prefix), by server name: nsys
    wrapper: Callable[[str], list[str]] | None = None
    stop_grace_s: float | None = None  # how long a wrapped server may take to stop (nsys writes its report)


class EngineAdapter(Protocol):
    """What each engine module (``vllm``, ``sglang``, ``external``, ``sleep``) provides; the
    rest of the orchestrator reaches an engine only through these (``engines.adapter_for``)."""

    def launches(
        self, spec: TrialSpec, model_path: str, port: int, next_port: Callable[[], int], workdir: str
    ) -> list[ServerLaunch]:
        """The trial's servers, the measured front last (none: the trial holds, see ``hold``)."""
        ...

    def unsupported(self, spec: TrialSpec) -> str | None:
        """Why this platform cannot run the trial (it is then SKIPPED), or None."""
        ...

    def cache_reset(self, spec: TrialSpec) -> tuple[str, str] | None:
        """(method, path) that empties the prefix cache before each load point, or None."""
        ...

    def metrics_for(self, spec: TrialSpec) -> dict[str, EngineMetric]:
        """The engine's Prometheus families under neutral names."""
        ...

    def api_key(self, spec: TrialSpec) -> str | None:
        """The server's API key (from the environment; ConfigError when the variable is unset)."""
        ...

    def version(self, spec: TrialSpec) -> str:
        """The engine's version where the trial's servers run."""
        ...

    def hold(self, spec: TrialSpec) -> dict[str, float] | None:
        """A trial without a server does this instead and returns its metrics; None for engines."""
        ...

    def profiler(self, spec: TrialSpec, trace_dir: str) -> Profiler | None:
        """How to trace the engine's servers into ``trace_dir``; None when it cannot be profiled."""
        ...
