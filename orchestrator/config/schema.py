"""Typed schema of a trial and of a sweep's settings (pydantic, ``extra="forbid"``).

The Hydra ``DictConfig`` is turned into these models once, in :mod:`orchestrator.config.convert`;
everything downstream sees typed objects only.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

ArrivalKind = Literal["poisson", "gamma", "constant"]


class StrictModel(BaseModel):
    """Base model: unknown keys are errors, instances are immutable."""

    # inf (rate: inf) must survive JSON (Ray ships specs as JSON): "Infinity", not null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


# --------------------------------------------------------------------------- engine


def _check_extra_args(extra_args: list[str | int | float], managed: dict[str, str]) -> None:
    """Flags the orchestrator sets itself may not come in through ``extra_args``."""
    for arg in extra_args:
        flag = str(arg).split("=", 1)[0]
        if flag in managed:
            raise ValueError(f"extra_args may not set {flag}; use {managed[flag]} instead")


# Where an engine's servers come from (orchestrator/engines/envs.py); shared by vLLM and SGLang.
EnginePython = Annotated[
    str | None,
    Field(
        description=(
            "interpreter for the server; None = the engine environment of `make engines-gpu` on platform=gpu, "
            "this interpreter on the CPU"
        )
    ),
]
LaunchPrefix = Annotated[
    list[str],
    Field(
        description=(
            "argv put before the interpreter, e.g. [apptainer, exec, --nv, vllm.sif] or "
            "[srun, --container-image=IMAGE]; the interpreter is then engine.python or python3 inside it"
        )
    ),
]


class DisaggregationSpec(StrictModel):
    """Prefill/decode disaggregation: one prefill and one decode server with their own GPUs,
    a KV connector between them and a proxy/router in front (the trial is measured there).

    ``connector`` is vLLM's KV connector (``NixlConnector``, ``P2pNcclConnector``) or
    SGLang's transfer backend (``mooncake``, ``nixl``).
    """

    connector: str
    prefill_tp: PositiveInt = 1
    decode_tp: PositiveInt = 1

    @property
    def num_gpus(self) -> int:
        return self.prefill_tp + self.decode_tp


class LMCacheSpec(StrictModel):
    """LMCache behind vLLM (``LMCacheConnectorV1``): its config file is rendered per trial."""

    chunk_size: PositiveInt = 256
    local_cpu: bool = True
    max_local_cpu_size_gb: PositiveFloat = 5.0
    local_disk: str | None = Field(default=None, description="directory of the disk tier; None = no disk tier")
    max_local_disk_size_gb: PositiveFloat = 20.0


class RouterSpec(StrictModel):
    """Data parallelism behind the SGLang router (PyPI ``sglang-router``): ``replicas`` identical
    engine servers (their own GPUs; a core each on the CPU) and the router in front, where the
    trial is measured. Week 9: round-robin vs cache-aware routing on a shared-prefix workload."""

    replicas: int = Field(default=2, ge=2)
    policy: Literal["round_robin", "cache_aware", "random", "power_of_two"] = "cache_aware"
    extra_args: list[str | int | float] = Field(default_factory=list, description="appended to the router's argv")


class BaseEngineSpec(StrictModel):
    """What every kind of trial's engine answers, whatever its fields (typed, no getattr)."""

    @property
    def num_gpus(self) -> int:
        return 0

    @property
    def context_limit(self) -> int | None:
        """The most tokens of one sequence the server takes, when configured."""
        return None

    @property
    def hold_s(self) -> float | None:
        """Seconds a trial holds its resources without a server (the sleep kind), else None."""
        return None


class LaunchedEngineSpec(BaseEngineSpec):
    """The fields of every engine whose servers the trial starts (vLLM, SGLang)."""

    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="None picks a free port")
    dtype: str = "auto"
    tensor_parallel_size: PositiveInt = 1
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    disaggregation: DisaggregationSpec | None = None
    reset_cache_between_points: bool = Field(default=False, description="empty the prefix cache before each point")
    restart_between_points: bool = Field(default=False, description="a fresh server for every load point")
    extra_args: list[str | int | float] = Field(default_factory=list, description="appended to argv as strings")
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: PositiveFloat = 600.0
    python: EnginePython = None
    launch_prefix: LaunchPrefix = Field(default_factory=list)

    @property
    def gpu_memory_share(self) -> float:
        """The share of each GPU's memory the engine takes: configured, else the engine's default."""
        raise NotImplementedError


class VLLMEngineSpec(LaunchedEngineSpec):
    """Server knobs of a vLLM trial. ``None`` means "leave vLLM's default"."""

    name: Literal["vllm"] = "vllm"
    api_key_env: str | None = Field(
        default=None,
        description="name of an environment variable holding the "
        "server's API key (passed to vLLM as VLLM_API_KEY, never on argv)",
    )
    max_model_len: PositiveInt | None = None
    block_size: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    enable_chunked_prefill: bool | None = None
    max_num_seqs: PositiveInt | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    pipeline_parallel_size: PositiveInt = 1
    speculative_config: dict[str, Any] | None = None
    kv_transfer_config: dict[str, Any] | None = Field(default=None, description="set by hand; P/D and LMCache set it")
    lmcache: LMCacheSpec | None = None
    router: RouterSpec | None = None
    reset_cache_between_points: bool = Field(
        default=False,
        description="POST /reset_prefix_cache before each load point (needs VLLM_SERVER_DEV_MODE=1, "
        "which the adapter sets)",
    )
    restart_between_points: bool = Field(
        default=False, description="a fresh server for every load point (cold vs warm across a restart, LMCache)"
    )
    seed: int | None = None
    cpu_kvcache_space_gib: PositiveInt | None = Field(
        default=None, description="VLLM_CPU_KVCACHE_SPACE (whole GiB) on the CPU build"
    )
    cpu_omp_threads_bind: str | None = Field(default=None, description="VLLM_CPU_OMP_THREADS_BIND")

    @model_validator(mode="after")
    def _extra_args_not_managed(self) -> VLLMEngineSpec:
        _check_extra_args(
            self.extra_args,
            {"--model": "model", "--served-model-name": "model.name", "--host": "engine.host", "--port": "engine.port"},
        )
        if sum(x is not None for x in (self.kv_transfer_config, self.disaggregation, self.lmcache)) > 1:
            raise ValueError("set at most one of kv_transfer_config, disaggregation and lmcache")
        if self.router is not None and self.disaggregation is not None:
            raise ValueError("set router (data parallel replicas) or disaggregation, not both")
        if (
            self.disaggregation is not None
            and self.disaggregation.connector == "ExampleConnector"
            and self.max_model_len is None
        ):
            raise ValueError(
                "disaggregation.connector ExampleConnector needs engine.max_model_len: the prefill "
                "server takes whole prompts in one step (max_num_batched_tokens = max_model_len)"
            )
        if self.disaggregation is not None and self.tensor_parallel_size != 1:
            raise ValueError("with disaggregation, set disaggregation.prefill_tp / decode_tp, not tensor_parallel_size")
        return self

    @property
    def num_gpus(self) -> int:
        if self.disaggregation is not None:
            return self.disaggregation.num_gpus
        replicas = self.router.replicas if self.router is not None else 1
        return replicas * self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def context_limit(self) -> int | None:
        return self.max_model_len

    @property
    def gpu_memory_share(self) -> float:
        return self.gpu_memory_utilization or 0.9  # vLLM's --gpu-memory-utilization default


class SGLangEngineSpec(LaunchedEngineSpec):
    """Server knobs of an SGLang trial (``python -m sglang.launch_server``). ``None`` = SGLang's default."""

    name: Literal["sglang"] = "sglang"
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    context_length: PositiveInt | None = None
    chunked_prefill_size: int | None = Field(default=None, ge=-1, description="-1 disables chunked prefill")
    schedule_policy: Literal["fcfs", "lpm", "dfs-weight", "lof", "random", "priority"] | None = None
    disable_radix_cache: bool = False
    page_size: PositiveInt | None = None
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None = None
    speculative_num_steps: PositiveInt | None = None
    speculative_eagle_topk: PositiveInt | None = None
    speculative_num_draft_tokens: PositiveInt | None = None
    speculative_draft_model_path: str | None = None
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"] | None = None
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    max_running_requests: PositiveInt | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: PositiveInt | None = None
    random_seed: int | None = None
    reset_cache_between_points: bool = Field(default=False, description="POST /flush_cache before each load point")
    startup_timeout_s: PositiveFloat = 900.0

    @model_validator(mode="after")
    def _consistent(self) -> SGLangEngineSpec:
        _check_extra_args(
            self.extra_args,
            {
                "--model-path": "model",
                "--model": "model",
                "--served-model-name": "model.name",
                "--host": "engine.host",
                "--port": "engine.port",
                "--tp-size": "engine.tensor_parallel_size",
            },
        )
        spec_knobs = (self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens)
        if any(k is not None for k in spec_knobs) and self.speculative_algorithm is None:
            raise ValueError("speculative_num_steps/eagle_topk/num_draft_tokens need speculative_algorithm")
        if self.speculative_num_steps is not None and None in spec_knobs:
            # SGLang asserts this at start: steps, top-k and draft tokens are set together.
            raise ValueError("speculative_num_steps needs speculative_eagle_topk and speculative_num_draft_tokens too")
        if self.speculative_algorithm == "STANDALONE" and not self.speculative_draft_model_path:
            raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path")
        if (
            self.page_size
            and self.chunked_prefill_size
            and self.chunked_prefill_size > 0
            and self.chunked_prefill_size % self.page_size
        ):
            raise ValueError(
                f"chunked_prefill_size {self.chunked_prefill_size} must be divisible by page_size {self.page_size}"
            )
        return self

    @property
    def num_gpus(self) -> int:
        if self.disaggregation is not None:
            return self.disaggregation.num_gpus
        return self.tensor_parallel_size

    @property
    def context_limit(self) -> int | None:
        return self.context_length

    @property
    def gpu_memory_share(self) -> float:
        return self.mem_fraction_static or 0.88  # SGLang's --mem-fraction-static default (one GPU)


class ExternalEngineSpec(BaseEngineSpec):
    """A server that is already running (started by hand, by a platform team, behind a gateway).

    Nothing is launched; the trial measures ``url``. The API key, if any, is read from the
    environment variable named by ``api_key_env`` (never written in a config).
    """

    name: Literal["external"] = "external"
    url: str = Field(pattern=r"^https?://[^/\s]+$", description="http(s)://host:port, no path")
    api_key_env: str | None = None
    health_path: str | None = "/health"
    metrics_path: str | None = "/metrics"
    metrics: Literal["vllm", "none"] = Field(default="vllm", description="whose Prometheus names to read")
    startup_timeout_s: PositiveFloat = 60.0


class SleepEngineSpec(BaseEngineSpec):
    """A trial that starts no server and only holds its resources for ``seconds``: cluster
    smoke tests (do GPUs get placed?) and the packing benchmark."""

    name: Literal["sleep"] = "sleep"
    gpus: int = Field(default=0, ge=0)
    seconds: float = Field(default=1.0, ge=0)

    @property
    def num_gpus(self) -> int:
        return self.gpus

    @property
    def hold_s(self) -> float | None:
        return self.seconds


EngineSpec = Annotated[
    VLLMEngineSpec | SGLangEngineSpec | ExternalEngineSpec | SleepEngineSpec, Field(discriminator="name")
]

# --------------------------------------------------------------------------- model


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
    """What feasibility needs to know of a model it cannot read here (hub models on GPUs).

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


# --------------------------------------------------------------------------- workload


class RequestClass(StrictModel):
    """One kind of request in a workload and where its prompts come from (``dataset``).

    * ``random``: prompts of ``input_tokens`` random tokens (``range_ratio`` spreads lengths);
    * ``vllm_random``: like ``random``, but each prompt is a run of consecutive token ids from a
      random start, as ``vllm bench serve --dataset-name random`` builds them (to reproduce its
      numbers: on a small vocabulary such prompts share leading blocks and hit the prefix cache);
    * ``shared_prefix``: one of ``num_groups`` fixed prefixes of ``prefix_tokens``, then
      ``input_tokens`` random tokens (prefix-caching labs);
    * ``sharegpt``: the first user turn of conversations in the ShareGPT file ``path``; output
      length from the first reply unless ``output_tokens`` is set; prompts longer than
      ``max_input_tokens`` are skipped.
    * ``multi_turn``: conversations of ``turns`` user turns of ``input_tokens`` random tokens
      each; every turn after the first resends the whole conversation so far (user turns and
      the server's actual replies), ``think_time_s`` after the previous reply ended. A load
      point's arrivals and ``num_requests`` count conversations; each turn is one record.

    A class with ``rate`` set is background traffic: it arrives on its own process
    (``arrival``) at that rate while each load point runs, whatever the point's setting.
    """

    dataset: Literal["random", "vllm_random", "shared_prefix", "sharegpt", "multi_turn"] = "random"
    input_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = None
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0, description="lengths drawn in [n(1-r), n(1+r)]")
    output_tokens_choices: list[PositiveInt] | None = Field(
        default=None,
        description="output lengths drawn uniformly from this list (week 7); output_tokens must be their maximum",
    )
    num_groups: PositiveInt | None = None
    prefix_tokens: PositiveInt | None = None
    path: str | None = None
    turns: PositiveInt | None = Field(default=None, description="multi_turn: user turns per conversation")
    think_time_s: float = Field(default=0.0, ge=0.0, description="multi_turn: pause between a reply and the next turn")
    max_input_tokens: PositiveInt = 1024
    max_output_tokens: PositiveInt = 1024
    weight: PositiveFloat = 1.0
    rate: PositiveFloat | None = None
    arrival: ArrivalKind = "poisson"
    burstiness: PositiveFloat = Field(default=1.0, description="gamma shape; <1 burstier, >1 smoother")

    @model_validator(mode="after")
    def _dataset_fields(self) -> RequestClass:
        need = {
            "random": ("input_tokens", "output_tokens"),
            "vllm_random": ("input_tokens", "output_tokens"),
            "shared_prefix": ("input_tokens", "output_tokens", "num_groups", "prefix_tokens"),
            "sharegpt": ("path",),
            "multi_turn": ("input_tokens", "output_tokens", "turns"),
        }[self.dataset]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dataset '{self.dataset}' needs {', '.join(missing)}")
        # keys this dataset never reads: an error, never silently ignored (issue 20)
        owners = {
            "num_groups": "shared_prefix",
            "prefix_tokens": "shared_prefix",
            "path": "sharegpt",
            "max_input_tokens": "sharegpt",
            "turns": "multi_turn",
            "think_time_s": "multi_turn",
        }
        dead = [
            k
            for k, owner in owners.items()
            if k in self.model_fields_set
            and self.dataset != owner
            and getattr(self, k) != type(self).model_fields[k].default
        ]
        if dead:
            raise ValueError(
                f"{', '.join(dead)}: not used by dataset '{self.dataset}' (only by "
                f"{', '.join(sorted({owners[k] for k in dead}))}); remove it or set dataset"
            )
        if self.rate is None and (self.arrival != "poisson" or self.burstiness != 1):
            raise ValueError(
                "'arrival' and 'burstiness' of a class apply to background traffic only (set 'rate'); "
                "a foreground class arrives as the load point says"
            )
        if self.burstiness != 1 and self.arrival != "gamma":
            raise ValueError(
                f"'burstiness' shapes gamma arrivals only (arrival is '{self.arrival}'): set arrival: gamma"
            )
        if self.output_tokens_choices is not None:
            if not self.output_tokens_choices:
                raise ValueError("output_tokens_choices: expected a non-empty list")
            if self.output_tokens != max(self.output_tokens_choices):
                raise ValueError(
                    f"output_tokens must be max(output_tokens_choices) = "
                    f"{max(self.output_tokens_choices)} (it bounds the context)"
                )
        return self

    def max_tokens(self) -> int:
        """Upper bound of prompt + output tokens of one request."""
        spread = 1 + self.range_ratio
        if self.dataset == "sharegpt":
            return self.max_input_tokens + (int((self.output_tokens or 0) * spread) or self.max_output_tokens)
        assert self.input_tokens is not None and self.output_tokens is not None
        per_turn = int(self.input_tokens * spread) + int(self.output_tokens * spread)
        if self.dataset == "multi_turn":
            assert self.turns is not None
            return self.turns * (per_turn + 2)  # + a separator between messages (completions API)
        return (self.prefix_tokens or 0) + per_turn


class LoadPointSpec(StrictModel):
    """One arrival setting: closed-loop ``concurrency``, open-loop ``rate`` (req/s), or a ``trace``.

    ``rate`` may be ``inf`` (everything at once). With ``rate``: ``arrival`` picks the process,
    ``max_concurrency`` caps requests in flight without ever sending faster than the rate,
    ``ramp_up_s`` raises the rate linearly from 0 over that time. A ``trace`` (JSONL/CSV of
    timestamp, input_tokens, output_tokens) replays its own arrivals and lengths, its clock
    stretched by ``time_scale``.
    """

    concurrency: PositiveInt | None = None
    rate: PositiveFloat | None = None
    trace: str | None = None
    arrival: ArrivalKind = "poisson"
    burstiness: PositiveFloat = Field(default=1.0, description="gamma shape; <1 burstier, >1 smoother")
    max_concurrency: PositiveInt | None = None
    ramp_up_s: float = Field(default=0.0, ge=0.0)
    time_scale: PositiveFloat = 1.0
    num_requests: PositiveInt | None = None
    duration_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _one_arrival(self) -> LoadPointSpec:
        if sum(x is not None for x in (self.concurrency, self.rate, self.trace)) != 1:
            raise ValueError("a load point needs exactly one of 'concurrency', 'rate' or 'trace'")
        if self.rate is None and (self.max_concurrency is not None or self.ramp_up_s):
            raise ValueError("'max_concurrency' and 'ramp_up_s' apply to 'rate' points only")
        if self.rate is None and self.arrival != "poisson":
            raise ValueError(
                "'arrival' applies to 'rate' points only (a concurrency point is a closed loop, "
                "a trace replays its own timestamps)"
            )
        if self.trace is None and self.time_scale != 1:
            raise ValueError("'time_scale' applies to 'trace' points only")
        return self

    @model_validator(mode="after")
    def _burstiness_of_gamma(self) -> LoadPointSpec:
        if self.burstiness != 1 and self.arrival != "gamma":
            raise ValueError(
                f"'burstiness' shapes gamma arrivals only (arrival is '{self.arrival}'): set arrival: gamma"
            )
        return self

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        if self.trace is not None:
            return "trace" if self.time_scale == 1 else f"trace_x{self.time_scale:g}"
        return f"r{self.rate:g}"


class SLOSpec(StrictModel):
    """Per-request latency objectives; a request meeting all set ones counts toward goodput."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


class ValiditySpec(StrictModel):
    """When a load point's numbers describe the client rather than the server (point invalid).

    Lags are judged at p95: with a few dozen requests p99 is the single worst one, and one
    late send (e.g. the machine's other processes taking the core for a moment) is a blip,
    not a client that cannot keep up. p99 and max stay in the point's metrics.
    """

    max_send_lag_ms_p95: PositiveFloat = 10.0
    max_loop_lag_ms_p95: PositiveFloat = 10.0
    max_client_cpu_util: PositiveFloat = 0.9
    min_rate_ratio: float = Field(default=0.98, gt=0, le=1, description="achieved / scheduled rate")


class FidelitySpec(StrictModel):
    """When a load point's numbers describe another workload than the planned one (point
    invalid; :mod:`orchestrator.metrics.fidelity`). Defaults: a tokenizer mismatch (tens of
    percent) or a server ignoring ``ignore_eos`` is caught, a BOS token or a chat template's
    few tokens are not."""

    prompt_tokens_slack: NonNegativeInt = Field(
        default=16,
        description="tokens the server may count beyond the plan (BOS, chat template) before the "
        "relative limit applies",
    )
    max_prompt_tokens_error: PositiveFloat = Field(
        default=0.1, description="median |server - plan| prompt tokens as a fraction of the plan"
    )
    max_output_tokens_off: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="fraction of requests whose completion tokens differ from the plan "
        "(with ignore_eos; without it, only longer ones count)",
    )
    max_unexpected_hit_rate: float = Field(
        default=0.1, ge=0, le=1, description="prefix-cache hit rate allowed on prompts that share no prefix"
    )
    min_hit_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="shared-prefix / multi-turn prompts with caching on: hit rate at least "
        "this fraction of what the workload implies",
    )
    max_preemptions_per_request: float = Field(default=0.1, ge=0)
    max_rejected_fraction: float = Field(default=0.0, ge=0, le=1, description="requests refused with HTTP 4xx")
    max_gap_ms: PositiveFloat | None = Field(
        default=50.0,
        description="client TTFT/ITL median above the top of the server histogram's bucket by "
        "more than this: the client or the network (null: report only)",
    )


SLO_METRIC = re.compile(
    r"^(?:(?P<cls>[A-Za-z0-9_.-]+)/)?(?:ttft|tpot|itl|e2e|itl_worst)_ms_(?:mean|p50|p90|p95|p99|max)$"
)


class CapacitySpec(StrictModel):
    """Search each trial's running server for the highest load at which ``slo`` holds.

    Probes are ordinary load points (``point`` holds their other fields: arrival, stop, cap),
    at a request ``rate`` or a ``concurrency`` (``knob``): from ``start``, multiplied by
    ``growth`` while the SLOs hold and divided while they do not (within ``low``..``high``),
    then bisected until the bracket is narrower than ``precision`` of its top, or
    ``max_probes`` or ``time_budget_s`` are spent. A rate probe also fails when the server
    completes fewer than ``min_sustained`` of the offered requests per second (its queue grows).
    """

    knob: Literal["rate", "concurrency"] = "rate"
    slo: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="metric -> highest allowed value, e.g. ttft_ms_p99: 2000 or "
        "short/itl_ms_p99: 300 (a request class's metric)",
    )
    min_goodput_fraction: float | None = Field(
        default=None, gt=0.0, le=1.0, description="goodput (workload.slo) >= this share of completions"
    )
    start: PositiveFloat = 1.0
    low: PositiveFloat | None = Field(default=None, description="lowest probe; default start / 16 (rate) or 1")
    high: PositiveFloat = 64.0
    growth: float = Field(default=2.0, gt=1.0)
    precision: float = Field(default=0.1, gt=0.0, lt=1.0)
    max_probes: PositiveInt = 8
    time_budget_s: PositiveFloat | None = None
    min_sustained: float = Field(default=0.9, gt=0.0, le=1.0)
    point: dict[str, Any] = Field(default_factory=dict, description="other LoadPointSpec fields of every probe")

    @model_validator(mode="after")
    def _valid(self) -> CapacitySpec:
        if not self.slo and self.min_goodput_fraction is None:
            raise ValueError("capacity: set slo (metric -> limit) and/or min_goodput_fraction")
        bad = [k for k in self.slo if not SLO_METRIC.match(k)]
        if bad:
            raise ValueError(
                f"capacity.slo: {', '.join(bad)}: expected [<class>/]<ttft|tpot|itl|e2e|itl_worst>"
                "_ms_<mean|p50|p90|p95|p99|max>"
            )
        for key in ("rate", "concurrency", "trace"):
            if key in self.point:
                raise ValueError(f"capacity.point: '{key}' is set by the search (knob), not in point")
        if self.knob == "concurrency" and self.point.get("max_concurrency") is not None:
            raise ValueError("capacity.point.max_concurrency applies to rate probes only")
        self.probe(self.start)  # the template must make a valid point
        if self.lowest > self.start or self.start > self.high:
            raise ValueError(
                f"capacity: expected low <= start <= high, got {self.lowest:g}, {self.start:g}, {self.high:g}"
            )
        return self

    @property
    def lowest(self) -> float:
        if self.low is not None:
            return self.low
        return 1.0 if self.knob == "concurrency" else self.start / 16

    def probe(self, value: float) -> LoadPointSpec:
        """The load point of a probe at ``value`` (req/s, or streams)."""
        setting: Any = int(value) if self.knob == "concurrency" else value
        return LoadPointSpec.model_validate({**self.point, self.knob: setting})


class WorkloadSpec(StrictModel):
    """Requests and the load points they are sent at."""

    name: str
    api: Literal["completions", "chat"] = "completions"
    classes: dict[str, RequestClass] = Field(min_length=1)
    load_points: list[LoadPointSpec] = Field(default_factory=list, description="fixed points, run first")
    capacity: CapacitySpec | None = Field(default=None, description="then an SLO capacity search (probes)")
    num_requests: PositiveInt | None = Field(default=None, description="default per load point")
    duration_s: PositiveFloat | None = Field(default=None, description="default per load point")
    warmup_requests: int = Field(default=2, ge=0)
    seed: int = 0
    ignore_eos: bool = True
    usage_per_chunk: bool = Field(
        default=False,
        description="ask for usage in every chunk (vLLM's continuous_usage_stats): exact tokens per chunk "
        "under speculative decoding, at a per-token cost on the server; otherwise a chunk counts one "
        "token and the final usage gives the total",
    )
    request_timeout_s: PositiveFloat = 300.0
    client_processes: PositiveInt = Field(
        default=1,
        description="client processes sharing each point's schedule and clock (scale-out when one "
        "process cannot keep up); their records merge into one table",
    )
    slo: SLOSpec = Field(default_factory=SLOSpec)
    validity: ValiditySpec = Field(default_factory=ValiditySpec)
    fidelity: FidelitySpec = Field(default_factory=FidelitySpec)
    repeats: PositiveInt = Field(default=1, description="run each load point this many times (fresh requests each)")
    max_ci_rel_width: PositiveFloat = Field(
        default=0.2, description="flag a repeated point whose 95% CI half-width exceeds this fraction of the mean"
    )

    @model_validator(mode="after")
    def _stops_and_classes(self) -> WorkloadSpec:
        if not any(c.rate is None for c in self.classes.values()):
            raise ValueError("at least one request class must follow the load point (no 'rate' of its own)")
        if not self.load_points and self.capacity is None:
            raise ValueError("load_points is empty and there is no capacity search: nothing to measure")
        if self.capacity is not None:
            for key in self.capacity.slo:
                cls = SLO_METRIC.match(key).group("cls")  # type: ignore[union-attr]
                if cls is not None and cls not in self.classes:
                    raise ValueError(
                        f"capacity.slo.{key}: no request class '{cls}' (classes: {', '.join(self.classes)})"
                    )
            probe = self.capacity.probe(self.capacity.start)
            if (
                probe.trace is None
                and (probe.num_requests or self.num_requests or probe.duration_s or self.duration_s) is None
            ):
                raise ValueError("capacity probes have no stop: set num_requests or duration_s")
        for i, p in enumerate(self.load_points):
            if p.trace is None and (p.num_requests or self.num_requests or p.duration_s or self.duration_s) is None:
                raise ValueError(f"load_points[{i}] has no stop: set num_requests or duration_s")
            if p.rate == float("inf") and self.stop_of(p)[0] is None:
                raise ValueError(f"load_points[{i}]: rate inf sends everything at once and needs num_requests")
        return self

    def stop_of(self, point: LoadPointSpec) -> tuple[int | None, float | None]:
        """(num_requests, duration_s) in force for a point."""
        n = point.num_requests if point.num_requests is not None else self.num_requests
        d = point.duration_s if point.duration_s is not None else self.duration_s
        if point.num_requests is not None and point.duration_s is None:
            d = None
        if point.duration_s is not None and point.num_requests is None:
            n = None
        return n, d

    def max_request_tokens(self) -> int:
        return max(c.max_tokens() for c in self.classes.values())


# --------------------------------------------------------------------------- platform, cluster, tracking


class PlatformSpec(StrictModel):
    """The kind of hardware trials run on."""

    name: Literal["cpu", "gpu"]
    device: Literal["cpu", "cuda"]
    max_concurrent_trials: PositiveInt | None = Field(
        default=None, description="cap on trials measured at once; 1 on CPU (they would share cores)"
    )
    cpus_per_trial: PositiveFloat = 1.0
    monitor_interval_s: PositiveFloat = 0.5
    monitor_budget: float = Field(
        default=0.01,
        gt=0.0,
        le=1.0,
        description=(
            "share of wall time each kind of sample (memory, engine gauges) may take: a sample that "
            "took w seconds waits max(monitor_interval_s, w / monitor_budget) before the next"
        ),
    )
    gpu_name: str | None = Field(default=None, description="a key of orchestrator/models/gpus.py, e.g. A100-80GB")
    gpu_memory_gb: PositiveFloat | None = Field(default=None, description="None = from gpu_name")
    # The roofline of a decode step (week 3): None = from gpu_name on GPUs; on CPU the memory
    # bandwidth is measured once per worker (numpy copy) and the peak is an estimate.
    memory_bandwidth_gb_s: PositiveFloat | None = None
    peak_tflops: PositiveFloat | None = None
    # Engine defaults that belong to the hardware (engine configs interpolate them).
    dtype: str = "auto"
    enforce_eager: bool = False
    cpu_kvcache_space_gib: PositiveInt | None = None
    engine_envs: str | None = Field(
        default=None,
        description=(
            "folder holding the engine environments (vllm-gpu/, sglang-gpu/) that `make engines-gpu` creates; "
            "None = $INFERENCE_LAB_ENGINES, else <project>/.engines. Used on device cuda"
        ),
    )


class ClusterSpec(StrictModel):
    """Where Ray runs. ``address`` None starts a local Ray."""

    address: str | None = None
    num_cpus: PositiveInt | None = None
    num_gpus: int | None = Field(default=None, ge=0, description="logical GPUs for a local Ray")
    include_dashboard: bool = False
    max_attempts: PositiveInt = Field(default=3, description="attempts of a trial lost with its Ray worker or node")


class TrackingSpec(StrictModel):
    """Where results go. The driver is the only writer."""

    uri: str
    experiment_name: str | None = Field(default=None, description="None = the experiment's name")
    enabled: bool = True


# --------------------------------------------------------------------------- trial and sweep


class EvalSpec(StrictModel):
    """Accuracy scored by lm-eval (``local-completions``) against the trial's own server, after
    its load points. ``tasks`` empty = no evaluation."""

    name: str = "none"
    tasks: list[str] = Field(default_factory=list, description="lm-eval task names")
    local_tasks: bool = Field(default=False, description="tasks shipped in orchestrator/evaluation/tasks (offline)")
    limit: PositiveInt | None = Field(default=None, description="questions per task (None = all)")
    num_fewshot: int | None = Field(default=None, ge=0)
    num_concurrent: PositiveInt = 4
    max_gen_toks: PositiveInt = 256
    timeout_s: PositiveFloat = 1800.0

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, v: list[str]) -> list[str]:
        bad = [t for t in v if not re.fullmatch(r"[A-Za-z0-9_.\-]+", t)]
        if bad:
            raise ValueError(f"task names may hold only letters, digits, '_', '.', '-': {bad}")
        return v


class TrialSpec(StrictModel):
    """Everything that determines one trial's measurement."""

    experiment: str
    variant: str | None = None
    seed: int = 0
    engine: EngineSpec
    model: ModelSpec
    workload: WorkloadSpec
    platform: PlatformSpec
    eval: EvalSpec = Field(default_factory=EvalSpec)

    @model_validator(mode="after")
    def _fits_context(self) -> TrialSpec:
        need = self.workload.max_request_tokens()
        limit = getattr(self.engine, "max_model_len", None) or getattr(self.engine, "context_length", None)
        if limit is None and self.model.tiny is not None:
            limit = self.model.tiny.max_position_embeddings
        if limit is not None and need > limit:
            raise ValueError(
                f"workload '{self.workload.name}' needs up to {need} tokens per request "
                f"(input + output at the top of range_ratio) but the context is {limit} "
                "(engine.max_model_len / model)"
            )
        if (
            self.model.tokenizer
            and self.model.source in ("tiny_random", "tiny_trained")
            and self.engine.name in ("vllm", "sglang")
        ):
            raise ValueError(
                f"model.tokenizer '{self.model.tokenizer}': the tiny model ({self.model.source}) is built "
                "with its own tokenizer and cannot be served with another; model.tokenizer is for "
                "model.source=path/hub (passed to the server too) or engine=external"
            )
        if self.workload.capacity is not None and getattr(self.engine, "restart_between_points", False):
            raise ValueError(
                "workload.capacity searches one running server: it cannot be combined with "
                "engine.restart_between_points"
            )
        return self


class ObjectiveSpec(StrictModel):
    """What the sweep's verdict optimises: one metric of each trial (or a knob, e.g.
    ``engine.max_num_batched_tokens``), among the trials that meet ``subject_to``.

    A metric is read from the trial's own metrics when it has one by that name (e.g.
    ``slo_capacity_rps``), else at load point ``at`` (a label such as ``c4``; default the
    trial's heaviest fixed point); ``<class>/<metric>`` reads a request class's metric.
    ``subject_to`` maps a metric to its highest allowed value, to ``{min: x}`` / ``{max: x}``,
    or to ``base-D``: at least the first trial's value minus D (e.g. ``accuracy: base-0.01``).
    ``frontier`` names two metrics, ``{maximize: a, minimize: b}``, for a Pareto plot; ``show``
    lists more metrics to quote next to the verdict and in its per-knob tables.
    """

    maximize: str | None = None
    minimize: str | None = None
    at: str | None = None
    subject_to: dict[str, float | str | dict[Literal["min", "max"], float]] = Field(default_factory=dict)
    show: list[str] = Field(default_factory=list)
    frontier: dict[Literal["maximize", "minimize"], str] | None = None

    @model_validator(mode="after")
    def _one_direction(self) -> ObjectiveSpec:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("objective: set exactly one of maximize / minimize (a metric or a knob)")
        for key, bound in self.subject_to.items():
            if isinstance(bound, str) and not re.fullmatch(r"base-\d+(\.\d+)?", bound):
                raise ValueError(
                    f"objective.subject_to.{key}: expected a number, {{min: x}}, {{max: x}} or "
                    f"'base-D' (at least the baseline minus D), got {bound!r}"
                )
        if self.frontier is not None and len(self.frontier) != 2:
            raise ValueError("objective.frontier: expected {maximize: metric, minimize: metric}")
        return self

    @property
    def key(self) -> str:
        return self.maximize or self.minimize  # type: ignore[return-value]


class SweepSettings(StrictModel):
    """Settings of a sweep that do not change a trial's measurement (not in the trial hash)."""

    tracking: TrackingSpec
    cluster: ClusterSpec
    dry_run: bool = False
    resume: bool = Field(default=True, description="skip trials whose hash already has a FINISHED run")
    reuse_servers: bool = Field(default=True, description="trials with identical servers share one server start")
    objective: ObjectiveSpec | None = Field(default=None, description="the report's verdict (see ObjectiveSpec)")
