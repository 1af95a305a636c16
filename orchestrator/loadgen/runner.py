"""The load-point runner: warms up, then for each load point plans its requests
(:mod:`~orchestrator.loadgen.plan`), sends them on schedule (:mod:`~orchestrator.loadgen.sender`,
or over several client processes: :mod:`~orchestrator.loadgen.fleet`) and returns the records.
Points are fed forward: a generator of points is sent each point's result."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any

import aiohttp
import numpy as np

from orchestrator.config.errors import LoadError
from orchestrator.config.schema import LoadPointSpec, WorkloadSpec
from orchestrator.loadgen.client import Endpoint, PlannedRequest, close_session, now, prewarm, stream_request
from orchestrator.loadgen.fleet import ClientFleet, MakeMore
from orchestrator.loadgen.plan import (
    FOREGROUND_PLAN,
    PointPlan,
    RequestPlanner,
    Seed,
    plan_point,
    repeat_seed,
    stream_rng,
)
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.sender import (
    PointSender,
    Refill,
    loop_factory,
    merge_shares,
    open_session_async,
    prewarm_count,
    worst_client_stats,
)
from orchestrator.loadgen.shards import START_LEAD_S as SHARD_START_LEAD_S
from orchestrator.loadgen.shards import RemoteShards, other_nodes_reaching
from orchestrator.loadgen.sizing import ClientGauge, ClientSizing, size_clients
from orchestrator.metrics.records import RequestRecord

log = logging.getLogger(__name__)


async def _warmup(
    endpoint: Endpoint, workload: WorkloadSpec, planner: RequestPlanner, session: aiohttp.ClientSession, seed: Seed
) -> None:
    for req in planner.foreground_batch(workload.warmup_requests, stream_rng(seed, -1, FOREGROUND_PLAN)):
        t = now()
        rec = RequestRecord(req.request_id, -1, req.request_class, t, t, req.input_tokens, req.output_tokens)
        await stream_request(
            session,
            endpoint,
            req,
            rec,
            workload.api,
            workload.ignore_eos,
            workload.request_timeout_s,
            workload.usage_per_chunk,
        )


def run_points(
    endpoint: Endpoint,
    workload: WorkloadSpec,
    factory: PromptFactory,
    seed: Seed,
    on_point_start: Callable[[int, LoadPointSpec], None] | None = None,
    on_point_end: Callable[[int, LoadPointSpec, list[RequestRecord], dict[str, float]], Any] | None = None,
    first_index: int = 0,
    points: Iterable[LoadPointSpec] | None = None,
    client_cores: int = 1,
) -> list[RequestRecord]:
    """Warm up, then run every load point in order; returns all records (``point`` = index).

    ``points`` replaces ``workload.load_points``. Points are fed forward: when ``points`` is a
    generator, it is sent what ``on_point_end`` returned for the point it last yielded (the
    point's result), so it can choose the next point from it (an SLO capacity search's probes)
    or stop (a server that died); it ends the run by returning.

    ``first_index`` numbers the points from there (a trial that restarts its server between
    points runs them one call at a time; each point keeps its own seeded draws).

    With ``workload.client_processes`` > 1 each point's plan is split over that many client
    processes (:mod:`orchestrator.loadgen.fleet`) that share one start instant; their
    records merge into one list. With ``auto`` each point gets the processes its planned chunk
    rate needs at the client's measured cost per chunk, up to ``client_cores``
    (:mod:`orchestrator.loadgen.sizing`). ``on_point_end`` gets the point's records and the
    client's own stats (CPU use, event-loop lag: the worst process's; processes and why).
    """
    planner = RequestPlanner(workload, factory)
    clients = Clients(endpoint, workload, client_cores)
    schedule = iter(workload.load_points if points is None else points)
    send = schedule.send if isinstance(schedule, Generator) else None
    out: list[RequestRecord] = []
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            session = runner.run(open_session_async())
            try:
                runner.run(_warmup(endpoint, workload, planner, session, seed))
                point, i = next(schedule, None), first_index
                while point is not None:
                    started = functools.partial(on_point_start, i, point) if on_point_start else None
                    records, stats = _run_point(
                        runner, session, clients, endpoint, workload, planner, seed, point, i, started
                    )
                    out.extend(records)
                    result = on_point_end(i, point, records, stats) if on_point_end else None
                    try:
                        point, i = (send(result) if send else next(schedule)), i + 1
                    except StopIteration:
                        break
            finally:
                runner.run(close_session(session))
    finally:
        clients.close()
    return out


class Clients:
    """The client processes of a trial's run: none besides this one, a fixed fleet
    (``client_processes: N``), or as many as each point needs (``auto``), started when first
    needed and kept for the points after."""

    def __init__(self, endpoint: Endpoint, workload: WorkloadSpec, cores: int) -> None:
        self.endpoint, self.workload, self.cores = endpoint, workload, max(1, cores)
        self.auto = workload.client_processes == "auto"
        self.gauge = ClientGauge()
        self.fleet: ClientFleet | None = None
        self.remote: RemoteShards | None = None
        nodes = workload.client_nodes
        if nodes != "auto" and nodes > 1:
            self.remote = RemoteShards(nodes - 1, endpoint, workload, self.cores)
        self.spread_checked = nodes != "auto"

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

    def learn(self, plan: PointPlan, records: list[RequestRecord], stats: dict[str, float]) -> None:
        """The client's own cost per chunk (CPU seconds over token chunks read) into its stats,
        and into what sizes the next points."""
        chunks = sum(len(r.chunk_times_s) for r in records)
        cpu = stats.get("client_cpu_s")
        if cpu is not None and chunks:
            stats["client_cpu_us_per_chunk"] = cpu / chunks * 1e6
            streams = plan.concurrency if plan.offsets is None else None
            self.gauge.learn(cpu, chunks, streams, stats.get("client_wall_s", 0.0))

    def close(self) -> None:
        try:
            if self.fleet is not None:
                self.fleet.close()
        finally:
            if self.remote is not None:
                self.remote.close()


def _run_point(
    runner: asyncio.Runner,
    session: aiohttp.ClientSession,
    clients: Clients,
    endpoint: Endpoint,
    workload: WorkloadSpec,
    planner: RequestPlanner,
    seed: Seed,
    point: LoadPointSpec,
    i: int,
    started: Callable[[], None] | None,
) -> tuple[list[RequestRecord], dict[str, float]]:
    """One load point, every repeat of it (``started`` is called once, when the first begins):
    its records and the client's worst stats."""
    records: list[RequestRecord] = []
    stats: list[dict[str, float]] = []
    for r in range(workload.repeats):
        run_seed = repeat_seed(seed, r)
        plan = plan_point(workload, point, i, planner, run_seed, r)  # before the clock
        first = started if r == 0 else None
        # requests past the plan (a duration-bounded closed loop), made here for every process
        make = _maker(planner, stream_rng(run_seed, i, FOREGROUND_PLAN + 100))
        clients.spread(plan)
        if clients.remote is not None:
            recs, st = _run_on_nodes(runner, session, clients, clients.remote, endpoint, workload, plan, first, make)
            records += recs
            stats.append(st)
            continue
        n, sizing = clients.size(plan)
        if sizing is not None:
            log.info("point %d: %s", i, sizing.why())
        if n > 1:
            recs, st = clients.fleet_of(n).run(plan, first, n, make)
        else:
            sender = PointSender(plan, endpoint, workload, session, _refill(make), prefetch=2 * (plan.concurrency or 0))
            runner.run(prewarm(session, endpoint, prewarm_count(plan)))
            if first:
                first()
            recs = runner.run(sender.run())
            st = {**sender.client_stats, "client_processes": 1.0}
        if sizing is not None:
            st.update(sizing.metrics())
        clients.learn(plan, recs, st)
        records += recs
        stats.append(st)
    return records, worst_client_stats(stats)


def _run_on_nodes(
    runner: asyncio.Runner,
    session: aiohttp.ClientSession,
    clients: Clients,
    remote: RemoteShards,
    endpoint: Endpoint,
    workload: WorkloadSpec,
    plan: PointPlan,
    started: Callable[[], None] | None,
    make: MakeMore,
) -> tuple[list[RequestRecord], dict[str, float]]:
    """One repeat of a point split over this node and the shards on other nodes, one start
    instant on this node's clock; records merged on it (see :mod:`orchestrator.loadgen.shards`)."""
    shares = plan.split(len(remote.shards) + 1)
    local, others = shares[0], shares[1:]
    remote.prepare(others)
    n, sizing = clients.size(local)
    if sizing is not None:
        log.info("point %d, this node's share: %s", plan.index, sizing.why())
    fleet = clients.fleet_of(n) if n > 1 else None
    if fleet is not None:
        fleet.prepare(local, n)  # ready before the start instant is chosen
    else:
        runner.run(prewarm(session, endpoint, prewarm_count(local)))
    far_streams = sum(share.concurrency or 0 for share in others)
    topper = remote.topper(make, far_streams).fill() if plan.extendable else None
    if started is not None:
        started()
    with topper or contextlib.nullcontext():
        start = now() + SHARD_START_LEAD_S
        calls = remote.start(start)
        if fleet is not None:
            recs, st = fleet.go(start, make)
        else:
            sender = PointSender(
                local, endpoint, workload, session, _refill(make), prefetch=2 * (local.concurrency or 0)
            )
            recs = runner.run(sender.run(start))
            st = {**sender.client_stats, "client_processes": 1.0}
            if topper is not None:  # the topper thread's CPU is not this client's
                st["client_cpu_s"] = max(0.0, st["client_cpu_s"] - topper.cpu_between(start, now()))
                st["client_cpu_util"] = st["client_cpu_s"] / st["client_wall_s"]
        if sizing is not None:
            st.update(sizing.metrics())
        clients.learn(local, recs, st)
        far, far_stats = remote.finish(calls)
    merged = merge_shares([st, *far_stats])
    merged.update(remote.clock_stats())
    records = sorted(recs + far, key=lambda x: x.intended_send_s)
    return records, merged


def _maker(planner: RequestPlanner, rng: np.random.Generator) -> MakeMore:
    """Makes ``n`` more foreground requests when a duration-bounded closed loop outruns its plan;
    safe from several threads (the event loop's refill, the shards' topper)."""
    lock = threading.Lock()

    def make(n: int) -> list[PlannedRequest]:
        with lock:
            return planner.foreground_batch(n, rng)

    return make


def _refill(make: MakeMore) -> Refill:
    """``make`` in a worker thread: a prompt of 2,000 tokens takes ~3 ms to draw, which on the
    event loop would stall every stream (asked ahead of need: see ``PointSender.prefetch``)."""

    async def refill(n: int) -> list[PlannedRequest]:
        return await asyncio.to_thread(make, n)

    return refill
