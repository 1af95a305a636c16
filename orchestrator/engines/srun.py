"""Servers started through ``srun`` (``engine.launch_prefix=[srun, ...]``): each runs in a Slurm job
step of its own name, so a step whose srun was KILLed can still be found and cancelled."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from collections.abc import Sequence

log = logging.getLogger(__name__)


def slurm_step_argv(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """A server started through ``srun`` (``engine.launch_prefix=[srun, ...]``) runs in a Slurm job
    step, maybe on another node. Its argv gets a step name of its own (``--job-name=il-...``, first
    after srun: a name the prefix sets itself comes later and wins, and then the step is not
    found by name), so a step whose srun was KILLed can still be cancelled. Other argv: as is."""
    if not argv or os.path.basename(argv[0]) != "srun":
        return list(argv), None
    name = f"il-server-{uuid.uuid4().hex[:12]}"
    return [argv[0], f"--job-name={name}", *argv[1:]], name


def cancel_slurm_step(name: str) -> list[str]:
    """Cancel the Slurm job (srun made one of its own) or else the steps named ``name`` that still
    run, and return their ids. A KILLed srun (Ray killing a dead worker's children, the OOM
    killer) leaves its step running: measured
    on the local Slurm of ``make test-slurm``, the step of a KILLed srun still ran 60 s later,
    holding what the engine held. srun given TERM cancels its step itself (under a second)."""
    steps: list[str] = []
    # a job of that name first: srun outside an allocation made one of its own, which the dead srun
    # still holds once its step is gone; inside one (an sbatch sweep), only the step has the name
    # (a job already COMPLETING, as after srun's own stop, is not listed: nothing to cancel)
    jobs = ["squeue", "-h", "-n", name, "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING", "-o", "%i %j"]
    for listing in (jobs, ["squeue", "-h", "-s", "-n", name, "-o", "%i %j"]):
        try:
            listed = subprocess.run(listing, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not list the Slurm steps to cancel %s: %s", name, exc)
            return []
        if listed.returncode != 0:
            log.warning("could not list the Slurm steps to cancel %s: %s", name, listed.stderr.strip()[-300:])
            return []
        steps += [line.split()[0] for line in listed.stdout.splitlines() if line.split()[1:] == [name]]
        if steps:
            break
    for step in steps:
        try:
            subprocess.run(["scancel", step], capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not cancel Slurm step %s (%s): %s", step, name, exc)
    return steps
