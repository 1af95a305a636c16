"""What CI serves on the real vLLM CPU server in place of two long tests, one short trial each:
an untrained tiny Llama quantized here with compressed-tensors (INT8 W8A8), and the tiny Llama
with two untrained LoRA adapters, the load spread over them and the base model. They keep the
wiring honest: the checkpoint the quantization lab builds loads as compressed-tensors, and the
adapters reach the server's command line, the requests, the records and the per-adapter metrics.
(One server for both fails on vLLM 0.32's CPU build: LoRA over a compressed-tensors model stops
its worker at start, "'NoneType' object has no attribute 'device'".)
What needs trained weights (the adder's accuracy after quantization, each adapter answering its own
requests) is in `make test-long`: test_cpu_gpu_paths.py and test_lora.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import to_specs
from orchestrator.metrics.records import parquet_bytes_to_table
from orchestrator.trial import run_trial
from tests.conftest import engine_processes

pytestmark = pytest.mark.integration


def untrained_adapter(base: Path, out: Path, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder for ``base`` whose A matrices are random and B small random ones: a
    valid adapter that changes the answers a little and has learned nothing."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head
    shapes = {  # module: (in, out)
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for module, (fan_in, fan_out) in shapes.items():
            name = f"base_model.model.model.layers.{i}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 1e-3
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": sorted({m.split(".")[1] for m in shapes}),
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": base.name,
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def served(compose, tmp_path, overrides: list[str], requests: int, streams: int):
    """One trial of ``requests`` (64 tokens in, 16 out) at ``streams`` on the real vLLM CPU server,
    FINISHED, every request answered: its result, its point, and the server's argv."""
    spec, _ = to_specs(
        compose(
            [
                *overrides,
                "workload.classes={main:{input_tokens:64,output_tokens:16}}",
                f"workload.load_points=[{{concurrency:{streams}}}]",
                f"workload.num_requests={requests}",
                "engine.max_model_len=512",
            ]
        )
    )
    result = run_trial(spec, tmp_path / "trial", ["test"], progress=lambda _: None)
    assert result.status == "FINISHED", result.error
    (point,) = result.points
    assert point.metrics["completed"] == requests and point.metrics["errors"] == 0, point.metrics
    return result, point, result.servers[0]["argv"]


def test_a_checkpoint_quantized_here_loads_as_compressed_tensors(compose, tmp_path):
    result, _, argv = served(compose, tmp_path, ["model.tiny.quantization=w8a8"], 4, 2)
    # the server was started on the checkpoint quantized here, and loaded it as compressed-tensors
    config = json.loads((Path(argv[argv.index("--model") + 1]) / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized", config.get("quantization_config")
    assert "quantization=compressed-tensors," in result.server_log
    assert not engine_processes()


def test_adapters_are_served_and_named_by_the_load(compose, tmp_path, tiny_model_dir):
    adapters = [untrained_adapter(tiny_model_dir, tmp_path / f"lora-{k}", 8, k) for k in (1, 2)]
    listed = ",".join(f"{{name:ad{k},path:{path}}}" for k, path in enumerate(adapters))
    lora = [f"model.lora={{adapters:[{listed}]}}", "workload.adapters={include_base:true}"]
    result, point, argv = served(compose, tmp_path, lora, 12, 3)
    # the adapters were served (argv) and named by the load: the records, the per-adapter metrics
    assert "--enable-lora" in argv and f"ad0={adapters[0]}" in argv and f"ad1={adapters[1]}" in argv, argv
    table = parquet_bytes_to_table(result.records_parquet)
    assert set(table.column("adapter").to_pylist()) == {"ad0", "ad1", None}
    assert set(point.adapter_metrics) == {"ad0", "ad1", "base"}
    for name, am in point.adapter_metrics.items():
        assert am["completed"] > 0 and am["first_ttft_ms"] > 0, (name, am)
    assert not engine_processes()
