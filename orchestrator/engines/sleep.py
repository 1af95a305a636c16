"""The ``sleep`` trial kind: no server, the trial holds its CPUs/GPUs for ``engine.seconds``.

Used to check a cluster's placement end to end (``engine=sleep engine.gpus=2``) and by the
packing benchmark; its result carries the GPU ids Ray assigned and when it held them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.config.schema import SleepEngineSpec, TrialSpec
from orchestrator.engines.base import EngineMetric, Profiler, ServerLaunch


def launches(
    spec: TrialSpec, model_path: str, port: int, next_port: Callable[[], int], workdir: str
) -> list[ServerLaunch]:
    return []  # nothing to start


def hold(spec: TrialSpec) -> dict[str, float]:
    """What the trial does instead of serving: wait. Returns its metrics."""
    assert isinstance(spec.engine, SleepEngineSpec)
    t0 = time.monotonic()
    time.sleep(spec.engine.seconds)
    return {"held_s": time.monotonic() - t0}


def unsupported(spec: TrialSpec) -> str | None:
    return None


def cache_reset(spec: TrialSpec) -> tuple[str, str] | None:
    return None


def metrics_for(spec: TrialSpec) -> dict[str, EngineMetric]:
    return {}


def api_key(spec: TrialSpec) -> str | None:
    return None


def version(spec: TrialSpec) -> str:
    return "sleep"


def profiler(spec: TrialSpec, trace_dir: str) -> Profiler | None:
    """No server, nothing to profile."""
    return None
