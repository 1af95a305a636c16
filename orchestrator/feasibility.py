"""Can a trial run, and on what? Decided before launch, from the spec alone.

A trial is SKIPPED (never started, never a crash) with the reason when:

* its engine or a feature it asks for does not exist on the platform (the adapter's
  ``unsupported``: SGLang, P/D, LMCache, quantized kernels on vLLM's CPU build, ...);
* it needs more GPUs than the cluster has;
* tensor parallelism does not divide the model's attention heads;
* on GPUs, the weights leave no room for the KV cache, or the KV cache cannot hold one
  request of the workload (weights and KV bytes per token from the model's shape:
  :mod:`orchestrator.models.capacity`);
* a LoRA adapter's rank is above the server's ``max_lora_rank``, or its matrices do not fit
  the model (an adapter of another base model): :func:`lora_unfit`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.metric_keys import M
from orchestrator.config.schema import LaunchedEngineSpec, SGLangEngineSpec, TrialSpec, VLLMEngineSpec
from orchestrator.engines import adapter_for, nsys
from orchestrator.metrics.probes import visible_devices
from orchestrator.models.capacity import Capacity, arch_of, kv_capacity
from orchestrator.models.gpus import GPUS, gpu_spec
from orchestrator.models.hardware import DetectedGPU, Roofs, cached_roofs, calibrate, detect_gpus
from orchestrator.models.lora import AdapterError, read_adapter, tiny_adapter_name
from orchestrator.models.roofline import DecodeFloor, decode_floor, measured_bandwidth_gb_s

log = logging.getLogger(__name__)


def host_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def gpus_needed(spec: TrialSpec) -> int:
    return spec.engine.num_gpus if spec.platform.device == "cuda" else 0


def _tp_sizes(spec: TrialSpec) -> list[int]:
    e = spec.engine
    if isinstance(e, LaunchedEngineSpec):
        if e.disaggregation is not None:
            return [e.disaggregation.prefill_tp, e.disaggregation.decode_tp]
        return [e.tensor_parallel_size]
    return []


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


def capacity(spec: TrialSpec) -> Capacity | None:
    """KV capacity of the trial's (smallest) TP group on its GPUs, when the shape and memory are known."""
    arch, mem = arch_of(spec.model), gpu_memory_gb(spec)
    e = spec.engine
    if spec.platform.device != "cuda" or arch is None or mem is None or not isinstance(e, LaunchedEngineSpec):
        return None
    util = e.gpu_memory_share
    return kv_capacity(arch, mem, util, min(_tp_sizes(spec)), e.kv_cache_dtype, e.quantization)


def assess(spec: TrialSpec, cluster_gpus: int | None = None, node_cpus: float | None = None) -> str | None:
    """Why the trial cannot run (it is then SKIPPED), or None. ``cluster_gpus`` None = unknown;
    ``node_cpus``: the most CPUs one node of the cluster offers (None = unknown)."""
    if node_cpus is not None and spec.platform.cpus_per_trial > node_cpus:
        return (
            f"platform.cpus_per_trial {spec.platform.cpus_per_trial:g} is more than any node offers ({node_cpus:g} CPUs): "
            "Ray would wait for such a node forever"
        )
    arch = arch_of(spec.model)
    if spec.platform.device == "cpu" and arch is not None and spec.model.tiny is None:
        dtype = spec.engine.dtype if isinstance(spec.engine, LaunchedEngineSpec) else ""
        dtype_bytes = 4.0 if dtype in ("float32", "float") else 2.0
        need_gb, have_gb = arch.params_b * dtype_bytes, host_memory_gb()
        if have_gb is not None and need_gb > have_gb:
            return (
                f"model {spec.model.name} needs ~{need_gb:.0f} GB for its weights on the CPU platform; "
                f"this host has {have_gb:.0f} GB"
            )
    reason = (
        adapter_for(spec.engine.name).unsupported(spec)
        or nsys.unsupported(spec)
        or lora_unfit(spec)
        or vllm_refuses(spec)
    )
    if reason:
        return reason
    need = gpus_needed(spec)
    if need and cluster_gpus is not None and need > cluster_gpus:
        return f"needs {need} GPU(s) but the cluster has {cluster_gpus}"
    if arch is not None:
        for tp in _tp_sizes(spec):
            if arch.num_heads % tp or (arch.num_kv_heads % tp and tp % arch.num_kv_heads):
                return (
                    f"tensor parallel size {tp} does not divide the model's {arch.num_heads} attention heads "
                    f"/ {arch.num_kv_heads} KV heads"
                )
    cap = capacity(spec)
    if cap is not None:
        if cap.tokens == 0:
            return (
                f"weights take {cap.weights_gib_per_gpu:.1f} GiB per GPU and leave no room for the KV cache "
                f"({gpu_memory_gb(spec):g} GB GPUs)"
            )
        needed = max(spec.workload.max_request_tokens(), spec.engine.context_limit or 0)
        if cap.tokens < needed:
            return (
                f"the KV cache holds {cap.tokens} tokens ({cap.kv_budget_gib_per_gpu:.1f} GiB per GPU at "
                f"{cap.kv_bytes_per_token / 1024:.0f} KiB/token) but one request needs up to {needed}"
            )
    return None


def vllm_refuses(spec: TrialSpec) -> str | None:
    """Why vLLM would refuse to start with the trial's scheduler and length settings (its
    SchedulerConfig.verify_max_model_len and ModelConfig's length check), or None: said before the
    server starts, not as its start-up traceback a minute later. Checked only where the values
    are set or read here (a default vLLM picks itself is not guessed)."""
    engine = spec.engine
    if not isinstance(engine, VLLMEngineSpec):
        return None
    from orchestrator.models.shape import max_positions

    found = max_positions(spec.model)
    # the servers' environment: engine.env over the one the trial's worker has
    allow = engine.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", ""))
    allow_long = str(allow).lower() in ("1", "true")
    if found is not None and engine.max_model_len is not None and engine.max_model_len > found[0] and not allow_long:
        return (
            f"engine.max_model_len {engine.max_model_len} is more than the model takes ({found[0]}, {found[1]}): "
            "vLLM refuses it (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in engine.env overrides, at the model's risk)"
        )
    tokens = engine.max_num_batched_tokens
    if tokens is None:
        return None
    # against the configured length only: the one vLLM derives by itself also reads the tokenizer
    model_len = engine.max_model_len
    if engine.enable_chunked_prefill is False and model_len is not None and tokens < model_len:
        return (
            f"engine.max_num_batched_tokens {tokens} is less than engine.max_model_len {model_len} with chunked prefill off: "
            "vLLM refuses it (a longer prompt could never be scheduled); raise the budget, lower "
            "engine.max_model_len or turn engine.enable_chunked_prefill on"
        )
    if engine.max_num_seqs is not None and tokens < engine.max_num_seqs:
        return (
            f"engine.max_num_batched_tokens {tokens} is less than engine.max_num_seqs {engine.max_num_seqs}: "
            "vLLM refuses it (every running sequence needs a token of the step's budget)"
        )
    return None


VLLM_DEFAULT_MAX_LORA_RANK = 16  # vllm.config.lora.LoRAConfig.max_lora_rank
# The modules whose LoRA input is the model's hidden state, and those whose output is.
_HIDDEN_IN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_HIDDEN_OUT = ("o_proj", "down_proj")


def lora_unfit(spec: TrialSpec) -> str | None:
    """Why the trial's server cannot take its LoRA adapters, or None: an adapter of a rank above
    the server's ``max_lora_rank`` (vLLM refuses to load it), or whose matrices do not fit the
    model's hidden size (an adapter of another base model). Reads each adapter's config and
    tensor header only; the tiny adapters' ranks come from their spec (they may not be built yet)."""
    lora, engine = spec.model.lora, spec.engine
    if lora is None or not isinstance(engine, LaunchedEngineSpec):
        return None
    ranks: list[tuple[str, int]] = []
    hidden = None
    arch = arch_of(spec.model)
    if arch is not None and spec.model.tiny is None:
        hidden = arch.num_heads * arch.head_dim
    elif spec.model.tiny is not None:
        hidden = spec.model.tiny.hidden_size
    for a in lora.adapters:
        try:
            info = read_adapter(a.path)
        except AdapterError as e:
            return f"LoRA adapter {a.name}: {e}"
        ranks.append((a.name, info.rank))
        for module, (n_in, n_out) in info.module_dims().items():
            got, side = (n_in, "input") if module in _HIDDEN_IN else (n_out, "output")
            if hidden and module in _HIDDEN_IN + _HIDDEN_OUT and got and got != hidden:
                return (
                    f"LoRA adapter {a.name} ({a.path}) was made for another base model: its {module} {side} is "
                    f"{got} wide, model {spec.model.name}'s hidden size is {hidden}"
                )
    if lora.tiny is not None:
        ranks += [(tiny_adapter_name(k), lora.tiny.rank) for k in range(lora.tiny.count)]
    limit: int | None = engine.max_lora_rank if isinstance(engine, VLLMEngineSpec | SGLangEngineSpec) else None
    default = ""
    if limit is None and isinstance(engine, VLLMEngineSpec):
        limit, default = VLLM_DEFAULT_MAX_LORA_RANK, " (vLLM's default)"
    for name, r in ranks:
        if limit is not None and r > limit:
            return (
                f"LoRA adapter {name} has rank {r}, above the server's max_lora_rank {limit}{default}: "
                f"set engine.max_lora_rank >= {r}"
            )
    return None


def describe(spec: TrialSpec) -> dict[str, Any]:
    """Numbers behind the decision, for dry runs."""
    out: dict[str, Any] = {"gpus": gpus_needed(spec)}
    model = gpu_model(spec)
    if model is not None:
        out["gpu_model"] = model.name or (model.detected.name if model.detected else "unknown")
        out["gpu_model_from"] = model.source
    r = roofs_used(spec)
    if r is not None:
        out["roofs"] = f"{r.bandwidth_gb_s:.0f} GB/s, {r.peak_tflops:g} TFLOP/s: {r.source}"
    cap = capacity(spec)
    if cap is not None:
        out["kv_capacity_tokens"] = cap.tokens
        out["weights_gib_per_gpu"] = round(cap.weights_gib_per_gpu, 2)
        out["kv_bytes_per_token"] = int(cap.kv_bytes_per_token)
    return out


# Rough planning figures when a trial has no FINISHED run to go by (measured on the
# project's CPU machine with the tiny model; a GPU guess for an 8B model on one A100).
STARTUP_S = {"cpu": 40.0, "cuda": 120.0}
OUTPUT_TOKENS_PER_S = {"cpu": 250.0, "cuda": 3000.0}


def estimate_seconds(spec: TrialSpec) -> float:
    """A rough duration of the trial: start-up plus each load point (scheduled time for rate
    and trace points, output tokens at a platform throughput for closed loops and bursts)."""
    if spec.engine.hold_s is not None:
        return spec.engine.hold_s
    device = spec.platform.device
    w = spec.workload
    total = STARTUP_S[device] if isinstance(spec.engine, LaunchedEngineSpec) else 0.0
    out_tokens = sum(c.output_tokens or 256 for c in w.classes.values()) / len(w.classes)
    turns = max(c.turns or 1 for c in w.classes.values())
    probes = [w.capacity.probe(w.capacity.start)] * w.capacity.max_probes if w.capacity else []
    for p in [*w.load_points, *probes]:
        n, d = w.stop_of(p)
        if d is not None:
            point = d
        elif p.rate is not None and p.rate != float("inf") and n is not None:
            point = n / p.rate
        else:
            point = (n or 100) * out_tokens * turns / OUTPUT_TOKENS_PER_S[device]
        total += (point + 2.0) * w.repeats
    return total


@dataclass(frozen=True)
class Roof:
    """The roofs a trial's decode floor uses, and where each came from (for the plan and the report)."""

    bandwidth_gb_s: float
    peak_tflops: float
    source: str


def roofs_used(spec: TrialSpec) -> Roof | None:
    """The trial's roofs: ``platform.memory_bandwidth_gb_s`` / ``peak_tflops`` when set, else this
    node's calibration (``platform.roofs: measured``; GPUs: ``python -m orchestrator.models.hardware``,
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
    launched = engine if isinstance(engine, LaunchedEngineSpec) else None
    quant = launched.quantization if launched else None
    kv_dtype: str | None = launched.kv_cache_dtype if launched else None
    if spec.platform.dtype in ("float32", "float", "fp32"):  # the CPU build runs fp32 weights and KV here
        if quant is None:
            arch = arch.model_copy(update={"weight_bytes_per_param": 4.0})
        if kv_dtype in (None, "auto"):
            kv_dtype = "float32"
    tp = launched.tensor_parallel_size if launched else 1
    return decode_floor(arch, hw[0], hw[1], max(1, batch), context_tokens, tp=tp, kv_dtype=kv_dtype, quantization=quant)


def floor_metrics(
    spec: TrialSpec, metrics: dict[str, float], batch: float | None = None, concurrency: int | None = None
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
