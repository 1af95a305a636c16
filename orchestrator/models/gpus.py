"""GPU specifications for feasibility (memory) and the roofline (bandwidth, peak FLOP/s).

Dense peak figures without sparsity, from the vendors' data sheets; the A100 row is the
course's spec card (../shared/seeds, week 3). Bandwidth in GB/s, compute in TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.errors import ConfigError


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
