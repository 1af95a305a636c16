"""A point's client shares: who sends which part of one load point, all on one start instant.

One Python process reads a few hundred concurrent streams before its own event loop becomes the
bottleneck, and one node's cores a few thousand. A point's plan is therefore split into shares
(:meth:`PointPlan.split`: the same schedule, dealt out), and each share is sent by one worker of
a :class:`ShareRunner`:

* :class:`InProcessShare`: this process, on the trial's event loop (one share);
* :class:`~orchestrator.loadgen.fleet.ClientFleet`: client processes on this node (one share each);
* :class:`~orchestrator.loadgen.shards.RemoteShards`: client actors on other Ray nodes (one each).

Every runner is driven the same way by :class:`~orchestrator.loadgen.session.LoadSession`:
``prepare`` (shares handed out, connections opened: before the clock), ``start`` at the shared
instant, ``finish`` (wait: a :class:`ShareDone` per worker, its records on the trial's clock, its
stats, its node and that node's clock offset), ``close``. A worker on another node is an
ordinary worker whose clock has an offset; the runners differ only in the channel that carries
the messages (a call on this event loop, a pipe to a process, a Ray actor).

Requests past the plan (a closed loop bounded by duration that outruns it) come from one place,
the trial's request planner (a :data:`MakeMore`, given at ``prepare``), asked through
:func:`answer_more` whichever channel carried the ask (a worker thread here, the processes' pipes,
a pool actor for other nodes). The workers' stats merge in one place, :func:`merge_shares`, and a
point's shares in :func:`merge_done`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest
from orchestrator.loadgen.plan import PointPlan
from orchestrator.loadgen.sender import PointSender, Refill, get_ready
from orchestrator.metrics.records import RequestRecord

MakeMore = Callable[[int], list[PlannedRequest]]
"""``make(n)``: ``n`` more foreground requests from the trial's planner (thread-safe)."""

Stats = dict[str, float]
log = logging.getLogger(__name__)


def answer_more(make: MakeMore | None, n: int, point: int) -> list[PlannedRequest]:
    """A worker's ask for ``n`` requests past the plan of point ``point``, answered by the one
    planner. Nothing (no planner, or it failed) ends the worker's streams early, and the point
    says so (``client_streams_ended_early``)."""
    if make is None:
        return []
    try:
        return make(n)
    except Exception as exc:
        log.warning("point %d: could not make more requests: %s", point, exc)
        return []


@dataclass
class ShareDone:
    """One worker's share of a point, sent: its records (on the trial's clock) and stats, and
    where it ran: ``node`` None is the trial's node, else another node whose clock is ``clock``
    (offset, uncertainty; s) from the trial's; ``in_driver``: sent by the trial's own process."""

    records: list[RequestRecord]
    stats: Stats
    node: str | None = None
    clock: tuple[float, float] = (0.0, 0.0)
    in_driver: bool = False


# Client stats that add up over the shares of one point (the others: the worst share's value).
SUMMED_STATS = (M.CLIENT_CPU_S, M.CLIENT_STREAMS_ENDED_EARLY, M.CLIENT_REQUESTS_PAST_PLAN)


def worst_client_stats(stats: list[Stats]) -> Stats:
    """The client's stats over a point's repeats: the worst value of each."""
    keys = set().union(*stats) if stats else set()
    return {k: max(s[k] for s in stats if k in s) for k in keys}


def merge_shares(stats: list[Stats]) -> Stats:
    """The client's stats over the shares of one point sent at once (client processes, nodes):
    the worst value of each, the sums of ``SUMMED_STATS``, and the processes that sent them (a
    share that does not say is one)."""
    merged = worst_client_stats(stats)
    for key in SUMMED_STATS:
        merged[key] = sum(s.get(key, 0.0) for s in stats)
    merged[M.CLIENT_PROCESSES] = sum(s.get(M.CLIENT_PROCESSES, 1.0) for s in stats)
    return merged


def clock_stats(nodes: int, offsets_s: list[float], uncertainties_s: list[float]) -> Stats:
    """The clocks of a point's client nodes (:class:`~orchestrator.loadgen.shards.RemoteShards`):
    how many, the largest offset from the trial's clock and the largest uncertainty of one."""
    return {
        M.CLIENT_NODES: float(nodes),
        M.CLIENT_CLOCK_OFFSET_MS_MAX: max(abs(x) for x in offsets_s) * 1e3,
        M.CLIENT_CLOCK_UNCERTAINTY_MS_MAX: max(uncertainties_s) * 1e3,
    }


class ShareRunner(Protocol):
    """Sends shares of a point's plan, one per worker, from one start instant."""

    lead_s: float  # between choosing the start instant and the instant: time for "go" to reach every worker

    def prepare(self, shares: list[PointPlan], more: MakeMore | None) -> None:
        """Hand out ``shares`` (at most one per worker) and open their connections; ``more``:
        where requests past the plan come from (None: nowhere, streams end with the plan)."""
        ...

    def start(self, at: float) -> None:
        """Start the prepared shares at ``at`` (a ``now()`` instant on the trial's clock); does not
        wait for them where the workers are elsewhere."""
        ...

    def finish(self) -> list[ShareDone]:
        """Wait for the shares: each worker's :class:`ShareDone`."""
        ...

    def driver_cpu_s(self, t0: float, t1: float) -> float:
        """CPU seconds the runner's helpers spent in the trial's own process between two
        instants, not sending (a thread topping up a pool): taken off the CPU of a share the
        trial's process sent over that time."""
        ...

    def close(self) -> None: ...


def merge_done(done: list[ShareDone]) -> tuple[list[RequestRecord], Stats]:
    """Shares of one node: their records (by intended send instant when several) and their stats
    merged (:func:`merge_shares`)."""
    records = [r for d in done for r in d.records]
    if len(done) > 1:
        records.sort(key=lambda r: r.intended_send_s)
    return records, merge_shares([d.stats for d in done])


def thread_refill(make: MakeMore) -> Refill:
    """``make`` in a worker thread: a prompt of 2,000 tokens takes ~3 ms to draw, which on the
    event loop would stall every stream (asked ahead of need: see ``PointSender.prefetch``)."""

    async def refill(n: int) -> list[PlannedRequest]:
        return await asyncio.to_thread(make, n)

    return refill


class InProcessShare:
    """One share sent by this process, on the trial's event loop (``runner``): the sender runs in
    :meth:`finish`, so it is started last and finished first. Its start instant is ``lead_s``
    after it is chosen, so the event loop is running and waiting when the first sends are due
    (as every later instant finds it), not starting up then."""

    lead_s = 0.02

    def __init__(self, runner: asyncio.Runner, http: HttpSession, endpoint: Endpoint, workload: WorkloadSpec) -> None:
        self.runner, self.http, self.endpoint, self.workload = runner, http, endpoint, workload
        self._sender: PointSender | None = None
        self._at: float | None = None

    def prepare(self, shares: list[PointPlan], more: MakeMore | None) -> None:
        (plan,) = shares
        refill = thread_refill(lambda n: answer_more(more, n, plan.index)) if more is not None else None
        self._sender = PointSender(
            plan, self.endpoint, self.workload, self.http, refill, prefetch=2 * (plan.concurrency or 0)
        )
        get_ready(self.runner, self.http, self.endpoint, plan)

    def start(self, at: float) -> None:
        self._at = at

    def finish(self) -> list[ShareDone]:
        sender, self._sender = self._sender, None
        assert sender is not None, "finish() without prepare()"
        records = self.runner.run(sender.run(self._at))
        return [ShareDone(records, {**sender.client_stats, M.CLIENT_PROCESSES: 1.0}, in_driver=True)]

    def driver_cpu_s(self, t0: float, t1: float) -> float:
        return 0.0  # its sender is the share itself

    def close(self) -> None:
        self._sender = None
