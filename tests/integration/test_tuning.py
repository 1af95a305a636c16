"""The tuner on the real vLLM CPU server: from a baseline held to one request at a time, its first
step reads "limited by batch slots" from the diagnosis, races more slots beside it and adopts
them only on the race's word; its second step acts on the new incumbent's diagnosis (or says no
lever is left). Few requests: this checks the loop, not the lab's numbers
(benchmarks and docs/tuning.md measure the path)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = pytest.mark.integration


def test_two_tuning_steps_from_a_diagnosis(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "+experiment=continuous_batching",
        "engine.max_num_seqs=1,8",  # the space: the baseline's 1, one lever away from 8
        "hydra/sweeper=tune",
        "hydra.sweeper.max_steps=2",
        "+objective.max_repeats=2",
        "per_platform.cpu.workload.num_requests=12",
        # a point of 12 requests lasts ~5 s, at the default monitor budget: each point's first
        # scrapes keep the interval (a CI run had 2 gauge samples in it when they did not)
        "workload.classes.main.output_tokens=48",
        "workload.classes.main.output_tokens_choices=[16,48]",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = p.stdout
    assert p.returncode in (0, 4), out[-4000:] + p.stderr[-3000:]  # 4: a step's race undecided after its budget
    step1 = next(line for line in out.splitlines() if line.startswith("tune: step 1: baseline"))
    assert "batch slots" in step1 and "max_num_seqs=8" in step1, step1 + "\n" + (out + p.stderr)[-6000:]
    report = tmp_path / "multirun" / "report"
    path = json.loads((report / "tuning.json").read_text())
    first = path["steps"][0]
    assert first["tried"][0]["change"] == "max_num_seqs 1 -> 8"
    assert "batch_slots" in first["causes"]
    assert set(first["values"]) == {"baseline", "max_num_seqs=8"}
    if first["adopted"]:  # adopted only on the race's word: better, with its interval above 0
        assert first["adopted"] == "max_num_seqs=8" and first["adopted_knobs"] == {"engine.max_num_seqs": 8}
        mid, lo, hi = first["gain"]
        assert 0 < lo <= mid <= hi
        assert "adopted" in first["decision"]
    else:
        assert "the incumbent stays" in first["decision"] and first["adopted_knobs"] is None
    assert len(path["steps"]) == 2  # the second step: the new incumbent's levers, or none left
    assert (report / "tuning.png").stat().st_size > 10_000
    assert "## Tuning path" in (report / "summary.md").read_text()
    assert any(line.startswith("tune: Best: ") for line in out.splitlines())
    runs = search_runs(store, "continuous_batching")
    parent = next(r for r in runs if r.data.tags.get("run_kind") == "sweep")
    assert parent.data.tags["tune_path"].startswith("step 1: baseline")
    trials = [r for r in runs if r.data.tags.get("run_kind") in ("trial", "repeat")]  # a race's repeats too
    assert len(trials) == path["trials"]  # the baseline's first run, read back in step 1, counted once
    # the baseline's first run is step 1's (read back, not run twice); a second look at an undecided
    # step 1 continues that race with its requests, so it reads the first runs back too
    assert (
        sum(r.data.tags.get("run_kind") == "trial" and r.data.params.get("engine.max_num_seqs") == "1" for r in trials)
        == 1
    )
    looks = [t for s in path["steps"] for t in s["tried"] if t.get("second_look_of")]
    for t in looks:
        assert t["second_look_of"] == 1 and "continued to" in t["change"], t
    raced = [r.data.tags for r in trials if r.data.tags.get("tune_step") == "1"]
    assert {t["tune_role"] for t in raced} == {"incumbent", "candidate"}
    assert {t.get("tune_lever") for t in raced if t["tune_role"] == "candidate"} == {first["tried"][0]["lever"]}
    assert all(t["tune_decision"] == first["decision"] for t in raced)
    assert not engine_processes()
    # the same command again: every trial read back from MLflow, nothing measured, the same path
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == p.returncode, again.stdout[-3000:] + again.stderr[-3000:]
    assert "server healthy" not in again.stdout + again.stderr
    best = [line for line in out.splitlines() if line.startswith("tune: Best: ")]
    assert best == [line for line in again.stdout.splitlines() if line.startswith("tune: Best: ")]
    assert len([r for r in search_runs(store, "continuous_batching") if r.data.tags.get("run_kind") != "sweep"]) == len(
        trials
    )
