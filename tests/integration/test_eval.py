"""Accuracy on the real vLLM CPU server: a tiny sweep of the tiny model trained here on
2-digit addition, scored by lm-eval on 100 held-out problems from the server's own answers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def test_each_trial_run_has_accuracy_scored_from_the_servers_answers(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "orchestrator", "model=tiny_adder", "eval=addition", "engine.max_num_seqs=4,8",
           "engine.max_model_len=512", "workload.classes={main:{input_tokens:32,output_tokens:8}}",
           "workload.load_points=[{concurrency:2}]", "workload.num_requests=4",
           f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path}/multirun", "-m"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 FINISHED" in p.stdout and "evaluating accuracy: lm-eval addition" in p.stdout, p.stdout[-3000:]
    trials = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]
    assert len(trials) == 2
    for t in trials:
        m = t.data.metrics
        # chance is ~1/100 for a 2-3 digit answer; the trained model gets most right
        assert m["accuracy"] >= 0.5, m["accuracy"]
        assert 0 < m["accuracy_stderr"] < 0.1 and m["eval_addition_exact_match"] == m["accuracy"]
    # the score comes from the server's real answers: lm-eval's per-question samples
    samples = list((tmp_path / "multirun").glob("trials/*/eval/**/samples_addition_*.jsonl"))
    assert len(samples) == 2
    rows = [json.loads(line) for line in samples[0].read_text().splitlines()]
    assert len(rows) == 100
    right = [r for r in rows if r["exact_match"] == 1.0]
    assert right and all(r["filtered_resps"][0].strip() == r["target"] for r in right)
    assert not engine_processes()
