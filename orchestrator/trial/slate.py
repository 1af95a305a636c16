"""A clean slate before a trial starts its servers.

On a shared node the classic silent failure is a previous trial's engine that lingers: it holds
memory (or a GPU, or the port), and the next trial measures a different machine. So before each
server start the trial waits, up to ``platform.slate.wait_s``, until:

- no engine process of an earlier trial is alive: every process a :class:`ServerProcess` starts,
  and everything it forks, carries its owner in ``SERVER_OWNER_ENV``; a marked process whose
  owner has exited, or whose owner is this worker but which is not one of its running servers,
  is a leftover (a concurrent trial's running server is not);
- no engine server runs that this sweep did not start (a vLLM or SGLang server found by its command
  line without an owner mark: somebody else's, sharing the machine; ``platform.slate.other_engines``);
- the trial's configured port is free;
- the machine's memory in use (less this worker and the running servers of concurrent trials) is
  within a margin of its idle baseline: the lowest clean reading this worker has seen;
- on GPUs: no compute process on the trial's GPUs, and each one's memory in use (NVML) within a
  margin of its idle reading.

If not, the trial fails with every leftover named (pid, command, memory) instead of measuring.
The reading is recorded on the trial's result (``TrialResult.slate``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from orchestrator.config.errors import TrialError
from orchestrator.config.logs import Progress
from orchestrator.config.schema import LaunchedEngineSpec, SlateSpec, TrialSpec
from orchestrator.engines.process import SERVER_OWNER_ENV, owner_alive, port_is_free, running_groups
from orchestrator.metrics.probes import nvml_handle, visible_devices

GB = 1e9
POLL_S = 0.5

# The lowest clean reading this process has seen: "cpu" (the machine's memory in use, GB) and
# one entry per GPU (its memory in use, GB). A worker's first clean reading starts it.
_BASELINE: dict[str, float] = {}


class DirtySlateError(TrialError):
    """The machine was not back at its idle baseline within ``platform.slate.wait_s``."""


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


@dataclass
class Reading:
    """One look at the machine."""

    leftovers: list[Leftover] = field(default_factory=list)
    cpu_used_gb: float = 0.0  # the machine's memory in use, less this process and running servers
    gpu_used_gb: dict[str, float] = field(default_factory=dict)  # per GPU (as given), NVML
    notes: dict[str, str] = field(default_factory=dict)
    others_running: int = 0  # processes of other trials' running servers (their memory is left out)


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
    and why not when NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no NVML (no driver, no library): nothing to read
        return {}, [], f"not checked: NVML unavailable ({type(exc).__name__}: {exc})"
    used: dict[str, float] = {}
    leftovers: list[Leftover] = []
    try:
        for d in devices:
            h = nvml_handle(pynvml, d)
            used[d] = float(pynvml.nvmlDeviceGetMemoryInfo(h).used) / GB
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                mem = getattr(p, "usedGpuMemory", None)
                proc = _process(p.pid)  # (NVML gives host pids: in a container, not ours to name)
                leftovers.append(
                    Leftover(
                        p.pid,
                        _command(proc) if proc else "not visible here (another container?)",
                        None if mem is None else float(mem) / GB,
                        f"a compute process on GPU {d}, one of the trial's",
                    )
                )
    except Exception as exc:
        return used, leftovers, f"not fully checked: {type(exc).__name__}: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return used, leftovers, None


def machine_used_gb(running_gb: float) -> float:
    """The machine's memory in use (total less available), less this process's own memory and
    the running servers': what an earlier trial could have left behind."""
    vm = psutil.virtual_memory()
    return max(0.0, (vm.total - vm.available) / GB - _private_gb(psutil.Process()) - running_gb)


def read(ports: Sequence[tuple[str, int]], devices: Sequence[str], other_engines: bool = True) -> Reading:
    """One look: leftover engine processes (and, with ``other_engines``, engine servers somebody
    else started), port holders, machine memory, the GPUs."""
    leftovers, running_gb, others = engine_processes()
    if other_engines:
        leftovers += unmarked_engines()
    reading = Reading(leftovers=leftovers, cpu_used_gb=machine_used_gb(running_gb), others_running=others)
    for host, port in ports:
        reading.leftovers.extend(port_holders(host, port))
    if devices:
        reading.gpu_used_gb, on_gpus, note = gpu_reading(devices)
        reading.leftovers.extend(on_gpus)
        if note:
            reading.notes["gpu"] = note
    return reading


def memory_margin_gb(spec: SlateSpec) -> float:
    if spec.memory_margin_gb is not None:
        return spec.memory_margin_gb
    return max(2.0, 0.1 * psutil.virtual_memory().total / GB)


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


def problems(reading: Reading, spec: SlateSpec, baseline: dict[str, float]) -> list[str]:
    """What keeps ``reading`` from being a clean slate, in words (empty: clean)."""
    out = [x.describe() for x in reading.leftovers]
    margin = memory_margin_gb(spec)
    base = baseline.get("cpu")
    if base is not None and reading.cpu_used_gb > base + margin:
        out.append(
            f"the machine's memory in use is {reading.cpu_used_gb:.2f} GB, more than its idle baseline "
            f"{base:.2f} GB + {margin:.2f} GB (platform.slate.memory_margin_gb)"
        )
    for d, used in reading.gpu_used_gb.items():
        gbase = baseline.get(f"gpu:{d}")
        if gbase is not None and used > gbase + spec.gpu_memory_margin_gb:
            out.append(
                f"GPU {d} has {used:.2f} GB in use, more than its idle baseline {gbase:.2f} GB + "
                f"{spec.gpu_memory_margin_gb:.2f} GB (platform.slate.gpu_memory_margin_gb)"
            )
    return out


def settle_baseline(reading: Reading, baseline: dict[str, float]) -> None:
    """A clean reading lowers (or starts) the idle baseline: the machine's only while no other
    trial's server runs (their clients and caches move it), each GPU's always (they are ours)."""
    if not reading.others_running or "cpu" not in baseline:
        baseline["cpu"] = min(baseline.get("cpu", reading.cpu_used_gb), reading.cpu_used_gb)
    for d, used in reading.gpu_used_gb.items():
        baseline[f"gpu:{d}"] = min(baseline.get(f"gpu:{d}", used), used)


def trial_ports(spec: TrialSpec) -> list[tuple[str, int]]:
    """The fixed ports the trial's servers will bind (free ones are picked at start)."""
    engine = spec.engine
    return [(engine.host, engine.port)] if isinstance(engine, LaunchedEngineSpec) and engine.port else []


def trial_devices(spec: TrialSpec, gpu_ids: Sequence[int]) -> list[str]:
    return visible_devices(list(gpu_ids)) if spec.platform.device == "cuda" and gpu_ids else []


def wait_for_clean_slate(
    spec: TrialSpec,
    gpu_ids: Sequence[int],
    say: Progress,
    look: Callable[[], Reading] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait until the machine is a clean slate for ``spec``'s servers, at most
    ``platform.slate.wait_s``; raise :class:`DirtySlateError` naming what is left. Returns the
    reading and the baseline, for the trial's result."""
    slate = spec.platform.slate
    if not slate.check or not isinstance(spec.engine, LaunchedEngineSpec):
        return {"checked": False}
    ports, devices = trial_ports(spec), trial_devices(spec, gpu_ids)
    look = look or (lambda: read(ports, devices, slate.other_engines == "wait"))
    t0 = clock()
    announced = False
    while True:
        reading = look()
        dirty = problems(reading, slate, _BASELINE)
        if not dirty:
            break
        waited = clock() - t0
        if waited >= slate.wait_s:
            extra = largest_processes() if any("memory in use" in d for d in dirty) else []
            advice = (
                "Stop what is left (a server of an earlier trial is safe to kill)"
                if any(x.ours for x in reading.leftovers)
                else "Stop what is left"
            )
            raise DirtySlateError(
                f"not a clean slate after {waited:.0f} s (platform.slate.wait_s={slate.wait_s:g}), so the trial "
                "was not measured: "
                + "; ".join(dirty + [x.describe() for x in extra])
                + f". {advice}, or set platform.slate.check=false to measure anyway"
            )
        if not announced:
            say(f"waiting up to {slate.wait_s:g}s for a clean slate: {dirty[0]}")
            announced = True
        sleep(POLL_S)
    settle_baseline(reading, _BASELINE)
    out: dict[str, Any] = {
        "checked": True,
        "waited_s": round(clock() - t0, 3),
        "cpu_mem_used_gb": round(reading.cpu_used_gb, 3),
        "cpu_mem_baseline_gb": round(_BASELINE["cpu"], 3),
        "cpu_mem_margin_gb": round(memory_margin_gb(slate), 3),
    }
    for k, (d, used) in enumerate(reading.gpu_used_gb.items()):
        out[f"gpu{k}_mem_used_gb"] = round(used, 3)
        out[f"gpu{k}_mem_baseline_gb"] = round(_BASELINE[f"gpu:{d}"], 3)
    out.update({f"note_{k}": v for k, v in reading.notes.items()})
    if announced:
        say(f"clean slate after {out['waited_s']:.1f}s")
    return out
