"""Which of vLLM's CPU kernels this machine's build has: probed, not guessed.

vLLM's CPU wheel ships one kernel library per instruction set (``_C`` for AVX-512 + BF16,
``_C_AVX512``, ``_C_AVX2``) and loads the one this CPU can run
(``CpuPlatform.import_kernels``). They do not hold the same ops: the 4-bit weight-only GEMM
``cpu_gemm_wna16`` (W4A16) is missing from the AVX2 library, so on an AVX2-only CPU (this
project's AMD EPYC machines) a W4A16 checkpoint starts and its engine dies on the first
request. Feasibility asks the engine's own interpreter, once per machine and build, whether
the ops a feature needs are registered after vLLM's own kernel import, and SKIPS the trial
with the reason before anything starts.

The answer is cached in memory and on disk (``~/.cache/inference-lab/cpu-kernels.json``),
keyed by interpreter, vLLM version and the CPU's flags: a probe imports torch and vLLM
(~5 s) and runs once per machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# What a feature runs on vLLM's CPU build (vllm 0.32: model_executor/kernels/linear/...).
FEATURE_OPS: dict[str, tuple[str, ...]] = {
    # CPUWNA16LinearKernel (mixed_precision/cpu.py)
    "w4a16": ("cpu_gemm_wna16",),
    # CPUInt8ScaledMMLinearKernel through oneDNN on CPUs without AMX (scaled_mm/cpu.py)
    "w8a8": ("onednn_scaled_mm", "dynamic_scaled_int8_quant"),
}

# Run by the engine's interpreter: vLLM's own kernel import, then which ops are registered.
PROBE = """
import json, sys
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
ops = json.loads(sys.argv[1])
print("PROBE " + json.dumps({op: hasattr(torch.ops._C, op) for op in ops}))
"""

CACHE_FILE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inference-lab" / "cpu-kernels.json"


class ProbeError(RuntimeError):
    """The engine's interpreter could not answer (not installed, import failed)."""


def cpu_flags() -> list[str]:
    """The instruction-set flags of this CPU that vLLM's kernel choice depends on."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
    flags = set(line.split(":", 1)[-1].split())
    return [f for f in wanted if f in flags]


def _vllm_stamp(python: str) -> str:
    """What changes the answer besides the CPU: the interpreter and its vLLM build's files."""
    try:
        out = subprocess.run(
            [
                python,
                "-c",
                "import importlib.util as u, os; s = u.find_spec('vllm');"
                "d = os.path.dirname(s.origin); print(sorted((f, os.path.getmtime(os.path.join(d, f)))"
                " for f in os.listdir(d) if f.endswith('.so')))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"{python}: {exc}") from None
    if out.returncode != 0:
        raise ProbeError(f"{python} has no vLLM: {out.stderr.strip().splitlines()[-1:] or out.returncode}")
    return out.stdout.strip()


def _key(python: str) -> str:
    ident = json.dumps([os.path.realpath(python), _vllm_stamp(python), cpu_flags()])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _read_cache() -> dict[str, dict[str, bool]]:
    try:
        return json.loads(CACHE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, answer: dict[str, bool]) -> None:
    try:
        cache = _read_cache()
        cache[key] = answer
        CACHE_FILE.parent.mkdir(parents=True, exist_ok=True)
        tmp = CACHE_FILE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, CACHE_FILE)
    except OSError as exc:  # an unwritable cache costs a probe next time, nothing else
        log.debug("cpu kernel cache not written: %s", exc)


@functools.lru_cache(maxsize=8)
def probe(python: str) -> dict[str, bool]:
    """``{op: registered}`` for every op of :data:`FEATURE_OPS`, in ``torch.ops._C`` after
    vLLM's own kernel import, run by ``python`` (one subprocess per machine and build, then the
    cache). Raises :class:`ProbeError` when that interpreter cannot tell."""
    ops = sorted({op for needed in FEATURE_OPS.values() for op in needed})
    key = _key(python)
    cached = _read_cache().get(key)
    if cached is not None and set(ops) <= set(cached):
        return cached
    try:
        out = subprocess.run(
            [python, "-c", PROBE, json.dumps(ops)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"{python}: {exc}") from None
    line = next((x for x in out.stdout.splitlines() if x.startswith("PROBE ")), None)
    if out.returncode != 0 or line is None:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the kernel probe failed in {python}: {last}")
    answer = {op: bool(v) for op, v in json.loads(line[len("PROBE ") :]).items()}
    _write_cache(key, answer)
    return answer


def missing_for(feature: str, python: str) -> list[str]:
    """The ops ``feature`` needs that this machine's vLLM build lacks (empty: it can run)."""
    answer = probe(python)
    return [op for op in FEATURE_OPS[feature] if not answer.get(op, False)]


def describe_cpu() -> str:
    """``AVX2, no AVX-512, no AMX``: the kernel-relevant instruction sets of this CPU."""
    flags = cpu_flags()
    has = [f.upper().replace("_", "-") for f in flags] or ["no AVX2"]
    lacks = [f"no {name}" for name, flag in (("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag not in flags]
    return ", ".join([" ".join(has), *lacks])


__all__ = ["FEATURE_OPS", "ProbeError", "cpu_flags", "describe_cpu", "missing_for", "probe"]
