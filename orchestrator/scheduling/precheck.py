"""What every way of sending a sweep elsewhere (SLURM, a Ray job) checks here first: the
sweep as a dry run on this machine (config errors surface now, not after a queue), and the
overrides the submitted driver command adds itself."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.config.paths import PROJECT_ROOT


def reserved_overrides(overrides: list[str]) -> list[str]:
    """Overrides a submitted sweep's driver command adds itself (``-m``, ``cluster.address``)."""
    return [o for o in overrides if o in ("-m", "--multirun") or o.startswith("cluster.address")]


def local_check(overrides: list[str]) -> subprocess.CompletedProcess[str]:
    """The sweep as a dry run on this machine: config errors surface here, not on the cluster."""
    cmd = [sys.executable, "-m", "orchestrator", *overrides, "dry_run=json", "-m"]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)


def plan_line(check: subprocess.CompletedProcess[str]) -> str | None:
    """The dry run's plan of the whole sweep (its last ``{"plan": ...}`` line)."""
    plan = [line for line in check.stdout.splitlines() if line.startswith('{"plan"')]
    return plan[-1] if plan else None
