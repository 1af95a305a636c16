"""vLLM's own benchmark client (``vllm.benchmarks.serve``) run in a subprocess, for comparisons.

The subprocess times its own CPU around ``main()`` only: importing vLLM costs ~13 CPU
seconds that vary by more than the request work itself, so they are not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_CLIENT = (
    "import sys, time; from vllm.benchmarks.serve import add_cli_args, main;"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P;"
    "p = P(); add_cli_args(p); a = p.parse_args(sys.argv[1:]);"
    "t = time.process_time(); main(a); print('CLIENT_CPU_S', time.process_time() - t)"
)


def run_vllm_client(args: list[str]) -> tuple[dict[str, Any], float]:
    """Run ``vllm bench serve`` with ``args`` (plus result-saving flags); return its result JSON
    and the CPU seconds it spent in ``main()``. Raises RuntimeError with its stderr on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        full = [
            *args,
            "--save-result",
            "--result-dir",
            tmp,
            "--result-filename",
            "r.json",
            "--disable-tqdm",
            "--ready-check-timeout-sec",
            "0",
        ]
        proc = subprocess.run(
            [sys.executable, "-c", _CLIENT, *full],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM's client failed:\n{proc.stderr[-3000:]}")
        result = json.loads((Path(tmp) / "r.json").read_text())
    cpu = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("CLIENT_CPU_S")]
    return result, (cpu[-1] if cpu else float("nan"))


def random_dataset_args(url: str, model: str, tokenizer: str, input_len: int, output_len: int, n: int) -> list[str]:
    """Arguments for vLLM's client: ``n`` random-token completions of the given lengths at ``url``."""
    return [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(n),
        "--ignore-eos",
    ]
