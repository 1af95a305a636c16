"""The whole product: `python -m orchestrator ... -m` on local Ray, real vLLM, a real sqlite MLflow."""

from __future__ import annotations

import subprocess
import sys

import mlflow
import pytest

from tests.conftest import ROOT, engine_processes, search_runs

pytestmark = pytest.mark.integration


@pytest.mark.long  # in CI another way: CLI sweeps on real vLLM (test_cpu_gpu_paths.py), a skipped
# trial's reasons logged (test_a_lab_whose_every_trial_is_skipped_...), the CPU block-size refusal (unit/test_engine_adapters.py)
def test_sweep_logs_finished_and_skipped_trials(tmp_path):
    """Block size 16 is known to be refused by the CPU attention backend: SKIPPED before launch."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine.block_size=16,32",
        "workload.classes={main:{input_tokens:64,output_tokens:16}}",
        "workload.load_points=[{concurrency:2}]",
        "workload.num_requests=6",
        "engine.max_model_len=512",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[2/2]" in p.stdout and "1 FINISHED, 1 SKIPPED" in p.stdout

    runs = search_runs(store, "default")
    parents = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("run_kind") == "trial"]
    assert len(parents) == 1 and len(children) == 2
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    by_block = {c.data.params["engine.block_size"]: c for c in children}
    ok, bad = by_block["32"], by_block["16"]
    assert ok.info.status == "FINISHED"
    for key in (
        "ttft_ms_p50",
        "ttft_ms_p99",
        "tpot_ms_mean",
        "itl_ms_p90",
        "e2e_ms_p95",
        "qps",
        "tokens_per_second",
        "total_tokens_per_second",
        "memory_peak_gb",
        "startup_s",
    ):
        assert key in ok.data.metrics, key
    for tag in ("trial_hash", "engine_version", "hardware", "git_commit"):
        assert ok.data.tags.get(tag), tag
    client = mlflow.tracking.MlflowClient(store)
    local = client.download_artifacts(ok.info.run_id, "records.parquet", str(tmp_path))
    import pyarrow.parquet as pq

    assert pq.read_table(local).num_rows == 6
    assert bad.data.tags["trial_status"] == "SKIPPED"
    assert "multiple of 32" in bad.data.tags["error"]
    assert not engine_processes()

    # Resume: the same finished trial again starts no server and logs no run.
    again = [c for c in cmd if not c.startswith("engine.block_size") and c != "-m"] + ["engine.block_size=32", "-m"]
    p = subprocess.run(again, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "already FINISHED" in p.stdout and "nothing to run" in p.stdout
    assert "starting vllm" not in p.stdout
    assert len(search_runs(store, "default")) == len(runs)


@pytest.mark.long  # in CI another way: the tie and its resume through real sweeps on fake servers
# (unit/test_race.py), which configurations share a start (unit/test_server_reuse.py)
def test_two_names_for_one_configuration_share_server_starts_and_race_to_no_winner(tmp_path):
    """A request timeout of 300 or 301 s, which no request comes near, cannot matter: two trials
    measured alike, whose servers are the same, so they share one start per round. The race runs
    both trials twice (real vLLM, fresh requests each round) and must not name a winner. (Which
    configurations share a start is unit-tested: tests/unit/test_server_reuse.py.)"""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "workload.request_timeout_s=300,301",
        "workload.num_requests=8",
        "workload.classes={main:{input_tokens:64,output_tokens:16}}",
        "workload.load_points=[{concurrency:2}]",
        "engine.max_model_len=512",
        "engine.max_num_seqs=4",
        # 99%: a false winner between two trials measured alike stays under 1% (this test must not flake)
        "+objective={maximize:tokens_per_second,max_repeats:2,budget:10,confidence:0.99}",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = p.stdout
    assert p.returncode in (0, 4), out[-3000:] + p.stderr[-3000:]  # 4: undecided, said in the exit status
    assert "2 FINISHED" in out and "2 repeat FINISHED" in out, out[-3000:]
    # one start per round: the first pass's and the repeats'
    assert out.count("starting vllm") == 2, out[-5000:]
    assert out.count("(server start saved)") == 2
    verdict = next(line for line in out.splitlines() if line.startswith("Verdict:"))
    assert " wins" not in verdict and "2 runs each" in verdict, verdict
    trials = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]
    assert len(trials) == 2 and all(t.info.status == "FINISHED" for t in trials)
    starts = sorted((t.data.metrics["server_starts"], t.data.metrics["server_reused"]) for t in trials)
    assert starts == [(0.0, 1.0), (1.0, 0.0)], starts  # one trial started the server, the other reused it
    repeats = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "repeat"]
    assert len(repeats) == 2 and {r.data.tags["race_run"] for r in repeats} == {"1"}
    assert not engine_processes()


def test_a_lab_whose_every_trial_is_skipped_still_says_why_each_claim_is_not_measurable(tmp_path):
    """The MoE lab needs GPUs: nothing runs on this machine, and the console says so claim by claim."""
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "+experiment=moe",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Expectations: 0 observed, 0 not observed, 1 not measurable here (of 1)" in p.stdout
    assert "[not measurable here] Mixtral-8x7B has 46.7B total parameters" in p.stdout
