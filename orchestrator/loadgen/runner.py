"""The load-point runner: plans a point's requests, sends them on schedule, returns records.

Foreground classes follow the point's arrival setting (closed-loop ``concurrency`` or
Poisson ``rate``); background classes (with a ``rate`` of their own) arrive on their own
Poisson process for as long as the foreground is sending.

Two rules keep the numbers honest:

* Every random draw comes from a generator seeded by (seed, point, stream), so a point's
  requests do not depend on how earlier points went, and every variant of a sweep sees
  the same requests.
* Prompts and arrival times are made before the point's clock starts, so the client's
  own tokenizer work never delays a send or the reading of a stream. Only a closed-loop
  point bounded by duration (count unknown in advance) may run out of planned requests;
  further ones are then made on the fly and counted in ``PointSender.late``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np

from orchestrator.config.errors import LoadError
from orchestrator.config.schema import LoadPointSpec, RequestClass, WorkloadSpec
from orchestrator.loadgen.arrivals import arrival_offsets, weighted_choice
from orchestrator.loadgen.client import Endpoint, PlannedRequest, Turn, now, prewarm, stream_request, trace_config
from orchestrator.loadgen.datasets import TraceRow, load_sharegpt, load_trace
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import distribution

log = logging.getLogger(__name__)

# Background traffic is planned this far ahead when the point has no duration of its own.
BACKGROUND_HORIZON_S = 300.0
# Caps on requests planned ahead (a closed loop bounded by duration, or a background class).
MAX_PLANNED = 4096

# Connections opened before an open-loop point (closed loops open one per stream).
PREWARM_OPEN_LOOP = 32

FOREGROUND_PLAN, FOREGROUND_ARRIVALS = 0, 1  # stream ids; background class i uses 2 + i


Seed = int | tuple[int, ...]


def ramp(t: float, ramp_up_s: float) -> float:
    """Map an offset of a constant-rate schedule onto one whose rate rises linearly from 0
    to the full rate over ``ramp_up_s`` (the arrival count up to t is rate * t^2 / 2R there)."""
    if t < ramp_up_s / 2:
        return math.sqrt(2 * ramp_up_s * t)
    return t + ramp_up_s / 2


def repeat_seed(seed: Seed, repeat: int) -> Seed:
    """Repeat 0 keeps the point's own draws; later repeats get fresh requests (identical
    prompts would hit the prefix cache and measure something else)."""
    if repeat == 0:
        return seed
    return (*(seed if isinstance(seed, tuple) else (seed,)), 1000 + repeat)


def worst_client_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """The client's stats over a point's repeats: the worst value of each."""
    keys = set().union(*stats) if stats else set()
    return {k: max(s[k] for s in stats if k in s) for k in keys}


def stream_rng(seed: Seed, point: int, stream: int) -> np.random.Generator:
    """The generator of one stream of draws of one point (point -1 = warmup)."""
    base = list(seed) if isinstance(seed, tuple) else [seed]
    return np.random.default_rng([*base, point + 1, stream])


class RequestPlanner:
    """Draws request lengths and prompts for a workload, from each class's dataset."""

    def __init__(self, workload: WorkloadSpec, factory: PromptFactory) -> None:
        self.workload = workload
        self.factory = factory
        self._ids = itertools.count()
        self.foreground = [n for n, c in workload.classes.items() if c.rate is None]
        self.background = [n for n, c in workload.classes.items() if c.rate is not None]
        self._prefixes: dict[tuple[str, int], str] = {}

    @staticmethod
    def _length(n: int, ratio: float, rng: np.random.Generator) -> int:
        if ratio == 0:
            return n
        lo, hi = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
        return int(rng.integers(lo, hi + 1))

    def make(self, class_name: str, rng: np.random.Generator) -> PlannedRequest:
        c: RequestClass = self.workload.classes[class_name]
        if c.dataset == "sharegpt":
            prompt, n_in, n_out = self._sharegpt(c, rng)
        else:
            assert c.input_tokens is not None and c.output_tokens is not None
            n_in = self._length(c.input_tokens, c.range_ratio, rng)
            if c.output_tokens_choices:
                n_out = int(c.output_tokens_choices[int(rng.integers(len(c.output_tokens_choices)))])
            else:
                n_out = self._length(c.output_tokens, c.range_ratio, rng)
            if c.dataset == "vllm_random":
                prompt = self.factory.ramp_prompt(n_in, rng)
            else:
                prompt = self.factory.prompt(n_in, rng)
            if c.dataset == "shared_prefix":
                assert c.num_groups is not None and c.prefix_tokens is not None
                prompt = self._prefix(class_name, c, int(rng.integers(c.num_groups))) + prompt
                n_in += c.prefix_tokens
            if c.dataset == "multi_turn":
                assert c.turns is not None
                first = next(self._ids)
                turns = []
                for _ in range(c.turns - 1):
                    t_in = self._length(c.input_tokens, c.range_ratio, rng)
                    t_out = self._length(c.output_tokens, c.range_ratio, rng)
                    turns.append(Turn(next(self._ids), self.factory.prompt(t_in, rng), t_in, t_out))
                return PlannedRequest(first, class_name, prompt, n_in, n_out, tuple(turns), c.think_time_s)
        return PlannedRequest(next(self._ids), class_name, prompt, n_in, n_out)

    def make_sized(self, class_name: str, n_in: int, n_out: int, rng: np.random.Generator) -> PlannedRequest:
        """A random prompt of exactly ``n_in`` tokens (trace replay)."""
        return PlannedRequest(next(self._ids), class_name, self.factory.prompt(n_in, rng), n_in, n_out)

    def _prefix(self, class_name: str, c: RequestClass, group: int) -> str:
        """The fixed prefix of a group: the same text in every point, ending in a newline so
        the suffix never merges into its last token."""
        key = (class_name, group)
        if key not in self._prefixes:
            assert c.prefix_tokens is not None
            rng = np.random.default_rng([self.workload.seed, 7919, group])
            self._prefixes[key] = self.factory.prompt(max(1, c.prefix_tokens - 1), rng) + "\n"
        return self._prefixes[key]

    def _sharegpt(self, c: RequestClass, rng: np.random.Generator) -> tuple[str, int, int]:
        assert c.path is not None
        convs = load_sharegpt(c.path).conversations
        for _ in range(1000):
            conv = convs[int(rng.integers(len(convs)))]
            n_in = self.factory.count(conv.prompt)
            if 1 <= n_in <= c.max_input_tokens:
                if c.output_tokens is not None:
                    n_out = self._length(c.output_tokens, c.range_ratio, rng)
                else:
                    n_out = min(max(1, self.factory.count(conv.reply)), c.max_output_tokens)
                return conv.prompt, n_in, n_out
        raise LoadError(f"sharegpt dataset '{c.path}': no prompt of at most {c.max_input_tokens} tokens found")

    def foreground_batch(self, n: int, rng: np.random.Generator) -> list[PlannedRequest]:
        weights = [self.workload.classes[c].weight for c in self.foreground]
        return [self.make(name, rng) for name in weighted_choice(self.foreground, weights, rng, n)]


@dataclass
class PointPlan:
    """Everything one load point (one repeat) sends, drawn before its clock starts.

    Plain data: it can be split into shares and pickled to client processes
    (:meth:`split`). ``offsets`` is None for a closed loop (``concurrency`` streams).
    """

    index: int
    repeat: int
    foreground: list[PlannedRequest]
    offsets: list[float] | None
    concurrency: int | None
    max_concurrency: int | None
    min_gap_s: float
    background: list[list[tuple[float, PlannedRequest]]]
    duration_s: float | None
    extendable: bool  # a closed loop bounded by duration may make more requests on the fly

    def split(self, n: int) -> list[PointPlan]:
        """Shares for ``n`` client processes on one clock (fewer if there are fewer streams).

        Open loop: every n-th arrival of the one schedule, so together they send exactly
        the schedule. Closed loop: streams dealt round-robin, requests dealt by stream.
        A ``max_concurrency`` cap is divided, and each share keeps to its part of the rate.
        """
        if self.offsets is None:
            assert self.concurrency is not None
            n = max(1, min(n, self.concurrency))
            streams = [self.concurrency // n + (1 if i < self.concurrency % n else 0) for i in range(n)]
            fg: list[list[PlannedRequest]] = [[] for _ in range(n)]
            for j, req in enumerate(self.foreground):
                fg[(j % self.concurrency) % n].append(req)
            return [replace(self, foreground=fg[i], concurrency=streams[i],
                            background=[b[i::n] for b in self.background]) for i in range(n)]
        cap = self.max_concurrency
        n = max(1, min(n, cap)) if cap else n
        return [replace(self, foreground=self.foreground[i::n], offsets=self.offsets[i::n],
                        max_concurrency=(cap // n + (1 if i < cap % n else 0)) if cap else None,
                        min_gap_s=self.min_gap_s * n, background=[b[i::n] for b in self.background])
                for i in range(n)]


def plan_point(workload: WorkloadSpec, point: LoadPointSpec, index: int, planner: RequestPlanner, seed: Seed,
               repeat: int = 0) -> PointPlan:
    """Draw a point's requests and arrival instants from its own seeded streams."""
    num_requests, duration_s = workload.stop_of(point)
    fg_rng = stream_rng(seed, index, FOREGROUND_PLAN)
    offsets: list[float] | None = None  # None: closed loop
    if point.trace is not None:
        rows = _trace_rows(point, num_requests, duration_s)
        foreground = [planner.make_sized("trace", r.input_tokens, r.output_tokens, fg_rng) for r in rows]
        offsets = [r.timestamp_s * point.time_scale for r in rows]
    elif point.rate is not None:
        # num_requests arrivals, or every arrival before duration_s (the plan's length follows)
        offsets = arrival_offsets(point.rate, stream_rng(seed, index, FOREGROUND_ARRIVALS), num_requests,
                                  duration_s if num_requests is None else None, point.arrival, point.burstiness)
        if point.ramp_up_s:
            offsets = [ramp(t, point.ramp_up_s) for t in offsets]
        foreground = planner.foreground_batch(len(offsets), fg_rng)
    else:
        count = num_requests if num_requests is not None else min(MAX_PLANNED, 32 * (point.concurrency or 1))
        foreground = planner.foreground_batch(count, fg_rng)

    background = []
    for i, name in enumerate(planner.background):
        c = workload.classes[name]
        assert c.rate is not None
        rng = stream_rng(seed, index, 2 + i)
        horizon = duration_s if duration_s is not None else BACKGROUND_HORIZON_S
        n = min(MAX_PLANNED, math.ceil(c.rate * horizon * 1.5) + 4)
        bg_offsets = arrival_offsets(c.rate, rng, n, horizon, c.arrival, c.burstiness)[1:]  # first one after a gap
        background.append([(t, planner.make(name, rng)) for t in bg_offsets])

    cap = point.max_concurrency
    return PointPlan(
        index=index, repeat=repeat, foreground=foreground, offsets=offsets,
        concurrency=point.concurrency, max_concurrency=cap,
        min_gap_s=1.0 / point.rate if cap and point.rate else 0.0,
        background=background, duration_s=duration_s,
        extendable=point.concurrency is not None and num_requests is None,
    )


def _trace_rows(point: LoadPointSpec, num_requests: int | None, duration_s: float | None) -> list[TraceRow]:
    assert point.trace is not None
    rows = [r for r in load_trace(point.trace)
            if duration_s is None or r.timestamp_s * point.time_scale < duration_s]
    return rows[:num_requests] if num_requests is not None else rows


class PointSender:
    """Sends one :class:`PointPlan` (or a share of one) and records what happened.

    ``make_more`` makes further requests when a duration-bounded closed loop outruns its plan
    (counted in ``late``); without it (a client process has no tokenizer) the stream stops.
    """

    def __init__(self, plan: PointPlan, endpoint: Endpoint, workload: WorkloadSpec, session: aiohttp.ClientSession,
                 make_more: Callable[[], PlannedRequest] | None = None) -> None:
        self.plan, self.endpoint, self.workload, self.session = plan, endpoint, workload, session
        self.make_more = make_more
        self.records: list[RequestRecord] = []
        self.late = 0
        self.client_stats: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._foreground_done = asyncio.Event()

    def _next_foreground(self, source: Iterator[PlannedRequest]) -> PlannedRequest | None:
        req = next(source, None)
        if req is None and self.plan.extendable:
            self.late += 1  # duration-bounded closed loop outran its plan
            if self.make_more is not None:
                req = self.make_more()
        return req

    def _record(self, req: PlannedRequest, intended: float, conversation: int | None = None,
                turn: int = 0) -> RequestRecord:
        rec = RequestRecord(
            request_id=req.request_id, point=self.plan.index, request_class=req.request_class,
            intended_send_s=intended, sent_s=intended,
            input_tokens_target=req.input_tokens, output_tokens_target=req.output_tokens, repeat=self.plan.repeat,
            conversation_id=conversation, turn=turn,
        )
        self.records.append(rec)
        return rec

    async def _send(self, req: PlannedRequest, intended: float) -> None:
        """One request, or a whole conversation: each later turn resends the history with the
        server's actual reply, ``think_time_s`` after that reply ended."""
        w = self.workload
        conversation = req.request_id if req.turns else None
        reply: list[str] | None = [] if req.turns else None
        rec = self._record(req, intended, conversation)
        await stream_request(self.session, self.endpoint, req, rec, w.api, w.ignore_eos, w.request_timeout_s,
                             w.usage_per_chunk, reply)
        history = (("user", req.prompt),)
        for k, turn in enumerate(req.turns, start=1):
            if not rec.ok or reply is None:
                return  # a failed turn ends its conversation
            history += (("assistant", "".join(reply)),)
            prior = (rec.prompt_tokens or rec.input_tokens_target) + (rec.output_tokens or 0)
            nxt = PlannedRequest(turn.request_id, req.request_class, turn.text, prior + turn.input_tokens,
                                 turn.output_tokens, history=history)
            intended = now() + req.think_time_s
            if req.think_time_s:
                await asyncio.sleep(req.think_time_s)
            reply = []
            rec = self._record(nxt, intended, conversation, k)
            await stream_request(self.session, self.endpoint, nxt, rec, w.api, w.ignore_eos, w.request_timeout_s,
                                 w.usage_per_chunk, reply)
            history += (("user", turn.text),)

    def _spawn(self, req: PlannedRequest, intended: float, slots: asyncio.Semaphore | None = None) -> None:
        task = asyncio.ensure_future(self._send(req, intended))
        if slots is not None:
            task.add_done_callback(lambda _: slots.release())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_loop(self, lags: list[float], tick_s: float = 0.005) -> None:
        """How late the event loop wakes up: a busy client shows here before anywhere else."""
        while not self._foreground_done.is_set():
            t = now()
            await asyncio.sleep(tick_s)
            lags.append((now() - t - tick_s) * 1e3)

    async def run(self, start: float | None = None) -> list[RequestRecord]:
        """Send the plan; its clock starts at ``start`` (a ``now()`` instant shared by every
        client process of the point) or at once."""
        if start is not None and start > now():
            await asyncio.sleep(start - now())
        start, cpu0 = now() if start is None else start, time.process_time()
        wall0 = now()
        plan = self.plan
        deadline = start + plan.duration_s if plan.duration_s is not None else None
        background = [asyncio.ensure_future(self._background(b, start)) for b in plan.background]
        lags: list[float] = []
        watcher = asyncio.ensure_future(self._watch_loop(lags))
        try:
            if plan.offsets is None:
                await self._closed_loop(deadline)
            else:
                await self._open_loop(start, plan.offsets)
        finally:
            self._foreground_done.set()
            await asyncio.gather(*background, return_exceptions=True)
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            watcher.cancel()
        wall = max(now() - wall0, 1e-9)
        self.client_stats = {"client_cpu_util": (time.process_time() - cpu0) / wall,
                             **distribution("loop_lag_ms", lags)}
        if self.late:
            what = "made during the point" if self.make_more else "not sent (no tokenizer in a client process)"
            log.warning("point %d: plan exhausted, %d requests %s", plan.index, self.late, what)
        return sorted(self.records, key=lambda r: r.intended_send_s)

    async def _closed_loop(self, deadline: float | None) -> None:
        source = iter(self.plan.foreground)

        async def worker() -> None:
            while deadline is None or now() < deadline:
                req = self._next_foreground(source)
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
        for offset, req in zip(offsets, self.plan.foreground):
            intended = start + offset
            delay = intended - now()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is not None:
                await slots.acquire()
                # Waited for a slot: catch up at the rate, never in a burst above it.
                wait = last_send + min_gap - now()
                if wait > 0:
                    await asyncio.sleep(wait)
                last_send = now()
            self._spawn(req, intended, slots)

    async def _background(self, plan: list[tuple[float, PlannedRequest]], start: float) -> None:
        for offset, req in plan:
            intended = start + offset
            try:
                await asyncio.wait_for(self._foreground_done.wait(), timeout=max(0.0, intended - now()))
                return  # foreground finished first
            except asyncio.TimeoutError:
                pass
            self._spawn(req, intended)
        if plan and not self._foreground_done.is_set():
            log.warning("point %d: background plan (%d requests, %.0f s) ran out before the foreground finished",
                        self.plan.index, len(plan), plan[-1][0])


async def _warmup(endpoint: Endpoint, workload: WorkloadSpec, planner: RequestPlanner,
                  session: aiohttp.ClientSession, seed: Seed) -> None:
    for req in planner.foreground_batch(workload.warmup_requests, stream_rng(seed, -1, FOREGROUND_PLAN)):
        t = now()
        rec = RequestRecord(req.request_id, -1, req.request_class, t, t, req.input_tokens, req.output_tokens)
        await stream_request(session, endpoint, req, rec, workload.api, workload.ignore_eos, workload.request_timeout_s,
                             workload.usage_per_chunk)


def open_session() -> aiohttp.ClientSession:
    """The client's HTTP session: unlimited keep-alive pool, send instants stamped on the wire."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
    return aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()])


def prewarm_count(plan: PointPlan) -> int:
    return plan.concurrency or plan.max_concurrency or PREWARM_OPEN_LOOP


def run_points(
    endpoint: Endpoint,
    workload: WorkloadSpec,
    factory: PromptFactory,
    seed: Seed,
    on_point_start: Callable[[int, LoadPointSpec], None] | None = None,
    on_point_end: Callable[[int, LoadPointSpec, list[RequestRecord], dict[str, float]], Any] | None = None,
    first_index: int = 0,
    points: Iterable[LoadPointSpec] | None = None,
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
    records merge into one list. ``on_point_end`` gets the point's records and the client's
    own stats (CPU use, event-loop lag; the worst process's).
    """
    from orchestrator.loadgen.fleet import ClientFleet  # imports this module

    planner = RequestPlanner(workload, factory)
    fleet = ClientFleet(workload.client_processes, endpoint, workload) if workload.client_processes > 1 else None
    schedule = iter(workload.load_points if points is None else points)
    send = schedule.send if isinstance(schedule, Generator) else None
    out: list[RequestRecord] = []
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            session = runner.run(_open_session_async())
            try:
                runner.run(_warmup(endpoint, workload, planner, session, seed))
                point, i = next(schedule, None), first_index
                while point is not None:
                    started = (lambda i=i, point=point: on_point_start(i, point)) if on_point_start else None
                    records, stats = _run_point(runner, session, fleet, endpoint, workload, planner, seed, point, i,
                                                started)
                    out.extend(records)
                    result = on_point_end(i, point, records, stats) if on_point_end else None
                    try:
                        point, i = (send(result) if send else next(schedule)), i + 1
                    except StopIteration:
                        break
            finally:
                runner.run(session.close())
    finally:
        if fleet is not None:
            fleet.close()
    return out


def _run_point(runner: asyncio.Runner, session: aiohttp.ClientSession, fleet: Any, endpoint: Endpoint,
               workload: WorkloadSpec, planner: RequestPlanner, seed: Seed, point: LoadPointSpec, i: int,
               started: Callable[[], None] | None) -> tuple[list[RequestRecord], dict[str, float]]:
    """One load point, every repeat of it (``started`` is called once, when the first begins):
    its records and the client's worst stats."""
    records: list[RequestRecord] = []
    stats: list[dict[str, float]] = []
    for r in range(workload.repeats):
        run_seed = repeat_seed(seed, r)
        plan = plan_point(workload, point, i, planner, run_seed, r)  # before the clock
        first = started if r == 0 else None
        if fleet is not None:
            recs, st = fleet.run(plan, first)
        else:
            fg_rng = stream_rng(run_seed, i, FOREGROUND_PLAN + 100)
            sender = PointSender(plan, endpoint, workload, session,
                                 make_more=lambda: planner.foreground_batch(1, fg_rng)[0])
            runner.run(prewarm(session, endpoint, prewarm_count(plan)))
            if first:
                first()
            recs = runner.run(sender.run())
            st = sender.client_stats
        records += recs
        stats.append(st)
    return records, worst_client_stats(stats)


async def _open_session_async() -> aiohttp.ClientSession:
    return open_session()  # a session belongs to the loop it was made in


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: a faster event loop means less client-side delay per chunk."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
