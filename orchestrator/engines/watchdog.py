"""Watchdog: ``python -m orchestrator.engines.watchdog OWNER_PID SERVER_PGID``.

Runs in its own session next to an engine server. If the owner process (the one that
started the server) disappears without stopping it, the watchdog TERMs and then KILLs the
server's process group, so no engine is left holding cores or GPUs. Exits when the server
group is gone or when it is told to (SIGTERM from a clean stop).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from orchestrator.engines.process import group_alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(owner: int, pgid: int, poll_s: float = 0.5, grace_s: float = 10.0) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the owner's business
    while group_alive(pgid):
        # Re-parented (our parent was the owner) or gone: the owner died without stopping us.
        if os.getppid() != owner or not _alive(owner):
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                return 0
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and group_alive(pgid):
                time.sleep(0.2)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return 0
        time.sleep(poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
