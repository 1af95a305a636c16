"""Multi-LoRA serving against the real vLLM CPU server: the tiny adder's adapters trained here,
served over it, the requests spread over them, and each adapter's answers read back to tell
that its requests reached it (the trial layer alone: no Ray, no MLflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import to_specs
from orchestrator.evaluation.adapters import problems
from orchestrator.metrics.records import parquet_bytes_to_table
from orchestrator.models import resolve_adapters
from orchestrator.trial import run_trial

pytestmark = pytest.mark.integration


@pytest.mark.long  # in CI another way: untrained adapters served and named by the load (test_served_wiring.py)
def test_each_adapter_answers_its_own_requests_on_real_vllm(compose, tmp_path):
    cfg = compose(
        [
            "+experiment=multi_lora",
            "variant=active_2",
            "workload.adapters.include_base=true",
            "engine.max_loras=1",  # two adapters in flight for one slot: they take turns
            "eval.limit=20",
        ]
    )
    cpu = cfg.per_platform.cpu  # the lab's CPU scale, smaller (its overlay comes after the overrides)
    cpu.model.lora.tiny.count = 2  # lora-a and lora-b: the lab's first two (trained once, cached)
    cpu.workload.num_requests = 24
    cpu.workload.load_points = [{"concurrency": 4}]
    spec, _ = to_specs(cfg)
    lines: list[str] = []
    result = run_trial(spec, tmp_path, ["test"], progress=lines.append)
    assert result.status == "FINISHED", result.error
    m = result.metrics
    adapters = dict(resolve_adapters(spec.model, build=False))
    # every adapter answered in its own convention, and none in another's: through the server,
    # its requests batched with the other adapter's and the base's, it adds as well as it did
    # alone in training (the same problems, greedy; its right share depends on how well it was
    # trained on this machine, so it is set against that, not against a fixed bar)
    for name in ("lora-a", "lora-b"):
        assert m[f"adapter.{name}.misrouted"] == 0.0, m
        training = json.loads((Path(adapters[name]) / "training.json").read_text())
        wrong_alone = {tuple(p) for p in training["heldout_wrong"]}
        alone = sum(p not in wrong_alone for p in problems(20)) / 20
        assert m[f"adapter.{name}.accuracy"] >= alone - 0.1, (name, alone, m)  # 2 in 20 another kernel's rounding
        assert m[f"adapter.{name}.trained_accuracy"] == pytest.approx(alone), m  # the product's own reading
    assert m["adapters_accuracy_min"] == min(m["adapter.lora-a.accuracy"], m["adapter.lora-b.accuracy"])
    # the lab's verdict reads what serving kept of each adapter's own accuracy (issue 58)
    kept = [m[f"adapter.{n}.accuracy"] / m[f"adapter.{n}.trained_accuracy"] for n in ("lora-a", "lora-b")]
    assert m["adapters_kept_min"] == pytest.approx(min(kept)), m
    # ...but the base model's requests, sharing batches with the adapters', come back in an
    # adapter's convention: vLLM 0.32's CPU LoRA kernels (lora/ops/torch_ops/lora_ops.py,
    # bgmv_shrink/expand) index the stacked adapters with each token's slot, and a base-model
    # token's slot is -1: Python's last slot. The scorer is there to catch exactly this; when
    # vLLM fixes it, this fails: update docs/lora.md and assert 0 here. (How many of the base's
    # answers leak depends on how its requests fall into batches: 18% to 92% of 50 over 21 runs
    # of the lab on 2026-12-01, 45% of 20 in a test run; any leak is the bug.)
    assert m["adapter.base.misrouted"] > 0.0 and m["adapters_misrouted_max"] == m["adapter.base.misrouted"], m
    assert "adapters scored in" in "\n".join(lines)
    # the load named them: per-adapter metrics, the records' adapter column, the server's argv
    (point,) = result.points
    assert point.metrics["errors"] == 0
    assert set(point.adapter_metrics) == {"lora-a", "lora-b", "base"}
    for name, am in point.adapter_metrics.items():
        assert am["completed"] > 0 and am["first_ttft_ms"] > 0, (name, am)
        assert 0 <= am["prefix_hit_rate"] <= 1, (name, am)  # the server said each prompt's cached tokens
    table = parquet_bytes_to_table(result.records_parquet)
    assert set(table.column("adapter").to_pylist()) == {"lora-a", "lora-b", None}
    argv = result.servers[0]["argv"]
    assert "--enable-lora" in argv and f"lora-a={adapters['lora-a']}" in argv, argv
    # the adapters were trained here, and each says how well it learned its convention: trained on
    # (bounded) while below its recipe's bar, and said so when it stayed below (how fast a tiny
    # adapter learns varies with the CPU's floating-point rounding: docs/lora.md)
    recipe = spec.model.lora.tiny
    for name in ("lora-a", "lora-b"):
        training = json.loads((Path(adapters[name]) / "training.json").read_text())
        short = training["validation_accuracy"] < recipe.min_accuracy
        assert training["below_target"] == short and 0 < training["heldout_accuracy"] <= 1, (name, training)
        most = recipe.steps + recipe.extra_rounds * (recipe.steps // 2)
        assert recipe.steps <= training["steps"] <= most and (training["steps"] == most or not short), training
