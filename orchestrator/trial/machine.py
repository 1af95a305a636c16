"""What runs on the machine and what it holds, read with psutil and NVML for the clean slate
(:mod:`orchestrator.trial.slate`): server processes left by earlier trials, engine servers this
sweep did not start, what holds a port, the largest processes (each a :class:`Leftover`), and the
memory in use of the machine and of each GPU."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from orchestrator.engines.owner import SERVER_OWNER_ENV, owner_alive
from orchestrator.engines.ports import port_is_free
from orchestrator.engines.process import running_groups
from orchestrator.metrics import nvml

GB = 1e9


@dataclass(frozen=True)
class Leftover:
    """Something that should not be there: a process (or what holds a port or a GPU).
    ``ours``: a server process of an earlier trial (safe to kill), not someone else's."""

    pid: int | None
    command: str
    memory_gb: float | None
    why: str
    ours: bool = False

    def describe(self) -> str:
        mem = "" if self.memory_gb is None else f", {self.memory_gb:.2f} GB"
        who = "pid ?" if self.pid is None else f"pid {self.pid}"
        return f"{who} ({self.command}{mem}): {self.why}"


def _command(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "?"
    return cmd if len(cmd) <= 160 else cmd[:157] + "..."


def _rss_gb(proc: psutil.Process) -> float | None:
    try:
        return float(proc.memory_info().rss) / GB
    except psutil.Error:
        return None


def _private_gb(proc: psutil.Process) -> float:
    """Memory of the process's own (RSS less its shared, file-backed pages, which the machine's
    available memory counts as cache already and which forked processes share)."""
    try:
        info = proc.memory_info()
    except psutil.Error:
        return 0.0
    return float(info.rss - getattr(info, "shared", 0)) / GB


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def engine_processes() -> tuple[list[Leftover], float, int]:
    """Marked server processes that are leftovers; the memory (GB) of the marked ones that
    legitimately run (this worker's running servers, concurrent trials' servers); and how many
    of those belong to other workers."""
    me, running = os.getpid(), running_groups()
    leftovers: list[Leftover] = []
    running_gb, others = 0.0, 0
    alive: dict[str, tuple[int | None, bool]] = {}  # per mark: one look at its owner per call
    for proc in psutil.process_iter():
        try:
            mark = proc.environ().get(SERVER_OWNER_ENV)
            if not mark or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            pgid = os.getpgid(proc.pid)
        except (psutil.Error, OSError):
            continue
        owner, owner_runs = alive.setdefault(mark, owner_alive(mark))
        if owner_runs and (owner != me or pgid in running):
            running_gb += _private_gb(proc)
            others += owner != me
            continue
        why = (
            "a server process of an earlier trial of this worker, alive after its stop"
            if owner_runs
            else f"a server process of an earlier trial whose worker ({'pid ' + str(owner) if owner else 'unknown'}) "
            "has exited"
        )
        leftovers.append(Leftover(proc.pid, _command(proc), _rss_gb(proc), why, ours=True))
    return leftovers, running_gb, others


# Command lines (or process titles) of engine servers and their workers: an unmarked one is a
# server somebody else started on this machine (by hand, another tool, another user).
ENGINE_COMMANDS = (
    "vllm.entrypoints",
    "vllm serve",
    "VLLM::",
    "sglang.launch_server",
    "sglang::",
    "sglang_router.launch_router",
    "sglang.srt.",
)


def is_engine(command: str) -> bool:
    return any(m in command for m in ENGINE_COMMANDS)


def _listening_ports(proc: psutil.Process) -> list[int]:
    try:
        return sorted({c.laddr.port for c in proc.net_connections("tcp") if c.status == "LISTEN" and c.laddr})
    except psutil.Error:
        return []


def unmarked_engines() -> list[Leftover]:
    """Engine servers running on this machine that no trial of ours started (no owner mark): one
    entry per server (the topmost matching process), its whole tree's memory, its listening
    ports and its average CPU since it started."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or not is_engine(" ".join(proc.cmdline()) or proc.name()):
                continue
        except psutil.Error:
            continue
        try:
            if SERVER_OWNER_ENV in proc.environ():
                continue
        except psutil.AccessDenied:  # another user's process: never one of ours (we run ours as us)
            pass
        except psutil.Error:
            continue
        found[proc.pid] = proc
    out = []
    for pid, proc in found.items():
        try:
            if proc.ppid() in found:  # a worker of a server already listed
                continue
            family = [proc, *proc.children(recursive=True)]
            cpu = sum(sum(p.cpu_times()[:2]) for p in family)
            age = max(time.time() - proc.create_time(), 1e-3)
        except psutil.Error:
            continue
        rss = sum(_rss_gb(p) or 0.0 for p in family)
        own = sorted(set(_listening_ports(proc)))  # the server's own (its API) first, its workers' after
        ports = own + sorted({port for p in family[1:] for port in _listening_ports(p)} - set(own))
        shown = ", ".join(map(str, ports[:3])) + (f" and {len(ports) - 3} more" if len(ports) > 3 else "")
        where = f"listening on port {shown}" if ports else "no listening port"
        why = (
            f"an engine server this sweep did not start (no owner mark; {where}; {cpu / age:.2f} cores on "
            "average since it started): it shares the machine with the measurement. Stop it, or set "
            "platform.slate.other_engines=ignore to measure beside it"
        )
        out.append(Leftover(pid, _command(proc), rss, why))
    return out


def port_holders(host: str, port: int) -> list[Leftover]:
    """What listens on ``host:port`` (empty when the port is free)."""
    if port_is_free(host, port):
        return []
    why = f"holds port {port}, the trial's engine.port"
    try:
        pids = {
            c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.status == "LISTEN"
        }
    except psutil.Error:
        pids = set()
    holders = []
    for pid in sorted(pids, key=lambda p: -1 if p is None else p):
        proc = _process(pid) if pid is not None else None
        cmd = _command(proc) if proc else "not visible to this user"
        holders.append(Leftover(pid, cmd, _rss_gb(proc) if proc else None, why))
    return holders or [Leftover(None, "not visible to this user", None, why)]


def gpu_reading(devices: Sequence[str]) -> tuple[dict[str, float], list[Leftover], str | None]:
    """Memory in use (GB) of each GPU as given (index or UUID), the compute processes on them,
    and what NVML could not say. This process and its children are not leftovers (a CUDA
    context of the checking process, seen on an H100); a process NVML lists that this one
    cannot see (another pid namespace: a container) is counted in the note, its memory left to
    the memory check."""
    try:
        nv = nvml.open_session()
    except Exception as exc:  # no NVML (no driver, no library): nothing to read
        return {}, [], f"not checked: NVML unavailable ({type(exc).__name__}: {exc})"
    used: dict[str, float] = {}
    leftovers: list[Leftover] = []
    unseen: list[float | None] = []
    ours = own_processes()
    try:
        for d in devices:
            h = nvml.handle(nv, d)
            used[d] = float(nv.nvmlDeviceGetMemoryInfo(h).used) / GB
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                mem = getattr(p, "usedGpuMemory", None)
                gb = None if mem is None else float(mem) / GB
                if p.pid in ours:
                    continue
                proc = _process(p.pid)
                if proc is None:
                    unseen.append(gb)
                    continue
                leftovers.append(
                    Leftover(p.pid, _command(proc), gb, f"a compute process on GPU {d}, one of the trial's")
                )
    except Exception as exc:
        return used, leftovers, f"not fully checked: {type(exc).__name__}: {exc}"
    finally:
        nv.nvmlShutdown()
    return used, leftovers, unseen_note(unseen)


def own_processes() -> set[int]:
    """This process and its descendants."""
    me = psutil.Process()
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def unseen_note(unseen: Sequence[float | None]) -> str | None:
    """What the slate says of compute processes it cannot see (None: there were none)."""
    if not unseen:
        return None
    held = sum(x for x in unseen if x is not None)
    return (
        f"NVML lists {len(unseen)} compute process(es) this process cannot see (another pid namespace, "
        f"e.g. a container), holding {held:.2f} GB: judged by each GPU's memory in use only"
    )


def machine_used_gb(running_gb: float) -> float:
    """The machine's memory in use (total less available), less this process's own memory and
    the running servers': what an earlier trial could have left behind."""
    vm = psutil.virtual_memory()
    return max(0.0, (vm.total - vm.available) / GB - _private_gb(psutil.Process()) - running_gb)


def largest_processes(n: int = 3) -> list[Leftover]:
    """The ``n`` largest processes by RSS other than this one, its children and running servers
    (the likely holders of memory above the baseline)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    sized = []
    for proc in psutil.process_iter():
        if proc.pid in mine:
            continue
        try:
            if SERVER_OWNER_ENV in proc.environ():  # a running server (a leftover is named already)
                continue
        except psutil.Error:
            pass
        rss = _rss_gb(proc)
        if rss:
            sized.append((rss, proc))
    sized.sort(key=lambda x: -x[0])
    return [Leftover(p.pid, _command(p), rss, "one of the largest processes") for rss, p in sized[:n]]
