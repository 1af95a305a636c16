"""A vLLM server's command line: its flags in argv order (:data:`FLAGS`, each read from the
:class:`VLLMServerArgs` of one server), the P/D prefill server's whole-prompt
steps, and the LMCache config file a server reads. The servers of a trial are laid out by
:class:`orchestrator.engines.vllm.VLLMAdapter`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.config.schema import LMCacheSpec, VLLMEngineSpec
from orchestrator.engines.flags import Flag, ServerArgs


@dataclass(frozen=True)
class VLLMServerArgs(ServerArgs[VLLMEngineSpec]):
    """One vLLM server's arguments: the shared ones and its KV transfer config."""

    kv_override: dict[str, Any] | None = None  # this server's, else engine.kv_transfer_config

    @property
    def kv_transfer_config(self) -> dict[str, Any] | None:
        return self.kv_override if self.kv_override is not None else self.engine.kv_transfer_config

    @property
    def pp(self) -> int:
        return self.engine.pipeline_parallel_size


# The server's flags in argv order (after the launch head, before engine.extra_args).
FLAGS: tuple[Flag[VLLMServerArgs], ...] = (
    Flag("model", lambda a: a.model_path),
    Flag("served-model-name", lambda a: a.served_name),
    Flag("tokenizer", lambda a: a.tokenizer),
    Flag("host", lambda a: a.engine.host),
    Flag("port", lambda a: a.port),
    Flag("dtype", lambda a: a.engine.dtype),
    Flag("max-model-len", lambda a: a.engine.max_model_len),
    Flag("block-size", lambda a: a.engine.block_size),
    Flag("max-num-batched-tokens", lambda a: a.engine.max_num_batched_tokens),
    Flag("enable-chunked-prefill", lambda a: a.engine.enable_chunked_prefill, "bool"),
    Flag("max-num-seqs", lambda a: a.engine.max_num_seqs),
    Flag("enable-prefix-caching", lambda a: a.engine.enable_prefix_caching, "bool"),
    Flag("enforce-eager", lambda a: a.engine.enforce_eager, "switch"),
    Flag("gpu-memory-utilization", lambda a: a.engine.gpu_memory_utilization),
    Flag("tensor-parallel-size", lambda a: a.tp if a.tp > 1 else None),
    Flag("pipeline-parallel-size", lambda a: a.pp if a.pp > 1 else None),
    # Inside a Ray task: keep vLLM's workers out of the outer Ray cluster.
    Flag("distributed-executor-backend", lambda a: "mp" if a.tp * a.pp > 1 else None),
    Flag("kv-cache-dtype", lambda a: a.engine.kv_cache_dtype),
    Flag("quantization", lambda a: a.engine.quantization),
    Flag("speculative-config", lambda a: a.engine.speculative_config, "json"),
    Flag("kv-transfer-config", lambda a: a.kv_transfer_config, "json"),
    Flag("seed", lambda a: a.engine.seed),
    Flag("enable-prompt-tokens-details", lambda a: a.engine.enable_prompt_tokens_details, "switch"),
    Flag("enable-lora", lambda a: a.lora, "switch"),
    Flag(
        "lora-modules",
        lambda a: [f"{name}={path}" for name, path in a.adapters] if a.engine.lora_loading == "start" else None,
        "list",
    ),
    Flag("max-loras", lambda a: a.engine.max_loras if a.lora else None),
    Flag("max-lora-rank", lambda a: a.engine.max_lora_rank if a.lora else None),
    Flag("max-cpu-loras", lambda a: a.engine.max_cpu_loras if a.lora else None),
)


def render_lmcache(c: LMCacheSpec) -> str:
    """LMCache's config file (YAML keys of LMCache's ``LMCACHE_CONFIG_FILE``)."""
    lines = [
        f"chunk_size: {c.chunk_size}",
        f"local_cpu: {str(c.local_cpu).lower()}",
        f"max_local_cpu_size: {c.max_local_cpu_size_gb:g}",
    ]
    if c.local_disk:
        lines += [
            f"local_disk: {json.dumps('file://' + c.local_disk)}",
            f"max_local_disk_size: {c.max_local_disk_size_gb:g}",
        ]
    return "\n".join(lines) + "\n"


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` without ``flags`` (and the value of those that take one)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = a == "--max-num-batched-tokens"
            continue
        out.append(a)
    return out


def prefill_in_one_step(argv: list[str], max_model_len: int | None) -> list[str]:
    """The P/D prefill server's ``argv`` with whole prompts in one step. The ExampleConnector saves
    a prompt's KV only when the prompt is scheduled whole: a chunked prefill stores its first chunk
    under the whole prompt's key, and the decode server then dies loading it ("shape mismatch",
    vLLM 0.32)."""
    argv = _without(argv, "--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill")
    return [*argv, "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]
