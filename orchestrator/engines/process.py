"""Lifecycle of one engine server process: start in its own process group, wait healthy, stop.

:class:`ServerProcess` is a context manager, so every exit path (exception, Ctrl-C) stops the
server: TERM to the whole process group, a grace period, then KILL. A watchdog process
(:mod:`orchestrator.engines.watchdog`) also kills the group if the process that started it
dies without cleaning up (e.g. a Ray worker killed with SIGKILL).
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
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

from orchestrator.config.errors import ServerCrashedError, ServerStartError
from orchestrator.config.logs import cause_line, explain
from orchestrator.config.secrets import redact_argv
from orchestrator.engines import shm

log = logging.getLogger(__name__)


# Process groups of the servers this process started and has not stopped yet: an interrupt
# TERMs them at once (:func:`terminate_running`), before the code unwinding it gets there.
_RUNNING: set[int] = set()
# After the group leader (the API server, which orchestrates its engine's shutdown) is gone,
# what is left of its group gets this long before KILL: measured here, vLLM's EngineCore
# orphaned by a killed API server took 9.1 s to exit on TERM (waiting on its dead worker's reply).
ORPHAN_GRACE_S = 2.0


# Every server process we start, and every process it forks (the environment is inherited), carries
# its owner in this variable: "<pid>:<start stamp>" of the process that started it. A later trial
# tells a leftover (owner gone, or owner here but the server not running) from a running server.
SERVER_OWNER_ENV = "INFERENCE_LAB_SERVER_OWNER"
RPC_DIR_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM binds its IPC sockets (start())


def start_stamp(pid: int) -> str:
    """When process ``pid`` started, as a string that never changes while it runs: its start in
    clock ticks since boot (``/proc/<pid>/stat``), not a wall-clock time, which moves when the
    system clock is stepped; elsewhere psutil's creation time. Raises psutil.NoSuchProcess."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return "t" + stat[stat.rindex(")") + 2 :].split()[19]  # field 22, starttime
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            return f"{psutil.Process(pid).create_time():.2f}"
        raise psutil.NoSuchProcess(pid) from None
    except (OSError, ValueError, IndexError):
        return f"{psutil.Process(pid).create_time():.2f}"


def owner_mark(pid: int | None = None) -> str:
    """The owner mark of process ``pid`` (this one by default): pid and start stamp, so a reused
    pid is not taken for the owner."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_stamp(pid)}"


def owner_alive(mark: str) -> tuple[int | None, bool]:
    """The owner's pid in a mark and whether that very process (same start) still runs."""
    pid_text, _, stamp = mark.partition(":")
    if not pid_text.isdigit():
        return None, False
    try:
        return int(pid_text), start_stamp(int(pid_text)) == stamp
    except psutil.Error:
        return int(pid_text), False


def running_groups() -> frozenset[int]:
    """Process groups of the servers this process started and has not stopped yet."""
    return frozenset(_RUNNING)


def terminate_running() -> None:
    """TERM every running server's process group now, without waiting (an interrupt's first
    act: each server's own stop then waits for its group and KILLs what is left)."""
    for pgid in list(_RUNNING):
        _signal_group(pgid, signal.SIGTERM)


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
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        terminate_running()
        raise KeyboardInterrupt(f"signal {signum}")

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
            # vLLM binds its ZeroMQ IPC sockets (API server <-> engine core <-> workers) in the
            # system temp folder and leaves them there when a process is killed: 1,300 of them
            # gathered in /tmp over a day of test runs. A folder of the server's own, removed
            # when it stops (or by the watchdog), keeps the machine clean. Short, under the temp
            # folder: a socket's path must fit 107 bytes. TMPDIR itself is left alone (torch's
            # compile cache lives there, and a new one per server would recompile every start).
            # Only for a server started here by its interpreter: behind a launch prefix (srun,
            # docker) it may run where this folder does not exist.
            self._rpc_dir = tempfile.mkdtemp(prefix="il-rpc-")
            env[RPC_DIR_ENV] = self._rpc_dir
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
                # Set on the process just started, still one thread at its interpreter's start-up: its
                # threads and children (vLLM's engine core, its workers) inherit it as they are made.
                try:
                    os.setpriority(os.PRIO_PROCESS, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
                except OSError as exc:
                    log.warning("%s: could not lower its priority (platform.server_nice): %s", self.name, exc)
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchestrator.engines.watchdog",
                    str(os.getpid()),
                    str(self.proc.pid),
                    *([self._rpc_dir] if self._rpc_dir else []),
                    *(["--slurm-step", self._slurm_step] if self._slurm_step else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._watchdog.wait(timeout=30)  # it forks a detached watcher and exits at once
        except BaseException:  # no watchdog (or Ctrl-C right here): do not leave the server behind
            self.stop()
            raise
        log.info("%s started (pid %d): %s", self.name, self.proc.pid, " ".join(redact_argv(self.argv)))

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
                _signal_group(pgid, signal.SIGTERM)
                wait_group(pgid, lambda: proc.poll() is not None, grace_s)
                if proc.poll() is None or group_alive(pgid):
                    log.warning("%s did not stop after TERM; sending KILL", self.name)
                    segments |= shm.held_by_group(pgid)
                    _signal_group(pgid, signal.SIGKILL)
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


def slurm_step_argv(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """A server started through ``srun`` (``engine.launch_prefix=[srun, ...]``) runs in a Slurm job
    step, maybe on another node. Its argv gets a step name of its own (``--job-name=il-...``, first
    after srun: a name the prefix sets itself comes later and wins, and then the step is not
    found by name), so a step whose srun was KILLed can still be cancelled. Other argv: as is."""
    if not argv or os.path.basename(argv[0]) != "srun":
        return list(argv), None
    name = f"il-server-{uuid.uuid4().hex[:12]}"
    return [argv[0], f"--job-name={name}", *argv[1:]], name


def cancel_slurm_step(name: str) -> list[str]:
    """Cancel the Slurm job (srun made one of its own) or else the steps named ``name`` that still
    run, and return their ids. A KILLed srun (Ray killing a dead worker's children, the OOM
    killer) leaves its step running: measured
    on the local Slurm of ``make test-slurm``, the step of a KILLed srun still ran 60 s later,
    holding what the engine held. srun given TERM cancels its step itself (under a second)."""
    steps: list[str] = []
    # a job of that name first: srun outside an allocation made one of its own, which the dead srun
    # still holds once its step is gone; inside one (an sbatch sweep), only the step has the name
    # (a job already COMPLETING, as after srun's own stop, is not listed: nothing to cancel)
    jobs = ["squeue", "-h", "-n", name, "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING", "-o", "%i %j"]
    for listing in (jobs, ["squeue", "-h", "-s", "-n", name, "-o", "%i %j"]):
        try:
            listed = subprocess.run(listing, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not list the Slurm steps to cancel %s: %s", name, exc)
            return []
        if listed.returncode != 0:
            log.warning("could not list the Slurm steps to cancel %s: %s", name, listed.stderr.strip()[-300:])
            return []
        steps += [line.split()[0] for line in listed.stdout.splitlines() if line.split()[1:] == [name]]
        if steps:
            break
    for step in steps:
        try:
            subprocess.run(["scancel", step], capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not cancel Slurm step %s (%s): %s", step, name, exc)
    return steps


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group(pgid: int, leader_gone: Callable[[], bool], grace_s: float, poll_s: float = 0.1) -> None:
    """Wait until the group is gone, at most ``grace_s``, and at most ``ORPHAN_GRACE_S`` after its
    leader is gone (the caller KILLs what is left)."""
    deadline = time.monotonic() + grace_s
    orphaned_at: float | None = None
    while time.monotonic() < deadline and group_alive(pgid):
        if orphaned_at is None and leader_gone():
            orphaned_at = time.monotonic()
            deadline = min(deadline, orphaned_at + ORPHAN_GRACE_S)
        time.sleep(poll_s)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in the group (zombies hold nothing; init reaps them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False
