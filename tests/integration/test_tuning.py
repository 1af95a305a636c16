"""The tuner on the real vLLM CPU server. The baseline serves prompts that share 1024-token prefixes
with its prefix cache off, one request at a time, 4 batch slots; the space lets both prefix caching
and the batch slots move, and a step tries one candidate. The diagnosis says prefix reuse was
missed; the lever table lists batch slots first, so a tuner that took the table's first lever would
race more batch slots. This one races prefix caching, the limiter's lever, and adopts it on the
race's word (TTFT p50 falls many times over, far outside the noise): exit status 0.

The first command measures afresh (``resume=false``): the baseline's run that was diagnosed is
still step 1's first run, read back, not measured twice. The same command again (resume) reads
every run back and measures nothing. Few requests: this checks the loop, not the lab's numbers
(benchmarks/tune.py and docs/runs/benchmarks.md measure the path)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.scheduling import outcome
from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = pytest.mark.integration


def test_the_tuner_takes_the_limiters_lever_and_adopts_it_on_the_races_word(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "+experiment=prefix_caching",
        "variant=apc_off_prefix_1024",
        # the space: prefix caching (the baseline's off) and the batch slots (the baseline's 4)
        "engine.enable_prefix_caching=false,true",
        "engine.max_num_seqs=4,8",
        "hydra/sweeper=tune",
        "hydra.sweeper.max_steps=1",
        "hydra.sweeper.candidates=1",
        "~objective",
        "+objective={minimize: ttft_ms_p50, max_repeats: 2}",
        "per_platform.cpu.workload.load_points=[{concurrency:1}]",  # no request waits: no slot is short
        "per_platform.cpu.workload.num_requests=8",
        "workload.classes.main.num_groups=2",  # 6 of 8 prompts could reuse their group's prefix
        "workload.classes.main.output_tokens=16",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run([*cmd, "resume=false"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out, said = p.stdout, (p.stdout + p.stderr)[-6000:]
    assert p.returncode == outcome.OK, said  # adopted, the race decided: neither a failure nor undecided
    step1 = next(line for line in out.splitlines() if line.startswith("tune: step 1: baseline limited by"))
    assert (
        "limited by prefix reuse missed" in step1 and "-> trying prefix caching (enable_prefix_caching=true)" in step1
    )
    report = tmp_path / "multirun" / "report"
    path = json.loads((report / "tuning.json").read_text())
    (first,) = path["steps"]
    assert first["causes"][0] == "prefix_reuse_missed"
    assert first["tried"] == [
        {
            "cause": "prefix_reuse_missed",
            "lever": "prefix caching",
            "name": "enable_prefix_caching=true",
            "change": "enable_prefix_caching false -> true",
        }
    ]
    # adopted on the race's word: better, with its whole interval below the incumbent's TTFT
    assert first["adopted"] == "enable_prefix_caching=true", first["decision"]
    assert first["adopted_knobs"] == {"engine.enable_prefix_caching": True}
    mid, lo, hi = first["gain"]
    assert -1 < lo <= mid <= hi < 0 and first["decision"].startswith("enable_prefix_caching=true adopted: ttft_ms_p50")
    assert set(first["values"]) == {"baseline", "enable_prefix_caching=true"}
    assert path["best"] == {"name": "enable_prefix_caching=true", "knobs": {"engine.enable_prefix_caching": True}}
    assert (report / "tuning.png").stat().st_size > 10_000
    assert "## Tuning path" in (report / "summary.md").read_text()
    runs = search_runs(store, "prefix_caching")
    parent = next(r for r in runs if r.data.tags.get("run_kind") == "sweep")
    assert parent.data.tags["tune_path"].startswith("step 1: baseline limited by prefix reuse missed")
    assert parent.data.tags["tune_best"] == "enable_prefix_caching=true"
    trials = [r for r in runs if r.data.tags.get("run_kind") in ("trial", "repeat")]  # a race's repeats too
    assert len(trials) == path["trials"] == 4  # two runs each; the baseline's first run counted once
    # resume=false: the run step 1 diagnosed is read back as its first, not measured twice
    first_runs = [r for r in trials if r.data.tags.get("run_kind") == "trial"]
    assert sorted(r.data.params["engine.enable_prefix_caching"] for r in first_runs) == ["False", "True"]
    assert "measured earlier in this sweep" in out
    raced = [r.data.tags for r in trials if r.data.tags.get("tune_step") == "1"]
    assert {t["tune_role"] for t in raced} == {"incumbent", "candidate"}
    assert {(t.get("tune_cause"), t.get("tune_lever")) for t in raced if t["tune_role"] == "candidate"} == {
        ("prefix_reuse_missed", "prefix caching")
    }
    assert all(t["tune_decision"] == first["decision"] for t in raced)
    assert not engine_processes()
    # the same command again: every trial read back from MLflow, nothing measured, the same path
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == outcome.OK, again.stdout[-3000:] + again.stderr[-3000:]
    assert "server healthy" not in again.stdout + again.stderr
    best = [line for line in out.splitlines() if line.startswith("tune: Best: ")]
    assert best and best == [line for line in again.stdout.splitlines() if line.startswith("tune: Best: ")]
    assert len([r for r in search_runs(store, "prefix_caching") if r.data.tags.get("run_kind") != "sweep"]) == 4
