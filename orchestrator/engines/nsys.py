"""Nsight Systems as an opt-in wrapper of the engine servers (``profile.nsys``, GPUs only).

The server runs as ``[*launch_prefix, nsys, profile, ..., interpreter, -m, module, ...]``: nsys
runs where the server runs (inside the container when there is a launch prefix) and captures
only between the engine's cudaProfilerStart and cudaProfilerStop, which the trial's profile
window triggers through the engine's start/stop profile endpoints. The report is written when
the server exits, so the server gets ``stop_grace_s`` to stop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import LaunchedEngineSpec, NsysSpec, TrialSpec

REPORT_SUFFIX = ".nsys-rep"


def nsys_of(spec: TrialSpec) -> NsysSpec | None:
    return spec.profile.nsys if spec.profile is not None else None


def wrapper(nsys: NsysSpec, trace_dir: str, server: str) -> list[str]:
    """``nsys profile ...`` in front of one server's interpreter; its report is
    ``<trace_dir>/nsys-<server>.nsys-rep``."""
    return [
        nsys.path,
        "profile",
        f"--output={trace_dir}/nsys-{server}",
        "--force-overwrite=true",
        f"--trace={','.join(nsys.trace)}",
        f"--cuda-graph-trace={nsys.cuda_graph_trace}",
        "--trace-fork-before-exec=true",  # the engine core and workers are forked/spawned processes
        "--capture-range=cudaProfilerApi",  # only between the window's start and stop
        "--capture-range-end=stop",
        *nsys.args,
    ]


def _prefix(spec: TrialSpec) -> list[str]:
    engine = spec.engine
    return [str(a) for a in engine.launch_prefix] if isinstance(engine, LaunchedEngineSpec) else []


def missing_on_host(spec: TrialSpec) -> str | None:
    """Why nsys cannot run the trial's servers on this host, or None. Behind a launch prefix the
    servers run in a container: :func:`check_in_container` asks it, before the servers start."""
    nsys = nsys_of(spec)
    if nsys is None or _prefix(spec) or spec.platform.device != "cuda":  # not on GPUs: SKIPPED (feasibility)
        return None
    found = shutil.which(nsys.path) if os.sep not in nsys.path else (nsys.path if Path(nsys.path).exists() else None)
    if found is None:
        return (
            f"profile.nsys: '{nsys.path}' was not found (PATH={os.environ.get('PATH', '')}); install Nsight "
            "Systems or set profile.nsys.path to its nsys"
        )
    return None


def check_in_container(spec: TrialSpec, timeout_s: float = 300.0) -> None:
    """Behind a launch prefix, run ``[*prefix, nsys, --version]`` once before the servers start;
    a ConfigError naming profile.nsys when it fails."""
    nsys, prefix = nsys_of(spec), _prefix(spec)
    if nsys is None or not prefix or spec.platform.device != "cuda":
        return
    argv = [*prefix, nsys.path, "--version"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"profile.nsys: {argv} could not run: {exc}") from None
    if proc.returncode != 0:
        raise ConfigError(
            f"profile.nsys: '{nsys.path}' does not run inside engine.launch_prefix ({' '.join(argv)} exited "
            f"{proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}); put Nsight Systems in the "
            "container or set profile.nsys.path"
        )


def unsupported(spec: TrialSpec) -> str | None:
    """Why the platform cannot run nsys for this trial (it is then SKIPPED), or None."""
    if nsys_of(spec) is not None and spec.platform.device != "cuda":
        return (
            f"profile.nsys traces CUDA kernels and needs GPUs (platform.device=cuda); this trial runs on "
            f"'{spec.platform.device}': use the torch profiler there (profile without nsys)"
        )
    return None
