"""Every vLLM command line we generate is accepted by vLLM's own server argument parser."""

from __future__ import annotations

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import adapter_for
from orchestrator.engines import vllm as vllm_adapter

VLLM = adapter_for("vllm")


@pytest.fixture(scope="module")
def vllm_parser():
    pytest.importorskip("vllm")
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


def test_cpu_env_and_unset_omp(compose):
    spec, _ = to_specs(compose(["engine.cpu_omp_threads_bind=0|1"]))
    launch = VLLM.launch(spec, "/m", 1)
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "OMP_NUM_THREADS" in launch.unset_env
