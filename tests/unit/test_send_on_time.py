"""What keeps a point's sends on their instants: connections opened ahead of a send that follows
a long wait, no garbage collection while a point is sent, the servers' niceness below the
client's, and the resource monitor's first sample before the point's clock rather than beside
its first sends (docs/benchmarks.md, "A trace's bursts on time")."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time

import psutil
import pytest

from orchestrator.config.schema import WorkloadSpec
from orchestrator.engines.process import ServerProcess
from orchestrator.loadgen import sender as sender_mod
from orchestrator.loadgen import wire
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest, now
from orchestrator.loadgen.plan import PointPlan
from orchestrator.loadgen.sender import PointSender, collector_paused, get_ready
from orchestrator.metrics.monitor import ResourceMonitor
from tests.unit.test_wire import OK_HEAD, chunked, serve, sse

pytestmark = pytest.mark.measures


def workload() -> WorkloadSpec:
    return WorkloadSpec(
        name="w", classes={"main": {"input_tokens": 8, "output_tokens": 1}}, load_points=[{"rate": 1}], num_requests=5
    )


def test_a_burst_after_a_long_wait_finds_its_connections_open(monkeypatch):
    """A schedule of one send, then a burst of three 0.9 s later: the first connection is too
    old by then (the pool keeps one 0.3 s here, as it keeps one 4 s against uvicorn's 5), so
    three are opened ahead of the burst, and none of its sends opens one."""
    monkeypatch.setattr(wire, "IDLE_REUSE_S", 0.3)
    monkeypatch.setattr(sender_mod, "CONNECT_AHEAD_S", 0.2)
    acquired: list[bool] = []
    opened: list[float] = []
    original_acquire, original_new = wire.WireSession.acquire, wire.WireSession._new

    async def acquire(self, host, port):
        conn, pooled = await original_acquire(self, host, port)
        acquired.append(pooled)
        return conn, pooled

    async def new(self, host, port):
        opened.append(now())
        return await original_new(self, host, port)

    monkeypatch.setattr(wire.WireSession, "acquire", acquire)
    monkeypatch.setattr(wire.WireSession, "_new", new)
    requests = [PlannedRequest(i, "main", "hello", 8, 1) for i in range(4)]
    plan = PointPlan(0, 0, requests, [0.0, 0.9, 0.9, 0.9], None, None, 0.0, [], None, False)

    async def main():
        server, port, seen = await serve([OK_HEAD + chunked(sse("a"), [])] * 4)
        async with server:
            session = await HttpSession.open()
            try:
                endpoint = Endpoint(f"http://127.0.0.1:{port}", "m")
                await session.prewarm(endpoint, 1)
                records = await PointSender(plan, endpoint, workload(), session).run()
            finally:
                await session.close()
        return records, seen

    records, seen = asyncio.run(main())
    assert all(r.ok for r in records) and len(seen) == 4, [r.error for r in records]
    assert acquired == [True] * 4  # no send waited for a connection
    burst = sorted(r.intended_send_s for r in records if r.request_id > 0)
    sent = min(r.sent_s for r in records if r.request_id > 0)
    assert len(opened) == 4  # one before the point, three for the burst...
    # ...0.2 s ahead of it: not before (give or take the timer's millisecond), and before its sends
    assert all(burst[0] - 0.2 - 0.002 <= t < sent for t in opened[1:]), (burst[0], opened, sent)


def test_the_pool_closes_what_would_be_too_old_at_the_instant_asked_for(monkeypatch):
    monkeypatch.setattr(wire, "IDLE_REUSE_S", 0.5)

    async def main():
        server, port, _ = await serve([])
        async with server:
            pool = wire.WireSession()
            await pool.open("127.0.0.1", port, 2)
            first = list(pool._idle[("127.0.0.1", port)])
            await pool.open("127.0.0.1", port, 2)  # still fresh now: nothing new
            same = list(pool._idle[("127.0.0.1", port)])
            await pool.open("127.0.0.1", port, 2, at=now() + 1.0)  # too old by then: replaced
            later = list(pool._idle[("127.0.0.1", port)])
            pool.close()
        return first, same, later

    first, same, later = asyncio.run(main())
    assert same == first and len(later) == 2
    assert not set(later) & set(first) and all(c.lost for c in first)  # closed, not left open


def test_no_collection_while_a_point_is_sent_and_its_frozen_objects_thawed_after():
    async def nothing(endpoint, connections):
        return None

    class Runner:
        def run(self, coro):
            return asyncio.run(coro)

    session = HttpSession.__new__(HttpSession)
    session.prewarm = nothing  # type: ignore[method-assign]
    plan = PointPlan(0, 0, [], [], None, None, 0.0, [], None, False)
    assert gc.isenabled()
    get_ready(Runner(), session, Endpoint("http://127.0.0.1:1", "m"), plan)  # type: ignore[arg-type]
    assert gc.get_freeze_count() > 0  # what lived before the point is left out of collections
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # a process that had it off keeps it off
    try:
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("the point failed")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_server_and_its_children_run_at_the_niceness_asked_for(tmp_path):
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    base = os.getpriority(os.PRIO_PROCESS, 0)
    server = ServerProcess(
        [sys.executable, "-c", script], dict(os.environ), tmp_path / "log", "http://127.0.0.1:1", nice=5
    )
    server.start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        deadline = time.monotonic() + 10
        while not (children := psutil.Process(pid).children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(base + 5, 19)
        assert children and os.getpriority(os.PRIO_PROCESS, children[0].pid) == min(base + 5, 19)
    finally:
        server.stop()


def test_the_monitor_samples_once_before_it_returns_then_in_its_thread():
    mon = ResourceMonitor([os.getpid()], None, {}, interval_s=60)
    mon.start()
    try:
        assert mon.samples == 1 and mon.peak_memory_bytes > 0  # the point's start, in the caller's thread
    finally:
        mon.stop()


@pytest.mark.parametrize("factory", [sender_mod.loop_factory(), asyncio.new_event_loop], ids=["uvloop", "asyncio"])
def test_no_wait_for_an_instant_ends_before_it(factory):
    """uvloop rounds a timer to whole milliseconds and counts it from a time read at the start of
    its loop's iteration, so a plain sleep woke up to 0.3 ms early in a third of these waits (a
    replayed trace's follower was sent before its instant: negative send lag). The sender's
    waits end at or after their instant, on either loop; a stop set first ends one at once."""
    assert factory is not None, "uvloop is installed with the product"

    async def main() -> tuple[list[float], bool, float]:
        early = []
        for i in range(200):
            until = now() + 0.0011 + (i % 7) * 0.00037
            assert await sender_mod.sleep_until(until)
            early.append(until - now())
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, stop.set)
        t = now()
        stopped = not await sender_mod.sleep_until(now() + 5, stop)
        return early, stopped, now() - t

    with asyncio.Runner(loop_factory=factory) as runner:
        early, stopped, waited = runner.run(main())
    assert max(early) <= 0, f"woke {max(early) * 1e3:.3f} ms early"
    assert stopped and waited < 1
