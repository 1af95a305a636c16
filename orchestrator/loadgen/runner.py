"""The load-point runner: warms up, then for each load point plans its requests
(:mod:`~orchestrator.loadgen.plan`), sends them on schedule (:mod:`~orchestrator.loadgen.sender`,
or over several client processes: :mod:`~orchestrator.loadgen.fleet`) and returns the records.
Points are fed forward: a generator of points is sent each point's result."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Generator, Iterable
from typing import Any

import aiohttp
import numpy as np

from orchestrator.config.schema import LoadPointSpec, WorkloadSpec
from orchestrator.loadgen.client import Endpoint, PlannedRequest, now, prewarm, stream_request
from orchestrator.loadgen.fleet import ClientFleet
from orchestrator.loadgen.plan import FOREGROUND_PLAN, RequestPlanner, Seed, plan_point, repeat_seed, stream_rng
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.sender import (
    PointSender,
    loop_factory,
    open_session_async,
    prewarm_count,
    worst_client_stats,
)
from orchestrator.metrics.records import RequestRecord


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
    planner = RequestPlanner(workload, factory)
    fleet = ClientFleet(workload.client_processes, endpoint, workload) if workload.client_processes > 1 else None
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
                        runner, session, fleet, endpoint, workload, planner, seed, point, i, started
                    )
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


def _run_point(
    runner: asyncio.Runner,
    session: aiohttp.ClientSession,
    fleet: ClientFleet | None,
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
        if fleet is not None:
            recs, st = fleet.run(plan, first)
        else:
            fg_rng = stream_rng(run_seed, i, FOREGROUND_PLAN + 100)
            sender = PointSender(plan, endpoint, workload, session, make_more=_more(planner, fg_rng))
            runner.run(prewarm(session, endpoint, prewarm_count(plan)))
            if first:
                first()
            recs = runner.run(sender.run())
            st = sender.client_stats
        records += recs
        stats.append(st)
    return records, worst_client_stats(stats)


def _more(planner: RequestPlanner, rng: np.random.Generator) -> Callable[[], PlannedRequest]:
    """Makes one more foreground request when a duration-bounded closed loop outruns its plan."""
    return lambda: planner.foreground_batch(1, rng)[0]
