"""The exit status of ``python -m orchestrator``: what a script needs to know of the sweep.

=====  ==========================================================================
0      every trial FINISHED or was SKIPPED with a reason (and a race, if any, decided)
2      bad input: a config or file error, before anything started (Hydra's own refusals too)
3      a trial FAILED (or a race's repeat of one)
4      the verdict is undecided after the race's budget (the sweep asked to decide)
130    interrupted (Ctrl-C, SIGTERM): trials and servers were stopped
=====  ==========================================================================

A failed trial outranks an undecided verdict. Several sweeps in one process (a search's
batches) keep the most serious status."""

from __future__ import annotations

OK, BAD_INPUT, TRIAL_FAILED, UNDECIDED, INTERRUPTED = 0, 2, 3, 4, 130
_WHY = {TRIAL_FAILED: "a trial FAILED", UNDECIDED: "the verdict is undecided after the race's budget"}
_RANK = (TRIAL_FAILED, UNDECIDED)  # most serious first

_seen: set[int] = set()
_reached: list[bool] = [False]  # the orchestrator's own code took over from Hydra's composition


def reached() -> None:
    """The command's config composed: what fails from here is the orchestrator's to say."""
    _reached[0] = True


def composed() -> bool:
    """Whether Hydra got as far as handing the composed config over (False: Hydra itself
    refused the command line, a typo in a key or a group option, with exit code 1)."""
    return _reached[0]


def note(status: int) -> None:
    """Record a status of the sweep running in this process."""
    _seen.add(status)


def exit_status() -> tuple[int, str]:
    """The most serious status noted (0 when none), and why in words."""
    for status in _RANK:
        if status in _seen:
            return status, _WHY[status]
    return OK, ""


def reset() -> None:
    _seen.clear()
    _reached[0] = False


def minutes(seconds: float) -> str:
    """A duration as the product's lines write it: ``3m05s``."""
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
