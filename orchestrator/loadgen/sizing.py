"""How many client processes a load point needs (``workload.client_processes: auto``).

A client process spends CPU per token chunk it reads (the event loop's wake-up, the HTTP and SSE
parsing, the record). A process kept busier than about half a core delays the chunks it reads
and its numbers start to describe itself. So, per point:

    processes = ceil(planned chunks per second x CPU seconds per chunk / PROCESS_LOAD)

capped by the cores the trial's client may use (``platform.cpus_per_trial``: the CPUs the trial
reserves in Ray, so trials packed on one node do not starve each other's clients). The chunk rate
comes from the point's plan: an open loop's arrivals times their output tokens, a closed loop's
streams times the rate one stream delivers. The rate one stream delivers and the cost per chunk
are the client's own measurements of the points before (both start from defaults measured on
this project's machines). A point whose need exceeds the cores is still run, with every core; the
client validity check then says whether it kept up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.metric_keys import M
from orchestrator.loadgen.plan import PointPlan

PROCESS_LOAD = 0.5  # cores per client process at most: its reads stay prompt
DEFAULT_CHUNK_COST_S = 30e-6  # CPU per chunk of one process (benchmarks/client_fidelity: 20-30 us here)
DEFAULT_STREAM_CHUNKS_PER_S = 100.0  # a stream at 10 ms per token (a fast GPU server) until measured


@dataclass(frozen=True)
class ClientSizing:
    """The decision for one point, and its inputs (logged and kept in the point's metrics)."""

    processes: int
    needed: int
    chunk_rate: float  # planned token chunks per second
    chunk_cost_s: float
    cores: int

    def why(self) -> str:
        load = self.chunk_rate * self.chunk_cost_s
        text = (
            f"{self.processes} client process{'es' if self.processes > 1 else ''}: "
            f"~{self.chunk_rate:,.0f} chunks/s x {self.chunk_cost_s * 1e6:.0f} us = {load:.2f} cores "
            f"at <= {PROCESS_LOAD:g} each"
        )
        if self.needed > self.processes:
            text += f"; {self.needed} needed but the client has {self.cores} core{'s' if self.cores > 1 else ''}"
        return text

    def metrics(self) -> dict[str, float]:
        return {
            M.CLIENT_PROCESSES: float(self.processes),
            M.CLIENT_PROCESSES_NEEDED: float(self.needed),
            M.CLIENT_PLANNED_CHUNK_RATE: self.chunk_rate,
            M.CLIENT_CHUNK_COST_US: self.chunk_cost_s * 1e6,
        }


def planned_chunk_rate(plan: PointPlan, stream_chunks_per_s: float) -> float:
    """Token chunks per second the point asks the client to read (one chunk per token)."""
    rate = 0.0
    if plan.offsets is None:  # closed loop: every stream busy
        rate += (plan.concurrency or 1) * stream_chunks_per_s
    elif plan.foreground:
        span = max(plan.offsets[-1] - plan.offsets[0], 0.0)
        tokens = sum(r.output_tokens for r in plan.foreground)
        # Everything at once (rate: inf) or one request: as many streams as requests.
        open_rate = tokens / span if span > 0 else len(plan.foreground) * stream_chunks_per_s
        # A request streams at most one stream's rate: arrivals faster than they finish pile up
        # as concurrent streams, each at the stream rate; max_concurrency caps those.
        if plan.max_concurrency:
            open_rate = min(open_rate, plan.max_concurrency * stream_chunks_per_s)
        rate += open_rate
    for share in plan.background:
        if len(share) > 1:
            span = share[-1][0] - share[0][0]
            if span > 0:
                rate += sum(r.output_tokens for _, r in share) / span
    return rate


def size_clients(
    plan: PointPlan,
    cores: int,
    chunk_cost_s: float = DEFAULT_CHUNK_COST_S,
    stream_chunks_per_s: float = DEFAULT_STREAM_CHUNKS_PER_S,
) -> ClientSizing:
    """The client processes for ``plan`` on ``cores`` cores (see the module's docstring)."""
    rate = planned_chunk_rate(plan, stream_chunks_per_s)
    needed = max(1, math.ceil(rate * chunk_cost_s / PROCESS_LOAD))
    streams = plan.concurrency if plan.offsets is None else None
    processes = max(1, min(needed, cores, streams or needed))
    return ClientSizing(processes, needed, rate, chunk_cost_s, max(1, cores))


class ClientGauge:
    """What the client learns about itself point after point: CPU per chunk (the highest seen,
    so a busy point is not forgotten) and the chunk rate of one stream (the last closed loop)."""

    def __init__(self) -> None:
        self.chunk_cost_s = DEFAULT_CHUNK_COST_S
        self.stream_chunks_per_s = DEFAULT_STREAM_CHUNKS_PER_S
        self._measured = False

    def learn(self, cpu_s: float, chunks: int, streams: int | None, window_s: float) -> None:
        """After a point: the client's CPU seconds (all processes), token chunks read, closed-loop
        streams (None: open loop) and the point's wall time."""
        if chunks >= 200 and cpu_s > 0:  # too few chunks: start-up costs, not per-chunk ones
            cost = cpu_s / chunks
            self.chunk_cost_s = cost if not self._measured else max(self.chunk_cost_s, cost)
            self._measured = True
        if streams and window_s > 0 and chunks:
            self.stream_chunks_per_s = chunks / window_s / streams
