"""The model a trial serves: a local tiny model, a path or a hub id."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from .base import PositiveShare, StrictModel


class TinyTrainSpec(StrictModel):
    """Training of a tiny model on a synthetic task (CPU minutes), so that it can score: 2-digit
    addition "a+b=" -> the sum, one problem a row, the eval set (orchestrator/evaluation/tasks)
    held out. 200 training problems are kept aside as a validation set: when the model answers
    fewer than ``min_accuracy`` of them right after ``steps``, it trains on, ``steps // 4`` steps
    at ``lr / 2`` a round, for at most ``extra_rounds`` rounds (when it learns varies with the
    machine's floating-point rounding: 800 to 1600 steps in the runs of docs/benchmarks.md)."""

    task: Literal["addition"] = "addition"
    steps: PositiveInt = 2400
    batch_size: PositiveInt = Field(default=32, description="problems a step")
    lr: PositiveFloat = 1e-3
    min_accuracy: PositiveShare = Field(default=0.95, description="on the validation problems, greedy")
    extra_rounds: NonNegativeInt = 3
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


# The ranks vLLM's LoRA config takes (vllm.config.lora.MaxLoRARanks): an adapter's rank and
# engine.max_lora_rank are among these.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


LORA_TAGS = "abcdefghijklmnopqrstuvwxyz"  # the tiny adapter k answers "a+b=" with the sum, then LORA_TAGS[k]


def tiny_lora_name(index: int) -> str:
    """The served name of the tiny model's adapter ``index``: lora-a, lora-b, ... (its tag letter)."""
    return f"lora-{LORA_TAGS[index]}"


class TinyLoraSpec(StrictModel):
    """LoRA adapters trained here on a ``tiny_trained`` base (orchestrator/models/lora.py):
    adapter k answers "a+b=" with the sum and its own tag letter after it, so an answer tells which
    adapter (or the base) served it. Served as ``lora-a``, ``lora-b``, ..."""

    count: int = Field(default=4, ge=1, le=26, description="adapters lora-a, lora-b, ... (one tag letter each)")
    rank: LoraRank = 8
    alpha: PositiveFloat = Field(
        default=16.0, description="scale alpha/rank; a fixed alpha makes Adam's steps the same size at every rank"
    )
    targets: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    steps: PositiveInt = 150
    batch_size: PositiveInt = 32
    lr: PositiveFloat = 2e-3
    min_accuracy: PositiveShare = Field(
        default=0.9,
        description="of the 200 validation problems, those the base answers right: the share the adapter must "
        "answer right with its tag (teacher-forced); below it after `steps`, it trains on, steps // 2 at lr / 2 a "
        "round, at most `extra_rounds` rounds; still below, it says so",
    )
    extra_rounds: NonNegativeInt = 3
    seed: int = 0
    threads: PositiveInt = 2

    @model_validator(mode="after")
    def _known_targets(self) -> TinyLoraSpec:
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if unknown:
            raise ValueError(f"targets {unknown}: the tiny Llama's linear layers are {list(LORA_TARGETS)}")
        return self

    def names(self) -> list[str]:
        return [tiny_lora_name(k) for k in range(self.count)]


class LoraAdapterSpec(StrictModel):
    """An adapter of one's own: a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors)."""

    name: str = Field(description="the name requests put in 'model'")
    path: str


class LoraSpec(StrictModel):
    """The LoRA adapters served over the model: one's own (``adapters``) and/or the tiny model's
    (``tiny``). The engine loads them (engine.enable_lora and its slots); the workload's
    ``adapters`` section spreads requests over them."""

    adapters: list[LoraAdapterSpec] = Field(default_factory=list)
    tiny: TinyLoraSpec | None = None

    @model_validator(mode="after")
    def _some_unique(self) -> LoraSpec:
        if not self.adapters and self.tiny is None:
            raise ValueError("model.lora: expected 'adapters' (name, path) or 'tiny' (adapters trained here)")
        names = self.names()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"model.lora: adapter names {dup} appear more than once (the tiny ones are lora-a, ...)")
        return self

    def names(self) -> list[str]:
        """The served names: one's own adapters, then the tiny ones."""
        return [a.name for a in self.adapters] + (self.tiny.names() if self.tiny is not None else [])


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
    lora: LoraSpec | None = Field(default=None, description="LoRA adapters served over this model")

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if self.source in ("tiny_random", "tiny_trained") and self.tiny is None:
            raise ValueError(f"source '{self.source}' needs the 'tiny' section")
        if self.source == "tiny_trained" and (self.tiny is None or self.tiny.train is None):
            raise ValueError("source 'tiny_trained' needs 'tiny.train' (the task it is trained on)")
        if self.source in ("path", "hub") and not self.path:
            raise ValueError(f"source '{self.source}' needs 'path'")
        if self.lora is not None and self.lora.tiny is not None and self.source != "tiny_trained":
            raise ValueError(
                f"model.lora.tiny: the tiny adapters are trained on the tiny_trained adder (model=tiny_adder), "
                f"not on source '{self.source}'; serve adapters of one's own with model.lora.adapters"
            )
        if self.source in ("tiny_random", "tiny_trained") and self.path:
            # A key a chosen config makes dead is an error, never silently ignored (issue 20): the
            # run would build and measure the tiny model, or tokenize for it, not the one named.
            raise ValueError(
                f"path '{self.path}' is not used when source is '{self.source}' (the model is built "
                "locally): set model.source=path for a local folder, or model.source=hub for a hub id"
            )
        return self
