"""A trial's load generation against one endpoint: :class:`LoadSession`.

The trial drives it, point by point, and measures between the calls::

    with LoadSession(endpoint, workload, factory, seed, cores) as load:
        load.warm_up()
        for index, point in the trial's schedule:
            load.prepare(point, index)   # requests drawn, shares handed out, connections open
            ... the trial starts measuring ...
            run = load.go()              # every repeat of the point: records and client stats
            ... the trial measures the point from run ...

``prepare`` draws the point's plan (:mod:`~orchestrator.loadgen.plan`) before any clock starts
and splits it over the workers that will send it (:mod:`~orchestrator.loadgen.shares`): this
process, client processes on this node (``workload.client_processes``, or as many as the plan's
chunk rate needs with ``auto``: :mod:`~orchestrator.loadgen.sizing`) and shards on other Ray
nodes (``workload.client_nodes``). ``go`` starts them on one instant and merges what they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import ParamSpec

import numpy as np

from orchestrator.config.errors import LoadError
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import LoadPointSpec, WorkloadSpec
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest, now
from orchestrator.loadgen.fleet import ClientFleet
from orchestrator.loadgen.plan import (
    ADAPTER_DRAWS,
    FOREGROUND_PLAN,
    PointPlan,
    RequestPlanner,
    Seed,
    plan_point,
    repeat_seed,
    stream_rng,
)
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.sender import loop_factory
from orchestrator.loadgen.shards import RemoteShards, other_nodes_reaching
from orchestrator.loadgen.shares import (
    InProcessShare,
    MakeMore,
    ShareDone,
    ShareRunner,
    Stats,
    clock_stats,
    merge_done,
    merge_shares,
    worst_client_stats,
)
from orchestrator.loadgen.sizing import ClientGauge, ClientSizing, size_clients
from orchestrator.metrics.records import RequestRecord

P = ParamSpec("P")
log = logging.getLogger(__name__)


@dataclass
class PointRun:
    """What one load point (every repeat of it) gave: its records (``point`` = its index) and the
    client's own stats (CPU use, event-loop lag: the worst process's and repeat's; processes and why)."""

    records: list[RequestRecord]
    client: Stats


@dataclass
class _Prepared:
    """One repeat of a point, ready to go: its plan, this node's share and who sends what
    (started in this order and finished in the reverse: this node's runner last to start and
    first to finish, as the in-process share sends in its ``finish``)."""

    plan: PointPlan
    here: PointPlan
    runners: list[ShareRunner]
    sizing: ClientSizing | None
    across_nodes: bool  # dealt to other nodes too (whose shards may sit idle: fewer streams than nodes)


class LoadSession:
    """Load generation for one trial: an event loop and HTTP session of its own, the client
    workers (started when first needed and kept for the points after), one request planner."""

    def __init__(
        self, endpoint: Endpoint, workload: WorkloadSpec, factory: PromptFactory, seed: Seed, client_cores: int = 1
    ) -> None:
        self.endpoint, self.workload, self.seed = endpoint, workload, seed
        self.planner = RequestPlanner(workload, factory)
        self._stack = contextlib.ExitStack()
        self._point: tuple[LoadPointSpec, int] | None = None
        self._first: _Prepared | None = None
        self._loop = asyncio.Runner(loop_factory=loop_factory())
        self.clients = Clients(endpoint, workload, client_cores)

    def __enter__(self) -> LoadSession:
        stack = self._stack
        try:
            stack.callback(self.clients.close)
            stack.enter_context(self._loop)
            self.http = self._loop.run(HttpSession.open())
            stack.callback(lambda: self._loop.run(self.http.close()))
        except BaseException:
            stack.close()
            raise
        self.clients.here = InProcessShare(self._loop, self.http, self.endpoint, self.workload)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    def warm_up(self) -> None:
        """``workload.warmup_requests`` requests, one after the other, recorded nowhere."""
        w = self.workload
        # the base model only (workload.adapters is not drawn): each adapter's first request of the
        # first point is then its cold one (loaded on first use), as the multi_lora lab reads it
        self._loop.run(
            self._warm_up(self.planner.foreground_batch(w.warmup_requests, stream_rng(self.seed, -1, FOREGROUND_PLAN)))
        )

    async def _warm_up(self, batch: list[PlannedRequest]) -> None:
        w = self.workload
        for req in batch:
            t = now()
            rec = RequestRecord(req.request_id, -1, req.request_class, t, t, req.input_tokens, req.output_tokens)
            await self.http.stream(self.endpoint, req, rec, w.api, w.ignore_eos, w.request_timeout_s, w.usage_per_chunk)

    def prepare(self, point: LoadPointSpec, index: int) -> None:
        """Draw the point's first repeat and make its senders ready (before the trial's clock)."""
        self._point = (point, index)
        self._first = self._prepare(point, index, 0)

    def go(self) -> PointRun:
        """Send the prepared point, then its further repeats (``workload.repeats``), each drawn
        from its own seed."""
        if self._point is None or self._first is None:
            raise LoadError("LoadSession.go() without prepare()")
        (point, index), first = self._point, self._first
        self._point = self._first = None
        records, stats = self._go(first)
        every = [stats]
        for r in range(1, self.workload.repeats):
            more, st = self._go(self._prepare(point, index, r))
            records += more
            every.append(st)
        return PointRun(records, worst_client_stats(every))

    def _prepare(self, point: LoadPointSpec, index: int, repeat: int) -> _Prepared:
        run_seed = repeat_seed(self.seed, repeat)
        plan = plan_point(self.workload, point, index, self.planner, run_seed, repeat)
        # requests past the plan (a duration-bounded closed loop): one maker for every worker
        more = _maker(
            self.planner,
            stream_rng(run_seed, index, FOREGROUND_PLAN + 100),
            stream_rng(run_seed, index, ADAPTER_DRAWS + 100),
        )
        clients = self.clients
        clients.spread(plan)
        remote = clients.remote
        by_node = plan.split(len(remote.shards) + 1) if remote is not None else [plan]
        here = by_node[0]
        if remote is not None:
            remote.prepare(by_node[1:], more if plan.extendable else None)
        n, sizing = clients.size(here)
        if sizing is not None:
            log.info("point %d%s: %s", index, ", this node's share" if remote else "", sizing.why())
        local: ShareRunner = clients.fleet_of(n) if n > 1 else clients.local()
        local.prepare(here.split(n) if n > 1 else [here], more)
        return _Prepared(plan, here, [local] if remote is None else [remote, local], sizing, remote is not None)

    def _go(self, p: _Prepared) -> tuple[list[RequestRecord], Stats]:
        """One repeat: every runner started on one instant, then finished (in reverse) and every
        worker's share merged: this node's first (its sizing, what it learns of the client's cost),
        then the other nodes' with their clocks."""
        start = now() + max(r.lead_s for r in p.runners)
        for runner in p.runners:
            runner.start(start)
        done: list[ShareDone] = []
        window: tuple[float, float] | None = None  # while the trial's own process sent a share
        for runner in reversed(p.runners):
            shares = runner.finish()
            if any(d.in_driver for d in shares):
                window = (start, now())
            done += shares
        records, stats = merge_done([d for d in done if d.node is None])
        if window is not None:  # its CPU, less what helpers of the other runners spent in this process
            helpers = sum(r.driver_cpu_s(*window) for r in p.runners)
            stats[M.CLIENT_CPU_S] = max(0.0, stats[M.CLIENT_CPU_S] - helpers)
            stats[M.CLIENT_CPU_UTIL] = stats[M.CLIENT_CPU_S] / stats[M.CLIENT_WALL_S]
        if p.sizing is not None:
            stats.update(p.sizing.metrics())
        stats.update(p.plan.planned)
        self.clients.learn(p.here, records, stats)
        if not p.across_nodes:
            return records, stats
        far = [d for d in done if d.node is not None]
        merged = merge_shares([stats, *(d.stats for d in far)])
        offsets, uncertainties = [d.clock[0] for d in far] or [0.0], [d.clock[1] for d in far] or [0.0]
        merged.update(clock_stats(len(far) + 1, offsets, uncertainties))
        records = sorted([*records, *(r for d in far for r in d.records)], key=lambda x: x.intended_send_s)
        return records, merged


class Clients:
    """The client workers of a trial: this process, a fleet of client processes (a fixed
    ``client_processes: N``, or as many as each point needs with ``auto``), shards on other
    nodes; started when first needed and kept for the points after."""

    def __init__(self, endpoint: Endpoint, workload: WorkloadSpec, cores: int) -> None:
        self.endpoint, self.workload, self.cores = endpoint, workload, max(1, cores)
        self.auto = workload.client_processes == "auto"
        self.gauge = ClientGauge()
        self.here: InProcessShare | None = None
        self.fleet: ClientFleet | None = None
        self.remote: RemoteShards | None = None
        nodes = workload.client_nodes
        if nodes != "auto" and nodes > 1:
            self.remote = RemoteShards(nodes - 1, endpoint, workload, self.cores)
        self.spread_checked = nodes != "auto"

    def local(self) -> InProcessShare:
        assert self.here is not None, "the session is not open"
        return self.here

    def spread(self, plan: PointPlan) -> None:
        """``client_nodes: auto``: the first point that needs more client processes than this
        node's CPUs allow starts shards on as many other nodes as it needs (and the cluster has,
        and can reach the server from); later points use them too."""
        if self.spread_checked or not self.auto:
            return
        sizing = size_clients(plan, self.cores, self.gauge.chunk_cost_s, self.gauge.stream_chunks_per_s)
        if sizing.needed <= self.cores:
            return
        self.spread_checked = True
        others = other_nodes_reaching(self.endpoint)
        wanted = -(-sizing.needed // self.cores) - 1
        if others == 0:
            log.info("point %d: %s; no other Ray node can take a shard", plan.index, sizing.why())
            return
        log.info("point %d: %s: shards on %d other node(s)", plan.index, sizing.why(), min(wanted, others))
        try:
            self.remote = RemoteShards(min(wanted, others), self.endpoint, self.workload, self.cores)
        except LoadError as exc:  # auto: this node alone still measures (its validity check judges it)
            log.warning("client_nodes: auto: no shards on other nodes: %s", exc)

    def size(self, plan: PointPlan) -> tuple[int, ClientSizing | None]:
        if not self.auto:
            return int(self.workload.client_processes), None
        sizing = size_clients(plan, self.cores, self.gauge.chunk_cost_s, self.gauge.stream_chunks_per_s)
        return sizing.processes, sizing

    def fleet_of(self, n: int) -> ClientFleet:
        if self.fleet is None:
            self.fleet = ClientFleet(n, self.endpoint, self.workload)
        elif len(self.fleet.procs) < n:
            self.fleet.grow(n)
        return self.fleet

    def learn(self, plan: PointPlan, records: list[RequestRecord], stats: Stats) -> None:
        """The client's own cost per chunk (CPU seconds over token chunks read) into its stats,
        and into what sizes the next points."""
        chunks = sum(len(r.chunk_times_s) for r in records)
        cpu = stats.get(M.CLIENT_CPU_S)
        if cpu is not None and chunks:
            stats[M.CLIENT_CPU_US_PER_CHUNK] = cpu / chunks * 1e6
            streams = plan.concurrency if plan.offsets is None else None
            self.gauge.learn(cpu, chunks, streams, stats.get(M.CLIENT_WALL_S, 0.0))

    def close(self) -> None:
        try:
            if self.fleet is not None:
                self.fleet.close()
        finally:
            if self.remote is not None:
                self.remote.close()


def _maker(planner: RequestPlanner, rng: np.random.Generator, adapter_rng: np.random.Generator) -> MakeMore:
    """Makes ``n`` more foreground requests when a duration-bounded closed loop outruns its plan;
    safe from several threads (the event loop's refill, the shards' topper)."""
    lock = threading.Lock()

    def make(n: int) -> list[PlannedRequest]:
        with lock:
            return planner.with_adapters(planner.foreground_batch(n, rng), adapter_rng)

    return make


def run_each(
    endpoint: Endpoint,
    workload: WorkloadSpec,
    factory: PromptFactory,
    seed: Seed,
    points: Iterable[LoadPointSpec] | None = None,
    client_cores: int = 1,
) -> list[PointRun]:
    """Warm up, then run ``points`` (default: ``workload.load_points``) one after the other with
    nothing measured between them (tools, tests, benchmarks; a trial drives a session itself)."""
    with LoadSession(endpoint, workload, factory, seed, client_cores) as load:
        load.warm_up()
        out = []
        for i, point in enumerate(workload.load_points if points is None else points):
            load.prepare(point, i)
            out.append(load.go())
        return out


def _records_only(run: Callable[P, list[PointRun]]) -> Callable[P, list[RequestRecord]]:
    def records(*args: P.args, **kwargs: P.kwargs) -> list[RequestRecord]:
        return [r for point in run(*args, **kwargs) for r in point.records]

    return records


# run_each's arguments; its records only (every point's, ``point`` = its index)
run_points = _records_only(run_each)
