"""The multi_lora lab's verdict reads what serving kept of each adapter's own accuracy (issue 58):
an adapter that learned its convention less well on this machine does not leave the lab without
a verdict."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import to_specs
from orchestrator.config.convert import config_to_dict
from orchestrator.evaluation.adapters import problems
from orchestrator.models.lora import tiny_adapter_dir
from orchestrator.trial.multi_lora import kept_accuracy


def test_served_accuracy_is_set_against_each_adapters_own(compose, tmp_path):
    data = config_to_dict(compose(["+experiment=multi_lora", "variant=active_2", "eval.limit=20"]))
    model = data["per_platform"]["cpu"]["model"]
    model["lora"]["tiny"]["count"], model["cache_dir"] = 2, str(tmp_path)
    spec, settings = to_specs(data)
    assert settings.objective is not None and "adapters_kept_min" in settings.objective.subject_to
    scored = problems(20)
    # lora-a alone got 6 of the 20 wrong (70%, a weak adapter); lora-b 2 (90%); wrong ones beyond
    # the 20 scored do not count
    for k, wrong in enumerate([scored[:6] + [(99, 99)], scored[10:12]]):
        folder = tiny_adapter_dir(spec.model.tiny, spec.model.lora.tiny, k, spec.model.cache_dir)
        folder.mkdir(parents=True)
        (folder / "training.json").write_text(json.dumps({"heldout_wrong": [list(p) for p in wrong]}))
    lines: list[str] = []
    served = {"adapter.lora-a.accuracy": 0.65, "adapter.lora-b.accuracy": 0.9}
    out = kept_accuracy(spec, served, lines.append)
    assert out["adapter.lora-a.trained_accuracy"] == pytest.approx(0.7)
    assert out["adapter.lora-b.trained_accuracy"] == pytest.approx(0.9)
    assert out["adapters_kept_min"] == pytest.approx(0.65 / 0.7)  # 93%: a verdict, though lora-a is weak
    assert "the worst kept 93% of its own accuracy" in lines[-1]
    # without a record of an adapter's own accuracy, nothing is claimed
    (folder / "training.json").unlink()
    assert kept_accuracy(spec, served, lines.append) == {} and "no record of its accuracy alone" in lines[-1]


def test_the_verdict_chooses_among_the_configurations_serving_every_adapter(compose):
    """The lab's question is a deployment's: with all 8 adapters in use, which configuration serves
    them fastest. A trial with fewer adapters, or none (another workload), answers an expectation,
    not the verdict (issue 58: it had raced base_only against prefix_1_adapter)."""
    from orchestrator.decide.trials import Point, TrialData
    from orchestrator.decide.verdict import decide

    _, settings = to_specs(config_to_dict(compose(["+experiment=multi_lora", "variant=active_8"])))
    objective = settings.objective
    assert objective is not None

    def trial(name: str, active: int | None, tps: float) -> TrialData:
        params = {"workload.adapters.active": str(active) if active else "null", "workload.adapters": "null"}
        metrics = {"tokens_per_second": tps, "adapters_kept_min": 1.0}
        return TrialData(name, "FINISHED", params, {}, [Point(0, "c8", {"concurrency": 8}, metrics)])

    trials = [trial("base_only", None, 450.0), trial("active_2", 2, 280.0), trial("active_8", 8, 175.0)]
    verdict = decide([*trials, trial("slots_8", 8, 255.0)], objective)
    assert verdict.best is not None and verdict.best.name == "slots_8"
    why = {t.name: reason for t, reason in verdict.excluded}
    assert why["base_only"] == "workload.adapters.active not set"
    assert why["active_2"] == "workload.adapters.active 2, needs >= 8"
