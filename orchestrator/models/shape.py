"""A model's shape read from the model itself: its ``config.json`` (a local folder, or the hub's
file in the local Hugging Face cache; nothing is downloaded) made into a
:class:`~orchestrator.config.schema.ModelArch`, for the memory check, the KV capacity and the
roofline. Layers, attention and KV heads, head dim, sliding window, the parameters counted from
the shapes (every expert of a MoE, and those active per token) and the bytes per weight from
the checkpoint's dtype or its ``quantization_config``.

Where no ``config.json`` is at hand (planning a GPU sweep on a laptop without the weights), the
course's hub models have their shapes here (:data:`KNOWN`, read from their config.json files).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ModelArch, ModelSpec

# The course's hub models, as their config.json files give them (parameters: the model cards').
KNOWN: dict[str, ModelArch] = {
    "meta-llama/Llama-3.1-8B-Instruct": ModelArch(
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, params_b=8.03
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ModelArch(
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, params_b=46.7, active_params_b=12.9
    ),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": ModelArch(
        num_layers=22, num_heads=32, num_kv_heads=4, head_dim=64, params_b=1.1
    ),
}
# What a declared shape must agree on with the checkpoint's (parameters and bytes are estimates).
SHAPE_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim")


def config_path(model: ModelSpec) -> Path | None:
    """Where the model's ``config.json`` is on this machine: in its folder (``source: path``, or a
    hub id that names a local folder), else the hub's copy in the local cache; None when neither."""
    if not model.path:
        return None
    local = Path(model.path).expanduser() / "config.json"
    if local.is_file():
        return local
    if model.source != "hub":
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model.path, "config.json")
    return Path(found) if isinstance(found, str) else None


@functools.lru_cache(maxsize=64)
def _read(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model config {path}: cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model config {path}: expected a JSON object")
    return data


def arch_from_config(cfg: dict[str, Any], where: str = "config.json") -> ModelArch:
    """The shape a ``config.json`` describes (Llama, Qwen2, Mistral, Mixtral, Qwen-MoE and the
    like; a multimodal model's ``text_config``)."""
    c = cfg.get("text_config") or cfg

    def need(*names: str) -> int:
        for n in names:
            if isinstance(c.get(n), int) and c[n] > 0:
                return int(c[n])
        raise ConfigError(f"model config {where}: no {' or '.join(names)} (a positive integer)")

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    hidden = need("hidden_size", "n_embd", "d_model")
    kv = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    inter = int(c.get("intermediate_size") or 4 * hidden)
    vocab = int(c.get("vocab_size") or 0)
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    experts = int(c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0)
    if experts > 1:
        expert = 3 * hidden * int(c.get("moe_intermediate_size") or inter)
        shared = (
            3
            * hidden
            * int(
                c.get("shared_expert_intermediate_size")
                or int(c.get("n_shared_experts") or 0) * int(c.get("moe_intermediate_size") or inter)
            )
        )
        top_k = int(c.get("num_experts_per_tok") or 2)
        mlp, active_mlp = experts * expert + shared + hidden * experts, top_k * expert + shared
    else:
        mlp = active_mlp = 3 * hidden * inter  # gate, up, down
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings", cfg.get("tie_word_embeddings")) else 2)
    params = layers * (attention + mlp) + embeddings
    active = layers * (attention + active_mlp) + embeddings
    window = c.get("sliding_window") if c.get("use_sliding_window", True) is not False else None
    return ModelArch(
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        params_b=params / 1e9,
        active_params_b=active / 1e9 if experts > 1 else None,
        weight_bytes_per_param=weight_bytes(cfg),
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
    )


def weight_bytes(cfg: dict[str, Any]) -> float:
    """Bytes per weight: the quantization's (fp8 1, 4-bit 0.5, compressed-tensors' weight bits
    / 8), else the checkpoint's dtype (float32 4, otherwise 2)."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method") or "").lower()
    if method == "fp8":
        return 1.0
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin") and q.get("bits"):
        return float(q["bits"]) / 8
    if method == "bitsandbytes":
        return 0.5 if q.get("load_in_4bit") else 1.0
    if method == "compressed-tensors":
        bits = [
            g["weights"]["num_bits"]
            for g in (q.get("config_groups") or {}).values()
            if isinstance(g, dict) and isinstance(g.get("weights"), dict) and g["weights"].get("num_bits")
        ]
        if bits:
            return max(bits) / 8
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").lower()
    return 4.0 if dtype in ("float32", "float") else 2.0


# The config.json keys a model's context length is given by (vLLM's _get_and_verify_max_len reads these)
_POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "max_target_positions",
)


def max_positions(model: ModelSpec) -> tuple[int, str] | None:
    """The longest engine.max_model_len vLLM accepts for the model (and where that was read): the
    tiny model's ``max_position_embeddings``; else the smallest of its config.json's length keys,
    or its ``model_max_length`` where that is larger (vLLM lets a length up to it through); None
    when its config is not at hand or scales its positions (RoPE scaling: vLLM derives more)."""
    if model.tiny is not None:
        return model.tiny.max_position_embeddings, "the tiny model's max_position_embeddings"
    path = config_path(model)
    if path is None:
        return None
    cfg = _read(str(path))
    text = cfg.get("text_config")
    if isinstance(text, dict):  # a multimodal model's language model
        cfg = text
    if cfg.get("rope_scaling") or cfg.get("rope_parameters"):
        return None
    lengths = [(int(cfg[k]), k) for k in _POSITION_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0]
    if not lengths:
        return None
    n, key = min(lengths)
    declared = cfg.get("model_max_length")
    if isinstance(declared, int) and declared > n:
        n, key = declared, "model_max_length"
    return n, f"{key} in {path}"


def read_arch(model: ModelSpec) -> tuple[ModelArch, str] | None:
    """The shape the model's own ``config.json`` gives, and where it was read; None without one."""
    path = config_path(model)
    if path is None:
        return None
    return arch_from_config(_read(str(path)), str(path)), str(path)


def check_declared(model: ModelSpec) -> None:
    """A declared ``model.arch`` that disagrees with the checkpoint's config is an error naming both."""
    found = read_arch(model) if model.arch is not None else None
    if found is None or model.arch is None:
        return
    arch, where = found
    wrong = [f"{f} {getattr(model.arch, f)} (declared) vs {getattr(arch, f)}" for f in SHAPE_FIELDS]
    wrong = [w for w, f in zip(wrong, SHAPE_FIELDS, strict=True) if getattr(model.arch, f) != getattr(arch, f)]
    if wrong:
        raise ConfigError(
            f"model.arch disagrees with the model's own config ({where}): {'; '.join(wrong)}. "
            "Leave model.arch out (it is read from the model) or fix it"
        )
