"""Sending a planned point: :class:`PointSender` keeps the plan's schedule (closed loop,
open loop, background classes) on one event loop and records every request; every worker of a
point's shares (:mod:`orchestrator.loadgen.shares`) sends its share with one.

Only a closed-loop point bounded by duration (count unknown in advance) may run out of planned
requests; further ones are then asked of ``refill`` (whoever holds the request planner: this
process, or the driver of a client process over its pipe) and counted in ``PointSender.late``.
A stream that still gets none ends before the duration and is counted in ``ended_early``: the
point then held fewer streams than asked, and is judged invalid.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest, Turn, now
from orchestrator.loadgen.plan import PointPlan
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import distribution

log = logging.getLogger(__name__)

# Connections opened before an open-loop point (closed loops open one per stream).
PREWARM_OPEN_LOOP = 32
# A send after a wait longer than this has its connections opened this long before it: a pooled
# connection idle past the server's keep-alive is not reused, and opening one at the send instant
# is send lag (5-8 ms for each burst of a trace whose bursts are 18 s apart, docs/benchmarks.md).
CONNECT_AHEAD_S = 0.5


Refill = Callable[[int], Awaitable[list[PlannedRequest]]]


class PointSender:
    """Sends one :class:`PointPlan` (or a share of one) and records what happened.

    ``refill(n)`` gives up to ``n`` further requests when a duration-bounded closed loop outruns
    its plan (counted in ``late``); it is asked for ``prefetch`` of them once only ``prefetch``
    are left (a refill over a pipe takes a round trip), else for one when none is left. Time
    streams wait for it is ``waited_s``; a stream that gets none ends early (``ended_early``).
    """

    def __init__(
        self,
        plan: PointPlan,
        endpoint: Endpoint,
        workload: WorkloadSpec,
        session: HttpSession,
        refill: Refill | None = None,
        prefetch: int = 0,
    ) -> None:
        self.plan, self.endpoint, self.workload, self.session = plan, endpoint, workload, session
        self.refill, self.prefetch = refill, prefetch
        self.records: list[RequestRecord] = []
        self.late = 0
        self.ended_early = 0
        self.waited_s = 0.0
        self.client_stats: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._foreground_done = asyncio.Event()
        self._queue: deque[PlannedRequest] = deque(plan.foreground)
        self._planned_left = len(plan.foreground)
        self._filling: asyncio.Task[None] | None = None
        self._dry = refill is None  # the refill gave nothing: no use asking again
        self._start = now()  # the point's clock (set by run)

    async def _fill(self, n: int) -> None:
        assert self.refill is not None
        try:
            batch = await self.refill(n)
        except Exception as exc:  # the stream ends early and the point says so
            log.warning("point %d: could not get more requests: %s", self.plan.index, exc)
            batch = []
        self._queue.extend(batch)
        self._dry = self._dry or not batch
        self._filling = None

    def _start_fill(self, n: int) -> asyncio.Task[None]:
        if self._filling is None:
            self._filling = asyncio.ensure_future(self._fill(n))
        return self._filling

    async def _next_foreground(self, deadline: float | None) -> PlannedRequest | None:
        """The next request of a closed loop's streams, or None: the stream ends. Time a stream
        waits for a refill is time it holds no request (``waited_s``)."""
        if self.plan.extendable and not self._dry and self.prefetch and len(self._queue) <= self.prefetch:
            self._start_fill(self.prefetch)
        while not self._queue:
            if not self.plan.extendable:
                return None  # a point of N requests: they are all sent
            if deadline is not None and now() >= deadline:
                return None  # the point is over (after waiting for a refill): not early
            if self._dry:
                self.ended_early += 1
                return None
            t = now()
            await asyncio.shield(self._start_fill(max(1, self.prefetch)))  # several streams may wait on it
            self.waited_s += now() - t
        if deadline is not None and now() >= deadline:
            return None
        self._planned_left -= 1
        if self._planned_left < 0:
            self.late += 1  # past the plan
        return self._queue.popleft()

    def _record(
        self, req: PlannedRequest, intended: float, conversation: int | None = None, turn: int = 0
    ) -> RequestRecord:
        rec = RequestRecord(
            request_id=req.request_id,
            point=self.plan.index,
            request_class=req.request_class,
            intended_send_s=intended,
            sent_s=intended,
            input_tokens_target=req.input_tokens,
            output_tokens_target=req.output_tokens,
            repeat=self.plan.repeat,
            conversation_id=conversation,
            turn=turn,
            adapter=req.model,
        )
        self.records.append(rec)
        return rec

    async def _send(self, req: PlannedRequest, intended: float) -> None:
        """One request, or a whole conversation: each later turn resends the history with the
        server's actual reply (:meth:`_follow`)."""
        await self._converse(req, req, intended, -1, 0)

    async def _converse(self, root: PlannedRequest, req: PlannedRequest, intended: float, node: int, turn: int) -> None:
        """Send ``req`` (turn ``node`` of ``root``'s conversation, -1 its first), then every turn
        that follows its reply, at once and each on its own."""
        w = self.workload
        conversation = root.request_id if root.turns else None
        reply: list[str] | None = [] if root.turns else None
        rec = self._record(req, intended, conversation, turn)
        await self.session.stream(
            self.endpoint, req, rec, w.api, w.ignore_eos, w.request_timeout_s, w.usage_per_chunk, reply
        )
        if not rec.ok or reply is None:
            return  # a failed turn ends its branch of the conversation
        history = (*req.history, ("user", req.prompt), ("assistant", "".join(reply)))
        prior = (rec.prompt_tokens or rec.input_tokens_target) + (rec.output_tokens or 0)
        after = [
            self._follow(root, k, t, history, prior, turn + 1)
            for k, t in enumerate(root.turns)
            if (k - 1 if t.parent is None else t.parent) == node
        ]
        await asyncio.gather(*after)

    async def _follow(
        self,
        root: PlannedRequest,
        k: int,
        turn: Turn,
        history: tuple[tuple[str, str], ...],
        prior: int,
        depth: int,
    ) -> None:
        """Turn ``k``: ``think_time_s`` after the reply it follows, or at its own instant
        (``at_s``) when the reply came before it; its prompt is the history plus its text."""
        if turn.at_s is not None:
            intended = max(now(), self._start + turn.at_s)
        else:
            intended = now() + root.think_time_s
        await self._wait_for(intended, 1)
        nxt = PlannedRequest(
            turn.request_id,
            root.request_class,
            turn.text,
            prior + turn.input_tokens,
            turn.output_tokens,
            history=history,
            model=root.model,  # a conversation keeps its adapter
        )
        await self._converse(root, nxt, intended, k, depth)

    async def _wait_for(self, intended: float, sends: int, stop: asyncio.Event | None = None) -> bool:
        """Sleep until ``intended``, the instant of ``sends`` sends; after a wait longer than
        :data:`CONNECT_AHEAD_S`, their connections are opened that long before it
        (:meth:`HttpSession.connect_ahead`). False when ``stop`` was set first."""
        ahead = intended - CONNECT_AHEAD_S
        for until, connect in ((ahead, True), (intended, False)):
            if until > now():
                if not await sleep_until(until, stop):
                    return False
                if connect:
                    await self.session.connect_ahead(self.endpoint, sends, intended)
        return True

    def _spawn(self, req: PlannedRequest, intended: float, slots: asyncio.Semaphore | None = None) -> None:
        task = asyncio.ensure_future(self._send(req, intended))
        if slots is not None:
            task.add_done_callback(lambda _: slots.release())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_loop(self, lags: list[float], tick_s: float = 0.005) -> None:
        """How late the event loop wakes up: a busy client shows here before anywhere else.
        Runs until cancelled, once every stream is read (an open loop's sends end first: at
        ``rate: inf`` at once, and its streams are read after)."""
        while True:
            t = now()
            await asyncio.sleep(tick_s)
            lags.append((now() - t - tick_s) * 1e3)

    async def run(self, start: float | None = None) -> list[RequestRecord]:
        """Send the plan; its clock starts at ``start`` (a ``now()`` instant shared by every
        client process of the point) or at once."""
        plan = self.plan
        with collector_paused():  # from before the start: a collection then would make it late
            if start is not None:  # the loop is up and waiting at the first instant
                await sleep_until(start)
            # how late it woke for the first instant (or came to it, when the start had passed): a
            # stall there delays the point's first sends together, and the point says so
            start_late = max(0.0, now() - start) if start is not None else 0.0
            start, cpu0 = now() if start is None else start, time.process_time()
            self._start = start
            wall0 = now()
            deadline = start + plan.duration_s if plan.duration_s is not None else None
            background = [asyncio.ensure_future(self._background(b, start)) for b in plan.background]
            lags: list[float] = []
            watcher = asyncio.ensure_future(self._watch_loop(lags))
            try:
                if plan.offsets is None:
                    await self._closed_loop(deadline)
                else:
                    await self._open_loop(start, plan.offsets)
                if self._filling is not None:  # a refill asked near the end: its answer is this point's
                    await self._filling
            finally:
                self._foreground_done.set()
                await asyncio.gather(*background, return_exceptions=True)
                while self._tasks:
                    await asyncio.gather(*list(self._tasks), return_exceptions=True)
                watcher.cancel()
        wall = max(now() - wall0, 1e-9)
        cpu = time.process_time() - cpu0
        self.client_stats = {
            M.CLIENT_CPU_UTIL: cpu / wall,
            M.CLIENT_CPU_S: cpu,
            M.CLIENT_WALL_S: wall,
            M.CLIENT_STREAMS_ENDED_EARLY: float(self.ended_early),
            M.CLIENT_REQUESTS_PAST_PLAN: float(self.late),
            # stream-seconds spent waiting for requests past the plan, over the streams' time
            M.CLIENT_STREAM_WAIT_SHARE: self.waited_s / (plan.concurrency or 1) / wall,
            M.CLIENT_START_LATE_MS: start_late * 1e3,
            **distribution("loop_lag_ms", lags),
        }
        if self.late:
            log.info("point %d: %d requests past the plan were made during the point", plan.index, self.late)
        if self.ended_early:
            log.warning(
                "point %d: %d of %s streams ran out of requests before the point's duration",
                plan.index,
                self.ended_early,
                plan.concurrency,
            )
        return sorted(self.records, key=lambda r: r.intended_send_s)

    async def _closed_loop(self, deadline: float | None) -> None:
        async def worker() -> None:
            while deadline is None or now() < deadline:
                req = await self._next_foreground(deadline)
                if req is None:
                    return
                await self._send(req, now())

        assert self.plan.concurrency is not None
        await asyncio.gather(*(worker() for _ in range(self.plan.concurrency)))

    async def _open_loop(self, start: float, offsets: list[float]) -> None:
        cap = self.plan.max_concurrency
        slots = asyncio.Semaphore(cap) if cap else None
        min_gap = self.plan.min_gap_s
        last_send = -math.inf
        for i, (offset, req) in enumerate(zip(offsets, self.plan.foreground)):
            intended = start + offset
            # the sends from this one's instant to as long after it as it is connected ahead
            sends = bisect.bisect_right(offsets, offset + CONNECT_AHEAD_S, lo=i) - i
            await self._wait_for(intended, min(sends, cap) if cap else sends)
            if slots is not None:
                await slots.acquire()
                # Waited for a slot: catch up at the rate, never in a burst above it.
                await sleep_until(last_send + min_gap)
                last_send = now()
            self._spawn(req, intended, slots)

    async def _background(self, plan: list[tuple[float, PlannedRequest]], start: float) -> None:
        offsets = [offset for offset, _ in plan]
        for i, (offset, req) in enumerate(plan):
            intended = start + offset
            sends = bisect.bisect_right(offsets, offset + CONNECT_AHEAD_S, lo=i) - i
            if not await self._wait_for(intended, sends, self._foreground_done):
                return  # foreground finished first
            self._spawn(req, intended)
        if plan and not self._foreground_done.is_set():
            log.warning(
                "point %d: background plan (%d requests, %.0f s) ran out before the foreground finished",
                self.plan.index,
                len(plan),
                plan[-1][0],
            )


def prewarm_count(plan: PointPlan) -> int:
    return plan.concurrency or plan.max_concurrency or PREWARM_OPEN_LOOP


def get_ready(runner: asyncio.Runner, session: HttpSession, endpoint: Endpoint, plan: PointPlan) -> None:
    """What a worker does before a point's clock: its connections opened (connection set-up is
    not TTFT), then this process's garbage collected and what survives frozen
    (:func:`collector_paused` keeps the collector off it while the point runs)."""
    runner.run(session.prewarm(endpoint, prewarm_count(plan)))
    gc.unfreeze()  # what an earlier point froze and a point never run left frozen
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a point is sent, then the objects frozen before it
    (:func:`get_ready`) thawed. A full collection of the trial's process (~80k objects, Hydra,
    MLflow, the tokenizer) stops every thread for 75-90 ms: the event loop woke that late once a
    point, and a trace's burst of sends caught in it was late together (send lag p95 > 10 ms,
    INVALID; docs/benchmarks.md). Reference counting still frees everything acyclic; cycles made
    during the point wait for its end."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


async def sleep_until(until: float, stop: asyncio.Event | None = None) -> bool:
    """Sleep until the instant ``until`` on the client's clock, never waking before it; False
    when ``stop`` was set first. uvloop schedules its timers in whole milliseconds from a time
    read at the start of its loop's iteration, so one sleep wakes up to ~0.5 ms early (a third
    of them did, here): the rest is waited out in sleeps of nothing, which yield to the loop."""
    while (delay := until - now()) > 0:
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                return False
    return True


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: a faster event loop means less client-side delay per chunk."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
