"""Every experiment config composes and every trial of its sweep validates, on every platform."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs, trial_hash
from tests.conftest import CONF

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
PLATFORMS = sorted(p.stem for p in (CONF / "platform").glob("*.yaml"))


def test_there_are_experiments():
    assert "chunked_prefill" in EXPERIMENTS


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_sweep_validates(compose, experiment, platform):
    base = compose([f"+experiment={experiment}", f"platform={platform}"])
    sweep = (base.get("sweeps") or {}).get(platform)
    variants = [v.strip() for v in str(sweep).split(",")] if sweep else [None]
    hashes = set()
    for variant in variants:
        overrides = [f"+experiment={experiment}", f"platform={platform}"]
        if variant:
            overrides.append(f"variant={variant}")
        spec, _ = to_specs(compose(overrides))
        assert spec.experiment == experiment
        assert spec.platform.name == platform
        hashes.add(trial_hash(spec))
    assert len(hashes) == len(variants), "two variants of one sweep produce the same trial"


WORKLOADS = sorted(p.stem for p in (CONF / "workload").glob("*.yaml"))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_validates(compose, workload, platform):
    spec, _ = to_specs(compose([f"workload={workload}", f"platform={platform}"]))
    assert spec.workload.name == workload
