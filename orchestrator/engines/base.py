"""What every engine adapter produces (a server launch description, a metric-name map) and the
adapter base class with its registry.

The rest of the orchestrator sees only :class:`ServerLaunch` (argv, env, URLs, role) and the
neutral metric map; engine specifics stay in their adapter class (one module per engine).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import BaseEngineSpec, TrialSpec
from orchestrator.config.secrets import REDACTED, is_secret_name, redact_argv

# "latency": a histogram in seconds whose buckets give the point's server-side percentiles
MetricKind = Literal["counter", "gauge", "histogram", "latency"]
# What a server is to its trial: the one engine server ("server", also an external one), one of
# several identical replicas behind a router, one side of a prefill/decode pair, or the router
# or proxy in front of those (it runs no model, has no cache, and is not scraped).
Role = Literal["server", "replica", "prefill", "decode", "router", "proxy"]
FRONT_ROLES: tuple[Role, ...] = ("router", "proxy")


@dataclass(frozen=True)
class EngineMetric:
    """A neutral metric (e.g. ``prefix_cache_hits``) and the engine's Prometheus family for it."""

    family: str
    kind: MetricKind


@dataclass(frozen=True)
class ServerLaunch:
    """Everything needed to start one engine server and talk to it."""

    name: str  # for logs, log files and traces: "server", "prefill", "replica0", "router", ...
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
    role: Role = field(kw_only=True)  # what the trial does with it (ServerGroup), never read from name

    @property
    def in_front(self) -> bool:
        """A router or proxy in front of the engine servers: no model, no cache, no metrics of ours."""
        return self.role in FRONT_ROLES

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


def _no_more_ports() -> int:
    raise RuntimeError("this launch has one port: LaunchContext.next_port was not given")


@dataclass(frozen=True)
class LaunchContext:
    """Where a trial's servers are launched, the same for every adapter: the model's local folder
    (or hub id), the measured front's port, more ports on demand (replicas, a P/D pair, the
    router's side port), a work folder for rendered configs and KV stores, and the LoRA adapters
    loaded at start (served name, folder)."""

    model_path: str
    port: int
    next_port: Callable[[], int] = _no_more_ports
    workdir: str = ""
    adapters: tuple[tuple[str, str], ...] = ()


S = TypeVar("S", bound=BaseEngineSpec)


class EngineAdapter(ABC, Generic[S]):
    """One engine: how a trial whose ``engine`` is a ``spec_type`` starts and reads its servers.
    The rest of the orchestrator reaches an engine only through these methods
    (``engines.adapter_for``); what most engines do not need defaults to nothing here. A
    subclass decorated with :func:`register` is found by its spec's ``name``."""

    spec_type: type[S]

    @property
    def name(self) -> str:
        return engine_name(self.spec_type)

    def narrow(self, spec: TrialSpec) -> S:
        """The trial's engine spec, of this adapter's type."""
        engine = spec.engine
        if not isinstance(engine, self.spec_type):
            raise TypeError(f"the {self.name} adapter got an engine spec of '{engine.name}' ({type(engine).__name__})")
        return engine

    @abstractmethod
    def launches(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        """The trial's servers, the measured front last (none: the trial holds, see ``hold``)."""

    def launch(self, spec: TrialSpec, model_path: str, port: int) -> ServerLaunch:
        """The server of a single-server trial (no further ports, no files in a work folder)."""
        return self.launches(spec, LaunchContext(model_path, port))[0]

    def version(self, spec: TrialSpec) -> str:
        """The engine's version where the trial's servers run; its name when it has none."""
        return self.name

    def unsupported(self, spec: TrialSpec) -> str | None:
        """Why this platform cannot run the trial (it is then SKIPPED), or None."""
        return None

    def refuses(self, spec: TrialSpec, positions: Callable[[], tuple[int, str] | None] = lambda: None) -> str | None:
        """Why the engine itself would refuse the trial's settings at start (its own checks, said
        before the server starts rather than as its start-up traceback), or None. ``positions()``:
        the most positions the model takes and where that was read (None: not known), read from
        the model only by an engine that checks it."""
        return None

    def batch_slots(self, spec: TrialSpec) -> int | None:
        """The most requests the engine runs at once when the trial sets it; None: the engine's
        own default, not known here."""
        return None

    def lora_rank_limit(self, spec: TrialSpec) -> tuple[int | None, str]:
        """The highest LoRA rank the trial's server loads, and how it was set (" (vLLM's default)");
        None: no limit known here."""
        return None, ""

    def prefix_cache_on(self, spec: TrialSpec) -> bool | None:
        """Whether the trial's server reuses cached prefixes; None: not known here."""
        return None

    def decode_ttft_holds_prefill(self, spec: TrialSpec) -> bool:
        """Whether, under P/D, the decode server's TTFT includes the prefill (its router sends each
        request to both sides at once), so the KV transfer cannot be told apart from it."""
        return False

    def cache_reset(self, spec: TrialSpec) -> tuple[str, str] | None:
        """(method, path) that empties the prefix cache before each load point, or None."""
        return None

    def adapter_loading(self, spec: TrialSpec) -> str | None:
        """The path a LoRA adapter is POSTed to (``{"lora_name", "lora_path"}``) to load it into a
        running server, when the trial loads its adapters at run time; None: they load at start."""
        return None

    def metrics_for(self, spec: TrialSpec) -> dict[str, EngineMetric]:
        """The engine's Prometheus families under neutral names."""
        return {}

    def api_key(self, spec: TrialSpec) -> str | None:
        """The server's API key (from the environment, see :func:`key_from_env`), or None."""
        return None

    def hold(self, spec: TrialSpec) -> dict[str, float] | None:
        """A trial without a server does this instead and returns its metrics; None: it serves."""
        return None

    def profiler(self, spec: TrialSpec, trace_dir: str) -> Profiler | None:
        """How to trace the engine's servers into ``trace_dir``; None when it cannot be profiled."""
        return None


def engine_name(spec_type: type[BaseEngineSpec]) -> str:
    """The ``name`` literal an engine spec class is chosen by (``engine=vllm``)."""
    name = spec_type.model_fields["name"].default
    if not isinstance(name, str):
        raise TypeError(f"{spec_type.__name__} has no default name to be chosen by")
    return name


ADAPTERS: dict[str, EngineAdapter[Any]] = {}  # by engine name, in the order they were registered
AdapterClass = TypeVar("AdapterClass", bound=type[EngineAdapter[Any]])


def register(cls: AdapterClass) -> AdapterClass:
    """Class decorator: ``cls`` serves the trials whose engine is named like its ``spec_type``."""
    adapter = cls()
    if adapter.name in ADAPTERS:
        other = type(ADAPTERS[adapter.name]).__name__
        raise TypeError(f"engine '{adapter.name}' has two adapters: {other} and {cls.__name__}")
    ADAPTERS[adapter.name] = adapter
    return cls


def key_from_env(variable: str | None) -> str | None:
    """The API key in the environment variable ``engine.api_key_env`` names (None: no key)."""
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise ConfigError(f"engine.api_key_env: environment variable {variable} is not set")
    return key
