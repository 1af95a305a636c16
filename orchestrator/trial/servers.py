"""A trial's servers: ports, each server's GPUs and environment, starting a group, the group
while it runs (:class:`ServerGroup`), emptying caches, and which trials can share a start."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.errors import TrialError
from orchestrator.config.logs import Progress
from orchestrator.config.schema import TrialSpec
from orchestrator.engines import (
    EngineAdapter,
    ExternalServer,
    ServerLaunch,
    ServerProcess,
    adapter_for,
    free_port,
    port_is_free,
    server_for,
)
from orchestrator.engines.base import LaunchContext, Profiler
from orchestrator.models import resolve_adapters, resolve_model
from orchestrator.trial.profile import TRACE_DIR, profiled_launches, with_profiler


def port_for(spec: TrialSpec, pick_free: bool = True) -> int:
    """The configured port, else a free one for engines we launch (0 for external servers, or
    when ``pick_free`` is off: a plan binds nothing)."""
    engine = spec.engine.launched
    if engine is not None and engine.port:
        if pick_free and not port_is_free(engine.host, engine.port):
            raise TrialError(
                f"engine.port: {engine.host}:{engine.port} is already in use (another server?); "
                "choose another port, or leave engine.port null to get a free one"
            )
        return engine.port
    if engine is not None and pick_free:
        return free_port(engine.host)
    return 0


def port_picker(spec: TrialSpec, taken: set[int]) -> Callable[[], int]:
    """Free ports for a trial's other servers (P/D, side channels), never the same one twice."""
    launched = spec.engine.launched
    host = launched.host if launched is not None else "127.0.0.1"

    def pick() -> int:
        for _ in range(100):
            port = free_port(host)
            if port not in taken:
                taken.add(port)
                return port
        raise TrialError("no free port found")

    return pick


def planned_launches(spec: TrialSpec) -> list[ServerLaunch]:
    """The trial's server launches with placeholder ports and folder: nothing is bound or built."""
    ports = iter(range(1, 100))
    adapter = adapter_for(spec.engine.name)
    at = LaunchContext(
        resolve_model(spec.model, build=False),
        port_for(spec, pick_free=False),
        lambda: next(ports),
        "<trial dir>",
        resolve_adapters(spec.model, build=False),
    )
    launches = adapter.launches(spec, at)
    return profiled_launches(adapter, spec, f"<trial dir>/{TRACE_DIR}", launches)[0]


def server_gpus(launch: ServerLaunch, gpu_ids: list[int]) -> list[int]:
    """The GPUs one server of the trial gets: its slots of the trial's assigned GPUs."""
    if launch.gpus is None:
        return list(gpu_ids)
    return [gpu_ids[i] for i in launch.gpus if i < len(gpu_ids)]


def describe_servers(launches: list[ServerLaunch], gpu_ids: list[int]) -> list[dict[str, Any]]:
    """Each server's redacted command and the GPUs it is given (for results, logs and tests)."""
    return [
        {**x.redacted(), "cuda_visible_devices": ",".join(str(g) for g in server_gpus(x, gpu_ids))} for x in launches
    ]


def server_env(launch: ServerLaunch, gpu_ids: list[int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in launch.unset_env}
    env.update(launch.env)
    mine = server_gpus(launch, gpu_ids)
    if mine:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in mine)
    elif gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a proxy/router: no GPU
    return env


@dataclass(frozen=True)
class GroupView:
    """What measuring a point reads of a running server group, read once (:meth:`ServerGroup.view`)."""

    pids: tuple[int, ...]  # the processes this trial started (none for an external server)
    urls: tuple[str, ...]  # every server's base URL, front last
    engines: tuple[tuple[str, str], ...]  # (name, base URL) of the servers that run the model
    metrics_url: str | None  # whose gauges are sampled: the last engine server (decode under P/D)
    counter_urls: tuple[str, ...]  # whose counters make a point's deltas: every replica, summed
    disaggregated: bool  # prefill and decode apart (P/D): the sampled server is the decode one
    front: str | None  # the router or proxy the client talks to; None when it talks to an engine
    front_url: str  # where the client sends
    profiler: Profiler | None  # how to trace the engine servers (``profile``), when asked


class ServerGroup:
    """The running servers of a trial (one, or prefill + decode + proxy), front last."""

    def __init__(
        self,
        launches: list[ServerLaunch],
        servers: list[ServerProcess | ExternalServer],
        profiler: Profiler | None = None,
    ) -> None:
        self.launches, self.servers = launches, servers
        self.profiler = profiler  # how to trace the engine servers (``profile``), when asked

    def view(self) -> GroupView:
        """The group as a point's measurement sees it. Engines: the servers that run the model
        (replicas, prefill and decode; an external server too): a router or a P/D proxy in front
        lists no real model (SGLang's router answers 'unknown') and tokenizes nothing."""
        engines = [x for x in self.launches if not x.in_front]
        sampled = next((x for x in reversed(engines) if x.metrics_path), None)
        replicas = [x.metrics_url for x in engines if x.metrics_path and x.role == "replica"]
        front = self.launches[-1]
        return GroupView(
            pids=tuple(s.pid for s in self.servers if s.pid),
            urls=tuple(x.base_url for x in self.launches),
            engines=tuple((x.name, x.base_url) for x in engines),
            metrics_url=sampled.metrics_url if sampled else None,
            counter_urls=tuple(replicas or ([sampled.metrics_url] if sampled else [])),
            disaggregated=any(x.role == "prefill" for x in self.launches),
            front=front.name if front.in_front else None,
            front_url=front.base_url,
            profiler=self.profiler,
        )

    def check_alive(self) -> None:
        for s in self.servers:
            s.check_alive()

    def ready(self, cache_reset: tuple[str, str] | None) -> None:
        """Before a point: every server alive (:class:`ServerCrashedError` if not), and their
        prefix caches emptied where ``cache_reset`` says how."""
        self.check_alive()
        if cache_reset is not None:
            reset_caches(self.launches, cache_reset)


def start_waves(launches: list[ServerLaunch], gpu_ids: list[int]) -> list[list[ServerLaunch]]:
    """The launches in the groups that start together, in order: engine servers (replicas,
    prefill and decode) start at once unless they share a GPU (vLLM sizes its KV cache from the
    memory it finds free, so a second engine on the same GPU waits for the first to be up); a
    router or proxy starts after every engine before it is healthy. On the CPU each engine has
    its own cores: two replicas start in the time of one."""
    waves: list[list[ServerLaunch]] = []
    current: list[ServerLaunch] = []
    taken: set[int] = set()
    for launch in launches:
        mine = set(server_gpus(launch, gpu_ids))
        if current and (launch.in_front or current[-1].in_front or mine & taken):
            waves.append(current)
            current, taken = [], set()
        current.append(launch)
        taken |= mine
    if current:
        waves.append(current)
    return waves


def start_servers(
    stack: contextlib.ExitStack,
    adapter: EngineAdapter,
    spec: TrialSpec,
    model_path: str,
    workdir: Path,
    gpu_ids: list[int],
    log_name: Callable[[str, bool], Path],
    progress: Progress,
    planned: Callable[[list[ServerLaunch]], None] = lambda launches: None,
) -> tuple[ServerGroup, float]:
    """Start the servers of ``spec`` wave by wave (:func:`start_waves`), each wave healthy before
    the next; they are stopped when ``stack`` closes (their scratch folders removed after).
    ``log_name(server, several)`` is where each server logs. Returns the group and its start-up
    seconds: one server's own (0 for an external one), several: until all are up."""
    port = port_for(spec)
    adapters = resolve_adapters(spec.model, build=False)  # built with the model (TrialRun)
    launches = adapter.launches(
        spec, LaunchContext(model_path, port, port_picker(spec, {port}), str(workdir), adapters)
    )
    launches, profiler = with_profiler(adapter, spec, workdir, launches)
    planned(launches)  # described before anything starts: a server that never comes up is still on record
    servers: list[ServerProcess | ExternalServer] = []
    t0 = time.monotonic()
    healthy_after = 0.0
    for wave in start_waves(launches, gpu_ids):
        started = []
        for launch in wave:
            for path, content in launch.files.items():
                Path(path).write_text(content)
            for folder in launch.scratch:  # registered first: removed after the server has stopped
                stack.callback(shutil.rmtree, folder, True)
            log_path = log_name(launch.name, len(launches) > 1)
            progress(f"starting {spec.engine.name} {launch.name} on {launch.base_url}")
            server = server_for(launch, server_env(launch, gpu_ids), log_path, spec.platform.server_nice)
            stack.enter_context(server)
            started.append((launch, server))
        for launch, server in started:
            healthy_after = server.wait_healthy(launch.startup_timeout_s)
            servers.append(server)
    return ServerGroup(launches, servers, profiler), healthy_after if len(launches) == 1 else time.monotonic() - t0


def reset_caches(launches: list[ServerLaunch], how: tuple[str, str]) -> None:
    """Empty every engine server's prefix cache (a busy SGLang refuses: retried)."""
    method, path = how
    for launch in launches:
        if launch.in_front:  # a proxy or router has no cache
            continue
        for attempt in range(20):
            try:
                req = urllib.request.Request(launch.base_url + path, method=method)
                with urllib.request.urlopen(req, timeout=30):
                    break
            except urllib.error.HTTPError as exc:
                if exc.code != 400 or attempt == 19:
                    raise TrialError(f"cache reset {method} {path} on {launch.name} failed: HTTP {exc.code}") from exc
                time.sleep(0.5)
            except OSError as exc:
                raise TrialError(f"cache reset {method} {path} on {launch.name} failed: {exc}") from exc


def shared_server_spec(spec: TrialSpec) -> TrialSpec:
    """The spec a shared server is started from: with the prefix-cache reset endpoint on, so
    that each trial of the group starts on an empty cache."""
    launched = spec.engine.launched
    if launched is not None:
        return spec.model_copy(update={"engine": launched.model_copy(update={"reset_cache_between_points": True})})
    return spec


# Platform settings of the trial's own observation (how often it samples, what it prices): they do
# not change the server, so trials differing only in them share one.
OBSERVER_SETTINGS = {
    "max_concurrent_trials",
    "monitor_interval_s",
    "monitor_budget",
    "telemetry",
    "telemetry_interval_s",
    "price_per_hour",
    "slate",
}


def server_key(spec: TrialSpec) -> str | None:
    """Identity of the servers a trial starts (every argv, env, file, GPU slot, the platform),
    or None when its servers cannot be shared: trials with the same key differ only in
    workload/load settings and can run one after the other on one server start."""
    engine = spec.engine.launched
    if engine is None or engine.restart_between_points or spec.profile is not None:
        return None  # a profiled trial's servers trace into its own folder: not shared
    launches = planned_launches(shared_server_spec(spec))
    ident = {
        "servers": [[x.argv, x.env, x.files, x.gpus, x.unset_env] for x in launches],
        "model": spec.model.model_dump(mode="json"),
        "platform": spec.platform.model_dump(mode="json", exclude=OBSERVER_SETTINGS),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
