"""engine.launch_prefix (`apptainer exec --nv IMAGE`, `srun --container-image=...` on SLURM):
the real vLLM CPU server started through a prefix script that records what it was asked to
run, then runs it. The trial measures through it and stops it like any server."""

from __future__ import annotations

import sys

import pytest

from orchestrator.config import to_specs
from orchestrator.trial import run_trial
from tests.conftest import engine_processes

pytestmark = pytest.mark.integration


def test_server_runs_behind_a_launch_prefix(compose, tmp_path, tiny_model_dir):
    record = tmp_path / "asked.txt"
    prefix = tmp_path / "container-exec"
    prefix.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$@" > {record}\nexec "$@"\n')
    prefix.chmod(0o755)
    spec, _ = to_specs(
        compose(
            [
                f"engine.launch_prefix=[{prefix}]",
                f"engine.python={sys.executable}",
                "workload.classes={main:{input_tokens:64,output_tokens:8}}",
                "workload.load_points=[{concurrency:2}]",
                "workload.num_requests=4",
                "engine.max_model_len=256",
            ]
        )
    )
    result = run_trial(spec, tmp_path / "trial", ["test"], progress=lambda _: None)
    assert result.status == "FINISHED", result.error
    assert result.points[0].metrics["completed"] == 4
    asked = record.read_text().splitlines()
    assert asked[:3] == [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert asked[asked.index("--model") + 1] == str(tiny_model_dir)
    assert not engine_processes()
