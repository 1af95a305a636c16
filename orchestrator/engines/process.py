"""Lifecycle of one engine server process: start in its own process group, wait healthy, stop.

:class:`ServerProcess` is a context manager, so every exit path (exception, Ctrl-C) stops the
server: TERM to the whole process group, a grace period, then KILL. A watchdog process
(:mod:`orchestrator.engines.watchdog`) also kills the group if the process that started it
dies without cleaning up (e.g. a Ray worker killed with SIGKILL).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

from orchestrator.config.errors import ServerCrashedError, ServerStartError

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 30


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


# An exception line, possibly behind a log prefix like "(Worker pid=7) ERROR 11-22 09:23:13 [x.py:1] ".
_EXC_LINE = re.compile(r"^(?:\(.*?\)\s+)?(?:[A-Z]+\s+[\d-]+\s+[\d:]+\s+\[[^\]]*\]\s+)?"
                       r"((?:[A-Za-z_][\w.]*)?(?:Error|Exception)(?::|\s*\().*)$")


def error_lines(path: Path, limit: int = 6) -> list[str]:
    """Distinct exception lines (``ValueError: ...``) found anywhere in a log, in order."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    seen: dict[str, None] = {}
    for line in text.splitlines():
        m = _EXC_LINE.match(line.strip())
        if m and not m.group(1).startswith("Traceback"):
            seen.setdefault(m.group(1)[:500], None)
    return list(seen)[:limit]


def explain(path: Path) -> str:
    """The errors found in a server log followed by its last lines, for error messages."""
    errors = error_lines(path)
    head = ("errors in the server log:\n  " + "\n  ".join(errors) + "\n") if errors else ""
    return f"{head}last log lines:\n{tail(path)}"


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
    ) -> None:
        if isinstance(argv, str):  # defensive: commands are argv lists, never shell strings
            raise TypeError("argv must be a sequence of strings, not a shell string")
        self.argv = [str(a) for a in argv]
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.name = name
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    # -- start / health -------------------------------------------------------------

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: we can signal all of it
            )
        finally:
            log_file.close()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.engines.watchdog", str(os.getpid()), str(self.proc.pid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._watchdog.wait(timeout=30)  # it forks a detached watcher and exits at once
        except BaseException:  # no watchdog (or Ctrl-C right here): do not leave the server behind
            self.stop()
            raise
        log.info("%s started (pid %d): %s", self.name, self.proc.pid, " ".join(self.argv))

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until ``health_url`` answers 200; return seconds since start.

        Fails at once (not after the timeout) when the process exits.
        """
        assert self.proc is not None, "start() first"
        t0 = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.name} exited with code {code} during start-up; {explain(self.log_path)}"
                )
            if self.is_healthy():
                self.startup_s = time.monotonic() - t0
                return self.startup_s
            if time.monotonic() - t0 > timeout_s:
                raise ServerStartError(
                    f"{self.name} not healthy after {timeout_s:.0f} s; {explain(self.log_path)}"
                )
            time.sleep(poll_s)

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def check_alive(self) -> None:
        """Raise :class:`ServerCrashedError` with the log tail if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerCrashedError(
                f"{self.name} died (exit code {self.proc.returncode}); {explain(self.log_path)}"
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- stop -----------------------------------------------------------------------

    def stop(self) -> None:
        """TERM the process group, wait up to the grace period, then KILL it. Idempotent."""
        proc = self.proc
        if proc is not None:
            pgid = proc.pid  # start_new_session: the pid is the group id
            if proc.poll() is None or group_alive(pgid):
                _signal_group(pgid, signal.SIGTERM)
                deadline = time.monotonic() + self.stop_grace_s
                while time.monotonic() < deadline and (proc.poll() is None or group_alive(pgid)):
                    time.sleep(0.1)
                if proc.poll() is None or group_alive(pgid):
                    log.warning("%s did not stop after TERM; sending KILL", self.name)
                    _signal_group(pgid, signal.SIGKILL)
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline and group_alive(pgid):
                        time.sleep(0.1)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.error("%s (pid %d) did not exit after KILL", self.name, proc.pid)
        self._watchdog = None  # the detached watcher exits by itself once the group is gone

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
