"""The roofline of a decode step (week 3): how fast a step could possibly be.

A decode step reads every weight once (per TP shard) and the KV cache of every sequence in
the batch, and does ~2 FLOPs per active parameter per sequence. Its time is at least
bytes / memory bandwidth and at least FLOPs / peak compute; the larger bound is the floor.
At batch 1 the memory bound wins by orders of magnitude (decode is memory-bound); the
batch at which both meet is the ridge point.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from orchestrator.config.schema import ModelArch
from orchestrator.perf.kv import kv_bytes_per_token, weight_bytes


@dataclass(frozen=True)
class DecodeFloor:
    batch: int
    context_tokens: int
    bytes_read: float
    flops: float
    memory_floor_ms: float
    compute_floor_ms: float

    @property
    def floor_ms(self) -> float:
        return max(self.memory_floor_ms, self.compute_floor_ms)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_floor_ms >= self.compute_floor_ms else "compute"

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes_read


def decode_floor(
    arch: ModelArch,
    bandwidth_gb_s: float,
    peak_tflops: float,
    *,
    batch: int = 1,
    context_tokens: int = 0,
    tp: int = 1,
    kv_dtype: str | None = None,
    quantization: str | None = None,
) -> DecodeFloor:
    """Floor of one decode step for ``batch`` sequences of ``context_tokens`` each, per TP rank."""
    weights = weight_bytes(arch, quantization) / tp
    kv = kv_bytes_per_token(arch, kv_dtype) * context_tokens * batch / tp
    active = (arch.active_params_b or arch.params_b) * 1e9
    flops = 2 * active * batch / tp
    return DecodeFloor(
        batch,
        context_tokens,
        weights + kv,
        flops,
        (weights + kv) / (bandwidth_gb_s * 1e9) * 1e3,
        flops / (peak_tflops * 1e12) * 1e3,
    )


@functools.lru_cache(maxsize=1)
def measured_bandwidth_gb_s(mib: int = 256, rounds: int = 5) -> float:
    """This host's memory bandwidth from one thread (best of ``rounds`` numpy copies of
    ``mib`` MiB, counting the read and the write): the CPU roof of a decode step."""
    import numpy as np

    src = np.ones(mib * 1024 * 1024 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
