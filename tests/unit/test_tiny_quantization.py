"""model.tiny.quantization: the tiny model quantized here, data-free, with compressed-tensors,
into checkpoints vLLM's CPU build serves (served for real in tests/integration/test_cpu_gpu_paths.py)."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from orchestrator.config.schema import TinyModelSpec
from orchestrator.models.tiny import ensure_tiny_model

SMALL = dict(num_layers=1, hidden_size=128, num_heads=2, num_kv_heads=2, intermediate_size=256, vocab_size=300)


@pytest.mark.parametrize(
    "method,fmt,weight", [("w8a8", "int-quantized", "weight"), ("w4a16", "pack-quantized", "weight_packed")]
)
def test_quantized_checkpoint(tmp_path, method, fmt, weight):
    base = ensure_tiny_model(TinyModelSpec(**SMALL), tmp_path)
    out = ensure_tiny_model(TinyModelSpec(**SMALL, quantization=method), tmp_path)
    assert out.name.startswith(f"{base.name}-{method}") and (out / "tokenizer.json").exists()
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["format"] == fmt and q["ignore"] == ["lm_head"]
    group = q["config_groups"]["group_0"]
    assert group["weights"]["num_bits"] == (8 if method == "w8a8" else 4)
    if method == "w8a8":  # dynamic per-token INT8 activations: vLLM's CompressedTensorsW8A8Int8
        assert group["input_activations"]["dynamic"] is True and group["input_activations"]["strategy"] == "token"
        # asymmetric: vLLM's CPU INT8 kernel is then oneDNN, which keeps float32 activations, on
        # every CPU (symmetric ones take an AMX-only kernel that needs bfloat16 activations)
        assert group["input_activations"]["symmetric"] is False
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        t = f.get_tensor(f"model.layers.0.mlp.down_proj.{weight}")
    assert "model.layers.0.mlp.down_proj.weight_scale" in keys and "lm_head.weight" in keys
    assert str(t.dtype) == ("torch.int8" if method == "w8a8" else "torch.int32")
    assert (out / "model.safetensors").stat().st_size < (base / "model.safetensors").stat().st_size
