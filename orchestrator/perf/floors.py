"""The floor of a trial's decode step on its hardware (week 3's roofline, applied): the roofs it
uses (``platform`` figures, this node's calibration, or the GPU table, and where each came
from), and per load point the floor at the batch and context the engine ran with, beside the
measured TPOT (:func:`floor_metrics`)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import TrialSpec
from orchestrator.perf.gpus import GPUS, gpu_model
from orchestrator.perf.kv import arch_of
from orchestrator.perf.roofline import DecodeFloor, decode_floor, measured_bandwidth_gb_s
from orchestrator.perf.roofs import Roofs, cached_roofs, calibrate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Roof:
    """The roofs a trial's decode floor uses, and where each came from (for the plan and the report)."""

    bandwidth_gb_s: float
    peak_tflops: float
    source: str


def roofs_used(spec: TrialSpec) -> Roof | None:
    """The trial's roofs: ``platform.memory_bandwidth_gb_s`` / ``peak_tflops`` when set, else this
    node's calibration (``platform.roofs: measured``; GPUs: ``python -m orchestrator.perf.roofs``,
    the CPU's bandwidth: a numpy copy, both cached per node), else the GPU table; None when unknown."""
    p = spec.platform
    bandwidth, peak = p.memory_bandwidth_gb_s, p.peak_tflops
    source = "platform.memory_bandwidth_gb_s / peak_tflops" if bandwidth and peak else ""
    if p.device == "cuda" and (bandwidth is None or peak is None):
        model = gpu_model(spec)
        device = None
        if model is not None:
            device = model.name or (model.detected.name if model.detected else None)
        measured = cached_roofs(device) if device and p.roofs == "measured" else None
        table = GPUS.get(model.name) if model and model.name else None
        if measured is not None:
            bandwidth, peak = bandwidth or measured.bandwidth_gb_s, peak or measured.bf16_tflops
            versus = f" (table: {table.bandwidth_gb_s:g} GB/s, {table.bf16_tflops:g} TFLOP/s)" if table else ""
            source = f"measured on this node, {measured.describe()}{versus}"
        elif table is not None:
            bandwidth, peak = bandwidth or table.bandwidth_gb_s, peak or table.bf16_tflops
            source = f"GPU table ({table.name}: data sheet; not calibrated here)"
    if p.device == "cpu" and bandwidth is None:
        bandwidth = cpu_bandwidth_gb_s()
        source = f"CPU memory bandwidth measured on this node (numpy copy, cached); peak {peak} TFLOP/s from platform"
    if bandwidth is None or peak is None:
        return None
    return Roof(bandwidth, peak, source or "platform")


def roof(spec: TrialSpec) -> tuple[float, float] | None:
    """(memory bandwidth GB/s, peak TFLOP/s) of the trial's hardware, for the decode roofline."""
    r = roofs_used(spec)
    return (r.bandwidth_gb_s, r.peak_tflops) if r else None


@functools.lru_cache(maxsize=1)
def cpu_bandwidth_gb_s() -> float:
    """This node's CPU memory bandwidth (:func:`measured_bandwidth_gb_s`), measured once per node
    and kept (every trial of every sweep uses one figure)."""

    def measure() -> Roofs:
        bw = measured_bandwidth_gb_s()
        return Roofs("cpu", bw, 0.0, None, time.time(), "numpy copy of 256 MiB, best of 5")

    return calibrate("cpu", measure)[0].bandwidth_gb_s


def trial_decode_floor(spec: TrialSpec, batch: int = 1, context_tokens: int = 0) -> DecodeFloor | None:
    """The floor of one decode step of this trial's model on its hardware (None if the model's
    shape or the hardware's roofs are unknown)."""
    arch = arch_of(spec.model)
    hw = roof(spec)
    if arch is None or hw is None:
        return None
    engine = spec.engine
    launched = engine.launched
    quant = launched.quantization if launched else None
    kv_dtype: str | None = launched.kv_cache_dtype if launched else None
    if spec.platform.dtype in ("float32", "float", "fp32"):  # the CPU build runs fp32 weights and KV here
        if quant is None:
            arch = arch.model_copy(update={"weight_bytes_per_param": 4.0})
        if kv_dtype in (None, "auto"):
            kv_dtype = "float32"
    tp = launched.tensor_parallel_size if launched else 1
    return decode_floor(
        arch,
        hw[0],
        hw[1],
        batch=max(1, batch),
        context_tokens=context_tokens,
        tp=tp,
        kv_dtype=kv_dtype,
        quantization=quant,
    )


def floor_metrics(
    spec: TrialSpec, metrics: Mapping[str, float], batch: float | None = None, concurrency: int | None = None
) -> dict[str, float]:
    """The decode-step floor at a point's batch and context, and its measured TPOT over it.

    Batch: the batch the engine actually ran (``batch``: its running-requests gauge averaged over
    the point's window), else the point's ``concurrency``, else the most requests the server ran
    at once (``server_requests_running_max``), else 1. Context: the mean prompt plus half the mean
    output (the middle of a decode)."""
    requests = metrics.get(M.COMPLETED) or metrics.get(M.REQUESTS) or 0.0
    if not requests:
        return {}
    if batch is None or batch <= 0:
        batch = concurrency or metrics.get(M.SERVER_REQUESTS_RUNNING_MAX, 1.0) or 1.0
    context = metrics.get(M.INPUT_TOKENS, 0.0) / requests + metrics.get(M.OUTPUT_TOKENS, 0.0) / requests / 2
    try:
        floor = trial_decode_floor(spec, max(1, int(round(batch))), int(context))
    except Exception as exc:  # a missing roof is not a trial failure
        log.warning("decode floor: %s", exc)
        return {}
    if floor is None:
        return {}
    out = {
        M.DECODE_FLOOR_MS: floor.floor_ms,
        M.DECODE_FLOOR_BATCH: float(floor.batch),
        M.DECODE_FLOOR_MEMORY_MS: floor.memory_floor_ms,
        M.DECODE_FLOOR_COMPUTE_MS: floor.compute_floor_ms,
    }
    tpot = metrics.get(M.TPOT_MS_P50)
    if tpot:
        out[M.DECODE_FLOOR_RATIO] = tpot / floor.floor_ms
    return out
