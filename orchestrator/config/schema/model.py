"""The model a trial serves: a local tiny model, a path or a hub id."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from .base import StrictModel


class TinyTrainSpec(StrictModel):
    """Training of a tiny model on a synthetic task (CPU minutes), so that it can score: 2-digit
    addition "a+b=" -> "a+b", the eval set (orchestrator/evaluation/tasks) held out."""

    task: Literal["addition"] = "addition"
    steps: PositiveInt = 1000
    batch_size: PositiveInt = 64
    seq_len: PositiveInt = 48
    lr: PositiveFloat = 3e-3
    threads: PositiveInt = 2


class TinyModelSpec(StrictModel):
    """Shape of the locally built small Llama used on CPU machines (random weights, or trained
    on a synthetic task when ``train`` is set)."""

    num_layers: PositiveInt = 6
    hidden_size: PositiveInt = 512
    num_heads: PositiveInt = 8
    num_kv_heads: PositiveInt = 4
    intermediate_size: PositiveInt = 1408
    vocab_size: int = Field(default=512, ge=300, description="byte-level BPE needs 256 bytes + specials")
    max_position_embeddings: PositiveInt = 8192
    seed: int = 0
    train: TinyTrainSpec | None = None
    quantization: Literal["w8a8", "w4a16"] | None = Field(
        default=None,
        description=(
            "quantize the built model here, data-free, with compressed-tensors (week 12 on the CPU): "
            "w8a8 = INT8 weights per channel + dynamic per-token INT8 activations (serves in float32); "
            "w4a16 = 4-bit weights in groups of 128 (the CPU kernel needs engine.dtype=bfloat16)"
        ),
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        if self.hidden_size // self.num_heads < 64:
            # vLLM's CPU build died on short prompts with a head dim of 32 (seen on these machines).
            raise ValueError("head dim (hidden_size / num_heads) must be >= 64 for the CPU engine")
        return self


class ModelArch(StrictModel):
    """A model's shape, for the memory check, the KV capacity and the roofline. Read from the
    model's own config.json when it is at hand (orchestrator.models.shape); declare it only for
    a model whose config cannot be read here (a hub model not in the local cache).

    ``params_b`` counts every weight (all experts of a MoE); ``active_params_b`` those used
    per token (roofline), when different.
    """

    num_layers: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    params_b: PositiveFloat
    active_params_b: PositiveFloat | None = None
    weight_bytes_per_param: PositiveFloat = Field(default=2.0, description="2 bf16/fp16, 1 fp8, 0.5 int4")
    sliding_window: PositiveInt | None = Field(
        default=None,
        description="attention window (tokens), where the model has one; the KV arithmetic counts full attention",
    )


class ModelSpec(StrictModel):
    """Which model a trial serves. ``tiny_random`` is built locally on first use."""

    name: str = Field(description="served model name seen by clients")
    source: Literal["tiny_random", "tiny_trained", "path", "hub"]
    path: str | None = Field(default=None, description="local directory (path) or hub id (hub)")
    tokenizer: str | None = None
    tiny: TinyModelSpec | None = None
    arch: ModelArch | None = Field(default=None, description="shape for feasibility checks (GPU models)")
    cache_dir: str | None = Field(default=None, description="where tiny models are built; None = default cache")

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if self.source in ("tiny_random", "tiny_trained") and self.tiny is None:
            raise ValueError(f"source '{self.source}' needs the 'tiny' section")
        if self.source == "tiny_trained" and (self.tiny is None or self.tiny.train is None):
            raise ValueError("source 'tiny_trained' needs 'tiny.train' (the task it is trained on)")
        if self.source in ("path", "hub") and not self.path:
            raise ValueError(f"source '{self.source}' needs 'path'")
        if self.source in ("tiny_random", "tiny_trained") and self.path:
            # A key a chosen config makes dead is an error, never silently ignored (issue 20): the
            # run would build and measure the tiny model, or tokenize for it, not the one named.
            raise ValueError(
                f"path '{self.path}' is not used when source is '{self.source}' (the model is built "
                "locally): set model.source=path for a local folder, or model.source=hub for a hub id"
            )
        return self
