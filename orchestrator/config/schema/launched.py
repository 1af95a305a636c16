"""What the engine specs share: the base every kind of engine answers (:class:`BaseEngineSpec`)
and the fields of an engine whose servers the trial starts (:class:`LaunchedEngineSpec`: address,
parallelism, P/D disaggregation, environment, interpreter, launch prefix), with the check that
``extra_args`` sets no flag the orchestrator sets itself. The engines are in :mod:`.engines`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PositiveFloat, PositiveInt

from .base import StrictModel


def _env_text(value: Any) -> Any:
    """``engine.env.OMP_NUM_THREADS=4`` (Hydra reads 4 as a number): the environment holds its
    text; a boolean as 1 / 0; anything else (a list, a mapping) is left for the type to refuse."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    return value


EnvValue = Annotated[str, BeforeValidator(_env_text)]


def check_extra_args(extra_args: list[str | int | float], managed: dict[str, str]) -> None:
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

    @property
    def launched(self) -> LaunchedEngineSpec | None:
        """The engine as one whose servers the trial starts (its host, port, parallelism, dtype),
        or None: a server somebody else runs, or none at all."""
        return None


class LaunchedEngineSpec(BaseEngineSpec):
    """The fields of every engine whose servers the trial starts (vLLM, SGLang)."""

    @property
    def launched(self) -> LaunchedEngineSpec | None:
        return self

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
    env: dict[str, EnvValue] = Field(
        default_factory=dict,
        description="the servers' environment (a number or a boolean is written as the shell would)",
    )
    startup_timeout_s: PositiveFloat = 600.0
    python: EnginePython = None
    launch_prefix: LaunchPrefix = Field(default_factory=list)

    @property
    def gpu_memory_share(self) -> float:
        """The share of each GPU's memory the engine takes: configured, else the engine's default."""
        raise NotImplementedError
