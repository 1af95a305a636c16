"""The trial's side of a point's diagnosis: what the pure rules of
:mod:`orchestrator.metrics.diagnosis` need from the trial (the engine's batch slots, the cores
the servers could use, the census of the machine's CPU over the point) and the words the
point's console line ends with."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

import psutil

from orchestrator.config.schema import LoadPointSpec, OpenLoop, TrialSpec
from orchestrator.engines import adapter_for
from orchestrator.engines.process import SERVER_OWNER_ENV
from orchestrator.metrics import census
from orchestrator.metrics.diagnosis import Diagnosis, PointEvidence, diagnose
from orchestrator.metrics.result import RawPoint
from orchestrator.trial.machine import is_engine

STALLS_KEPT = 200  # the worst stalls of a point kept in its result (the timeline marks them)


def machine_cores() -> float:
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return float(os.cpu_count() or 1)


def foreign_bound(spec: TrialSpec) -> float | None:
    """``workload.validity.max_foreign_cpu_cores``, with ``auto`` an eighth of the machine's cores
    (at least 0.25); None: not judged."""
    bound = spec.workload.validity.max_foreign_cpu_cores
    if bound == "auto":
        return max(0.25, machine_cores() / 8)
    return bound


def _ours(external: bool) -> Callable[[int, str], bool]:
    """Whether a process outside the trial's tree is the sweep's own: a server another trial of
    this sweep started (its owner's mark, and the sweep's driver in its environment when this
    process knows it), or, for a server we did not start, an engine process on this machine (it
    serves the trial, e.g. inside a container behind a proxy)."""
    driver = os.environ.get(census.DRIVER_ENV)

    def ours(pid: int, command: str) -> bool:
        if external and is_engine(command):
            return True
        try:
            env = psutil.Process(pid).environ()
        except psutil.Error:
            return False
        return SERVER_OWNER_ENV in env and (driver is None or env.get(census.DRIVER_ENV) == driver)

    return ours


def _local(host: str | None) -> bool:
    """Whether ``host`` is this machine (a loopback or one of its interfaces' addresses)."""
    if host is None:
        return False
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs} | {"0.0.0.0", "::"}
    return any(a in mine or a.startswith("127.") or a == "::1" for a in addresses)


def _listening(url: str) -> set[int]:
    """The local processes listening on ``url``'s port (an external server on this machine)."""
    u = urlparse(url)
    if u.port is None or not _local(u.hostname):
        return set()
    try:
        return {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == u.port and c.status == "LISTEN" and c.pid
        }
    except psutil.Error:
        return set()


class Census:
    """The machine's CPU over one point, split into the trial's, the sweep's and the rest."""

    def __init__(self, pids: Sequence[int], urls: Sequence[str]) -> None:
        self.pids, self.urls = list(pids), list(urls)  # the trial's servers: started, else found listening
        self._before: census.Snapshot | None = None

    def start(self) -> None:
        self._before = census.snapshot()

    def finish(self, seconds: float) -> dict[str, Any] | None:
        if self._before is None:
            return None
        servers = set(self.pids)
        if not servers:  # a server we did not start, perhaps on this machine: it is the trial's too
            for url in self.urls:
                servers |= _listening(url)
        trial = census.tree([os.getpid(), *servers])
        external = not self.pids
        out = census.foreign_cpu(self._before, census.snapshot(), seconds, trial, _ours(external))
        self._before = None
        return out


def point_diagnosis(
    spec: TrialSpec,
    point: LoadPointSpec,
    raw: RawPoint,
    metrics: Mapping[str, float],
    class_metrics: Mapping[str, Mapping[str, float]],
    client_reasons: Sequence[str],
    disaggregated: bool,
    server_failed: bool,
) -> Diagnosis:
    """The point's diagnosis from what the trial gathered around it (``raw``) and the stages
    measured before it (``metrics``)."""
    rate = point.load.rate if isinstance(point.load, OpenLoop) else None
    adapter = adapter_for(spec.engine.name)
    evidence = PointEvidence(
        metrics=metrics,
        class_metrics=class_metrics,
        records=raw.records,
        rows=raw.rows,
        window=raw.window,
        rate=rate,
        capped=point.max_concurrency is not None,
        slots=adapter.batch_slots(spec),
        prefix_cache=adapter.prefix_cache_on(spec),
        cores=machine_cores() if spec.platform.device == "cpu" else None,
        device=spec.platform.device,
        client_reasons=client_reasons,
        foreign=raw.foreign,
        foreign_limit=foreign_bound(spec),
        disaggregated=disaggregated,
        decode_ttft_holds_prefill=adapter.decode_ttft_holds_prefill(spec),
        server_failed=server_failed,
    )
    return diagnose(evidence)
