"""A model's shape read from the model (its config.json), not assumed from a config group."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ModelArch, ModelSpec
from orchestrator.models.shape import KNOWN, arch_from_config, weight_bytes
from orchestrator.perf.kv import arch_of, kv_bytes_per_token
from tests.conftest import ROOT

# The published config.json values of these models (the fields the shape needs).
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
MIXTRAL = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
}
LLAMA31_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_shapes_and_parameters_come_from_config_json():
    qwen = arch_from_config(QWEN2_7B)
    assert (qwen.num_layers, qwen.num_heads, qwen.num_kv_heads, qwen.head_dim) == (28, 28, 4, 128)
    assert qwen.params_b == pytest.approx(7.62, rel=0.01) and qwen.active_params_b is None
    assert qwen.sliding_window is None  # declared but switched off
    mixtral = arch_from_config(MIXTRAL)  # every expert counted, two of eight active per token
    assert mixtral.params_b == pytest.approx(46.7, rel=0.01) and mixtral.active_params_b == pytest.approx(
        12.9, rel=0.01
    )
    llama = arch_from_config(LLAMA31_8B)
    assert llama.params_b == pytest.approx(8.03, rel=0.01)
    known = KNOWN["meta-llama/Llama-3.1-8B-Instruct"]  # the offline table agrees with the file
    assert (llama.num_layers, llama.num_kv_heads, llama.head_dim) == (
        known.num_layers,
        known.num_kv_heads,
        known.head_dim,
    )
    assert arch_from_config({**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096}).sliding_window == 4096
    assert arch_from_config({"text_config": LLAMA31_8B}).num_layers == 32  # a multimodal model's text tower
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        arch_from_config({"hidden_size": 8}, "x/config.json")


def test_bytes_per_weight_from_the_checkpoints_dtype_or_quantization():
    assert weight_bytes({"torch_dtype": "bfloat16"}) == 2.0 and weight_bytes({"torch_dtype": "float32"}) == 4.0
    assert weight_bytes({"quantization_config": {"quant_method": "fp8"}}) == 1.0
    assert weight_bytes({"quantization_config": {"quant_method": "awq", "bits": 4}}) == 0.5
    w4 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}
    assert weight_bytes({"quantization_config": w4}) == 0.5


def _folder(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_a_local_model_is_planned_with_its_own_shape_and_a_wrong_declaration_is_named(tmp_path):
    path = _folder(tmp_path, QWEN2_7B)
    model = ModelSpec(name="my-qwen", source="path", path=path)
    arch = arch_of(model)
    assert arch is not None and (arch.num_layers, arch.num_kv_heads) == (28, 4)
    assert kv_bytes_per_token(arch) == 28 * 2 * 4 * 128 * 2
    llama = ModelArch(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, params_b=8.03)
    with pytest.raises(ConfigError, match=r"config.json\): num_layers 32 \(declared\) vs 28"):
        arch_of(ModelSpec(name="my-qwen", source="path", path=path, arch=llama))
    # a hub model with no config at hand: the course's known shape; an unknown one: no shape
    hub = ModelSpec(name="x", source="hub", path="meta-llama/Llama-3.1-8B-Instruct")
    assert arch_of(hub) == KNOWN["meta-llama/Llama-3.1-8B-Instruct"]
    assert arch_of(ModelSpec(name="x", source="hub", path="nobody/unknown-model-xyz")) is None


def test_a_gpu_dry_run_of_a_local_qwen_folder_plans_with_its_shape(tmp_path):
    """On top of the default model group, ``model.source=path model.path=<folder>`` plans with the
    folder's model: its KV bytes per token and weights, not Llama-3.1-8B's."""
    path = _folder(tmp_path, QWEN2_7B)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "model=llama31_8b", "model.source=path", f"model.path={path}",
         "model.name=my-qwen", "platform=gpu", "dry_run=json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (line,) = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{") and "trial_hash" in x]
    assert line["kv_bytes_per_token"] == 28 * 2 * 4 * 128 * 2
    assert line["weights_gib_per_gpu"] == pytest.approx(7.62e9 * 2 / 1024**3, rel=0.02)


def _cache(root, repo: str, files: dict[str, str]) -> None:
    """A Hugging Face cache holding ``files`` of ``repo`` at ``main``, as the hub's client lays it out."""
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("abc123")
    snap = base / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)


def test_a_tokenizer_hub_id_is_a_hub_id_cached_or_a_clear_error_offline(tmp_path, monkeypatch, compose):
    from huggingface_hub import constants

    from orchestrator.config import to_specs
    from orchestrator.models import check_hub_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    # as written, not made into '<cwd>/org/name' (no such folder here), whatever the model's source
    spec, _ = to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:9", "model.tokenizer=org/tok"]))
    assert spec.model.tokenizer == "org/tok"
    with pytest.raises(
        ConfigError, match=r"'org/tok' is no local folder.*not in the local Hugging Face cache.*HF_HUB_OFFLINE"
    ):
        check_hub_tokenizer("org/tok")
    _cache(tmp_path / "hub", "org/tok", {"tokenizer_config.json": "{}"})
    check_hub_tokenizer("org/tok")  # cached: fine, offline too
    with pytest.raises(ConfigError, match="'./my/tok' does not exist"):
        check_hub_tokenizer("./my/tok")  # a path by its spelling is never taken for a hub id


def test_a_hub_model_without_a_tokenizer_of_its_own_is_checked_before_the_start(tmp_path, monkeypatch, compose):
    """``model=tinyllama_1b`` (a hub id, no model.tokenizer): offline and not cached, the sweep is
    refused naming model.path, before anything starts; a dry run (planned for another machine) and
    a trial that sends no request (engine=sleep) are not held to it; cached, it passes."""
    from huggingface_hub import constants

    from orchestrator.scheduling import prepare_jobs

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_id = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    over = ["model=tinyllama_1b"]
    with pytest.raises(ConfigError, match=rf"model.path: '{hub_id}' is no local folder.*HF_HUB_OFFLINE") as err:
        prepare_jobs([(over, compose(over))])
    assert "or model.path at a local snapshot" in str(err.value)
    for fine in (["dry_run=true"], ["engine=sleep"]):
        assert prepare_jobs([([*over, *fine], compose([*over, *fine]))])
    # SKIPPED before it starts (the CPU quantization lab's fp8 checkpoint): not held to it either
    fp8 = ["+experiment=quantization", "variant=fp8"]
    assert prepare_jobs([(fp8, compose(fp8))])
    _cache(tmp_path / "hub", hub_id, {"tokenizer_config.json": "{}"})
    assert prepare_jobs([(over, compose(over))])


def test_a_hub_that_cannot_be_resolved_is_said_at_once(tmp_path, monkeypatch):
    """Not offline by HF_HUB_OFFLINE, but the hub's host does not resolve (this machine): the error
    comes at once, naming the host, not after huggingface_hub's 24 s of retries. Behind a proxy the
    name is the proxy's to resolve."""
    import socket

    from huggingface_hub import constants

    from orchestrator.models import check_hub_tokenizer, hub_unreachable

    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(
        ConfigError, match=r"model.path: 'org/m' .*cannot be reached from here \(huggingface.co does not"
    ):
        check_hub_tokenizer("org/m", key="model.path")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub_unreachable("https://huggingface.co") is None
