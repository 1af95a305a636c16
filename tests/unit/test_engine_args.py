"""Every server command we generate, for every engine and topology, is accepted by that
engine's own argument parser: vLLM's, SGLang's ``ServerArgs`` (installed with --no-deps,
see the Makefile), and our P/D proxy's. No GPU is needed to parse."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import LaunchContext, adapter_for, pd_proxy
from orchestrator.engines import sglang as sglang_adapter
from orchestrator.engines import vllm as vllm_adapter
from orchestrator.engines.router import ROUTER_MODULE
from orchestrator.feasibility import assess
from tests.conftest import CONF

VLLM, SGLANG = adapter_for("vllm"), adapter_for("sglang")


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


@pytest.fixture(scope="module")
def sglang_parser():
    from sglang.srt import server_args  # make install puts SGLang (without its GPU dependencies) in .venv

    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def proxy_parser_args(argv):
    """Parse our proxy's argv with its own parser (main() would serve)."""
    captured = {}

    class Stop(Exception):
        pass

    def fake_run_app(app, host, port, **kw):
        captured.update(host=host, port=port)
        raise Stop

    import aiohttp.web

    orig = aiohttp.web.run_app
    pd_proxy.web.run_app = fake_run_app
    try:
        with pytest.raises(Stop):
            pd_proxy.main(argv)
    finally:
        pd_proxy.web.run_app = orig
    return captured


def parse_launch(launch, vllm_parser, sglang_parser):
    argv = launch.argv
    module = argv[2]
    if module == vllm_adapter.SERVER_MODULE:
        return vllm_parser.parse_args(argv[3:])
    if module == sglang_adapter.SERVER_MODULE:
        ns = sglang_parser.parse_args(argv[3:])
        return ns
    if module == vllm_adapter.PROXY_MODULE:
        return proxy_parser_args(argv[3:])
    if module == ROUTER_MODULE:  # the router's own parser (sglang-router, in the cpu extra)
        from sglang_router.launch_router import parse_router_args

        return parse_router_args(argv[3:])
    raise AssertionError(f"unknown server module {module}")


SGLANG_CASES = [
    ["engine=sglang"],
    [
        "engine=sglang",
        "engine.tensor_parallel_size=2",
        "engine.chunked_prefill_size=512",
        "engine.schedule_policy=lpm",
        "engine.page_size=16",
    ],
    ["engine=sglang", "engine.disable_radix_cache=true", "engine.schedule_policy=dfs-weight"],
    [
        "engine=sglang",
        "engine.speculative_algorithm=EAGLE",
        "engine.speculative_num_steps=3",
        "engine.speculative_eagle_topk=4",
        "engine.speculative_num_draft_tokens=8",
        "engine.speculative_draft_model_path=/models/eagle",
    ],
    [
        "engine=sglang",
        "engine.quantization=fp8",
        "engine.kv_cache_dtype=fp8_e5m2",
        "engine.mem_fraction_static=0.8",
        "engine.max_running_requests=64",
        "engine.disable_cuda_graph=true",
        "engine.random_seed=1",
    ],
    ["engine=sglang", "engine.disaggregation={connector:mooncake,prefill_tp:1,decode_tp:2}"],
]


@pytest.mark.parametrize("overrides", SGLANG_CASES, ids=lambda o: " ".join(o[1:]) or "defaults")
def test_sglang_commands_parse(sglang_parser, vllm_parser, compose, overrides):
    spec, _ = to_specs(compose(["platform=gpu", *overrides]))
    e = spec.engine
    launches = SGLANG.launches(spec, LaunchContext("/models/x", 30000, iter(range(31000, 31100)).__next__, "/tmp/t"))
    servers = [x for x in launches if x.argv[2] == sglang_adapter.SERVER_MODULE]
    for launch in servers:
        ns = parse_launch(launch, vllm_parser, sglang_parser)
        assert ns.model_path == "/models/x" and ns.host == "127.0.0.1" and ns.enable_metrics
        assert ns.served_model_name == spec.model.name
        if e.chunked_prefill_size is not None:
            assert ns.chunked_prefill_size == e.chunked_prefill_size
        if e.schedule_policy is not None:
            assert ns.schedule_policy == e.schedule_policy
        assert ns.disable_radix_cache is e.disable_radix_cache
        if e.speculative_algorithm:
            assert ns.speculative_algorithm == e.speculative_algorithm
            assert int(ns.speculative_num_draft_tokens) == e.speculative_num_draft_tokens
    if e.disaggregation is None:
        assert (
            len(launches) == 1
            and int(parse_launch(launches[0], vllm_parser, sglang_parser).tp_size) == e.tensor_parallel_size
        )
    else:
        prefill, decode, router = launches
        p = parse_launch(prefill, vllm_parser, sglang_parser)
        d = parse_launch(decode, vllm_parser, sglang_parser)
        assert (p.disaggregation_mode, d.disaggregation_mode) == ("prefill", "decode")
        assert p.disaggregation_transfer_backend == "mooncake" and int(d.tp_size) == 2
        assert prefill.gpus == (0,) and decode.gpus == (1, 2) and router.gpus == ()
        assert router.port == 30000 and prefill.base_url in router.argv and decode.base_url in router.argv
        assert str(p.disaggregation_bootstrap_port) in router.argv
        assert len({prefill.port, decode.port, router.port}) == 3


def test_sglang_is_skipped_on_cpu(compose):
    spec, _ = to_specs(compose(["engine=sglang"]))
    assert "CUDA" in assess(spec)


def test_sglang_rejects_half_set_speculation(compose):
    from orchestrator.config.errors import ConfigError

    with pytest.raises(ConfigError, match="speculative_num_steps needs"):
        to_specs(
            compose(
                [
                    "engine=sglang",
                    "platform=gpu",
                    "engine.speculative_algorithm=EAGLE",
                    "engine.speculative_num_steps=3",
                ]
            )
        )


def test_vllm_pd_topology(vllm_parser, sglang_parser, compose):
    spec, _ = to_specs(
        compose(["platform=gpu", "engine.disaggregation={connector:NixlConnector,prefill_tp:2,decode_tp:1}"])
    )
    launches = VLLM.launches(spec, LaunchContext("/models/x", 8000, iter(range(9000, 9100)).__next__, "/tmp/t"))
    prefill, decode, proxy = launches
    for launch in (prefill, decode):
        ns = parse_launch(launch, vllm_parser, sglang_parser)
        kv = ns.kv_transfer_config
        assert kv.kv_connector == "NixlConnector" and kv.kv_role == "kv_both"
    assert prefill.gpus == (0, 1) and decode.gpus == (2,) and proxy.gpus == ()
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert parse_launch(prefill, vllm_parser, sglang_parser).tensor_parallel_size == 2
    assert parse_launch(proxy, vllm_parser, sglang_parser) == {"host": "127.0.0.1", "port": 8000}
    assert spec.engine.num_gpus == 3
    assert "GPUs" in assess(to_specs(compose(["engine.disaggregation={connector:NixlConnector}"]))[0])


def test_vllm_lmcache_renders_config(vllm_parser, sglang_parser, compose):
    spec, _ = to_specs(compose(["platform=gpu", "engine.lmcache={chunk_size:512,local_disk:/tmp/lmc}"]))
    (launch,) = VLLM.launches(spec, LaunchContext("/models/x", 8000, lambda: 0, "/tmp/trial"))
    ns = parse_launch(launch, vllm_parser, sglang_parser)
    assert ns.kv_transfer_config.kv_connector == "LMCacheConnectorV1"
    assert launch.env["LMCACHE_CONFIG_FILE"] == "/tmp/trial/lmcache.yaml"
    text = launch.files["/tmp/trial/lmcache.yaml"]
    assert "chunk_size: 512" in text and 'local_disk: "file:///tmp/lmc"' in text


def test_vllm_speculative_forms_parse(vllm_parser, sglang_parser, compose):
    for cfg in (
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
        {"model": "/models/draft", "num_speculative_tokens": 3},
        {"method": "eagle", "model": "/models/eagle", "num_speculative_tokens": 3},
    ):
        hydra_dict = "{" + ",".join(f"{k}:{json.dumps(v) if isinstance(v, str) else v}" for k, v in cfg.items()) + "}"
        spec, _ = to_specs(compose(["platform=gpu", f"engine.speculative_config={hydra_dict}"]))
        (launch,) = VLLM.launches(spec, LaunchContext("/m", 1, lambda: 0, "/t"))
        ns = parse_launch(launch, vllm_parser, sglang_parser)
        assert ns.speculative_config["num_speculative_tokens"] == cfg["num_speculative_tokens"]


def test_cache_reset_switches_dev_mode(compose):
    spec, _ = to_specs(compose(["engine.reset_cache_between_points=true"]))
    (launch,) = VLLM.launches(spec, LaunchContext("/m", 1, lambda: 0, "/t"))
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert VLLM.cache_reset(spec) == ("POST", "/reset_prefix_cache")


def test_every_experiment_command_parses(vllm_parser, sglang_parser, compose):
    """Every trial of every experiment, on both platforms: every server's argv parses."""
    count = 0
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        for platform in ("cpu", "gpu"):
            base = compose([f"+experiment={path.stem}", f"platform={platform}"])
            for variant in str((base.get("sweeps") or {}).get(platform, "")).split(","):
                overrides = [f"+experiment={path.stem}", f"platform={platform}"]
                if variant.strip():
                    overrides.append(f"variant={variant.strip()}")
                spec, _ = to_specs(compose(overrides))
                adapter = adapter_for(spec.engine.name)
                for launch in adapter.launches(spec, LaunchContext("/m", 9000, iter(range(9100, 9200)).__next__, "/t")):
                    if launch.argv:
                        parse_launch(launch, vllm_parser, sglang_parser)
                        count += 1
    assert count > 0


def test_pd_on_cpu_through_the_example_connector(vllm_parser, sglang_parser, compose):
    from orchestrator.config.errors import ConfigError

    with pytest.raises(ConfigError, match="needs engine.max_model_len"):
        to_specs(compose(["engine.disaggregation={connector:ExampleConnector}"]))
    spec, _ = to_specs(
        compose(
            [
                "engine.disaggregation={connector:ExampleConnector}",
                "engine.max_model_len=2048",
                "engine.max_num_batched_tokens=256",
            ]
        )
    )
    assert assess(spec, cluster_gpus=0) is None  # runs on the CPU build
    prefill, decode, proxy = VLLM.launches(
        spec, LaunchContext("/models/x", 8000, iter(range(9000, 9100)).__next__, "/tr")
    )
    for launch, core in ((prefill, "0"), (decode, "1")):
        kv = parse_launch(launch, vllm_parser, sglang_parser).kv_transfer_config
        assert kv.kv_connector == "ExampleConnector"
        assert kv.kv_connector_extra_config == {"shared_storage_path": "/tr/kv_store"}
        assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == core  # a core each, not both on all
        assert launch.scratch == ("/tr/kv_store",)  # removed after the servers stop
    p, d = parse_launch(prefill, vllm_parser, sglang_parser), parse_launch(decode, vllm_parser, sglang_parser)
    assert (p.enable_chunked_prefill, p.max_num_batched_tokens) == (False, 2048)  # whole prompts in one step
    assert d.max_num_batched_tokens == 256
    nixl, _ = to_specs(compose(["engine.disaggregation={connector:NixlConnector}"]))
    assert "ExampleConnector" in assess(nixl, cluster_gpus=0)


def test_quantized_tiny_model_on_cpu(compose, monkeypatch):
    from orchestrator.engines import cpu_kernels

    w4, _ = to_specs(compose(["model.tiny.quantization=w4a16"]))
    assert "bfloat16" in assess(w4, cluster_gpus=0)
    w4_bf16, _ = to_specs(compose(["model.tiny.quantization=w4a16", "engine.dtype=bfloat16"]))
    w8, _ = to_specs(compose(["model.tiny.quantization=w8a8"]))
    # a build with every kernel (an AVX-512 CPU) runs both
    monkeypatch.setattr(
        cpu_kernels,
        "probe",
        lambda python: {"cpu_gemm_wna16": True, "onednn_scaled_mm": True, "dynamic_scaled_int8_quant": True},
    )
    assert assess(w4_bf16, cluster_gpus=0) is None and assess(w8, cluster_gpus=0) is None
    # a build without the 4-bit kernel (vLLM's AVX2 library): W4A16 SKIPPED before launch, naming the op
    monkeypatch.setattr(
        cpu_kernels,
        "probe",
        lambda python: {"cpu_gemm_wna16": False, "onednn_scaled_mm": True, "dynamic_scaled_int8_quant": True},
    )
    reason = assess(w4_bf16, cluster_gpus=0)
    assert reason and "torch.ops._C.cpu_gemm_wna16" in reason and "model.tiny.quantization=w4a16" in reason
    assert assess(w8, cluster_gpus=0) is None

    def cannot_tell(python):
        raise cpu_kernels.ProbeError("no vllm")

    monkeypatch.setattr(cpu_kernels, "probe", cannot_tell)  # no answer: it starts (a death is then reported)
    assert assess(w4_bf16, cluster_gpus=0) is None
    monkeypatch.undo()
    fp8, _ = to_specs(compose(["engine.quantization=fp8"]))
    assert "compressed-tensors" in assess(fp8, cluster_gpus=0)
    from orchestrator.config import trial_hash
    from orchestrator.models import resolve_model

    base, _ = to_specs(compose([]))
    assert resolve_model(w8.model, build=False) == resolve_model(base.model, build=False) + "-w8a8-asym"
    assert trial_hash(w8) != trial_hash(base)


def test_replicas_behind_the_router(vllm_parser, sglang_parser, compose):
    from sglang_router import launch_router

    spec, _ = to_specs(compose(["engine.router={replicas:2,policy:cache_aware}"]))
    assert assess(spec, cluster_gpus=0) is None and spec.engine.num_gpus == 2
    r0, r1, router = VLLM.launches(spec, LaunchContext("/models/x", 8000, iter(range(9000, 9100)).__next__, "/t"))
    assert (r0.name, r1.name, router.name) == ("replica0", "replica1", "router")
    assert (r0.env["VLLM_CPU_OMP_THREADS_BIND"], r1.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    for r in (r0, r1):
        assert parse_launch(r, vllm_parser, sglang_parser).port == r.port
    args = launch_router.parse_router_args(router.argv[3:])  # the router's own parser
    assert args.worker_urls == [r0.base_url, r1.base_url] and args.policy == "cache_aware"
    assert (args.host, args.port, args.prometheus_host) == ("127.0.0.1", 8000, "127.0.0.1")
    gpu, _ = to_specs(compose(["platform=gpu", "engine.router={replicas:3}", "engine.tensor_parallel_size=2"]))
    launches = VLLM.launches(gpu, LaunchContext("/m", 8000, iter(range(9000, 9100)).__next__, "/t"))
    assert [x.gpus for x in launches] == [(0, 1), (2, 3), (4, 5), ()] and gpu.engine.num_gpus == 6
    assert launches[-1].argv[0].endswith("sglang-gpu/bin/python")


def test_a_profiled_trial_configures_each_engines_profiler(vllm_parser, sglang_parser, compose, tmp_path):
    """vLLM 0.32 takes --profiler-config (torch, into the trial's profile/ folder) on every
    engine server, not the proxy; SGLang's start endpoint gets the folder. Parsed by their own code."""
    from orchestrator.trial.profile import with_profiler

    base, _ = to_specs(compose([]))
    label = base.workload.load_points[0].label
    spec, _ = to_specs(
        compose(
            [
                f"+profile={{point:{label}}}",
                "engine.disaggregation={connector:ExampleConnector}",
                "engine.max_model_len=1024",
            ]
        )
    )
    launches = VLLM.launches(spec, LaunchContext("/models/x", 8000, iter(range(9000, 9100)).__next__, str(tmp_path)))
    profiled, profiler = with_profiler(VLLM, spec, tmp_path, launches)
    assert profiler is not None and profiler.start == ("/start_profile", None)
    for launch in profiled[:2]:  # prefill, decode
        config = parse_launch(launch, vllm_parser, sglang_parser).profiler_config
        assert config.profiler == "torch" and config.torch_profiler_dir == str(tmp_path / "profile")
        assert config.torch_profiler_with_stack is False and config.torch_profiler_use_gzip
    assert "--profiler-config" not in profiled[2].argv  # our proxy
    assert (tmp_path / "profile").is_dir()
    sg, _ = to_specs(compose(["platform=gpu", "engine=sglang", f"+profile={{point:{label}}}"]))
    p = SGLANG.profiler(sg, "/t/profile")
    assert p is not None and p.start[1]["output_dir"] == "/t/profile" and dict(p.env)["SGLANG_TORCH_PROFILER_DIR"]


def test_nsys_wraps_each_engine_server_inside_the_launch_prefix(vllm_parser, sglang_parser, compose):
    """profile.nsys on GPUs: `nsys profile` between the container prefix and the interpreter of
    every engine server (the engine's own parser reads the rest), vLLM's cuda profiler (the
    endpoints call cudaProfilerStart/Stop, nsys's capture range), a long stop for the report."""
    from orchestrator.trial.profile import profiled_launches

    label = to_specs(compose([]))[0].workload.load_points[0].label
    prefix = ["apptainer", "exec", "--nv", "/shared/vllm.sif"]
    spec, _ = to_specs(
        compose(
            [
                "platform=gpu",
                "engine.tensor_parallel_size=2",
                f"engine.launch_prefix=[{','.join(prefix)}]",
                f"+profile={{point:{label},nsys:{{trace:[cuda,nvtx],args:['--sample=none']}}}}",
            ]
        )
    )
    assert assess(spec, cluster_gpus=2) is None
    launches = VLLM.launches(spec, LaunchContext("/models/x", 8000, iter(range(9000, 9100)).__next__, "/t"))
    (server,), profiler = profiled_launches(VLLM, spec, "/t/profile", launches)
    assert profiler is not None and server.stop_grace_s == 300.0
    head = len(prefix)
    assert server.argv[:head] == prefix and server.argv[head : head + 2] == ["nsys", "profile"]
    rest = server.argv.index("python3")  # the container's interpreter, right after nsys's options
    nsys_options = server.argv[head + 2 : rest]
    assert nsys_options == [
        "--output=/t/profile/nsys-server",
        "--force-overwrite=true",
        "--trace=cuda,nvtx",
        "--cuda-graph-trace=node",
        "--trace-fork-before-exec=true",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--sample=none",
    ]
    unwrapped = dataclasses.replace(server, argv=server.argv[rest:])
    args = parse_launch(unwrapped, vllm_parser, sglang_parser)
    assert args.profiler_config.profiler == "cuda" and args.tensor_parallel_size == 2
    sg, _ = to_specs(compose(["platform=gpu", "engine=sglang", f"+profile={{point:{label},nsys:{{}}}}"]))
    (sg_server,), sg_profiler = profiled_launches(
        SGLANG,
        sg,
        "/t/profile",
        SGLANG.launches(sg, LaunchContext("/m", 8000, iter(range(9000, 9100)).__next__, "/t")),
    )
    assert sg_profiler is not None and sg_profiler.start[1] == {
        "output_dir": "/t/profile",
        "activities": ["CUDA_PROFILER"],
    }
    assert sg_server.argv[:2] == ["nsys", "profile"] and "--trace=cuda,nvtx,osrt" in sg_server.argv
    parse_launch(
        dataclasses.replace(sg_server, argv=sg_server.argv[sg_server.argv.index("--capture-range-end=stop") + 1 :]),
        vllm_parser,
        sglang_parser,
    )


def test_nsys_is_checked_before_anything_starts(compose, tmp_path, monkeypatch):
    """A missing nsys is a clear error before launch (on this host, or inside the container);
    nsys on the CPU platform is SKIPPED with the reason; bad trace names are refused."""
    from orchestrator.config.errors import ConfigError
    from orchestrator.engines import envs, nsys

    label = to_specs(compose([]))[0].workload.load_points[0].label
    profile = f"+profile={{point:{label},nsys:{{}}}}"
    cpu, _ = to_specs(compose([profile]))
    assert "profile.nsys traces CUDA kernels and needs GPUs" in (assess(cpu) or "")
    monkeypatch.setenv("PATH", str(tmp_path))
    gpu, _ = to_specs(compose(["platform=gpu", "engine.python=/usr/bin/env", profile]))
    assert "profile.nsys: 'nsys' was not found" in (envs.missing(gpu) or "")
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\necho 'NVIDIA Nsight Systems version 2025.3'\n")
    fake.chmod(0o755)
    assert envs.missing(gpu) is None
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    boxed, _ = to_specs(compose(["platform=gpu", "engine.launch_prefix=[env]", profile]))
    assert envs.missing(boxed) is None  # in a container: asked there, by the trial, before its servers
    with pytest.raises(ConfigError, match=r"profile.nsys: 'nsys' does not run inside engine.launch_prefix"):
        nsys.check_in_container(boxed)
    found, _ = to_specs(
        compose(["platform=gpu", "engine.launch_prefix=[env]", f"+profile={{point:{label},nsys:{{path:'{fake}'}}}}"])
    )
    nsys.check_in_container(found)
    with pytest.raises(ConfigError, match="nsys trace names"):
        to_specs(compose([f"+profile={{point:{label},nsys:{{trace:['cuda,nvtx']}}}}"]))
