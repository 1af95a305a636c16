"""Bad inputs through the real CLI: each fails before any server starts (or Ray), with a
message naming the key or file and what was expected."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(300)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def malformed(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}, {oops')
    return path


CASES = {
    "unknown experiment": (["+experiment=no_such_lab"], r"no_such_lab"),
    "missing dataset": (
        ["workload=sharegpt", "workload.classes.main.path=/nonexistent/sg.json"],
        r"workload.classes.main.path.*/nonexistent/sg.json",
    ),
    "negative rate": (["workload.load_points=[{rate:-2}]"], r"workload.load_points.0.rate"),
    "empty sweep value": (["engine.max_num_seqs="], r"engine.max_num_seqs.*valid integer"),
    "empty variant list": (["+experiment=chunked_prefill", "sweeps.cpu=''"], r"variant: unknown value ''.*budget_256"),
    "tokens beyond the context": (
        ["workload.classes.main.output_tokens=9000", "engine.max_model_len=2048"],
        r"needs up to \d+ tokens per request.*context is 2048",
    ),
    "model path missing": (["model.source=path", "model.path=/no/such/model"], r"model.path.*/no/such/model"),
    "api key variable unset": (
        ["engine.api_key_env=NO_SUCH_VARIABLE_SET"],
        r"engine.api_key_env.*NO_SUCH_VARIABLE_SET",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_before_launch(case):
    args, pattern = CASES[case]
    p = run(*args, "-m")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    import re

    assert re.search(pattern, out, re.S), f"{case}: {out[-2000:]}"
    assert "starting vllm" not in out and "sweep '" not in out, "nothing may start"


def test_malformed_dataset_file(malformed):
    p = run("workload=sharegpt", f"workload.classes.main.path={malformed}", "-m")
    out = p.stdout + p.stderr
    assert p.returncode != 0 and str(malformed) in out and "starting vllm" not in out, out[-2000:]
