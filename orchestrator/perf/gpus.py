"""GPUs: the table of specifications for feasibility (memory) and the roofline (bandwidth,
peak FLOP/s), the GPUs NVML reports on this node (name, memory, UUID, driver, CUDA capability)
mapped to it, and the GPU a trial is planned for (:func:`gpu_model`).

Dense peak figures without sparsity, from the vendors' data sheets; the A100 row is the
course's spec card (../shared/seeds, week 3). Bandwidth in GB/s, compute in TFLOP/s.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.errors import ConfigError
from orchestrator.metrics import nvml
from orchestrator.metrics.nvml import visible_devices

if TYPE_CHECKING:  # detection needs NVML only (make gpu-check on a bare machine): no pydantic here
    from orchestrator.config.schema import TrialSpec


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gb: float
    bandwidth_gb_s: float
    bf16_tflops: float
    fp8_tflops: float | None = None

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the bf16 compute roof meets the memory roof."""
        return self.bf16_tflops * 1e12 / (self.bandwidth_gb_s * 1e9)


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("A100-40GB", 40, 1555, 312),
        GPUSpec("A100-80GB", 80, 2039, 312),
        GPUSpec("H100-SXM-80GB", 80, 3350, 989, 1979),
        GPUSpec("H100-PCIe-80GB", 80, 2000, 756, 1513),
        GPUSpec("H200-141GB", 141, 4800, 989, 1979),
        GPUSpec("L40S-48GB", 48, 864, 362, 733),
        GPUSpec("L4-24GB", 24, 300, 121, 242),
        GPUSpec("A10G-24GB", 24, 600, 125),
    )
}


def gpu_spec(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"platform.gpu_name: unknown GPU '{name}'; expected one of: {', '.join(GPUS)}") from None


@dataclass(frozen=True)
class DetectedGPU:
    """One GPU as NVML reports it."""

    index: int
    name: str  # NVML's, e.g. "NVIDIA H100 80GB HBM3"
    uuid: str
    memory_gb: float
    capability: str  # CUDA compute capability, e.g. "9.0"
    driver: str

    @property
    def table_name(self) -> str | None:
        return table_name(self.name, self.memory_gb)

    def describe(self) -> str:
        known = self.table_name
        as_known = f" = {known}" if known else " (not in the GPU table: its measured memory and roofs are used)"
        return (
            f"GPU {self.index}: {self.name}{as_known}, {self.memory_gb:.0f} GB, capability {self.capability}, "
            f"driver {self.driver}, {self.uuid}"
        )


# NVML's product names to the GPU table's keys (orchestrator/perf/gpus.py), first match wins.
_NAMES: list[tuple[str, Callable[[float], str | None]]] = [
    (r"\bH200\b", lambda gb: "H200-141GB"),
    (r"\bH100\b.*\bNVL\b", lambda gb: None),  # 94 GB, its own bandwidth: not in the table
    (r"\bH100\b.*\bPCIe\b", lambda gb: "H100-PCIe-80GB"),
    (r"\bH100\b", lambda gb: "H100-SXM-80GB"),  # "H100 80GB HBM3", "H100 SXM5 80GB"
    (r"\bA100\b", lambda gb: "A100-80GB" if gb > 60 else "A100-40GB"),
    (r"\bL40S\b", lambda gb: "L40S-48GB"),
    (r"\bL4\b", lambda gb: "L4-24GB"),
    (r"\bA10G\b", lambda gb: "A10G-24GB"),
]


def table_name(nvml_name: str, memory_gb: float) -> str | None:
    """The GPU table's key for a GPU as NVML names it, or None when the table lacks it."""
    for pattern, pick in _NAMES:
        if re.search(pattern, nvml_name, re.IGNORECASE):
            name = pick(memory_gb)
            return name if name in GPUS else None
    return None


def detect_gpus(devices: Sequence[str] | None = None) -> tuple[list[DetectedGPU], str | None]:
    """The GPUs of this node (``devices``: indices or UUIDs as CUDA_VISIBLE_DEVICES gives them;
    None: all of them), and why none were read (no NVML, no driver)."""
    try:
        nv = nvml.open_session()
    except Exception as exc:
        return [], f"no GPU detected: NVML unavailable ({type(exc).__name__}: {exc})"
    try:
        driver = nvml.text(nv.nvmlSystemGetDriverVersion())
        wanted = list(devices) if devices is not None else [str(i) for i in range(nv.nvmlDeviceGetCount())]
        out = []
        for d in wanted:
            h = nvml.handle(nv, d)
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            out.append(
                DetectedGPU(
                    index=int(nv.nvmlDeviceGetIndex(h)),
                    name=nvml.text(nv.nvmlDeviceGetName(h)),
                    uuid=nvml.text(nv.nvmlDeviceGetUUID(h)),
                    memory_gb=float(nv.nvmlDeviceGetMemoryInfo(h).total) / 1e9,
                    capability=f"{major}.{minor}",
                    driver=driver,
                )
            )
    except Exception as exc:
        return [], f"no GPU detected: NVML failed ({type(exc).__name__}: {exc})"
    finally:
        nv.nvmlShutdown()
    return out, (None if out else "no GPU detected: NVML reports none")


# What ``platform.gpu_name: auto`` plans for where no GPU can be read (a laptop planning a
# GPU sweep, a Ray head without GPUs): the course's GPU, said so in the plan.
AUTO_FALLBACK = "A100-80GB"


@functools.lru_cache(maxsize=4)
def node_gpus(devices: tuple[str, ...] | None = None) -> tuple[tuple[DetectedGPU, ...], str | None]:
    """The GPUs of this node (``devices`` as CUDA_VISIBLE_DEVICES gives them; None: those of
    this process's CUDA_VISIBLE_DEVICES, else all), read once per process."""
    if devices is None:
        devices = tuple(visible_devices([])) or None
    gpus, why = detect_gpus(list(devices) if devices is not None else None)
    return tuple(gpus), why


@dataclass(frozen=True)
class GpuModel:
    """The GPU a trial is planned for: a GPU table key (None: a GPU the table lacks), its
    memory, and where that came from, in words."""

    name: str | None
    memory_gb: float
    source: str
    detected: DetectedGPU | None = None


def gpu_model(spec: TrialSpec) -> GpuModel | None:
    """The GPU the trial is planned for: the configured table name, else (``auto``) the one
    NVML reports on this node, else the course's A100-80GB (said so). None off GPUs."""
    p = spec.platform
    if p.device != "cuda" or not p.gpu_name:
        return None
    if p.gpu_name != "auto":
        return GpuModel(p.gpu_name, gpu_spec(p.gpu_name).memory_gb, "platform.gpu_name")
    gpus, why = node_gpus()
    if gpus:
        g = gpus[0]
        return GpuModel(g.table_name, g.memory_gb, f"detected here: {g.name}", g)
    return GpuModel(AUTO_FALLBACK, gpu_spec(AUTO_FALLBACK).memory_gb, f"{why}; planned for {AUTO_FALLBACK}")


def gpu_mismatch(spec: TrialSpec, devices: Sequence[str] | None = None) -> str | None:
    """Why the configured ``platform.gpu_name`` is not the GPU this node has (None: it is, it is
    ``auto``, or no GPU can be read here)."""
    p = spec.platform
    if p.device != "cuda" or not p.gpu_name or p.gpu_name == "auto":
        return None
    gpus, _ = node_gpus(tuple(devices) if devices is not None else None)
    for g in gpus:
        if g.table_name != p.gpu_name:
            known = g.table_name or "not in the GPU table"
            return (
                f"platform.gpu_name is {p.gpu_name} but GPU {g.index} here is {g.name} ({known}, "
                f"{g.memory_gb:.0f} GB): feasibility and the roofline floors would be the {p.gpu_name}'s. "
                "Set platform.gpu_name=auto to use this GPU, or platform.gpu_name_check=warn to plan for "
                "another GPU on purpose"
            )
    return None


def gpu_memory_gb(spec: TrialSpec) -> float | None:
    p = spec.platform
    if p.gpu_memory_gb is not None:
        return p.gpu_memory_gb
    model = gpu_model(spec)
    return model.memory_gb if model else None
