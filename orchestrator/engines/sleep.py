"""The ``sleep`` trial kind (:class:`SleepAdapter`): no server, the trial holds its CPUs/GPUs
for ``engine.seconds``.

Used to check a cluster's placement end to end (``engine=sleep engine.gpus=2``) and by the
packing benchmark; its result carries the GPU ids Ray assigned and when it held them.
"""

from __future__ import annotations

import time

from orchestrator.config.schema import SleepEngineSpec, TrialSpec
from orchestrator.engines.base import EngineAdapter, LaunchContext, ServerLaunch, register


@register
class SleepAdapter(EngineAdapter[SleepEngineSpec]):
    """No server: the trial holds (``hold``) instead of serving."""

    spec_type = SleepEngineSpec

    def launches(self, spec: TrialSpec, at: LaunchContext) -> list[ServerLaunch]:
        return []  # nothing to start

    def hold(self, spec: TrialSpec) -> dict[str, float]:
        """What the trial does instead of serving: wait. Returns its metrics."""
        t0 = time.monotonic()
        time.sleep(self.narrow(spec).seconds)
        return {"held_s": time.monotonic() - t0}
