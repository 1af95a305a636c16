"""Engine specs: vLLM, SGLang (launched by us), an external server, a sleep stand-in. What they
share (the base specs, the launched engines' fields) is in :mod:`.launched`."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from .base import PositiveShare, StrictModel
from .launched import BaseEngineSpec, LaunchedEngineSpec, check_extra_args
from .model import LoraRank


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


# vLLM 0.32's own value sets (the CPU build and engines/vllm-gpu.txt pin the same version;
# tests/unit/test_vllm_args.py reads them back from the installed vLLM's source): a typo is an
# error naming the key here, not argparse's refusal when the server starts.
VLLMDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]  # vllm.config.model.ModelDType
VLLMCacheDType = Literal[  # vllm.config.cache.CacheDType
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
]
VLLMQuantization = Literal[  # vllm.model_executor.layers.quantization.QuantizationMethods
    "awq",
    "auto_awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
]


class VLLMEngineSpec(LaunchedEngineSpec):
    """Server knobs of a vLLM trial. ``None`` means "leave vLLM's default"."""

    name: Literal["vllm"] = "vllm"
    dtype: VLLMDType = "auto"
    kv_cache_dtype: VLLMCacheDType | None = None
    quantization: VLLMQuantization | None = None
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
    gpu_memory_utilization: PositiveShare | None = None
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
    enable_lora: bool | None = Field(
        default=None, description="serve LoRA adapters; None: on when model.lora names some (--enable-lora)"
    )
    max_loras: PositiveInt | None = Field(default=None, description="adapters in one batch (vLLM's default 1)")
    max_lora_rank: LoraRank | None = Field(
        default=None, description="the largest adapter rank the server takes (vLLM's default 16)"
    )
    max_cpu_loras: PositiveInt | None = Field(
        default=None, description="adapters kept in CPU memory (vLLM's default: max_loras); others reload from disk"
    )
    lora_loading: Literal["start", "runtime"] = Field(
        default="start",
        description="start: model.lora's adapters on the command line (--lora-modules); runtime: the trial loads "
        "each through POST /v1/load_lora_adapter once the server is up (VLLM_ALLOW_RUNTIME_LORA_UPDATING), timed",
    )
    enable_prompt_tokens_details: bool = Field(
        default=False, description="each response's usage says its prompt's cached tokens (per-request prefix hits)"
    )

    @field_validator("speculative_config")
    @classmethod
    def _speculation(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        """What vLLM needs of a speculative config, said now (it was a start-up traceback, or on
        the CPU "speculative method 'None'"): a method or a draft model, a draft model for the
        methods that need one, a positive token count. A draft folder is not looked for here: a
        GPU sweep is often planned on another machine than the one it runs on."""
        if v is None:
            return v
        method, draft, n = v.get("method"), v.get("model"), v.get("num_speculative_tokens")
        if method is None and draft is None:
            raise ValueError(
                "expected 'method' (ngram, eagle, eagle3, mtp, draft_model, ...) or 'model' (a draft model)"
            )
        if method in ("eagle", "eagle3", "medusa", "mlp_speculator", "draft_model") and draft is None:
            raise ValueError(f"method {method} needs 'model' (its draft model or head)")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"num_speculative_tokens: expected a whole number >= 1, got {n!r}")
        return v

    @model_validator(mode="after")
    def _extra_args_not_managed(self) -> VLLMEngineSpec:
        check_extra_args(
            self.extra_args,
            {
                "--model": "model",
                "--served-model-name": "model.name",
                "--host": "engine.host",
                "--port": "engine.port",
                "--lora-modules": "model.lora",
            },
        )
        if self.max_cpu_loras is not None and self.max_cpu_loras < (self.max_loras or 1):
            raise ValueError(
                f"max_cpu_loras {self.max_cpu_loras} must be >= max_loras {self.max_loras or 1} (vLLM refuses it)"
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
    mem_fraction_static: PositiveShare | None = None
    max_running_requests: PositiveInt | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: PositiveInt | None = None
    random_seed: int | None = None
    enable_lora: bool | None = Field(
        default=None, description="serve LoRA adapters; None: on when model.lora names some (--enable-lora)"
    )
    max_loras_per_batch: PositiveInt | None = Field(default=None, description="adapters in one batch (SGLang: 8)")
    max_loaded_loras: PositiveInt | None = Field(default=None, description="adapters kept in CPU memory")
    max_lora_rank: LoraRank | None = Field(default=None, description="None: the largest rank of the adapters given")
    lora_backend: str | None = Field(default=None, description="SGLang's LoRA kernels (triton, csgmv, ...)")
    reset_cache_between_points: bool = Field(default=False, description="POST /flush_cache before each load point")
    startup_timeout_s: PositiveFloat = 900.0

    @model_validator(mode="after")
    def _consistent(self) -> SGLangEngineSpec:
        check_extra_args(
            self.extra_args,
            {
                "--model-path": "model",
                "--model": "model",
                "--served-model-name": "model.name",
                "--host": "engine.host",
                "--port": "engine.port",
                "--tp-size": "engine.tensor_parallel_size",
                "--lora-paths": "model.lora",
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
    url: str = Field(description="http(s)://host:port, no path")
    api_key_env: str | None = None
    health_path: str | None = "/health"
    metrics_path: str | None = "/metrics"
    metrics: Literal["vllm", "none"] = Field(default="vllm", description="whose Prometheus names to read")
    startup_timeout_s: PositiveFloat = 60.0

    @field_validator("url")
    @classmethod
    def _server_url(cls, url: str) -> str:
        """http(s)://host[:port], said part by part when it is not (a port out of range or not a
        number failed later, inside the trial, as a traceback)."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.netloc or any(c.isspace() for c in url):
            raise ValueError("expected http(s)://host:port")
        if u.path.strip("/") or u.query or u.fragment:
            raise ValueError("expected the server's root, http(s)://host:port, no path (the client adds /v1/...)")
        try:
            port = u.port
        except ValueError:
            raise ValueError("expected a port from 1 to 65535 after the host") from None
        if port == 0 or not u.hostname:
            raise ValueError("expected a host and a port from 1 to 65535")
        return url.rstrip("/")


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
