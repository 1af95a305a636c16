"""Every vLLM command line we generate is accepted by vLLM's own server argument parser."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import LaunchContext, adapter_for
from orchestrator.engines import vllm as vllm_adapter
from testkit.levers import lever_overrides

VLLM = adapter_for("vllm")


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def parse(parser, argv):
    assert argv[1:3] == ["-m", vllm_adapter.SERVER_MODULE]
    return parser.parse_args(argv[3:])


CASES = [
    [],
    ["engine.enable_chunked_prefill=false"],
    ["engine.max_num_batched_tokens=256", "engine.enable_chunked_prefill=true", "engine.max_num_seqs=8"],
    ["engine.block_size=32", "engine.enable_prefix_caching=false", "engine.kv_cache_dtype=fp8"],
    [
        "engine.tensor_parallel_size=2",
        "engine.pipeline_parallel_size=2",
        "engine.gpu_memory_utilization=0.85",
        "platform=gpu",
    ],
    ["engine.quantization=fp8", "engine.seed=3", "engine.max_model_len=2048"],
    ["+engine.speculative_config={method:ngram,num_speculative_tokens:3,prompt_lookup_max:3}"],
    ["engine.extra_args=[--max-logprobs,5]"],
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o) or "defaults")
def test_generated_argv_parses(vllm_parser, compose, overrides):
    spec, _ = to_specs(compose(overrides))
    launch = VLLM.launch(spec, "/models/x", 8123)
    ns = parse(vllm_parser, launch.argv)
    e = spec.engine
    assert ns.model == "/models/x" and ns.port == 8123 and ns.host == "127.0.0.1"
    assert ns.served_model_name == [spec.model.name]
    if e.max_num_batched_tokens is not None:
        assert ns.max_num_batched_tokens == e.max_num_batched_tokens
    if e.enable_chunked_prefill is not None:
        assert ns.enable_chunked_prefill is e.enable_chunked_prefill
    if e.enable_prefix_caching is not None:
        assert ns.enable_prefix_caching is e.enable_prefix_caching
    assert ns.tensor_parallel_size == e.tensor_parallel_size
    assert ns.pipeline_parallel_size == e.pipeline_parallel_size
    if e.num_gpus > 1:
        assert ns.distributed_executor_backend == "mp"
    if e.speculative_config:
        assert ns.speculative_config["num_speculative_tokens"] == 3
    # on: the flag; off: no flag, so vLLM's own default (not an `or` that a None/False mix passes)
    assert ns.enforce_eager is (True if e.enforce_eager else vllm_parser.get_default("enforce_eager"))


LEVERS = [(f"{platform}: {name}", o) for platform in ("gpu", "cpu") for name, o in lever_overrides("vllm", platform)]


@pytest.mark.parametrize("overrides", [o for _, o in LEVERS], ids=[n for n, _ in LEVERS])
def test_every_tuning_lever_makes_command_lines_vllm_accepts(vllm_parser, compose, overrides):
    """Each vLLM move of conf/tuning/levers.yaml, as a tuner's candidate gets it, composes,
    validates and launches servers whose flags vLLM's parser takes (the GPU builds check the
    same moves in tests/engines/test_gpu_builds.py)."""
    spec, _ = to_specs(compose(overrides))
    ports = iter(range(9100, 9200))
    launches = VLLM.launches(spec, LaunchContext("/models/x", 8123, ports.__next__, "/tmp/trial"))
    servers = [launch for launch in launches if launch.argv[1:3] == ["-m", vllm_adapter.SERVER_MODULE]]
    assert servers
    for launch in servers:
        parse(vllm_parser, launch.argv)


def test_cpu_env_and_unset_omp(compose):
    spec, _ = to_specs(compose(["engine.cpu_omp_threads_bind=0|1"]))
    launch = VLLM.launch(spec, "/m", 1)
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "OMP_NUM_THREADS" in launch.unset_env


def test_the_vllm_value_sets_are_the_installed_vllms_own():
    """engine.dtype / kv_cache_dtype / quantization are checked against value sets copied from
    vLLM 0.32 (the CPU build here and engines/vllm-gpu.txt): read back from the installed vLLM's
    source, so an upgrade that changes them fails here, not as a refused or a let-through value."""
    import ast
    import importlib.util
    from pathlib import Path
    from typing import get_args

    from orchestrator.config.schema.engines import VLLMCacheDType, VLLMDType, VLLMQuantization

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent

    def literal(path: str, name: str) -> tuple[str, ...]:
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                items = node.value.slice.elts  # type: ignore[attr-defined]
                return tuple(e.value for e in items)
        raise AssertionError(f"{name} not found in vllm/{path}")

    assert get_args(VLLMDType) == literal("config/model.py", "ModelDType")
    assert get_args(VLLMCacheDType) == literal("config/cache.py", "CacheDType")
    assert get_args(VLLMQuantization) == literal(
        "model_executor/layers/quantization/__init__.py", "QuantizationMethods"
    )


def test_a_vllm_value_outside_its_set_names_the_key(compose):
    from orchestrator.config import ConfigError

    for override, key in (
        ("engine.kv_cache_dtype=foo", "engine.kv_cache_dtype"),
        ("engine.quantization=foo", "engine.quantization"),
        ("platform.dtype=float8", "engine.dtype"),
    ):
        with pytest.raises(ConfigError, match=f"{key}: Input should be"):
            to_specs(compose([override]))
