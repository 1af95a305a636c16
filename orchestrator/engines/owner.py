"""Who owns a server process: the mark every server we start carries in its environment
(:data:`SERVER_OWNER_ENV`), and whether the process it names still runs."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

# Every server process we start, and every process it forks (the environment is inherited), carries
# its owner in this variable: "<pid>:<start stamp>" of the process that started it. A later trial
# tells a leftover (owner gone, or owner here but the server not running) from a running server.
SERVER_OWNER_ENV = "INFERENCE_LAB_SERVER_OWNER"


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
