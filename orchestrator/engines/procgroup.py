"""A server's process group (each server starts in a session of its own): signal all of it, wait
for it to go (what outlives its leader gets a short grace), and tell whether any of it still runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

# After the group leader (the API server, which orchestrates its engine's shutdown) is gone,
# what is left of its group gets this long before KILL: measured here, vLLM's EngineCore
# orphaned by a killed API server took 9.1 s to exit on TERM (waiting on its dead worker's reply).
ORPHAN_GRACE_S = 2.0


def signal_group(pgid: int, sig: int) -> None:
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
