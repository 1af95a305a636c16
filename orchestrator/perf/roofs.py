"""Roofs measured on this node (memory bandwidth, dense matmul rate) beside the GPU table's
data-sheet figures (:mod:`orchestrator.perf.gpus` reads which GPUs the node has).

Measured on one H100 80GB HBM3 (2026-11): 3,023 GB/s device copy (read + write) and 795
bf16 TFLOP/s (8192^3), against the table's 3,350 and 989: a roofline from the data sheet
puts the floor 10-20% too low. A calibration takes seconds and is cached per node and GPU
model (``~/.cache/inference-lab/roofs``); it never runs while a trial's servers run.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.paths import cache_root
from orchestrator.perf.gpus import detect_gpus

CACHE_DIR = cache_root() / "roofs"


@dataclass(frozen=True)
class Roofs:
    """A device's measured roofs: memory bandwidth (read + write of a copy) and dense matmul rates."""

    device: str  # "cpu", or the GPU table's name / NVML's name
    bandwidth_gb_s: float
    bf16_tflops: float
    fp8_tflops: float | None
    measured_at: float  # time.time()
    how: str  # what was run, in words

    def describe(self) -> str:
        fp8 = f", fp8 {self.fp8_tflops:.0f} TFLOP/s" if self.fp8_tflops else ""
        return f"{self.bandwidth_gb_s:.0f} GB/s, bf16 {self.bf16_tflops:.1f} TFLOP/s{fp8} (measured: {self.how})"


def _best_seconds(run: Callable[[], object], sync: Callable[[], None], rounds: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        run()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_roofs(device: str = "cuda", copy_mib: int = 1024, n: int = 8192, rounds: int = 5) -> Roofs:
    """Measure a torch device's roofs: the best of ``rounds`` copies of ``copy_mib`` MiB (bytes
    read and written), the best of ``rounds`` ``n``^3 bf16 matmuls (2 n^3 FLOP), and fp8 where
    torch has a scaled fp8 matmul for the device (Hopper and later)."""
    import torch

    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def copy_gb_s() -> float:  # its buffers are freed before the matmuls
        src = torch.ones(copy_mib * 1024 * 1024 // 4, dtype=torch.float32, device=dev)
        dst = torch.empty_like(src)
        return 2 * float(src.numel()) * 4 / _best_seconds(lambda: dst.copy_(src), sync, rounds) / 1e9

    bandwidth = copy_gb_s()
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    mm_s = _best_seconds(lambda: torch.mm(a, b), sync, rounds)
    bf16 = 2 * n**3 / mm_s / 1e12
    fp8 = None
    if dev.type == "cuda" and hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability(dev) >= (8, 9):
        try:
            a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().t().to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev, dtype=torch.float32)
            fp8_s = _best_seconds(
                lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), sync, rounds
            )
            fp8 = 2 * n**3 / fp8_s / 1e12
        except (RuntimeError, AttributeError, TypeError):
            fp8 = None  # no fp8 kernel for this device or torch: the table's figure stands
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    how = f"torch {torch.__version__}: {copy_mib} MiB copy, {n}^3 bf16 matmul, best of {rounds}"
    return Roofs(name, bandwidth, bf16, fp8, time.time(), how)


def cache_path(device: str, cache_dir: Path | None = None) -> Path:
    """Where a node's roofs for one GPU model (or its CPU) are kept."""
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{socket.gethostname()}-{device}")
    return (cache_dir or CACHE_DIR) / f"{key}.json"


def cached_roofs(device: str, cache_dir: Path | None = None) -> Roofs | None:
    """This node's measured roofs for ``device`` (a GPU's table or NVML name, or "cpu"), if any."""
    path = cache_path(device, cache_dir)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return Roofs(**data)
    except (OSError, ValueError, TypeError):
        return None


def calibrate(
    device: str, measure: Callable[[], Roofs], cache_dir: Path | None = None, again: bool = False
) -> tuple[Roofs, bool]:
    """This node's roofs for ``device``: from the cache, else measured now and cached.
    Returns (roofs, whether they were measured now)."""
    if not again:
        known = cached_roofs(device, cache_dir)
        if known is not None:
            return known, False
    roofs = measure()
    path = cache_path(device, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(roofs), indent=1))
    tmp.replace(path)
    return roofs, True


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.perf.roofs [--calibrate] [--again]``: this node's GPUs, and
    with ``--calibrate`` each GPU model's roofs measured (or read from the cache) and kept for
    the roofline. Run it with the engine environment's python (its torch sees the GPUs), before
    a sweep, never beside a running trial."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--calibrate", action="store_true", help="measure each GPU model's roofs (cached)")
    parser.add_argument("--again", action="store_true", help="measure even when cached")
    args = parser.parse_args(argv)
    gpus, why = detect_gpus()
    if not gpus:
        print(why)
        return 1
    for g in gpus:
        print(g.describe())
    if args.calibrate:
        done: set[str] = set()
        for g in gpus:
            key = g.table_name or g.name
            if key in done:
                continue
            done.add(key)
            roofs, fresh = calibrate(key, functools.partial(measure_roofs, f"cuda:{g.index}"), again=args.again)
            print(f"{key}: {roofs.describe()} ({'measured now' if fresh else 'cached'}: {cache_path(key)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
