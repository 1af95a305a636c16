"""Shared-memory segments a killed engine server leaves in ``/dev/shm``.

vLLM's processes talk through ``multiprocessing.shared_memory`` buffers (``psm_*``, 160 and
240 MB each here: the executor's ``MessageQueue``). The creator unlinks them when it exits, or
Python's resource tracker does after it; when the server's process group is KILLed (it
ignored TERM, the watchdog stopped it after its owner died, a fault test), the tracker dies
with it and the segments stay until the machine reboots: 28 of them were found here after a
day of test runs. What an engine wrote into one stays in RAM (tmpfs), and vLLM refuses to
start when ``/dev/shm`` is short (``check_shm_free_space``).

:func:`mark` is taken when a server starts; :func:`remove_left` after its process group is
gone removes the ``psm_*`` segments created since then, owned by this user, that no live
process maps or holds open (a concurrent server's segments are mapped by it, so they stay).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "psm_"  # multiprocessing.shared_memory's names
MIN_AGE_S = 1.0  # a segment younger than this may be between its shm_open and its mmap


@dataclass(frozen=True)
class ShmMark:
    names: frozenset[str]  # the segments that existed when the server started
    since: float  # wall clock, seconds: segments changed before this are not the server's


@dataclass(frozen=True)
class Removed:
    name: str
    resident_bytes: int  # the pages it held (sparse segments hold few)


def _segments(shm_dir: Path) -> list[str]:
    try:
        return [n for n in os.listdir(shm_dir) if n.startswith(PREFIX)]
    except OSError:  # no /dev/shm (not Linux): nothing to look after
        return []


def mark(shm_dir: Path = SHM_DIR) -> ShmMark:
    return ShmMark(frozenset(_segments(shm_dir)), time.time())


def in_use(shm_dir: Path = SHM_DIR) -> set[str]:
    """Names of the segments in ``shm_dir`` that a live process maps or holds open."""
    used: set[str] = set()
    prefix = f"{shm_dir}/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at + len(prefix) :].split()[0])
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix):
                        used.add(target[len(prefix) :].split()[0])
    return used


def remove_left(start: ShmMark, shm_dir: Path = SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[Removed]:
    """Remove the segments created since ``start`` that nothing uses any more; returns them."""
    uid = os.getuid()
    candidates: dict[str, os.stat_result] = {}
    for name in _segments(shm_dir):
        if name in start.names:
            continue
        with contextlib.suppress(OSError):
            st = os.stat(shm_dir / name)
            if st.st_uid == uid and st.st_ctime >= start.since - 1:
                candidates[name] = st
    if not candidates:
        return []
    youngest = time.time() - max(st.st_ctime for st in candidates.values())
    if youngest < min_age_s:  # another process may be between creating it and mapping it
        time.sleep(min_age_s - youngest)
    used = in_use(shm_dir)
    removed = []
    for name, st in sorted(candidates.items()):
        if name in used:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(shm_dir / name)
            removed.append(Removed(name, st.st_blocks * 512))
    return removed


def describe(removed: list[Removed]) -> str:
    resident = sum(r.resident_bytes for r in removed) / 1e6
    names = ", ".join(r.name for r in removed)
    return f"{len(removed)} shared-memory segment(s) left in {SHM_DIR} ({names}; {resident:.1f} MB in RAM)"
