"""A vLLM server's command line: its flags in argv order (:data:`FLAGS`, each read from the
:class:`VLLMServerArgs` of one server), the P/D prefill server's whole-prompt
steps, and the LMCache config file a server reads. The servers of a trial are laid out by
:class:`orchestrator.engines.vllm.VLLMAdapter`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.config.schema import LMCacheSpec, VLLMEngineSpec
from orchestrator.engines.flags import Flag, ServerArgs, engine_flags, lora_flags


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
    *engine_flags("host"),
    Flag("port", lambda a: a.port),
    *engine_flags("dtype", "max-model-len", "block-size", "max-num-batched-tokens"),
    *engine_flags("enable-chunked-prefill", kind="bool"),
    *engine_flags("max-num-seqs"),
    *engine_flags("enable-prefix-caching", kind="bool"),
    *engine_flags("enforce-eager", kind="switch"),
    *engine_flags("gpu-memory-utilization"),
    Flag("tensor-parallel-size", lambda a: a.tp if a.tp > 1 else None),
    Flag("pipeline-parallel-size", lambda a: a.pp if a.pp > 1 else None),
    # Inside a Ray task: keep vLLM's workers out of the outer Ray cluster.
    Flag("distributed-executor-backend", lambda a: "mp" if a.tp * a.pp > 1 else None),
    *engine_flags("kv-cache-dtype", "quantization"),
    *engine_flags("speculative-config", kind="json"),
    Flag("kv-transfer-config", lambda a: a.kv_transfer_config, "json"),
    *engine_flags("seed"),
    *engine_flags("enable-prompt-tokens-details", kind="switch"),
    Flag("enable-lora", lambda a: a.lora, "switch"),
    Flag(
        "lora-modules",
        lambda a: [f"{name}={path}" for name, path in a.adapters] if a.engine.lora_loading == "start" else None,
        "list",
    ),
    *lora_flags("max-loras", "max-lora-rank", "max-cpu-loras"),
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
