"""Shared-memory segments a killed engine server leaves in ``/dev/shm``.

vLLM's processes talk through ``multiprocessing.shared_memory`` buffers (``psm_*``, 160 and
240 MB each here: the executor's ``MessageQueue``). The creator unlinks them when it exits, or
Python's resource tracker does after it; when the server's process group is KILLed (it
ignored TERM, the watchdog stopped it after its owner died, a fault test), the tracker dies
with it and the segments stay until the machine reboots: 29 of them were found here after a
day of test runs. What an engine wrote into one stays in RAM (tmpfs), and vLLM refuses to
start when ``/dev/shm`` is short (``check_shm_free_space``).

:func:`held_by_group` is read while the server's processes are alive, before they are
signalled; :func:`remove_unused` once the group is gone unlinks those of the segments that no
live process maps or holds open any more. Only segments the server's own processes had mapped
are ever considered: another program's, or another server's, are never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "psm_"  # multiprocessing.shared_memory's names


@dataclass(frozen=True)
class Removed:
    name: str
    resident_bytes: int  # the pages it held (sparse segments hold few)


def _pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                yield int(entry)


def _segments_of(pid: int, shm_dir: Path) -> set[str]:
    """The ``psm_*`` segments in ``shm_dir`` that process ``pid`` maps or holds open."""
    found: set[str] = set()
    prefix = f"{shm_dir}/{PREFIX}"
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                at = line.find(prefix)
                if at >= 0:
                    found.add(line[at + len(prefix) - len(PREFIX) :].split()[0])
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    found.add(target[len(prefix) - len(PREFIX) :].split()[0])
    return found


def held_by_group(pgid: int, shm_dir: Path = SHM_DIR) -> set[str]:
    """The segments the processes of group ``pgid`` map or hold open now."""
    held: set[str] = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                held |= _segments_of(pid, shm_dir)
    return held


def in_use(shm_dir: Path = SHM_DIR) -> set[str]:
    """The segments any live process maps or holds open."""
    used: set[str] = set()
    for pid in _pids():
        used |= _segments_of(pid, shm_dir)
    return used


def remove_unused(names: Iterable[str], shm_dir: Path = SHM_DIR) -> list[Removed]:
    """Unlink those of ``names`` that still exist and that no live process uses; returns them."""
    left = {n for n in names if (shm_dir / n).exists()}
    if not left:
        return []
    left -= in_use(shm_dir)
    removed = []
    for name in sorted(left):
        with contextlib.suppress(FileNotFoundError):
            resident = os.stat(shm_dir / name).st_blocks * 512
            os.unlink(shm_dir / name)
            removed.append(Removed(name, resident))
    return removed


def describe(removed: list[Removed]) -> str:
    resident = sum(r.resident_bytes for r in removed) / 1e6
    names = ", ".join(r.name for r in removed)
    return f"{len(removed)} shared-memory segment(s) left in {SHM_DIR} ({names}; {resident:.1f} MB in RAM)"
