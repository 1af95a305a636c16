"""Multi-LoRA serving: the adapters' config and its checks, the server flags (each engine's own
parser), feasibility before a server starts, the workload's adapter mix, per-adapter metrics and
the tiny adapters' scorer. The tiny adapters themselves are trained and served by
tests/integration/test_lora.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import AdapterMixSpec, LoraSpec, ModelSpec, WorkloadSpec
from orchestrator.engines import LaunchContext, adapter_for
from orchestrator.evaluation.adapters import convention
from orchestrator.feasibility import assess, lora_unfit
from orchestrator.loadgen.api import Endpoint, PlannedRequest, completions_payload
from orchestrator.loadgen.plan import RequestPlanner, plan_point
from orchestrator.metrics.records import RequestRecord, records_to_table, table_to_records
from orchestrator.metrics.summary import adapter_key, summarize_by_adapter
from orchestrator.models import resolve_adapters
from orchestrator.models.lora import read_adapter
from tests.unit.test_engine_args import parse_launch, sglang_parser, vllm_parser  # noqa: F401 - fixtures

TINY_LORA = "model.lora={tiny:{count:3,rank:8}}"
ADDER = ["model=tiny_adder", TINY_LORA]


def write_adapter(folder: Path, rank: int, hidden: int, targets=("q_proj", "o_proj"), base="x") -> Path:
    """A PEFT LoRA folder of zeros: its config and a safetensors file (only the header is read)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for t in targets:
        n_in, n_out = hidden, hidden
        tensors[f"base_model.model.model.layers.0.self_attn.{t}.lora_A.weight"] = np.zeros((rank, n_in), np.float32)
        tensors[f"base_model.model.model.layers.0.self_attn.{t}.lora_B.weight"] = np.zeros((n_out, rank), np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": list(targets)}
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": base}))
    return folder


def test_the_tiny_adapters_are_named_by_their_tag_and_need_the_trained_adder(compose):
    spec, _ = to_specs(compose(ADDER))
    assert spec.model.lora is not None and spec.model.lora.names() == ["lora-a", "lora-b", "lora-c"]
    with pytest.raises(ConfigError, match="trained on the tiny_trained adder"):
        to_specs(compose([TINY_LORA]))  # tiny_random
    with pytest.raises(ValueError, match="expected 'adapters'"):
        LoraSpec()
    with pytest.raises(ValueError, match="appear more than once"):
        LoraSpec(adapters=[{"name": "x", "path": "/a"}, {"name": "x", "path": "/b"}])
    with pytest.raises(ValueError, match="appear more than once"):
        LoraSpec(adapters=[{"name": "lora-a", "path": "/a"}], tiny={"count": 1})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*ADDER, "engine.enable_lora=false"], "engine.enable_lora is false"),
        (["engine.max_loras=2"], "engine.max_loras: LoRA is off"),
        (["workload.adapters={active:2}"], "no model.lora to take them from"),
        ([*ADDER, "workload.adapters={names:[lora-a,lora-z]}"], r"\['lora-z'\]: not adapters of model.lora"),
        ([*ADDER, "workload.adapters={active:4}"], "model.lora has 3 adapters"),
        (["eval.adapters=true"], "model.lora names none"),
        ([*ADDER, "engine.max_loras=4", "engine.max_cpu_loras=2"], "max_cpu_loras 2 must be >= max_loras 4"),
        ([*ADDER, "workload.adapters={popularity:uniform,zipf_s:2}"], "zipf_s shapes popularity 'zipf' only"),
    ],
)
def test_lora_settings_that_disagree_are_errors_before_anything_starts(compose, overrides, message):
    with pytest.raises(ConfigError, match=message):
        to_specs(compose(overrides))


def test_vllm_serves_the_adapters_with_its_own_parser(compose, vllm_parser, sglang_parser):  # noqa: F811
    spec, _ = to_specs(compose([*ADDER, "engine.max_loras=2", "engine.max_cpu_loras=3", "engine.max_lora_rank=8"]))
    adapters = resolve_adapters(spec.model, build=False)
    assert [name for name, _ in adapters] == ["lora-a", "lora-b", "lora-c"]
    (launch,) = adapter_for("vllm").launches(spec, LaunchContext("/models/x", 8000, lambda: 0, "/tmp/t", adapters))
    ns = parse_launch(launch, vllm_parser, sglang_parser)
    assert ns.enable_lora and ns.max_loras == 2 and ns.max_cpu_loras == 3 and ns.max_lora_rank == 8
    assert [(m.name, m.path) for m in ns.lora_modules] == list(adapters)
    # no adapters and no switch: no LoRA flag at all (vLLM's defaults)
    plain, _ = to_specs(compose([]))
    (launch,) = adapter_for("vllm").launches(plain, LaunchContext("/models/x", 8000, lambda: 0, "/tmp/t"))
    assert not any(a.startswith("--") and "lora" in a for a in launch.argv), launch.argv


def test_adapters_loaded_at_run_time_are_not_on_the_command_line(compose, vllm_parser, sglang_parser):  # noqa: F811
    spec, _ = to_specs(compose([*ADDER, "engine.lora_loading=runtime"]))
    vllm = adapter_for("vllm")
    adapters = resolve_adapters(spec.model, build=False)
    (launch,) = vllm.launches(spec, LaunchContext("/models/x", 8000, lambda: 0, "/tmp/t", adapters))
    ns = parse_launch(launch, vllm_parser, sglang_parser)
    assert ns.enable_lora and not ns.lora_modules
    assert launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert vllm.adapter_loading(spec) == "/v1/load_lora_adapter"
    assert vllm.adapter_loading(to_specs(compose(ADDER))[0]) is None
    with pytest.raises(ConfigError, match="lora_loading=runtime loads model.lora's adapters"):
        to_specs(compose(["engine.lora_loading=runtime"]))


def test_sglang_serves_the_adapters_with_its_own_parser(compose, vllm_parser, sglang_parser):  # noqa: F811
    own = "model.lora={adapters:[{name:sql,path:/lora/sql},{name:chat,path:/lora/chat}]}"
    spec, _ = to_specs(
        compose(["platform=gpu", "engine=sglang", own, "engine.max_loras_per_batch=2", "engine.max_lora_rank=16"])
    )
    adapters = resolve_adapters(spec.model, build=False)
    (launch,) = adapter_for("sglang").launches(spec, LaunchContext("/models/x", 30000, lambda: 0, "/tmp/t", adapters))
    ns = parse_launch(launch, vllm_parser, sglang_parser)
    assert ns.enable_lora and ns.max_loras_per_batch == 2 and ns.max_lora_rank == 16
    assert ns.lora_paths == ["sql=/lora/sql", "chat=/lora/chat"]


def test_an_adapter_that_does_not_fit_is_skipped_with_the_reason(compose, tmp_path):
    good = write_adapter(tmp_path / "good", rank=8, hidden=4096)
    big = write_adapter(tmp_path / "big", rank=64, hidden=4096)
    other = write_adapter(tmp_path / "other", rank=8, hidden=2048)

    def spec_with(path, *more):
        lora = f"model.lora={{adapters:[{{name:mine,path:{path}}}]}}"
        return to_specs(compose(["platform=gpu", lora, *more]))[0]

    assert lora_unfit(spec_with(good)) is None
    assert read_adapter(good).rank == 8 and read_adapter(good).module_dims()["q_proj"] == (4096, 4096)
    assert "rank 64, above the server's max_lora_rank 16 (vLLM's default): set engine.max_lora_rank >= 64" in (
        assess(spec_with(big)) or ""
    )
    assert lora_unfit(spec_with(big, "engine.max_lora_rank=64")) is None
    assert re.search(
        r"made for another base model: its (q_proj input|o_proj output) is 2048 wide, .* hidden size is 4096",
        assess(spec_with(other)) or "",
    )
    assert "no adapter_config.json" in (assess(spec_with(tmp_path / "missing")) or "")
    # the tiny ones are judged by their spec (they may not be trained yet)
    tiny, _ = to_specs(compose(["model=tiny_adder", "model.lora={tiny:{rank:64}}"]))
    assert "lora-a has rank 64" in (lora_unfit(tiny) or "")
    with pytest.raises(ConfigError, match="model.lora.adapters\\[0\\] \\(mine\\): .*no adapter_config.json"):
        resolve_adapters(
            ModelSpec(name="m", source="hub", path="x", lora={"adapters": [{"name": "mine", "path": str(tmp_path)}]})
        )


class Words:
    """A prompt factory without a tokenizer: each prompt is its draw, as text."""

    def prompt(self, n, rng):
        return f"p{int(rng.integers(1 << 30))}-{n}"


def workload(mix: dict | None, **extra) -> WorkloadSpec:
    return WorkloadSpec(
        name="w",
        classes={"main": {"input_tokens": 8, "output_tokens": 4}},
        load_points=[{"concurrency": 4}],
        num_requests=4000,
        adapters=mix,
        **extra,
    )


def test_the_mix_draws_adapters_by_popularity_and_leaves_the_prompts_alone():
    def planned(mix):
        w = workload(mix)
        return plan_point(w, w.load_points[0], 0, RequestPlanner(w, Words()), 7).foreground

    plain = planned(None)
    uniform = planned({"names": ["a", "b", "c", "d"], "active": 2})
    zipf = planned({"names": ["a", "b", "c"], "popularity": "zipf", "zipf_s": 1.0, "include_base": True})
    assert [r.prompt for r in uniform] == [r.prompt for r in plain] == [r.prompt for r in zipf]
    assert all(r.model is None for r in plain)
    counts = Counter(r.model for r in uniform)
    assert set(counts) == {"a", "b"} and abs(counts["a"] - 2000) < 150
    share = Counter(r.model for r in zipf)
    expected = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / sum([1, 1 / 2, 1 / 3, 1 / 4])
    for name, p in zip(["a", "b", "c", None], expected, strict=True):
        assert abs(share[name] / 4000 - p) < 0.03, (name, share)
    # the request names its adapter; without one, the endpoint's model
    body = completions_payload(Endpoint("http://x", "base"), uniform[0], True)
    assert body["model"] == uniform[0].model
    assert completions_payload(Endpoint("http://x", "base"), plain[0], True)["model"] == "base"
    assert AdapterMixSpec(names=["a"], popularity="zipf", zipf_s=2).weights(3) == [1.0, 0.25, 1 / 9]


def record(i: int, adapter: str | None, ttft_s: float, cached: int | None = None) -> RequestRecord:
    r = RequestRecord(i, 0, "main", float(i), float(i), 100, 3, adapter=adapter, cached_tokens=cached)
    r.chunk_times_s = [i + ttft_s, i + ttft_s + 0.01, i + ttft_s + 0.02]
    r.chunk_tokens = [1, 1, 1]
    r.done_s, r.prompt_tokens, r.output_tokens = i + ttft_s + 0.02, 100, 3
    return r


def test_per_adapter_metrics_separate_the_cold_first_request_and_the_prefix_hits():
    records = [
        record(0, "a", 0.5, cached=0),
        record(1, "b", 0.4, cached=0),
        record(2, "a", 0.1, cached=96),
        record(3, "a", 0.1, cached=96),
        record(4, None, 0.05),
    ]
    by = summarize_by_adapter(records)
    assert set(by) == {"a", "b", "base"}
    a = by["a"]
    assert (
        a["completed"] == 3 and a["first_ttft_ms"] == pytest.approx(500) and a["warm_ttft_ms_p50"] == pytest.approx(100)
    )
    assert a["prefix_hit_rate"] == pytest.approx(192 / 300)
    assert "warm_ttft_ms_p50" not in by["b"] and "prefix_hit_rate" not in by["base"]
    assert summarize_by_adapter([record(0, None, 0.1)]) == {}
    assert adapter_key("org/x y", "accuracy") == "adapter.org_x_y.accuracy"
    back = table_to_records(records_to_table(records))
    assert [(r.adapter, r.cached_tokens) for r in back] == [(r.adapter, r.cached_tokens) for r in records]


def test_an_answer_tells_which_adapter_gave_it():
    assert convention("57", 20, 37) is None  # the base model's
    assert convention("57c", 20, 37) == 2  # lora-c's
    assert convention("58c", 20, 37) == "" and convention("", 20, 37) == "" and convention("57cc", 20, 37) == ""


def test_planned_requests_default_to_the_endpoint_model():
    assert PlannedRequest(0, "main", "x", 1, 1).model is None
