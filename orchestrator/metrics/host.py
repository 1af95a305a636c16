"""A short description of the machine a trial ran on (CPU model, cores, memory, GPUs)."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

import psutil

from orchestrator.metrics import nvml


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_names(indices: list[int]) -> list[str]:
    try:
        with nvml.session() as nv:
            return [nvml.text(nv.nvmlDeviceGetName(nvml.handle(nv, i))) for i in indices]
    except Exception:  # no NVML, no GPU: nothing to name
        return []


def describe(gpu_indices: list[int] | None = None) -> dict[str, Any]:
    gpus = gpu_names(gpu_indices or [])
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "gpus": gpus,
        "gpu_count": len(gpu_indices or []),
        "summary": f"{len(gpus)}x {gpus[0]}"
        if gpus
        else f"{len(gpu_indices)}x GPU (name unreadable: NVML failed)"
        if gpu_indices
        else f"cpu:{os.cpu_count()}x {cpu_model()}",
    }
