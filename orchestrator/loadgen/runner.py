"""The load-point runner: plans a point's requests, sends them on schedule, returns records.

Foreground classes follow the point's arrival setting (closed-loop ``concurrency`` or
Poisson ``rate``); background classes (with a ``rate`` of their own) arrive on their own
Poisson process for as long as the foreground is sending. Prompts are made before the
clock starts so the client's own work does not delay sends.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator

import aiohttp
import numpy as np

from orchestrator.config.schema import LoadPointSpec, RequestClass, WorkloadSpec
from orchestrator.loadgen.arrivals import poisson_offsets, weighted_choice
from orchestrator.loadgen.client import Endpoint, PlannedRequest, now, stream_request
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.metrics.records import RequestRecord

# Upper bound of requests planned ahead for duration-bounded closed-loop points.
_MAX_PLANNED = 100_000


class RequestPlanner:
    """Draws request lengths and prompts for a workload from one seeded generator."""

    def __init__(self, workload: WorkloadSpec, factory: PromptFactory, rng: np.random.Generator) -> None:
        self.workload = workload
        self.factory = factory
        self.rng = rng
        self._ids = itertools.count()
        self.foreground = [n for n, c in workload.classes.items() if c.rate is None]
        self.background = [n for n, c in workload.classes.items() if c.rate is not None]

    def _length(self, n: int, ratio: float) -> int:
        if ratio == 0:
            return n
        lo, hi = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
        return int(self.rng.integers(lo, hi + 1))

    def make(self, class_name: str) -> PlannedRequest:
        c: RequestClass = self.workload.classes[class_name]
        n_in = self._length(c.input_tokens, c.range_ratio)
        n_out = self._length(c.output_tokens, c.range_ratio)
        return PlannedRequest(next(self._ids), class_name, self.factory.prompt(n_in, self.rng), n_in, n_out)

    def foreground_batch(self, n: int) -> list[PlannedRequest]:
        weights = [self.workload.classes[c].weight for c in self.foreground]
        return [self.make(name) for name in weighted_choice(self.foreground, weights, self.rng, n)]


class PointRun:
    """One load point against one endpoint."""

    def __init__(
        self,
        endpoint: Endpoint,
        workload: WorkloadSpec,
        point: LoadPointSpec,
        point_index: int,
        planner: RequestPlanner,
        session: aiohttp.ClientSession,
    ) -> None:
        self.endpoint = endpoint
        self.workload = workload
        self.point = point
        self.index = point_index
        self.planner = planner
        self.session = session
        self.records: list[RequestRecord] = []
        self.num_requests, self.duration_s = workload.stop_of(point)
        self._tasks: set[asyncio.Task[RequestRecord]] = set()
        self._foreground_done = asyncio.Event()

    def _record(self, req: PlannedRequest, intended: float) -> RequestRecord:
        rec = RequestRecord(
            request_id=req.request_id,
            point=self.index,
            request_class=req.request_class,
            intended_send_s=intended,
            sent_s=intended,
            input_tokens_target=req.input_tokens,
            output_tokens_target=req.output_tokens,
        )
        self.records.append(rec)
        return rec

    async def _send(self, req: PlannedRequest, intended: float) -> RequestRecord:
        rec = self._record(req, intended)
        return await stream_request(
            self.session, self.endpoint, req, rec, self.workload.api, self.workload.ignore_eos,
            self.workload.request_timeout_s,
        )

    def _spawn(self, req: PlannedRequest, intended: float) -> None:
        task = asyncio.ensure_future(self._send(req, intended))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> list[RequestRecord]:
        planned = self._plan_foreground()
        start = now()
        deadline = start + self.duration_s if self.duration_s is not None else None
        background = [asyncio.ensure_future(self._background(name, start, deadline)) for name in self.planner.background]
        try:
            if self.point.concurrency is not None:
                await self._closed_loop(planned, deadline)
            else:
                await self._open_loop(planned, start, deadline)
        finally:
            self._foreground_done.set()
            await asyncio.gather(*background, return_exceptions=True)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        return sorted(self.records, key=lambda r: r.intended_send_s)

    def _plan_foreground(self) -> Iterator[PlannedRequest] | list[PlannedRequest]:
        if self.num_requests is not None:
            return self.planner.foreground_batch(self.num_requests)
        # Duration-bounded: plan lazily (count unknown in advance).
        return (self.planner.foreground_batch(1)[0] for _ in range(_MAX_PLANNED))

    async def _closed_loop(self, planned: Iterator[PlannedRequest] | list[PlannedRequest], deadline: float | None) -> None:
        source = iter(planned)
        lock = asyncio.Lock()

        async def worker() -> None:
            while True:
                async with lock:
                    if deadline is not None and now() >= deadline:
                        return
                    req = next(source, None)
                if req is None:
                    return
                await self._send(req, now())

        assert self.point.concurrency is not None
        await asyncio.gather(*(worker() for _ in range(self.point.concurrency)))

    async def _open_loop(
        self, planned: Iterator[PlannedRequest] | list[PlannedRequest], start: float, deadline: float | None
    ) -> None:
        assert self.point.rate is not None
        count = len(planned) if isinstance(planned, list) else None
        offsets = poisson_offsets(self.point.rate, self.planner.rng, count=count, duration_s=self.duration_s)
        for offset, req in zip(offsets, planned):
            intended = start + offset
            delay = intended - now()
            if delay > 0:
                await asyncio.sleep(delay)
            self._spawn(req, intended)

    async def _background(self, class_name: str, start: float, deadline: float | None) -> None:
        rate = self.workload.classes[class_name].rate
        assert rate is not None
        t = start
        while not self._foreground_done.is_set():
            t += float(self.planner.rng.exponential(1.0 / rate))
            if deadline is not None and t >= deadline:
                return
            req = self.planner.make(class_name)
            try:
                await asyncio.wait_for(self._foreground_done.wait(), timeout=max(0.0, t - now()))
                return  # foreground finished first
            except asyncio.TimeoutError:
                pass
            self._spawn(req, t)


async def _warmup(endpoint: Endpoint, workload: WorkloadSpec, planner: RequestPlanner, session: aiohttp.ClientSession) -> None:
    for req in planner.foreground_batch(workload.warmup_requests):
        rec = RequestRecord(req.request_id, -1, req.request_class, now(), now(), req.input_tokens, req.output_tokens)
        await stream_request(session, endpoint, req, rec, workload.api, workload.ignore_eos, workload.request_timeout_s)


def run_points(
    endpoint: Endpoint,
    workload: WorkloadSpec,
    factory: PromptFactory,
    seed: int,
    on_point_start: Callable[[int, LoadPointSpec], None] | None = None,
    on_point_end: Callable[[int, LoadPointSpec, list[RequestRecord]], bool] | None = None,
) -> list[RequestRecord]:
    """Warm up, then run every load point in order; returns all records (``point`` = index).

    ``on_point_end`` may return False to stop after that point (e.g. the server died).
    """
    rng = np.random.default_rng(seed)
    planner = RequestPlanner(workload, factory, rng)

    async def main() -> list[RequestRecord]:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        out: list[RequestRecord] = []
        async with aiohttp.ClientSession(connector=connector) as session:
            await _warmup(endpoint, workload, planner, session)
            for i, point in enumerate(workload.load_points):
                if on_point_start:
                    on_point_start(i, point)
                records = await PointRun(endpoint, workload, point, i, planner, session).run()
                out.extend(records)
                if on_point_end and on_point_end(i, point, records) is False:
                    break
        return out

    return asyncio.run(main())
