"""The KV-capacity worksheet (../shared/seeds/002_*), filled in from a model and a GPU.

    python -m orchestrator.labs.kv_worksheet                                   # Llama-3.1-8B, A100-80GB
    python -m orchestrator.labs.kv_worksheet --gpu L4-24GB --util 0.85 --kv-cache-dtype fp8 \
        --prompt-p50 512 --prompt-p95 3000 --output-p50 200 --output-p95 800

KV bytes per token = layers x 2 (K, V) x KV heads x head dim x bytes per value; a sequence
holds prompt + output tokens. The KV budget is GPU memory x utilisation minus the weights
(per GPU under TP); capacity = budget / bytes per token. Prints the worksheet's fields and
how many sequences fit at the p50 and p95 traffic shapes, the numbers to pick
``max_num_seqs`` / ``max_model_len`` / TP from. Activations and graphs are not counted, so
real capacity is a little lower (vLLM logs its own "KV cache size" at start).
"""

from __future__ import annotations

import argparse

from orchestrator.labs.roofline_worksheet import load_arch
from orchestrator.perf.gpus import GPUS, gpu_spec
from orchestrator.perf.kv import GIB, kv_capacity


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama31_8b", help="a conf/model/ name")
    ap.add_argument("--gpu", default="A100-80GB", choices=sorted(GPUS))
    ap.add_argument("--util", type=float, default=0.9, help="gpu_memory_utilization")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--prompt-p50", type=int, default=512)
    ap.add_argument("--prompt-p95", type=int, default=2048)
    ap.add_argument("--output-p50", type=int, default=128)
    ap.add_argument("--output-p95", type=int, default=512)
    a = ap.parse_args(argv)
    model, arch = load_arch(a.model)
    gpu = gpu_spec(a.gpu)
    cap = kv_capacity(arch, gpu.memory_gb, a.util, a.tp, a.kv_cache_dtype, a.quantization)
    per_token = cap.kv_bytes_per_token
    rows = [
        ("model", model.name),
        ("parameters", f"{arch.params_b:g} B"),
        ("layers x KV heads x head dim", f"{arch.num_layers} x {arch.num_kv_heads} x {arch.head_dim}"),
        ("KV bytes per token", f"{per_token / 1024:.0f} KiB ({a.kv_cache_dtype or 'model dtype'})"),
        ("GPU", f"{a.tp} x {gpu.name}, utilisation {a.util:g}"),
        ("weights per GPU", f"{cap.weights_gib_per_gpu:.1f} GiB"),
        ("KV budget per GPU", f"{cap.kv_budget_gib_per_gpu:.1f} GiB"),
        ("KV capacity", f"{cap.tokens:,} tokens"),
        ("one sequence at max_model_len", f"{per_token * a.max_model_len / GIB:.2f} GiB ({a.max_model_len} tokens)"),
    ]
    for label, prompt, out in (("p50", a.prompt_p50, a.output_p50), ("p95", a.prompt_p95, a.output_p95)):
        seq = prompt + out
        rows.append((f"sequences that fit at {label} ({prompt} + {out} tokens)", f"{cap.tokens // max(seq, 1):,}"))
    rows.append(
        ("fits max_model_len", "yes" if cap.tokens >= a.max_model_len else "NO: lower it, quantize KV, or add TP")
    )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


if __name__ == "__main__":
    main()
