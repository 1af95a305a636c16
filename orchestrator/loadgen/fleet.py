"""Scale-out: several client processes send one load point's schedule on one clock.

One Python process streams a few hundred concurrent responses before its own event loop
becomes the bottleneck (the point is then flagged invalid). ``workload.client_processes``
> 1 splits each point's plan (:meth:`PointPlan.split`) over that many processes:

1. the driver of the trial plans the point (prompts and arrival instants, one seed);
2. each process gets its share, opens and warms its connections, and says ready;
3. the driver picks one start instant on the machine's monotonic clock
   (``time.perf_counter`` is ``CLOCK_MONOTONIC`` on Linux, the same in every process)
   and every process starts its share's schedule from it;
4. records (request ids are unique across shares) and client stats come back and merge
   into one table, as if one client had sent them.

A duration-bounded closed loop may outrun its plan: a process then asks the driver, which
holds the request planner (the tokenizer, the datasets, one sequence of request ids), for
more over its pipe, before its share runs out (:class:`PipeRefill`).

The processes are started once per trial and reused for every point. They ignore Ctrl-C
(the driver stops them), die with their parent (``PR_SET_PDEATHSIG``), and exit when their
pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Coroutine
from multiprocessing.connection import Connection, wait
from typing import Any

from orchestrator.config.errors import LoadError
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest
from orchestrator.loadgen.plan import PointPlan
from orchestrator.loadgen.sender import PointSender, get_ready, loop_factory
from orchestrator.loadgen.shares import MakeMore, ShareDone, answer_more
from orchestrator.metrics.records import RequestRecord

log = logging.getLogger(__name__)

# Between "all ready" and the shared start instant: time for the "go" message to reach every process.
START_LEAD_S = 0.05
READY_TIMEOUT_S = 120.0


class ClientFleet:
    """``n`` client processes for one endpoint and workload, each sending one share of a point
    (a :class:`~orchestrator.loadgen.shares.ShareRunner`)."""

    lead_s = START_LEAD_S

    def __init__(self, n: int, endpoint: Endpoint, workload: WorkloadSpec) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tx: list[Connection] = []
        self.rx: list[Connection] = []
        self.endpoint, self.workload = endpoint, workload
        self._shares: list[PointPlan] = []
        self._more: MakeMore | None = None
        self.grow(n)

    def grow(self, n: int) -> None:
        """Start processes until there are ``n`` (a later point may need more than the first)."""
        root = str(PROJECT_ROOT)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        first = len(self.procs)
        try:
            for _ in range(first, n):
                down_r, down_w = os.pipe()
                up_r, up_w = os.pipe()
                argv = [sys.executable, "-m", "orchestrator.loadgen.fleet", str(down_r), str(up_w), str(os.getpid())]
                proc = subprocess.Popen(argv, pass_fds=(down_r, up_w), env=env, stdin=subprocess.DEVNULL)
                os.close(down_r)
                os.close(up_w)
                self.procs.append(proc)
                self.tx.append(Connection(down_w, readable=False))
                self.rx.append(Connection(up_r, writable=False))
            for tx in self.tx[first:]:
                tx.send((self.endpoint, self.workload))
            for i in range(first, n):
                self._expect(i, "hello", READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _expect(self, i: int, kind: str, timeout_s: float | None) -> tuple[Any, ...]:
        """The next message of process ``i``; raises if it died, failed or timed out."""
        waited = 0.0
        while not self.rx[i].poll(1.0):
            waited += 1.0
            self._check_alive(i)
            if timeout_s is not None and waited >= timeout_s:
                raise LoadError(f"client process {i} sent no '{kind}' within {timeout_s:.0f} s")
        msg = self._recv(i)
        if msg[0] != kind:
            raise LoadError(f"client process {i} sent '{msg[0]}', expected '{kind}'")
        return msg

    def _answer_more(self, i: int, n: int) -> None:
        """Process ``i`` asks for ``n`` requests past the plan (:func:`answer_more`)."""
        batch = answer_more(self._more, n, self._shares[i].index)
        with contextlib.suppress(OSError):  # a process that died is seen by its pipe's end
            self.tx[i].send(("more", batch))

    def _check_alive(self, i: int) -> None:
        code = self.procs[i].poll()
        if code is not None:
            raise LoadError(f"client process {i} (pid {self.procs[i].pid}) exited with code {code}")

    def _recv(self, i: int) -> tuple[Any, ...]:
        try:
            msg = self.rx[i].recv()
        except EOFError:
            raise LoadError(f"client process {i} closed its pipe (exit code {self.procs[i].wait(5)})") from None
        if msg[0] == "error":
            raise LoadError(f"client process {i} failed:\n{msg[1]}")
        return tuple(msg)

    def prepare(self, shares: list[PointPlan], more: MakeMore | None) -> None:
        """Hand one share to each of the first ``len(shares)`` processes and wait until each has
        warmed up; ``more`` answers their asks for requests past the plan."""
        if len(shares) > len(self.procs):
            raise LoadError(f"{len(shares)} shares for {len(self.procs)} client processes")
        self._shares, self._more = shares, more
        for i, share in enumerate(shares):
            self.tx[i].send(("prepare", share))
        for i in range(len(shares)):
            self._expect(i, "ready", READY_TIMEOUT_S)

    def start(self, at: float) -> None:
        for i in range(len(self._shares)):
            self.tx[i].send(("go", at))

    def finish(self) -> list[ShareDone]:
        """Wait for the started shares, answering their asks for more."""
        done: dict[int, tuple[Any, ...]] = {}
        waiting = {self.rx[i]: i for i in range(len(self._shares))}
        while waiting:
            ready = wait(list(waiting), timeout=1.0)
            if not ready:
                for i in waiting.values():
                    self._check_alive(i)
            for conn in ready:
                i = waiting[conn]  # type: ignore[index]  # wait() returns the objects it was given
                msg = self._recv(i)
                if msg[0] == "more":
                    self._answer_more(i, msg[1])
                elif msg[0] == "done":
                    done[i] = msg
                    del waiting[conn]  # type: ignore[arg-type]
                else:
                    raise LoadError(f"client process {i} sent '{msg[0]}' during a point")
        self._shares, self._more = [], None
        return [ShareDone(done[i][1], done[i][2]) for i in sorted(done)]

    def driver_cpu_s(self, t0: float, t1: float) -> float:
        return 0.0  # its helpers are its processes, whose CPU is their own

    def close(self) -> None:
        for tx in self.tx:
            try:
                tx.send(("stop",))
                tx.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for rx in self.rx:
            rx.close()
        self.procs, self.tx, self.rx = [], [], []


# ----------------------------------------------------------------------------- client process


class PipeRefill:
    """A client process's refill: asks the driver for ``n`` more requests over its pipe and
    waits for the answer on its event loop (the pipe is read only while a point runs). Anything
    else from the driver meanwhile (its "stop", its end) aborts the point: the driver is gone or
    stopping, so nothing more is sent."""

    def __init__(self, rx: Connection, tx: Connection) -> None:
        self.rx, self.tx = rx, tx
        self._answer: asyncio.Future[list[PlannedRequest]] | None = None
        self._point: asyncio.Future[list[RequestRecord]] | None = None
        self.aborted = False

    def run(
        self, runner: asyncio.Runner, point: Coroutine[Any, Any, list[RequestRecord]]
    ) -> list[RequestRecord] | None:
        """Run the point while listening; None if the driver aborted it."""
        loop = runner.get_loop()
        fd = self.rx.fileno()

        async def main() -> list[RequestRecord]:
            self._point = asyncio.ensure_future(point)
            return await self._point

        loop.add_reader(fd, self._readable)  # makes the pipe non-blocking (uvloop)
        try:
            return runner.run(main())
        except asyncio.CancelledError:
            if self.aborted:
                return None
            raise
        finally:
            loop.remove_reader(fd)
            os.set_blocking(fd, True)  # the next point's messages are read blocking

    def _readable(self) -> None:
        # a message can span several reads: read it whole (the driver writes it in one go)
        os.set_blocking(self.rx.fileno(), True)
        try:
            msg: tuple[Any, ...] = self.rx.recv()
        except (EOFError, OSError):
            msg = ("end",)
        finally:
            os.set_blocking(self.rx.fileno(), False)
        if msg[0] == "more" and self._answer is not None and not self._answer.done():
            self._answer.set_result(msg[1])
            return
        self.aborted = True
        asyncio.get_running_loop().remove_reader(self.rx.fileno())
        if self._point is not None:
            self._point.cancel()

    async def more(self, n: int) -> list[PlannedRequest]:
        self._answer = asyncio.get_running_loop().create_future()
        self.tx.send(("more", n))
        return await self._answer


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        sys.exit(0)  # the parent died before the hook was set


def _serve(rx: Connection, tx: Connection) -> None:
    endpoint, workload = rx.recv()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        http = runner.run(HttpSession.open())
        tx.send(("hello", os.getpid()))
        try:
            while True:
                try:
                    msg = rx.recv()
                except EOFError:
                    return
                if msg[0] == "stop":
                    return
                plan: PointPlan = msg[1]
                refill = PipeRefill(rx, tx)
                # asked for two streams' worth of requests while that many are left: a round trip early
                sender = PointSender(plan, endpoint, workload, http, refill.more, prefetch=2 * (plan.concurrency or 0))
                get_ready(runner, http, endpoint, plan)
                tx.send(("ready",))
                go = rx.recv()
                if go[0] != "go":
                    return
                records = refill.run(runner, sender.run(go[1]))
                if records is None:
                    return  # the driver stopped the point
                tx.send(("done", records, sender.client_stats))
        finally:
            runner.run(http.close())


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when to stop
    _die_with_parent(int(argv[2]))
    rx = Connection(int(argv[0]), writable=False)
    tx = Connection(int(argv[1]), readable=False)
    try:
        _serve(rx, tx)
    except (EOFError, BrokenPipeError):
        pass
    except BaseException:
        try:
            tx.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
