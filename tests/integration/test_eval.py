"""Accuracy on the real vLLM CPU server: a tiny sweep of the tiny model trained here on
2-digit addition, scored by lm-eval on 100 held-out problems from the server's own answers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def test_each_trial_run_has_accuracy_scored_from_the_servers_answers(tmp_path):
    """Run as a newcomer does: from the project root, with the default (relative) sweep
    folder ``multirun/<experiment>/<time>``; lm-eval runs in the trial's own folder and must
    still find the task written there (issue 19)."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    name = f"test_eval_{os.getpid()}"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "model=tiny_adder",
        "eval=addition",
        "engine.max_num_seqs=4",  # one trial (the quantization lab's test scores three, each its own)
        "engine.max_model_len=512",
        "workload.classes={main:{input_tokens:32,output_tokens:8}}",
        "workload.load_points=[{concurrency:2}]",
        "workload.num_requests=4",
        f"tracking.experiment_name={name}",
        f"tracking.uri={store}",
        "-m",
    ]
    before = set((ROOT / "multirun" / "default").glob("*"))
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "1 FINISHED" in p.stdout and "evaluating accuracy: lm-eval addition" in p.stdout, p.stdout[-3000:]
        where = re.search(r"results in (\S+)", p.stdout)
        assert where, p.stdout[-3000:]
        sweep_dir = Path(where.group(1))
        assert sweep_dir.is_absolute() and sweep_dir.parent == ROOT / "multirun" / "default", sweep_dir
        trials = [r for r in search_runs(store, name) if r.data.tags.get("run_kind") == "trial"]
        assert len(trials) == 1
        for t in trials:
            m = t.data.metrics
            # chance is ~1/100 for a 2-3 digit answer; the trained model gets most right
            assert m["accuracy"] >= 0.5, m["accuracy"]
            assert 0 < m["accuracy_stderr"] < 0.1 and m["eval_addition_exact_match"] == m["accuracy"]
        # the score comes from the server's real answers: lm-eval's per-question samples
        samples = list(sweep_dir.glob("trials/*/eval/**/samples_addition_*.jsonl"))
        assert len(samples) == 1
        rows = [json.loads(line) for line in samples[0].read_text().splitlines()]
        assert len(rows) == 100
        right = [r for r in rows if r["exact_match"] == 1.0]
        assert right and all(r["filtered_resps"][0].strip() == r["target"] for r in right)
        assert not engine_processes()
    finally:  # only the sweep folders this test made
        for d in set((ROOT / "multirun" / "default").glob("*")) - before:
            shutil.rmtree(d, ignore_errors=True)
