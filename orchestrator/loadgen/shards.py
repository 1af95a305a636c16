"""Client shards on other Ray nodes (``workload.client_nodes``): one point's schedule sent from
several machines on one start instant, its records merged onto the trial's clock.

When one node's cores cannot read the streams a point asks for, its plan is split by node
(:meth:`PointPlan.split`): the trial's own node sends one share (in this process or its local
client processes), and a :class:`ShardActor` on each other node sends one. Each machine has
its own monotonic clock, so:

1. a :class:`ClockActor` on the trial's node answers ``now()`` on the trial's clock;
2. each shard measures its clock's offset to it by round trips (the sample with the shortest
   round trip; offset = trial time - the round trip's midpoint, uncertainty = half of it);
3. the trial picks the start instant on its own clock; each shard starts at that instant less
   its offset, sends its share, and stamps every time on its own clock, as one client would
   (latencies are per host: a request's TTFT is measured where it was sent);
4. the trial moves each shard's records onto its clock (+ offset) and merges them.

A duration-bounded closed loop may outrun its plan: the trial keeps a :class:`RequestPool`
actor on its node topped up with requests from its one planner (:class:`PoolTopper`, a thread
while the point runs), and each shard takes from it before its share runs out.

The offsets and their uncertainties are in the point's stats (``client_clock_offset_ms_max``,
``client_clock_uncertainty_ms_max``) and the log. The servers must be reachable from the other
nodes (an external server, or ``engine.host`` set to an address they can reach).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.config.errors import LoadError
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest
from orchestrator.loadgen.plan import PointPlan
from orchestrator.loadgen.shares import MakeMore, ShareDone, answer_more
from orchestrator.metrics.records import RequestRecord

log = logging.getLogger(__name__)

OFFSET_PROBES = 15
POOL_TICK_S = 0.05  # how often the trial tops up the shards' request pool
POOL_WAIT_S = 2.0  # how long a shard waits on an empty pool before its stream ends
POOL_CALL_TIMEOUT_S = 10.0
ACTOR_START_TIMEOUT_S = 120.0
START_LEAD_S = 0.25  # between the trial's "go" and the start instant: time for the call to reach each node


class RequestPool:
    """Requests past the plan for the shards of a duration-bounded closed loop (an async actor
    on the trial's node, filled by the trial's :class:`PoolTopper`)."""

    def __init__(self) -> None:
        self.queue: deque[PlannedRequest] = deque()
        self.taken = 0
        self.filled = asyncio.Event()

    def reset(self) -> None:
        self.queue.clear()
        self.taken = 0

    def put(self, batch: list[PlannedRequest]) -> None:
        self.queue.extend(batch)
        self.filled.set()

    def level(self) -> tuple[int, int]:
        """(requests in the pool, requests taken since the point's reset)."""
        return len(self.queue), self.taken

    async def take(self, n: int) -> list[PlannedRequest]:
        """Up to ``n`` requests; waits up to ``POOL_WAIT_S`` for a top-up when empty."""
        if not self.queue:
            self.filled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.filled.wait(), POOL_WAIT_S)
        out = [self.queue.popleft() for _ in range(min(n, len(self.queue)))]
        self.taken += len(out)
        return out


class PoolTopper:
    """Keeps ``pool`` above twice the shards' streams plus twice what they took in the last
    tick, with requests from ``make`` (the trial's planner), while a point runs (a thread of
    the trial's process: its CPU, ``cpu_s``, is not the local client's)."""

    def __init__(self, pool: Any, make: MakeMore, streams: int, point: int) -> None:
        self.pool, self.make, self.streams, self.point = pool, make, streams, point
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-pool", daemon=True)
        self._cpu: list[tuple[float, float]] = [(time.perf_counter(), 0.0)]  # (instant, thread CPU s so far)

    def fill(self) -> PoolTopper:
        """Empty the pool of an earlier point and fill it: before the point's clock starts."""
        import ray

        ray.get(self.pool.reset.remote(), timeout=POOL_CALL_TIMEOUT_S)
        ray.get(self.pool.put.remote(answer_more(self.make, 2 * self.streams, self.point)), timeout=POOL_CALL_TIMEOUT_S)
        return self

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()  # its calls time out: the next point's planning must not race it

    def _run(self) -> None:
        import ray

        cpu0 = time.thread_time()
        taken_before = 0
        try:
            while not self._stop.wait(POOL_TICK_S):
                level, taken = ray.get(self.pool.level.remote(), timeout=POOL_CALL_TIMEOUT_S)
                want = 2 * self.streams + 2 * (taken - taken_before)
                taken_before = taken
                if level < want and not self._stop.is_set():
                    batch = answer_more(self.make, want - level, self.point)
                    if not batch:
                        return  # the planner could not make more (said): the shards' streams end early
                    ray.get(self.pool.put.remote(batch), timeout=POOL_CALL_TIMEOUT_S)
                self._cpu.append((time.perf_counter(), time.thread_time() - cpu0))
        except Exception as exc:  # the shards' streams then wait or end early, and the point says so
            log.warning("client shards: topping up their requests failed: %s", exc)

    def cpu_between(self, t0: float, t1: float) -> float:
        """The thread's CPU seconds between two instants (``now()``), to a tick."""

        def at(t: float) -> float:
            return max((cpu for when, cpu in list(self._cpu) if when <= t), default=0.0)

        return at(t1) - at(t0)


class ClockActor:
    """Answers the time on its node's monotonic clock (placed on the trial's node)."""

    def now(self) -> float:
        return time.perf_counter()


def measure_offset(clock: Any, probes: int = OFFSET_PROBES) -> tuple[float, float]:
    """(offset, uncertainty) in seconds of ``clock``'s node against this process's clock:
    the other clock's time = this clock's time + offset, within +- uncertainty."""
    import ray

    best: tuple[float, float] | None = None
    for _ in range(probes):
        t0 = time.perf_counter()
        remote = ray.get(clock.now.remote())
        t1 = time.perf_counter()
        sample = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None
    return best


class ShardActor:
    """One node's client: an HTTP session kept for the trial, a share of each point sent on the
    trial's start instant (converted to this node's clock), records on this node's clock."""

    def __init__(self, endpoint: Endpoint, workload: WorkloadSpec, clock: Any) -> None:
        from orchestrator.loadgen.sender import loop_factory

        self.endpoint, self.workload = endpoint, workload
        self.runner = asyncio.Runner(loop_factory=loop_factory())
        self.http = self.runner.run(HttpSession.open())
        self.offset, self.uncertainty = measure_offset(clock)
        self.plan: PointPlan | None = None
        self.pool: Any = None

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "offset_s": self.offset,
            "uncertainty_s": self.uncertainty,
        }

    def prepare(self, plan: PointPlan, clock: Any, pool: Any = None) -> tuple[float, float]:
        """Open the share's connections before the start instant, and measure the clock's
        offset again (clocks of separate machines drift apart): returns it. ``pool``: where
        requests past the plan come from."""
        from orchestrator.loadgen.sender import get_ready

        self.plan, self.pool = plan, pool
        get_ready(self.runner, self.http, self.endpoint, plan)
        self.offset, self.uncertainty = measure_offset(clock)
        return self.offset, self.uncertainty

    def run(self, start_on_trial_clock: float) -> tuple[list[RequestRecord], dict[str, float]]:
        from orchestrator.loadgen.sender import PointSender

        plan, self.plan = self.plan, None  # never sent twice, whatever happens
        if plan is None:
            raise LoadError("client shard: run without a prepared share")
        pool = self.pool

        async def refill(n: int) -> list[PlannedRequest]:
            batch: list[PlannedRequest] = await pool.take.remote(n)
            return batch

        sender = PointSender(
            plan,
            self.endpoint,
            self.workload,
            self.http,
            refill if pool is not None else None,
            prefetch=2 * (plan.concurrency or 0),
        )
        records = self.runner.run(sender.run(start_on_trial_clock - self.offset))
        return records, sender.client_stats

    def close(self) -> None:
        self.runner.run(self.http.close())
        self.runner.close()


def other_nodes_reaching(endpoint: Endpoint) -> int:
    """Alive Ray nodes besides this one that can reach ``endpoint`` (0 outside Ray): all of
    them, unless the endpoint is on loopback and they are other machines."""
    try:
        import ray

        if not ray.is_initialized():
            return 0
        here = ray.get_runtime_context().get_node_id()
        nodes = [x for x in ray.nodes() if x.get("Alive")]
    except Exception:  # no cluster to ask: this node only
        return 0
    ips = {x["NodeID"]: x.get("NodeManagerAddress") for x in nodes}
    loopback = urlsplit(endpoint.base_url).hostname in ("127.0.0.1", "localhost", "::1")
    return sum(1 for n, ip in ips.items() if n != here and (not loopback or ip == ips.get(here)))


def reachable(endpoint: Endpoint, here_ip: str | None, there_ip: str | None) -> Endpoint:
    """The endpoint as another node reaches it: a loopback address becomes this node's address
    when the other node is another machine (the server must listen there: ``engine.host``)."""
    url = urlsplit(endpoint.base_url)
    if here_ip and there_ip and here_ip != there_ip and url.hostname in ("127.0.0.1", "localhost", "::1"):
        netloc = f"{here_ip}:{url.port}" if url.port else here_ip
        return replace(endpoint, base_url=urlunsplit(url._replace(netloc=netloc)))
    return endpoint


def on_trial_clock(records: list[RequestRecord], offset: float) -> list[RequestRecord]:
    """Records stamped on a shard's clock, moved onto the trial's (``+ offset``)."""
    for r in records:
        r.intended_send_s += offset
        r.sent_s += offset
        r.chunk_times_s = [t + offset for t in r.chunk_times_s]
        if r.done_s is not None:
            r.done_s += offset
    return records


@dataclass
class Shard:
    actor: Any
    node: str
    offset: float
    uncertainty: float


class RemoteShards:
    """The trial's client shards on ``n`` other nodes of its Ray cluster (started once per
    trial, each holding ``cores`` CPUs there), each sending one share of a point (a
    :class:`~orchestrator.loadgen.shares.ShareRunner`: :meth:`start` does not wait, so the
    trial's own node sends its share between :meth:`start` and :meth:`finish`)."""

    lead_s = START_LEAD_S

    def __init__(self, n: int, endpoint: Endpoint, workload: WorkloadSpec, cores: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        others = [x["NodeID"] for x in ray.nodes() if x.get("Alive") and x["NodeID"] != here]
        if len(others) < n:
            raise LoadError(f"workload.client_nodes: {n + 1} nodes asked, the Ray cluster has {len(others) + 1} alive")
        on_here = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        clock_cls: Any = ray.remote(num_cpus=0)(ClockActor)  # Ray's actor handles are untyped here
        self.clock: Any = clock_cls.options(scheduling_strategy=on_here).remote()
        pool_cls: Any = ray.remote(num_cpus=0)(RequestPool)
        self.pool: Any = pool_cls.options(scheduling_strategy=on_here).remote()
        shard_cls: Any = ray.remote(ShardActor)
        ips = {x["NodeID"]: x.get("NodeManagerAddress") for x in ray.nodes()}
        actors: list[Any] = [
            shard_cls.options(
                num_cpus=cores, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            ).remote(reachable(endpoint, ips.get(here), ips.get(node)), workload, self.clock)
            for node in others[:n]
        ]
        self.shards: list[Shard] = []
        self.active: list[Shard] = []
        self._topper: PoolTopper | None = None
        self._cpu_of: PoolTopper | None = None  # the last point's topper: its CPU is read after it stops
        self._calls: list[Any] = []
        try:
            for actor in actors:
                w = ray.get(actor.where.remote(), timeout=ACTOR_START_TIMEOUT_S)
                self.shards.append(Shard(actor, w["node"], w["offset_s"], w["uncertainty_s"]))
                log.info(
                    "client shard on node %s (%s): clock offset %+.3f ms +- %.3f ms",
                    w["node"][:12],
                    w["host"],
                    w["offset_s"] * 1e3,
                    w["uncertainty_s"] * 1e3,
                )
        except BaseException as exc:
            for actor in [*actors, self.clock, self.pool]:
                ray.kill(actor)
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise LoadError(
                    f"workload.client_nodes: a client shard did not start within {ACTOR_START_TIMEOUT_S:.0f} s "
                    f"(does each node have {cores} free CPUs?)"
                ) from None
            if isinstance(exc, Exception):  # the actor died starting (a missing package there, ...)
                raise LoadError(f"workload.client_nodes: a client shard could not start: {exc}") from exc
            raise

    def prepare(self, shares: list[PointPlan], more: MakeMore | None) -> None:
        """Hand the first ``len(shares)`` shards their shares (a point with fewer streams than
        nodes leaves the others idle); each measures its clock's offset again. With ``more``
        (a duration-bounded closed loop) their pool of requests past the plan is filled now and
        topped up from ``more`` while the point runs."""
        import ray

        self.active = self.shards[: len(shares)]
        measured = ray.get(
            [s.actor.prepare.remote(share, self.clock, self.pool) for s, share in zip(self.active, shares)]
        )
        for shard, (offset, uncertainty) in zip(self.active, measured):
            shard.offset, shard.uncertainty = offset, uncertainty
        streams = sum(share.concurrency or 0 for share in shares)
        topper = PoolTopper(self.pool, more, streams, shares[0].index).fill() if more is not None and shares else None
        self._topper = self._cpu_of = topper

    def start(self, at: float) -> None:
        """Send each prepared shard its start instant (the trial's clock)."""
        if self._topper is not None:
            self._topper.start()
        self._calls = [s.actor.run.remote(at) for s in self.active]

    def finish(self) -> list[ShareDone]:
        """Each shard's share, its records moved onto the trial's clock."""
        import ray

        calls, self._calls = self._calls, []
        try:
            answers = ray.get(calls)
        finally:
            self._stop_topper()
        return [
            ShareDone(on_trial_clock(recs, s.offset), st, node=s.node, clock=(s.offset, s.uncertainty))
            for s, (recs, st) in zip(self.active, answers)
        ]

    def driver_cpu_s(self, t0: float, t1: float) -> float:
        """The thread topping up the shards' pool, here (:class:`PoolTopper`)."""
        return self._cpu_of.cpu_between(t0, t1) if self._cpu_of is not None else 0.0

    def _stop_topper(self) -> None:
        topper, self._topper = self._topper, None
        if topper is not None:
            topper.stop()

    def close(self) -> None:
        """Kill the shards (their connections close with them), at once: a shard in the middle
        of a point (an interrupted trial) stops sending now."""
        import ray

        self._stop_topper()
        for s in self.shards:
            try:
                ray.kill(s.actor)
            except Exception as exc:  # already gone
                log.debug("client shard: %s", exc)
        for helper in (self.clock, self.pool):
            try:
                ray.kill(helper)
            except Exception as exc:
                log.debug("clock or pool actor: %s", exc)
