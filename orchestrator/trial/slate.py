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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from orchestrator.config.errors import TrialError
from orchestrator.config.logs import Progress
from orchestrator.config.schema import SlateSpec, TrialSpec
from orchestrator.metrics.nvml import visible_devices
from orchestrator.trial.machine import (
    GB,
    Leftover,
    engine_processes,
    gpu_reading,
    largest_processes,
    machine_used_gb,
    port_holders,
    unmarked_engines,
)

POLL_S = 0.5

# The lowest clean reading this process has seen: "cpu" (the machine's memory in use, GB) and
# one entry per GPU (its memory in use, GB). A worker's first clean reading starts it.
_BASELINE: dict[str, float] = {}


class DirtySlateError(TrialError):
    """The machine was not back at its idle baseline within ``platform.slate.wait_s``."""


@dataclass
class Reading:
    """One look at the machine."""

    leftovers: list[Leftover] = field(default_factory=list)
    cpu_used_gb: float = 0.0  # the machine's memory in use, less this process and running servers
    gpu_used_gb: dict[str, float] = field(default_factory=dict)  # per GPU (as given), NVML
    notes: dict[str, str] = field(default_factory=dict)
    others_running: int = 0  # processes of other trials' running servers (their memory is left out)


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
    engine = spec.engine.launched
    return [(engine.host, engine.port)] if engine is not None and engine.port else []


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
    if not slate.check or spec.engine.launched is None:
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
