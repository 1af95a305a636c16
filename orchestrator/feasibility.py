"""Can a trial run, and on what? Decided before launch, from the spec alone.

A trial is SKIPPED (never started, never a crash) with the reason when:

* its engine or a feature it asks for does not exist on the platform (the adapter's
  ``unsupported``: SGLang, P/D, LMCache, quantized kernels on vLLM's CPU build, ...);
* it needs more GPUs than the cluster has;
* tensor parallelism does not divide the model's attention heads;
* on GPUs, the weights leave no room for the KV cache, or the KV cache cannot hold one
  request of the workload (weights and KV bytes per token from the model's shape:
  :mod:`orchestrator.perf.kv`);
* a LoRA adapter's rank is above the server's ``max_lora_rank``, or its matrices do not fit
  the model (an adapter of another base model): :func:`lora_unfit`.
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.config.schema import OpenLoop, TrialSpec
from orchestrator.engines import adapter_for, nsys
from orchestrator.models.lora import AdapterError, read_adapter, tiny_adapter_name
from orchestrator.models.shape import max_positions
from orchestrator.perf.floors import roofs_used
from orchestrator.perf.gpus import gpu_memory_gb, gpu_model
from orchestrator.perf.kv import arch_of, tp_sizes, trial_kv_capacity


def host_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def gpus_needed(spec: TrialSpec) -> int:
    return spec.engine.num_gpus if spec.platform.device == "cuda" else 0


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
        launched = spec.engine.launched
        dtype = launched.dtype if launched is not None else ""
        dtype_bytes = 4.0 if dtype in ("float32", "float") else 2.0
        need_gb, have_gb = arch.params_b * dtype_bytes, host_memory_gb()
        if have_gb is not None and need_gb > have_gb:
            return (
                f"model {spec.model.name} needs ~{need_gb:.0f} GB for its weights on the CPU platform; "
                f"this host has {have_gb:.0f} GB"
            )
    adapter = adapter_for(spec.engine.name)
    reason = (
        adapter.unsupported(spec)
        or nsys.unsupported(spec)
        or lora_unfit(spec)
        or adapter.refuses(spec, lambda: max_positions(spec.model))
    )
    if reason:
        return reason
    need = gpus_needed(spec)
    if need and cluster_gpus is not None and need > cluster_gpus:
        return f"needs {need} GPU(s) but the cluster has {cluster_gpus}"
    if arch is not None:
        for tp in tp_sizes(spec):
            if arch.num_heads % tp or (arch.num_kv_heads % tp and tp % arch.num_kv_heads):
                return (
                    f"tensor parallel size {tp} does not divide the model's {arch.num_heads} attention heads "
                    f"/ {arch.num_kv_heads} KV heads"
                )
    cap = trial_kv_capacity(spec)
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


# The modules whose LoRA input is the model's hidden state, and those whose output is.
_HIDDEN_IN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_HIDDEN_OUT = ("o_proj", "down_proj")


def lora_unfit(spec: TrialSpec) -> str | None:
    """Why the trial's server cannot take its LoRA adapters, or None: an adapter of a rank above
    the server's ``max_lora_rank`` (vLLM refuses to load it), or whose matrices do not fit the
    model's hidden size (an adapter of another base model). Reads each adapter's config and
    tensor header only; the tiny adapters' ranks come from their spec (they may not be built yet)."""
    lora, engine = spec.model.lora, spec.engine
    if lora is None or engine.launched is None:
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
    limit, default = adapter_for(engine.name).lora_rank_limit(spec)
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
    cap = trial_kv_capacity(spec)
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
    total = STARTUP_S[device] if spec.engine.launched is not None else 0.0
    out_tokens = sum(c.output_tokens or 256 for c in w.classes.values()) / len(w.classes)
    turns = max(c.turns or 1 for c in w.classes.values())
    probes = [w.capacity.probe(w.capacity.start)] * w.capacity.max_probes if w.capacity else []
    for p in [*w.load_points, *probes]:
        n, d = w.stop_of(p)
        load = p.load
        if d is not None:
            point = d
        elif isinstance(load, OpenLoop) and load.rate != float("inf") and n is not None:
            point = n / load.rate
        else:
            point = (n or 100) * out_tokens * turns / OUTPUT_TOKENS_PER_S[device]
        total += (point + 2.0) * w.repeats
    return total
