"""A trial (everything that determines one measurement) and a sweep's settings; what a sweep's
report judges the trials by (the objective, the expected phenomena) is in :mod:`.goals`."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from .base import StrictModel, all_match
from .engines import EngineSpec
from .goals import ExpectationSpec, ObjectiveSpec
from .launched import LaunchedEngineSpec
from .model import ModelSpec
from .platform import ClusterSpec, PlatformSpec, TrackingSpec
from .sizing import SizingSpec
from .workload import WorkloadSpec


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
    adapters: bool = Field(
        default=False,
        description="score every LoRA adapter of model.lora too: the tiny ones by their own scorer (does each "
        "answer in its adapter's convention?), one's own with `tasks` under each adapter's name",
    )

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, v: list[str]) -> list[str]:
        return all_match(v, r"[A-Za-z0-9_.\-]+", "task names may hold only letters, digits, '_', '.', '-'")


class NsysSpec(StrictModel):
    """Nsight Systems around each engine server (GPUs only; opt-in: ``profile.nsys: {}``): the
    server runs under ``nsys profile --capture-range=cudaProfilerApi``, inside
    ``engine.launch_prefix`` when there is one, and the engine's start/stop profile endpoints
    (vLLM's ``cuda`` profiler, SGLang's ``CUDA_PROFILER`` activity) open and close the capture
    around the chosen window. NCCL's collectives (tensor parallelism) show as NVTX ranges: NCCL
    annotates them itself, so keep ``nvtx`` in ``trace``. The ``.nsys-rep`` report is written when
    the server exits and is a trial artifact (open it in the Nsight Systems GUI)."""

    path: str = Field(default="nsys", description="the nsys executable, where the server runs")
    trace: list[str] = Field(default_factory=lambda: ["cuda", "nvtx", "osrt"], min_length=1)
    cuda_graph_trace: Literal["graph", "node"] = Field(default="node", description="kernels inside CUDA graphs")
    args: list[str] = Field(default_factory=list, description="more `nsys profile` options, one per item")
    stop_grace_s: PositiveFloat = Field(default=300.0, description="time nsys gets to write its report at stop")

    @field_validator("trace")
    @classmethod
    def _trace_names(cls, v: list[str]) -> list[str]:
        return all_match(
            v, r"[a-z0-9][a-z0-9-]*", "nsys trace names are lower-case words like cuda, nvtx, osrt, cublas"
        )


class ProfileSpec(StrictModel):
    """A profiler trace of a window of one load point: the engine starts with its profiler
    configured (vLLM: ``--profiler-config``, torch; SGLang: its profile endpoints) and the window
    is bracketed with the server's start/stop profile endpoints. The trace (gzipped Chrome trace
    JSON, opened in Perfetto; with ``nsys`` on GPUs an Nsight Systems report) is a trial artifact. The profiler slows the point: it is marked
    ``profiled`` and the verdict does not read it unless ``in_verdict``."""

    point: str = Field(description="label of the load point to profile (e.g. c8, r2)")
    start_after_s: float = Field(default=1.0, ge=0.0, description="seconds into the point before the trace starts")
    duration_s: PositiveFloat = Field(default=3.0, description="seconds traced (less if the point ends first)")
    with_stack: bool = Field(default=False, description="Python stacks of each op (large traces)")
    record_shapes: bool = False
    in_verdict: bool = Field(default=False, description="let the verdict read the profiled point")
    nsys: NsysSpec | None = Field(default=None, description="Nsight Systems instead of the torch profiler (GPUs)")


class TrialSpec(StrictModel):
    """Everything that determines one trial's measurement."""

    experiment: str
    variant: str | None = None
    seed: int = 0
    run: int = Field(
        default=0,
        ge=0,
        description="which run of this configuration: 0 the first; a race's repeats 1, 2, ... (fresh requests, "
        "the same ones for every trial of a round)",
    )
    engine: EngineSpec
    model: ModelSpec
    workload: WorkloadSpec
    platform: PlatformSpec
    eval: EvalSpec = Field(default_factory=EvalSpec)
    profile: ProfileSpec | None = None

    @model_validator(mode="after")
    def _profiled_point_exists(self) -> TrialSpec:
        if self.profile is None:
            return self
        labels = [p.label for p in self.workload.load_points]
        if self.profile.point not in labels:
            raise ValueError(
                f"profile.point '{self.profile.point}' is not a load point of workload '{self.workload.name}' "
                f"(its points: {', '.join(labels)})"
            )
        if not isinstance(self.engine, LaunchedEngineSpec):
            raise ValueError(f"profile: engine '{self.engine.name}' has no profiler we can start (vllm or sglang)")
        return self

    @model_validator(mode="after")
    def _lora_consistent(self) -> TrialSpec:
        """LoRA: the engine's switch, its slots and the workload's adapter mix agree with model.lora."""
        lora, engine, mix = self.model.lora, self.engine, self.workload.adapters
        served = lora.names() if lora is not None else []
        if isinstance(engine, LaunchedEngineSpec):
            switch = getattr(engine, "enable_lora", None)
            if getattr(engine, "lora_loading", "start") == "runtime" and lora is None:
                raise ValueError("engine.lora_loading=runtime loads model.lora's adapters, and it names none")
            if lora is not None and switch is False:
                raise ValueError("model.lora names adapters but engine.enable_lora is false: remove one of them")
            if lora is None and switch is not True:
                knobs = ("max_loras", "max_lora_rank", "max_cpu_loras", "max_loras_per_batch", "max_loaded_loras")
                dead = [k for k in knobs if getattr(engine, k, None) is not None]
                if dead:
                    raise ValueError(
                        f"engine.{', engine.'.join(dead)}: LoRA is off (no model.lora, engine.enable_lora not true)"
                    )
            if mix is not None and mix.names is not None and lora is not None:
                unknown = [n for n in mix.names if n not in served]
                if unknown:
                    raise ValueError(
                        f"workload.adapters.names {unknown}: not adapters of model.lora (it serves {served})"
                    )
        if self.eval.adapters and lora is None:
            raise ValueError("eval.adapters scores LoRA adapters, and model.lora names none")
        if mix is not None and mix.names is None:
            if lora is None:
                raise ValueError(
                    "workload.adapters: no adapter names and no model.lora to take them from: set "
                    "workload.adapters.names or model.lora"
                )
            if mix.active is not None and mix.active > len(served):
                raise ValueError(f"workload.adapters.active {mix.active}: model.lora has {len(served)} adapters")
        return self

    @model_validator(mode="after")
    def _clients_reach_the_server(self) -> TrialSpec:
        host = getattr(self.engine, "host", None)
        nodes = self.workload.client_nodes
        if nodes != "auto" and nodes > 1 and host in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(
                f"workload.client_nodes: {self.workload.client_nodes}: clients on other nodes cannot reach a server "
                f"bound to {host}: set engine.host=0.0.0.0 (or an address the other nodes reach)"
            )
        return self

    @model_validator(mode="after")
    def _fits_context(self) -> TrialSpec:
        need = self.workload.max_request_tokens()
        limit = self.engine.context_limit
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
            and isinstance(self.engine, LaunchedEngineSpec)
        ):
            raise ValueError(
                f"model.tokenizer '{self.model.tokenizer}': the tiny model ({self.model.source}) is built "
                "with its own tokenizer and cannot be served with another; model.tokenizer is for "
                "model.source=path/hub (passed to the server too) or engine=external"
            )
        if (
            self.workload.capacity is not None
            and isinstance(self.engine, LaunchedEngineSpec)
            and self.engine.restart_between_points
        ):
            raise ValueError(
                "workload.capacity searches one running server: it cannot be combined with "
                "engine.restart_between_points"
            )
        return self


class SweepSettings(StrictModel):
    """Settings of a sweep that do not change a trial's measurement (not in the trial hash)."""

    tracking: TrackingSpec
    cluster: ClusterSpec
    dry_run: bool | Literal["json"] = Field(
        default=False,
        description="plan only, start nothing: true a table to read, json a JSON line per trial with every command",
    )
    resume: bool = Field(default=True, description="skip trials whose hash already has a FINISHED run")
    reuse_servers: bool = Field(default=True, description="trials with identical servers share one server start")
    objective: ObjectiveSpec | None = Field(default=None, description="the report's verdict (see ObjectiveSpec)")
    expect: list[ExpectationSpec] = Field(
        default_factory=list, description="what the lab expects to observe (see ExpectationSpec), checked in the report"
    )
    sizing: SizingSpec | None = Field(
        default=None, description="the workload sized to this machine before the sweep (see SizingSpec)"
    )

    @field_validator("objective")
    @classmethod
    def _objective_names(cls, v: ObjectiveSpec | None) -> ObjectiveSpec | None:
        if v is not None:
            v.check_names()
        return v

    @field_validator("expect")
    @classmethod
    def _expected_names(cls, v: list[ExpectationSpec]) -> list[ExpectationSpec]:
        for i, claim in enumerate(v):
            claim.check_names(f"expect[{i}]")
        return v
