"""``make gpu-check`` on a machine without its packages: one line says what is missing and how to
get it, every check that needs them is SKIP, and nothing fails on an import (issue 58, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.gpu_check import CHECKS, NEEDS, missing_modules, what_to_install
from tests.conftest import ROOT


def test_without_its_packages_gpu_check_says_in_one_line_what_to_install():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # -S: no site-packages, as a bare python3 with nothing installed
    p = subprocess.run(
        [sys.executable, "-S", "-m", "orchestrator.gpu_check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Traceback" not in out and "ModuleNotFoundError" not in out, out
    said = [line for line in out.splitlines() if line.startswith("gpu-check: not installed")]
    assert len(said) == 1, out
    assert "nvidia-ml-py" in said[0] and "torch" in said[0] and "make gpu-check-wheels" in said[0], said[0]
    assert out.count("[SKIP]") == len(CHECKS), out
    assert "gpu-check: incomplete" in out


def test_detection_needs_nvml_alone():
    assert NEEDS[CHECKS[0][1]] == ["pynvml"]
    code = "import sys, orchestrator.perf.gpus; print(sorted({'pyarrow', 'pydantic', 'hydra', 'psutil'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr


def test_the_line_names_packages_not_modules():
    assert missing_modules(["json", "no_such_module_here"]) == ["no_such_module_here"]
    line = what_to_install(["pynvml", "hydra"])
    assert "pip install nvidia-ml-py" in line and "hydra-core" in line and "carry .whl/" in line
