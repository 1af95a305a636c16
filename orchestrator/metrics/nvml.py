"""The one module that opens NVML (nvidia-ml-py's ``pynvml``): a session, a device's handle as
``CUDA_VISIBLE_DEVICES`` names it, its text values and how its power reading averages. Every
reader of the GPUs goes through it: telemetry (:class:`orchestrator.metrics.probes.NvmlProbe`), the
memory monitor, the host record, GPU detection (:mod:`orchestrator.perf.gpus`), the clean-slate
check (:mod:`orchestrator.trial.machine`) and the GPU self-check (:mod:`orchestrator.gpu_check`).
It lives at the metrics layer, the lowest that reads the GPUs (telemetry), so that perf/ and the
trial read through the same module."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


def open_session() -> Any:
    """``pynvml``, initialised: the caller ends the session (``nvmlShutdown``). Raises ImportError
    without nvidia-ml-py and pynvml's ``NVMLError`` without a driver."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


@contextmanager
def session() -> Iterator[Any]:
    """``pynvml`` initialised for the block, shut down after it (errors as :func:`open_session`)."""
    nv = open_session()
    try:
        yield nv
    finally:
        nv.nvmlShutdown()


def handle(nv: Any, device: str | int) -> Any:
    """NVML's handle of one device as given: a ``GPU-``/``MIG-`` UUID or an index."""
    device = str(device)
    if device.startswith(("GPU-", "MIG-")):
        return nv.nvmlDeviceGetHandleByUUID(device)
    return nv.nvmlDeviceGetHandleByIndex(int(device))


def text(x: bytes | str) -> str:
    """A name, UUID or version as NVML returns it (bytes in older bindings)."""
    return x.decode() if isinstance(x, bytes) else x


def power_window_s(nv: Any, h: Any) -> float:
    """Seconds NVML's power reading averages over: 1 on Ampere (GA100 excepted) and later GPUs,
    0 (an instant reading) on GA100 (compute capability 8.0) and older (NVML's
    ``nvmlDeviceGetPowerUsage``); 1 when the capability cannot be read."""
    try:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
    except Exception:  # an NVML too old for the call, or a device that does not answer it
        return 1.0
    return 1.0 if (major, minor) >= (8, 6) else 0.0


def visible_devices(gpu_ids: Sequence[int | str], env: Mapping[str, str] | None = None) -> list[str]:
    """The trial's GPUs as NVML identifies them: the entries of the ``CUDA_VISIBLE_DEVICES`` it was
    given (indices or ``GPU-``/``MIG-`` UUIDs), else Ray's GPU ids."""
    given = [x.strip() for x in ((os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES") or "").split(",")]
    given = [x for x in given if x]
    return given or [str(g) for g in gpu_ids]
