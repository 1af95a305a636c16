"""Lifecycle of one engine server process: start in its own process group, wait healthy, stop.

:class:`ServerProcess` is a context manager, so every exit path (exception, Ctrl-C) stops the
server: TERM to the whole process group, a grace period, then KILL. A watchdog process
(:mod:`orchestrator.engines.watchdog`) also kills the group if the process that started it
dies without cleaning up (e.g. a Ray worker killed with SIGKILL). The process group's own
operations are in :mod:`.procgroup`, the owner's mark in :mod:`.owner`, a Slurm step's in
:mod:`.srun`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType

from orchestrator.config.errors import ServerCrashedError, ServerStartError
from orchestrator.config.logs import cause_line, explain
from orchestrator.config.secrets import redact_argv
from orchestrator.engines import shm
from orchestrator.engines.owner import SERVER_OWNER_ENV, owner_mark
from orchestrator.engines.procgroup import group_alive, signal_group, wait_group
from orchestrator.engines.srun import cancel_slurm_step, slurm_step_argv

log = logging.getLogger(__name__)


# Process groups of the servers this process started and has not stopped yet: an interrupt
# TERMs them at once (:func:`terminate_running`), before the code unwinding it gets there.
_RUNNING: set[int] = set()
RPC_DIR_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM binds its IPC sockets (start())


def running_groups() -> frozenset[int]:
    """Process groups of the servers this process started and has not stopped yet."""
    return frozenset(_RUNNING)


def terminate_running() -> None:
    """TERM every running server's process group now, without waiting (an interrupt's first
    act: each server's own stop then waits for its group and KILLs what is left)."""
    for pgid in list(_RUNNING):
        signal_group(pgid, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_stop_servers() -> Iterator[None]:
    """In the main thread: SIGTERM (``kill``, a scheduler ending the job) and SIGINT (Ctrl-C; Ray
    cancelling a task interrupts its main thread the same way) first TERM every running server's
    group (:func:`terminate_running`), then raise KeyboardInterrupt, so the servers go down at
    once rather than after the code above them has unwound: if that took longer than Ray's
    cancel grace, Ray killed the worker and its API server and left the engine core orphaned.

    SIGINT gets the handler explicitly: a process started from a background job of a
    non-interactive shell inherits SIGINT *ignored*, and Python then never raises
    KeyboardInterrupt, so ``kill -INT`` would be lost (seen in CI-like runs here)."""

    def handler(signum: int, frame: object) -> None:
        terminate_running()
        raise KeyboardInterrupt(f"signal {signum}")

    with on_interrupt(handler):
        yield


@contextlib.contextmanager
def on_interrupt(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for SIGTERM and SIGINT inside the block, the handlers before it restored after;
    outside the main thread (where Python cannot set one) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ServerProcess:
    """One server subprocess (argv list, never a shell string) with its log file."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        health_url: str,
        name: str = "server",
        stop_grace_s: float = 15.0,
        fatal_log_markers: Sequence[str] = (),
        nice: int = 0,
    ) -> None:
        if isinstance(argv, str):  # defensive: commands are argv lists, never shell strings
            raise TypeError("argv must be a sequence of strings, not a shell string")
        self.argv, self._slurm_step = slurm_step_argv([str(a) for a in argv])
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.name = name
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._started_at = 0.0  # monotonic time of start(): start-up is counted from it
        self.fatal_log_markers = tuple(fatal_log_markers)
        self.nice = nice
        self._log_scanned = 0  # bytes of the log already searched for fatal markers
        self._healthy_at = 0  # log size when the server became healthy: later errors are the run's
        self._rpc_dir: str | None = None  # the server's own folder of IPC sockets (start())
        self._segments: set[str] = set()  # shared memory its group held, kept across an interrupted stop

    # -- start / health -------------------------------------------------------------

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._started_at = time.monotonic()
        env = {**self.env, SERVER_OWNER_ENV: owner_mark(), "SPT_NOENV": "1"}
        if RPC_DIR_ENV not in env and Path(self.argv[0]).name.startswith("python"):
            env[RPC_DIR_ENV] = self._make_rpc_dir()
        try:
            log_file = open(self.log_path, "ab")
        except BaseException:
            self.stop()  # nothing started: only the IPC folder to remove
            raise
        try:
            self.proc = subprocess.Popen(
                self.argv,
                # SPT_NOENV: setproctitle (SGLang's processes, vLLM's engine core) must not write
                # the title over the environment, where the owner mark is read
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: we can signal all of it
            )
        except BaseException:
            self.stop()  # nothing started: only the IPC folder to remove
            raise
        finally:
            log_file.close()
        # From here a Ctrl-C (raised wherever the main thread is) or any failure stops the server
        # just started: it must not run on without its watchdog or its place in _RUNNING.
        try:
            _RUNNING.add(self.proc.pid)
            if self.nice:
                self._lower_priority(self.proc.pid)
            self._start_watchdog(self.proc.pid)
        except BaseException:  # no watchdog (or Ctrl-C right here): do not leave the server behind
            self.stop()
            raise
        log.info("%s started (pid %d): %s", self.name, self.proc.pid, " ".join(redact_argv(self.argv)))

    def _make_rpc_dir(self) -> str:
        """A folder of the server's own for vLLM's IPC sockets, removed when it stops.

        vLLM binds its ZeroMQ IPC sockets (API server <-> engine core <-> workers) in the
        system temp folder and leaves them there when a process is killed: 1,300 of them
        gathered in /tmp over a day of test runs. A folder of the server's own, removed
        when it stops (or by the watchdog), keeps the machine clean. Short, under the temp
        folder: a socket's path must fit 107 bytes. TMPDIR itself is left alone (torch's
        compile cache lives there, and a new one per server would recompile every start).
        Only for a server started here by its interpreter: behind a launch prefix (srun,
        docker) it may run where this folder does not exist."""
        self._rpc_dir = tempfile.mkdtemp(prefix="il-rpc-")
        return self._rpc_dir

    def _lower_priority(self, pid: int) -> None:
        """``platform.server_nice`` on the process just started, still one thread at its
        interpreter's start-up: its threads and children (vLLM's engine core, its workers)
        inherit it as they are made."""
        try:
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
        except OSError as exc:
            log.warning("%s: could not lower its priority (platform.server_nice): %s", self.name, exc)

    def _start_watchdog(self, pid: int) -> None:
        """The detached watchdog of the server's group (:mod:`orchestrator.engines.watchdog`)."""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.engines.watchdog",
                str(os.getpid()),
                str(pid),
                *([self._rpc_dir] if self._rpc_dir else []),
                *(["--slurm-step", self._slurm_step] if self._slurm_step else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._watchdog.wait(timeout=30)  # it forks a detached watcher and exits at once

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until ``health_url`` answers 200; return seconds since :meth:`start` (servers
        started together are each timed from their own start, whichever is waited on first).

        Fails at once (not after the timeout) when the process exits.
        """
        assert self.proc is not None, "start() first"
        t0 = self._started_at
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"{self.name} exited with code {code} during start-up: {explain(self.log_path)}")
            if self.is_healthy():
                self.startup_s = time.monotonic() - t0
                self._healthy_at = self._log_scanned = self._log_size()
                return self.startup_s
            if time.monotonic() - t0 > timeout_s:
                raise ServerStartError(f"{self.name} not healthy after {timeout_s:.0f} s: {explain(self.log_path)}")
            time.sleep(poll_s)

    def is_healthy(self) -> bool:
        return self.health_status() == 200

    def health_status(self, timeout_s: float = 2.0) -> int | None:
        """The health endpoint's HTTP status, or None when it does not answer."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=timeout_s) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def check_alive(self) -> None:
        """Raise :class:`ServerCrashedError` if the server cannot serve any more: its process
        exited, its log says its engine died (the API process may live on, answering 5xx), or its
        health check fails three times. The message's first line is the engine's own error."""
        self._raise_if_exited()
        marker = self._fatal_marker()
        status = None if marker else self._health_after_retries()
        if marker is None and status == 200:
            return
        # a process killed an instant ago may have closed its sockets before it could be reaped:
        # asked again after the health retries, its exit code is the better reason
        self._raise_if_exited()
        why = (
            f"its log says '{marker}'"
            if marker
            else (f"its health check answers HTTP {status}" if status else "its health check does not answer")
        )
        raise ServerCrashedError(f"{self.name}: the engine died ({why}): {self._run_cause()}")

    def _raise_if_exited(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerCrashedError(f"{self.name} died (exit code {self.proc.returncode}): {explain(self.log_path)}")

    def _health_after_retries(self, tries: int = 3) -> int | None:
        status = None
        for attempt in range(tries):
            status = self.health_status(timeout_s=5.0)
            if status == 200:
                return status
            if attempt < tries - 1:
                time.sleep(1.0)
        return status

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _fatal_marker(self) -> str | None:
        """The first fatal marker written to the log since the last look (None if none)."""
        if not self.fatal_log_markers:
            return None
        overlap = max(len(m) for m in self.fatal_log_markers)
        start = max(self._healthy_at, self._log_scanned - overlap)
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return None
        self._log_scanned = start + len(data)
        text = data.decode("utf-8", errors="replace")
        return next((m for m in self.fatal_log_markers if m in text), None)

    def _run_cause(self) -> str:
        """The engine's own error since it became healthy (its root cause first), then the log's
        errors and last lines."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._healthy_at)
                since = f.read().decode("utf-8", errors="replace")
        except OSError:
            since = ""
        cause = cause_line(since)
        details = explain(self.log_path)
        return f"{cause}\n{details}" if cause else details

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- stop -----------------------------------------------------------------------

    def stop(self) -> None:
        """TERM the process group, wait up to the grace period, then KILL it. Once the group's
        leader has exited, what is left of the group (its orchestrator gone) gets only
        ``ORPHAN_GRACE_S``. Then the shared-memory segments it left (:mod:`.shm`) are removed.
        Idempotent.

        An interrupt during the stop (a second Ctrl-C, Ray cancelling again) does not cut it
        short: the group is KILLed at once, and then the interrupt goes on. Cut short, the server
        ran on, unwatched while its owner lived (a Ray worker is kept for the next task)."""
        grace, interrupted = self.stop_grace_s, None
        for _ in range(3):  # a later try KILLs at once; an interrupt during the third is let through
            try:
                self._stop(grace)
                break
            except KeyboardInterrupt as exc:
                interrupted, grace = exc, 0.0
                log.warning("%s: interrupted while stopping; killing its process group now", self.name)
        if interrupted is not None:
            raise interrupted

    def _stop(self, grace_s: float) -> None:
        proc = self.proc
        if proc is not None:
            pgid = proc.pid  # start_new_session: the pid is the group id
            segments = self._segments  # the shared memory its processes hold (see engines/shm.py)
            if proc.poll() is None or group_alive(pgid):
                segments |= shm.held_by_group(pgid)
                signal_group(pgid, signal.SIGTERM)
                wait_group(pgid, lambda: proc.poll() is not None, grace_s)
                if proc.poll() is None or group_alive(pgid):
                    log.warning("%s did not stop after TERM; sending KILL", self.name)
                    segments |= shm.held_by_group(pgid)
                    signal_group(pgid, signal.SIGKILL)
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline and group_alive(pgid):
                        time.sleep(0.1)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.error("%s (pid %d) did not exit after KILL", self.name, proc.pid)
            if self._slurm_step:
                cancelled = cancel_slurm_step(self._slurm_step)
                if cancelled:
                    log.warning("%s: its srun was gone, its Slurm step %s was not: cancelled", self.name, cancelled[0])
            _RUNNING.discard(pgid)
            if segments and not group_alive(pgid):
                removed = shm.remove_unused(segments)  # a KILLed group's resource tracker died with it
                if removed:
                    log.warning("%s: removed %s", self.name, shm.describe(removed))
                self._segments = set()
        if self._rpc_dir and (proc is None or not group_alive(proc.pid)):
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._rpc_dir = None
        self._watchdog = None  # the detached watcher exits by itself once the group is gone

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
