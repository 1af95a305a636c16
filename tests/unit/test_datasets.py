"""Datasets from files (ShareGPT, traces) and the planner's request sources."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.config import ConfigError
from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen import PromptFactory
from orchestrator.loadgen.arrivals import ramp
from orchestrator.loadgen.datasets import load_sharegpt
from orchestrator.loadgen.plan import RequestPlanner
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def factory(tiny_model_dir):
    return PromptFactory(str(tiny_model_dir))


def test_sharegpt_counts_malformed_entries():
    data = load_sharegpt(str(DATA / "sharegpt_sample.json"))
    assert len(data.conversations) == 40 and data.malformed == 4


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "not valid JSON"),
        ('{"a": 1}', "expected a JSON list"),
        ('[{"id": 1}]', "none of its 1 entries"),
    ],
)
def test_sharegpt_bad_file_rejected(tmp_path, content, reason):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=reason):
        load_sharegpt(str(f))


def test_sharegpt_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_sharegpt("/nonexistent/sharegpt.json")


def workload(classes):
    return WorkloadSpec.model_validate(
        {"name": "t", "classes": classes, "load_points": [{"concurrency": 1}], "num_requests": 1}
    )


def test_shared_prefix_requests_share_exact_prefix_tokens(factory):
    w = workload(
        {
            "sp": {
                "dataset": "shared_prefix",
                "num_groups": 3,
                "prefix_tokens": 40,
                "input_tokens": 10,
                "output_tokens": 2,
            }
        }
    )
    planner = RequestPlanner(w, factory)
    rng = np.random.default_rng(0)
    reqs = [planner.make("sp", rng) for _ in range(30)]
    by_prefix: dict[tuple[int, ...], int] = {}
    for r in reqs:
        ids = factory.encode(r.prompt)
        assert abs(len(ids) - 50) <= 1 and r.input_tokens == 50
        by_prefix[tuple(ids[:40])] = by_prefix.get(tuple(ids[:40]), 0) + 1
    assert len(by_prefix) == 3 and sum(by_prefix.values()) == 30  # three groups, token-identical prefixes


def test_sharegpt_planner_uses_file_prompts_and_reply_lengths(factory):
    w = workload({"sg": {"dataset": "sharegpt", "path": str(DATA / "sharegpt_sample.json"), "max_input_tokens": 200}})
    planner = RequestPlanner(w, factory)
    prompts = {c.prompt for c in load_sharegpt(str(DATA / "sharegpt_sample.json")).conversations}
    reqs = [planner.make("sg", np.random.default_rng(i)) for i in range(10)]
    assert all(r.prompt in prompts and r.input_tokens == factory.count(r.prompt) for r in reqs)
    assert all(1 <= r.output_tokens <= 1024 for r in reqs)


def test_dataset_needs_its_fields():
    with pytest.raises(ValueError, match="needs num_groups, prefix_tokens"):
        workload({"sp": {"dataset": "shared_prefix", "input_tokens": 10, "output_tokens": 2}})


def test_ramp_mapping():
    assert ramp(0.0, 10) == 0.0
    assert ramp(5.0, 10) == pytest.approx(10.0)  # half the operational time reaches the ramp's end
    assert ramp(7.0, 10) == pytest.approx(12.0)  # then the full rate
    offsets = [ramp(i / 4.0, 20.0) for i in range(200)]  # rate 4/s, 20 s ramp: 40 arrivals in the ramp
    assert sum(1 for t in offsets if t < 20.0) == 40
