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
  further ones are then made on the fly and counted in ``PointRun.late``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator

import aiohttp
import numpy as np

from orchestrator.config.errors import LoadError
from orchestrator.config.schema import LoadPointSpec, RequestClass, WorkloadSpec
from orchestrator.loadgen.arrivals import arrival_offsets, weighted_choice
from orchestrator.loadgen.client import Endpoint, PlannedRequest, now, prewarm, stream_request, trace_config
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
            n_out = self._length(c.output_tokens, c.range_ratio, rng)
            prompt = self.factory.prompt(n_in, rng)
            if c.dataset == "shared_prefix":
                assert c.num_groups is not None and c.prefix_tokens is not None
                prompt = self._prefix(class_name, c, int(rng.integers(c.num_groups))) + prompt
                n_in += c.prefix_tokens
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


class PointRun:
    """One load point against one endpoint; everything random is planned in ``__init__``."""

    def __init__(
        self,
        endpoint: Endpoint,
        workload: WorkloadSpec,
        point: LoadPointSpec,
        point_index: int,
        planner: RequestPlanner,
        session: aiohttp.ClientSession,
        seed: Seed,
        repeat: int = 0,
    ) -> None:
        self.endpoint, self.workload, self.point, self.index = endpoint, workload, point, point_index
        self.repeat = repeat
        self.planner, self.session = planner, session
        self.records: list[RequestRecord] = []
        self.late = 0
        self.client_stats: dict[str, float] = {}
        self.num_requests, self.duration_s = workload.stop_of(point)
        self._tasks: set[asyncio.Task[RequestRecord]] = set()
        self._foreground_done = asyncio.Event()
        self._fg_rng = stream_rng(seed, point_index, FOREGROUND_PLAN)
        self.foreground = self._plan_foreground(seed)
        self.background = {
            name: self._plan_background(name, stream_rng(seed, point_index, 2 + i))
            for i, name in enumerate(planner.background)
        }

    # -- planning (before the clock starts) ------------------------------------------

    def _plan_foreground(self, seed: Seed) -> list[PlannedRequest]:
        if self.point.trace is not None:
            rows = self._trace_rows()
            return [self.planner.make_sized("trace", r.input_tokens, r.output_tokens, self._fg_rng) for r in rows]
        if self.num_requests is not None:
            count = self.num_requests
        elif self.point.rate is not None:
            assert self.duration_s is not None
            count = len(self._foreground_offsets(seed, duration_s=self.duration_s))
        else:
            count = min(MAX_PLANNED, 32 * (self.point.concurrency or 1))
        return self.planner.foreground_batch(count, self._fg_rng)

    def _trace_rows(self) -> list[TraceRow]:
        assert self.point.trace is not None
        rows = [r for r in load_trace(self.point.trace)
                if self.duration_s is None or r.timestamp_s * self.point.time_scale < self.duration_s]
        return rows[: self.num_requests] if self.num_requests is not None else rows

    def _foreground_offsets(self, seed: Seed, count: int | None = None, duration_s: float | None = None) -> list[float]:
        p = self.point
        if p.trace is not None:
            return [r.timestamp_s * p.time_scale for r in self._trace_rows()]
        assert p.rate is not None
        offsets = arrival_offsets(p.rate, stream_rng(seed, self.index, FOREGROUND_ARRIVALS), count, duration_s,
                                  p.arrival, p.burstiness)
        return [ramp(t, p.ramp_up_s) for t in offsets] if p.ramp_up_s else offsets

    def _plan_background(self, name: str, rng: np.random.Generator) -> list[tuple[float, PlannedRequest]]:
        c = self.workload.classes[name]
        assert c.rate is not None
        horizon = self.duration_s if self.duration_s is not None else BACKGROUND_HORIZON_S
        n = min(MAX_PLANNED, math.ceil(c.rate * horizon * 1.5) + 4)
        offsets = arrival_offsets(c.rate, rng, n, horizon, c.arrival, c.burstiness)[1:]  # first one after a gap
        return [(t, self.planner.make(name, rng)) for t in offsets]

    def _next_foreground(self, source: Iterator[PlannedRequest]) -> PlannedRequest | None:
        req = next(source, None)
        if req is None and self.num_requests is None and self.point.concurrency is not None:
            self.late += 1  # duration-bounded closed loop outran its plan
            req = self.planner.foreground_batch(1, self._fg_rng)[0]
        return req

    # -- sending ----------------------------------------------------------------------

    def _record(self, req: PlannedRequest, intended: float) -> RequestRecord:
        rec = RequestRecord(
            request_id=req.request_id, point=self.index, request_class=req.request_class,
            intended_send_s=intended, sent_s=intended,
            input_tokens_target=req.input_tokens, output_tokens_target=req.output_tokens, repeat=self.repeat,
        )
        self.records.append(rec)
        return rec

    async def _send(self, req: PlannedRequest, intended: float) -> RequestRecord:
        rec = self._record(req, intended)
        w = self.workload
        return await stream_request(self.session, self.endpoint, req, rec, w.api, w.ignore_eos, w.request_timeout_s,
                                    w.usage_per_chunk)

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

    async def run(self, seed: Seed) -> list[RequestRecord]:
        start, cpu0 = now(), time.process_time()
        deadline = start + self.duration_s if self.duration_s is not None else None
        background = [asyncio.ensure_future(self._background(plan, start)) for plan in self.background.values()]
        lags: list[float] = []
        watcher = asyncio.ensure_future(self._watch_loop(lags))
        try:
            if self.point.concurrency is not None:
                await self._closed_loop(deadline)
            else:
                await self._open_loop(start, seed)
        finally:
            self._foreground_done.set()
            await asyncio.gather(*background, return_exceptions=True)
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            watcher.cancel()
        wall = max(now() - start, 1e-9)
        self.client_stats = {"client_cpu_util": (time.process_time() - cpu0) / wall,
                             **distribution("loop_lag_ms", lags)}
        if self.late:
            log.warning("point %d: %d requests were made during the point (plan exhausted)", self.index, self.late)
        return sorted(self.records, key=lambda r: r.intended_send_s)

    async def _closed_loop(self, deadline: float | None) -> None:
        source = iter(self.foreground)

        async def worker() -> None:
            while deadline is None or now() < deadline:
                req = self._next_foreground(source)
                if req is None:
                    return
                await self._send(req, now())

        assert self.point.concurrency is not None
        await asyncio.gather(*(worker() for _ in range(self.point.concurrency)))

    async def _open_loop(self, start: float, seed: Seed) -> None:
        offsets = self._foreground_offsets(seed, count=len(self.foreground))
        cap = self.point.max_concurrency
        slots = asyncio.Semaphore(cap) if cap else None
        min_gap = 1.0 / self.point.rate if cap and self.point.rate else 0.0
        last_send = -math.inf
        for offset, req in zip(offsets, self.foreground):
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
                        self.index, len(plan), plan[-1][0])


async def _warmup(endpoint: Endpoint, workload: WorkloadSpec, planner: RequestPlanner,
                  session: aiohttp.ClientSession, seed: Seed) -> None:
    for req in planner.foreground_batch(workload.warmup_requests, stream_rng(seed, -1, FOREGROUND_PLAN)):
        t = now()
        rec = RequestRecord(req.request_id, -1, req.request_class, t, t, req.input_tokens, req.output_tokens)
        await stream_request(session, endpoint, req, rec, workload.api, workload.ignore_eos, workload.request_timeout_s,
                             workload.usage_per_chunk)


def run_points(
    endpoint: Endpoint,
    workload: WorkloadSpec,
    factory: PromptFactory,
    seed: Seed,
    on_point_start: Callable[[int, LoadPointSpec], None] | None = None,
    on_point_end: Callable[[int, LoadPointSpec, list[RequestRecord], dict[str, float]], bool] | None = None,
) -> list[RequestRecord]:
    """Warm up, then run every load point in order; returns all records (``point`` = index).

    ``on_point_end`` gets the point's records and the client's own stats (CPU use, event-loop
    lag); it may return False to stop after that point (e.g. the server died).
    """
    planner = RequestPlanner(workload, factory)

    async def main() -> list[RequestRecord]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
        out: list[RequestRecord] = []
        async with aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()]) as session:
            await _warmup(endpoint, workload, planner, session, seed)
            for i, point in enumerate(workload.load_points):
                records: list[RequestRecord] = []
                stats: list[dict[str, float]] = []
                for r in range(workload.repeats):
                    run_seed = repeat_seed(seed, r)
                    run = PointRun(endpoint, workload, point, i, planner, session, run_seed, r)  # plans first
                    await prewarm(session, endpoint, point.concurrency or point.max_concurrency or PREWARM_OPEN_LOOP)
                    if on_point_start and r == 0:
                        on_point_start(i, point)
                    records += await run.run(run_seed)
                    stats.append(run.client_stats)
                out.extend(records)
                if on_point_end and on_point_end(i, point, records, worst_client_stats(stats)) is False:
                    break
        return out

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: a faster event loop means less client-side delay per chunk."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
