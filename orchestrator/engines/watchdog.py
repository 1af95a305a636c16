"""Watchdog: ``python -m orchestrator.engines.watchdog OWNER_PID SERVER_PGID [RPC_DIR] [--slurm-step NAME]``.

Runs detached next to an engine server. If the owner process (the one that started the
server) disappears without stopping it, the watchdog TERMs and then KILLs the server's
process group, so no engine is left holding cores or GPUs, and removes the shared-memory
segments the group left (:mod:`orchestrator.engines.shm`) and the server's private folder of
IPC sockets (``RPC_DIR``, :class:`~orchestrator.engines.process.ServerProcess`), and cancels the
Slurm step of a server started through srun (``NAME``: a KILLed srun leaves its step running).
It exits by itself once the group is gone.

It double-forks at start: a supervisor such as a Ray worker kills its *direct* children
when it dies (and so would kill a plain child watchdog along with the server's leader,
orphaning the engine's own worker processes). The owner is recognised by pid and
creation time, so a recycled pid is not mistaken for it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

import psutil

from orchestrator.engines import shm
from orchestrator.engines.procgroup import group_alive, wait_group
from orchestrator.engines.srun import cancel_slurm_step


def started_at(proc: psutil.Process) -> float:
    """When the process started, in seconds since boot: unlike ``create_time()`` (boot time
    + that, with boot time re-read from the wall clock) it does not move when the clock is
    stepped. A VM restore stepped the clock here, the owner looked like a recycled pid, and
    the watchdog killed a healthy server mid-start."""
    try:
        return proc.create_time(monotonic=True)  # psutil >= 7
    except TypeError:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def owner_alive(pid: int, create_time: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(started_at(proc) - create_time) > 0.01:
            return False  # the pid was recycled
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leader_gone(pgid: int) -> bool:
    """The group's leader (the server's first process, pid == pgid) has exited (or is a zombie)."""
    try:
        return psutil.Process(pgid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_group(pgid: int, grace_s: float) -> None:
    """TERM the group, then KILL what is left after ``grace_s``, or ``ORPHAN_GRACE_S`` after the
    leader is gone: a supervisor that kills a dead owner's children (Ray does) takes the API
    server first, and vLLM's EngineCore without it took 9.1 s to exit on TERM here."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_group(pgid, lambda: leader_gone(pgid), grace_s, poll_s=0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(
    owner: int,
    pgid: int,
    poll_s: float = 0.5,
    grace_s: float = 10.0,
    rpc_dir: str | None = None,
    slurm_step: str | None = None,
) -> int:
    try:
        owner_created: float | None = started_at(psutil.Process(owner))
    except psutil.Error:
        owner_created = None
    while group_alive(pgid):
        if not owner_alive(owner, owner_created):
            segments = shm.held_by_group(pgid)
            kill_group(pgid, grace_s)
            if slurm_step:  # behind srun: a step whose srun was KILLed runs on without it
                cancel_slurm_step(slurm_step)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and group_alive(pgid):
                time.sleep(0.1)
            if not group_alive(pgid):
                shm.remove_unused(segments)  # its owner, which would have, is gone
                if rpc_dir:
                    shutil.rmtree(rpc_dir, ignore_errors=True)
            return 0
        time.sleep(poll_s)
    if slurm_step and not owner_alive(owner, owner_created):  # its srun KILLed with its owner (Ray does)
        cancel_slurm_step(slurm_step)
    return 0


def main(argv: list[str]) -> int:
    args = list(argv[1:])
    slurm_step = None
    if "--slurm-step" in args:
        at = args.index("--slurm-step")
        slurm_step = args[at + 1]
        del args[at : at + 2]
    owner, pgid = int(args[0]), int(args[1])
    rpc_dir = args[2] if len(args) > 2 else None
    if os.fork() > 0:  # detach: the first child exits, the grandchild watches
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the owner's business
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return watch(owner, pgid, rpc_dir=rpc_dir, slurm_step=slurm_step)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
