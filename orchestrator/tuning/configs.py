"""The tuner's configurations as Hydra composes them: the baseline's overrides with a
configuration's knobs on top and its step's seed (:meth:`ComposedConfigs.overrides`), each one
validated as a sweep's job would be (:meth:`ComposedConfigs.job_of`), its knobs as the levers
read them, and why one cannot run (the :class:`orchestrator.tuning.planner.Configurations` the
planner asks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.feasibility import assess
from orchestrator.scheduling.compose import SweepComposer
from orchestrator.scheduling.jobs import TrialJob, prepare_jobs
from orchestrator.tuning.candidates import hydra_value, key_of
from orchestrator.tuning.moves import MODEL_KNOB

SEED_STEP = 1000  # step k's requests: seed + (k - 1) * SEED_STEP (fresh for the step, the same for its trials)


class ComposedConfigs:
    """The configurations of one tuning: ``fixed`` (the command line's overrides but the seed)
    with a configuration's knobs on top, composed by ``composer``."""

    def __init__(self, composer: SweepComposer, fixed: list[str], base_seed: int) -> None:
        self.composer, self.fixed, self.base_seed = composer, fixed, base_seed

    def overrides(self, knobs: Mapping[str, Any], step: int, extra: Sequence[str] = ()) -> list[str]:
        """A configuration's overrides for step ``step`` (its requests: step 0, the baseline, and
        step 1 share them); ``extra``: the race's own (a second look's)."""
        kept = [o for o in self.fixed if key_of(o) not in knobs]
        return [
            *kept,
            *(f"++{k}={hydra_value(v)}" for k, v in knobs.items()),
            f"seed={self.base_seed + max(step - 1, 0) * SEED_STEP}",
            *extra,
        ]

    def job_of(self, knobs: Mapping[str, Any]) -> TrialJob:
        """The configuration as a validated job (a :class:`ConfigError` says why not)."""
        lines = self.overrides(knobs, 0)
        data, _ = self.composer.compose(lines, 0)
        return prepare_jobs([(lines, data)], whole_sweep=False)[0]

    def knobs(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """The configuration's knobs as the levers read them: every engine knob, and the model's name."""
        job = self.job_of(knobs)
        engine: dict[str, Any] = {f"engine.{k}": v for k, v in job.spec.engine.model_dump(mode="json").items()}
        return {**engine, MODEL_KNOB: job.spec.model.name}  # what a lever's models read

    def refused(self, knobs: Mapping[str, Any]) -> str:
        """Why the configuration cannot run (its config, the engine, the hardware), or ''."""
        try:
            job = self.job_of(knobs)
        except ConfigError as exc:
            text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            return text.split("]: ", 1)[-1][:300]
        return assess(job.spec) or ""
