"""Where a trial runs and where its results go: platform, cluster, tracking."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
)

from .base import PositiveShare, StrictModel


class SlateSpec(StrictModel):
    """The clean slate a trial starts its servers on: no engine process of an earlier trial, its
    port free, the machine's memory (and its GPUs' memory and compute processes) back at their
    idle baseline. Checked before every server start; not part of a trial's identity."""

    check: bool = Field(default=True, description="false: start the servers whatever the machine holds")
    wait_s: float = Field(
        default=60.0, ge=0.0, description="how long a leftover may take to go before the trial fails naming it"
    )
    memory_margin_gb: PositiveFloat | None = Field(
        default=None,
        description=(
            "the machine's memory in use may exceed its idle baseline (the lowest clean reading of the worker) "
            "by this much; null = the larger of 2 GB and 10% of the machine's memory"
        ),
    )
    gpu_memory_margin_gb: PositiveFloat = Field(
        default=0.5, description="the same for each GPU's memory in use (NVML), over its idle reading"
    )
    other_engines: Literal["wait", "ignore"] = Field(
        default="wait",
        description=(
            "an engine server this sweep did not start (vLLM or SGLang, found by its command line, unmarked): "
            "'wait' treats it as a leftover (waited for, then the trial fails naming it); 'ignore' measures beside it"
        ),
    )


class PlatformSpec(StrictModel):
    """The kind of hardware trials run on."""

    name: Literal["cpu", "gpu"]
    device: Literal["cpu", "cuda"]
    max_concurrent_trials: PositiveInt | None = Field(
        default=None, description="cap on trials measured at once; 1 on CPU (they would share cores)"
    )
    cpus_per_trial: PositiveFloat = 1.0
    monitor_interval_s: PositiveFloat = 0.5
    monitor_budget: PositiveShare = Field(
        default=0.01,
        description=(
            "share of wall time each kind of sample (memory, engine gauges, telemetry) may cost: a "
            "sample that cost c seconds waits max(its interval, c / monitor_budget) before the next; "
            "the cost of a gauge scrape is the fastest wall time a scrape has taken (the server answers "
            "it; a later, slower answer waited behind the server's load), that of a local "
            "sample (memory, telemetry) the CPU time it used; a load point's first 3 gauge scrapes "
            "after its start keep the interval whatever they cost (the diagnosis needs 3)"
        ),
    )
    server_nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description=(
            "the niceness of the servers this trial starts (0: as the orchestrator). Where the "
            "client shares the servers' cores (the CPU build on a few cores), a positive value lets "
            "the client's event loop wake on time while the server works: the client is the "
            "measuring instrument"
        ),
    )
    telemetry: bool = Field(
        default=True,
        description="sample the servers' CPU/RSS, the machine and the trial's GPUs (NVML) beside every trial",
    )
    telemetry_interval_s: float = Field(
        default=1.0, ge=0.05, description="seconds between telemetry samples (nvidia-smi dmon -d 1: 1 s)"
    )
    price_per_hour: float | None = Field(
        default=None,
        ge=0.0,
        description=(
            "what one device costs per hour, for cost per million tokens: per GPU-hour on GPUs, per node-hour on "
            "the CPU (e.g. 0.42); null = no price set (no cost metrics, never $0)"
        ),
    )
    gpu_name: str | None = Field(
        default=None,
        description="auto: the GPU NVML reports on this node, mapped to orchestrator/perf/gpus.py; else a key "
        "of that table (e.g. A100-80GB), checked against the node's GPU when it has one",
    )
    gpu_name_check: Literal["error", "warn"] = Field(
        default="error",
        description="a gpu_name that disagrees with the node's GPU: an error before anything starts, or a "
        "warning (planning for another GPU on purpose)",
    )
    gpu_memory_gb: PositiveFloat | None = Field(default=None, description="None = from gpu_name")
    # The roofline of a decode step (week 3): set, these win; else this node's measured roofs
    # (roofs: measured, once calibrated: python -m orchestrator.perf.roofs), else the GPU
    # table's data-sheet figures; on CPU the bandwidth is measured (a numpy copy, cached per node)
    # and the peak is an estimate.
    memory_bandwidth_gb_s: PositiveFloat | None = None
    peak_tflops: PositiveFloat | None = None
    roofs: Literal["measured", "table"] = Field(
        default="measured", description="the roofline's roofs: this node's calibration when it has one, or the table"
    )
    # Engine defaults that belong to the hardware (engine configs interpolate them).
    dtype: str = "auto"
    enforce_eager: bool = False
    cpu_kvcache_space_gib: PositiveInt | None = None
    slate: SlateSpec = Field(default_factory=SlateSpec)
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


# The schemes of MLflow's tracking stores (mlflow.tracking._tracking_service.utils; a database
# URI may name its driver, postgresql+psycopg2://)
TRACKING_SCHEMES = frozenset(
    {"sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"}
)


class TrackingSpec(StrictModel):
    """Where results go. The driver is the only writer."""

    uri: str
    experiment_name: str | None = Field(default=None, description="None = the experiment's name")
    enabled: bool = True

    @field_validator("uri")
    @classmethod
    def _store(cls, uri: str) -> str:
        """A store MLflow can open (its tracking stores' schemes; a plain path is a file store):
        anything else failed only when the sweep's first result was logged."""
        scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
        if scheme and scheme.split("+", 1)[0] not in TRACKING_SCHEMES:
            raise ValueError(
                f"'{scheme}' is no MLflow store: expected sqlite:///FILE.db, http(s)://HOST:PORT, file:///DIR, "
                f"a database URI ({', '.join(sorted(TRACKING_SCHEMES - {'sqlite', 'http', 'https', 'file'}))}) or a folder"
            )
        return uri
