"""Week 3's roofline calculator: the floor of a decode step for a model on a GPU.

    python -m orchestrator.labs.roofline_worksheet                                  # Llama-3.1-8B on an A100-80GB
    python -m orchestrator.labs.roofline_worksheet --model mixtral_8x7b --gpu H100-SXM-80GB --tp 2
    python -m orchestrator.labs.roofline_worksheet --batch 1 8 64 256 --context 2048

Model shapes come from conf/model/<name>.yaml (``arch``), GPU numbers from
orchestrator/perf/gpus.py. Prints, per batch size: bytes read per step, FLOPs, the
memory and compute floors, which one binds, and the arithmetic intensity against the
GPU's ridge point. Compare the floor with a measured TPOT (the roofline experiment logs
``tpot_ms_p50`` per concurrency).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from orchestrator.config.schema import ModelArch, ModelSpec
from orchestrator.perf.gpus import GPUS, gpu_spec
from orchestrator.perf.kv import arch_of
from orchestrator.perf.roofline import decode_floor

CONF = Path(__file__).resolve().parents[2] / "conf"


def load_model(name: str) -> ModelSpec:
    path = CONF / "model" / f"{name}.yaml"
    if not path.exists():
        choices = ", ".join(sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
        raise SystemExit(f"--model: no conf/model/{name}.yaml; expected one of: {choices}")
    data = yaml.safe_load(path.read_text())
    data.pop("defaults", None)
    return ModelSpec.model_validate(data)


def load_arch(name: str) -> tuple[ModelSpec, ModelArch]:
    model = load_model(name)
    arch = arch_of(model)
    if arch is None:
        raise SystemExit(f"model {name} has no 'arch' section")
    return model, arch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama31_8b", help="a conf/model/ name")
    ap.add_argument("--gpu", default="A100-80GB", choices=sorted(GPUS))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--context", type=int, default=256, help="tokens already in each sequence's KV cache")
    ap.add_argument("--quantization", default=None, help="fp8, awq, gptq, ... (weight bytes)")
    ap.add_argument("--kv-cache-dtype", default=None, help="fp8 halves KV bytes")
    a = ap.parse_args(argv)
    model, arch = load_arch(a.model)
    gpu = gpu_spec(a.gpu)
    print(
        f"{model.name} on {a.tp}x {gpu.name}: {gpu.bandwidth_gb_s:g} GB/s, {gpu.bf16_tflops:g} TFLOP/s bf16, "
        f"ridge {gpu.ridge_flop_per_byte:.0f} FLOP/byte; context {a.context} tokens"
    )
    header = ["batch", "GB read", "GFLOP", "mem floor ms", "compute floor ms", "floor ms", "bound", "FLOP/byte"]
    rows = []
    for b in a.batch:
        f = decode_floor(
            arch,
            gpu.bandwidth_gb_s,
            gpu.bf16_tflops,
            batch=b,
            context_tokens=a.context,
            tp=a.tp,
            kv_dtype=a.kv_cache_dtype,
            quantization=a.quantization,
        )
        rows.append(
            [
                str(b),
                f"{f.bytes_read / 1e9:.2f}",
                f"{f.flops / 1e9:.1f}",
                f"{f.memory_floor_ms:.3f}",
                f"{f.compute_floor_ms:.3f}",
                f"{f.floor_ms:.3f}",
                f.bound,
                f"{f.arithmetic_intensity:.1f}",
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)))


if __name__ == "__main__":
    main()
