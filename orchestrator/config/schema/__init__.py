"""Typed schema of a trial and of a sweep's settings (pydantic, ``extra="forbid"``).

The Hydra ``DictConfig`` is turned into these models once, in :mod:`orchestrator.config.convert`;
everything downstream sees typed objects only. One module per part of a trial: ``engines`` (what
they share in ``launched``), ``model``, ``workload`` (its load points, SLOs and capacity search in
``load``, its point checks in ``validity``), ``platform`` (platform, cluster, tracking) and
``trial`` (the trial, a sweep's settings; the objective and the expectations in ``goals``); every
name is importable from here.
"""

from .base import ArrivalKind, StrictModel
from .engines import (
    EngineSpec,
    ExternalEngineSpec,
    LMCacheSpec,
    RouterSpec,
    SGLangEngineSpec,
    SleepEngineSpec,
    VLLMEngineSpec,
)
from .launched import BaseEngineSpec, DisaggregationSpec, EnginePython, LaunchedEngineSpec, LaunchPrefix
from .load import SLO_METRIC, CapacitySpec, ClosedLoop, LoadPointSpec, OpenLoop, PointLoad, SLOSpec, TraceReplay
from .model import (
    LORA_RANKS,
    LoraAdapterSpec,
    LoraRank,
    LoraSpec,
    ModelArch,
    ModelSpec,
    TinyLoraSpec,
    TinyModelSpec,
    TinyTrainSpec,
)
from .platform import ClusterSpec, PlatformSpec, SlateSpec, TrackingSpec
from .sizing import SizeRule, SizingSpec
from .trial import EvalSpec, ExpectationSpec, NsysSpec, ObjectiveSpec, ProfileSpec, SweepSettings, TrialSpec
from .validity import FidelitySpec, ValiditySpec
from .workload import AdapterMixSpec, RequestClass, WorkloadSpec

__all__ = [
    "AdapterMixSpec",
    "LORA_RANKS",
    "LoraAdapterSpec",
    "LoraRank",
    "LoraSpec",
    "SLO_METRIC",
    "ArrivalKind",
    "BaseEngineSpec",
    "CapacitySpec",
    "ClusterSpec",
    "DisaggregationSpec",
    "EnginePython",
    "EngineSpec",
    "EvalSpec",
    "ExternalEngineSpec",
    "FidelitySpec",
    "LMCacheSpec",
    "LaunchPrefix",
    "LaunchedEngineSpec",
    "ClosedLoop",
    "LoadPointSpec",
    "OpenLoop",
    "PointLoad",
    "TraceReplay",
    "ModelArch",
    "ModelSpec",
    "ObjectiveSpec",
    "ExpectationSpec",
    "PlatformSpec",
    "SlateSpec",
    "NsysSpec",
    "ProfileSpec",
    "RequestClass",
    "RouterSpec",
    "SGLangEngineSpec",
    "SizeRule",
    "SizingSpec",
    "SLOSpec",
    "SleepEngineSpec",
    "StrictModel",
    "SweepSettings",
    "TinyLoraSpec",
    "TinyModelSpec",
    "TinyTrainSpec",
    "TrackingSpec",
    "TrialSpec",
    "VLLMEngineSpec",
    "ValiditySpec",
    "WorkloadSpec",
]
