"""What a subprocess's log says went wrong (engines, lm-eval, routers): its exception lines, the
one line that names the cause, and its last lines, for error messages.

An error message built from a log puts the cause on its first line: consoles, progress lines
and status tables show only that line (``ValueError: Tasks not found: addition``, not
``lm-eval exited with 1; log tail:``).

Also the one progress printer of sweeps and trials (:data:`Progress`, :func:`print_progress`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

TAIL_LINES = 30

Progress = Callable[[str], None]
"""Where progress lines go: one line per trial event and per load point."""


def print_progress(msg: str) -> None:
    """The default :data:`Progress`: the console, at once."""
    print(msg, flush=True)


def mark(label: str) -> None:
    """With ``INFERENCE_LAB_TIMING=1``: ``[timing] <label> at <t>`` on stderr, ``t`` on the
    machine's monotonic clock (shared by every process: driver, Ray workers, the benchmark that
    started them). ``benchmarks/quick_start.py`` reads these to say where a start's seconds go."""
    if os.environ.get("INFERENCE_LAB_TIMING"):
        import sys
        import time

        print(f"[timing] {label} at {time.perf_counter():.3f}", file=sys.stderr, flush=True)


# An exception line, possibly behind a log prefix like "(Worker pid=7) ERROR 11-22 09:23:13 [x.py:1] ".
_EXC_LINE = re.compile(
    r"^(?:\(.*?\)\s+)?(?:[A-Z]+\s+[\d-]+\s+[\d:]+\s+\[[^\]]*\]\s+)?"
    r"((?:[A-Za-z_][\w.]*)?(?:Error|Exception)(?::|\s*\().*)$"
)
# Lines that only point elsewhere ("see root cause above"): a cause is looked for before them.
_WRAPPERS = re.compile(
    r"root cause|see stack trace|EngineDeadError|Engine core initialization failed"
    r"|EngineGenerateError",
    re.IGNORECASE,
)


def tail(path: Path, lines: int = TAIL_LINES) -> str:
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


def exception_lines(text: str, limit: int | None = 6) -> list[str]:
    """Distinct exception lines (``ValueError: ...``) found anywhere in ``text``, in order."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        m = _EXC_LINE.match(line.strip())
        if m and not m.group(1).startswith("Traceback"):
            seen.setdefault(m.group(1)[:500], None)
    found = list(seen)
    return found if limit is None else found[:limit]


def error_lines(path: Path, limit: int = 6) -> list[str]:
    """Distinct exception lines found anywhere in a log file, in order."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return exception_lines(text, limit)


def cause_line(text: str, last: bool = False) -> str | None:
    """The exception line that names the cause: the first one (an engine's root cause, before
    the cascade it triggers) or, with ``last``, the last one (a tool's final raise); lines that
    only point elsewhere ("see root cause above", EngineDeadError) are used only when nothing
    else is there. None if the text holds no exception line."""
    found = exception_lines(text, limit=None)
    real = [x for x in found if not _WRAPPERS.search(x)] or found
    if not real:
        return None
    return real[-1] if last else real[0]


def explain(path: Path, last: bool = False) -> str:
    """A log's cause on the first line, then its distinct errors and its last lines."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"no log at {path}"
    cause = cause_line(text, last)
    errors = exception_lines(text)
    head = ("errors in the log:\n  " + "\n  ".join(errors) + "\n") if errors else ""
    first = cause or (next((x for x in reversed(text.splitlines()) if x.strip()), "") or "the log is empty")
    return f"{first[:500]}\n{head}last log lines ({path}):\n{tail(path)}"


__all__ = ["cause_line", "error_lines", "exception_lines", "explain", "tail"]
