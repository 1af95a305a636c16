"""KV-cache and weight arithmetic (the KV-capacity worksheet of the course, as functions).

KV bytes per token = layers x 2 (K and V) x KV heads x head dim x bytes per value.
Weights = parameters x bytes per parameter. Per GPU under tensor parallelism both divide
by TP. Capacity in tokens = (GPU memory x utilisation - weights per GPU) / KV bytes per
token per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.schema import ModelArch, ModelSpec, TrialSpec
from orchestrator.models.shape import KNOWN, arch_from_config, check_declared, read_arch
from orchestrator.perf.gpus import gpu_memory_gb

GIB = 1024**3

# Bytes per KV value for an engine's kv_cache_dtype ("auto" = the model's 16-bit dtype).
KV_DTYPE_BYTES = {
    "auto": 2.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "float": 4.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}
# Bytes per weight for a quantization method (None = the checkpoint's own, ModelArch.weight_bytes_per_param).
QUANT_BYTES = {
    "fp8": 1.0,
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "bitsandbytes": 0.5,
    "w8a8_int8": 1.0,
    "w8a8_fp8": 1.0,
    "modelopt_fp4": 0.5,
}


def arch_of(model: ModelSpec) -> ModelArch | None:
    """The model's shape: declared (``model.arch``, checked against the model's own config.json
    when that is at hand), the tiny model's, read from the model's config.json (its folder or
    the local hub cache: :mod:`orchestrator.models.shape`), or a course hub model's known shape;
    None when none of these is at hand."""
    if model.arch is not None:
        check_declared(model)
        return model.arch
    if model.tiny is not None:  # the same arithmetic as a checkpoint's config.json
        t = model.tiny
        return arch_from_config(
            {
                "num_hidden_layers": t.num_layers,
                "num_attention_heads": t.num_heads,
                "num_key_value_heads": t.num_kv_heads,
                "hidden_size": t.hidden_size,
                "intermediate_size": t.intermediate_size,
                "vocab_size": t.vocab_size,
            },
            "the tiny model",
        )
    found = read_arch(model)
    if found is not None:
        return found[0]
    return KNOWN.get(model.path or "") if model.source == "hub" else None


def kv_bytes_per_token(arch: ModelArch, kv_dtype: str | None = None) -> float:
    return arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * KV_DTYPE_BYTES.get(kv_dtype or "auto", 2.0)


def weight_bytes(arch: ModelArch, quantization: str | None = None) -> float:
    per_param = QUANT_BYTES.get(quantization or "", arch.weight_bytes_per_param)
    return arch.params_b * 1e9 * per_param


@dataclass(frozen=True)
class Capacity:
    weights_gib_per_gpu: float
    kv_bytes_per_token: float
    kv_budget_gib_per_gpu: float
    tokens: int  # concurrent tokens the KV cache holds across the TP group


def kv_capacity(
    arch: ModelArch,
    gpu_memory_gb: float,
    utilization: float,
    tp: int = 1,
    kv_dtype: str | None = None,
    quantization: str | None = None,
) -> Capacity:
    """How many tokens fit in the KV cache of a TP group (activations and graphs not counted)."""
    weights = weight_bytes(arch, quantization) / tp
    kv_token = kv_bytes_per_token(arch, kv_dtype) / tp
    budget = gpu_memory_gb * 1e9 * utilization - weights
    tokens = int(budget // kv_token) if budget > 0 else 0
    return Capacity(weights / GIB, kv_token * tp, max(budget, 0) / GIB, tokens)


def tp_sizes(spec: TrialSpec) -> list[int]:
    """The tensor-parallel sizes of the trial's servers (a P/D pair: its two), none for an external one."""
    e = spec.engine.launched
    if e is not None:
        if e.disaggregation is not None:
            return [e.disaggregation.prefill_tp, e.disaggregation.decode_tp]
        return [e.tensor_parallel_size]
    return []


def trial_kv_capacity(spec: TrialSpec) -> Capacity | None:
    """KV capacity of the trial's (smallest) TP group on its GPUs, when the shape and memory are known."""
    arch, mem = arch_of(spec.model), gpu_memory_gb(spec)
    e = spec.engine.launched
    if spec.platform.device != "cuda" or arch is None or mem is None or e is None:
        return None
    util = e.gpu_memory_share
    return kv_capacity(arch, mem, util, min(tp_sizes(spec)), e.kv_cache_dtype, e.quantization)
