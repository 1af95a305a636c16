"""One sweep across two Ray nodes on this machine (Ray's own multi-node test cluster: a head
and a second raylet), driven by `python -m orchestrator ... cluster.address=...`."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_sweep_runs_on_both_nodes(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    try:
        cluster.add_node(num_cpus=1, num_gpus=0)
        cluster.wait_for_nodes()
        cmd = [
            sys.executable,
            "-m",
            "orchestrator",
            "engine=sleep",
            "engine.seconds=3",
            "seed=0,1,2,3",
            "platform=gpu",
            "platform.cpus_per_trial=1",
            f"cluster.address={cluster.address}",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.sweep.dir={tmp_path}/multirun",
            "-m",
        ]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "4 FINISHED" in p.stdout
        results = [json.loads(f.read_text()) for f in (tmp_path / "multirun").glob("trials/*/result.json")]
        assert len(results) == 4 and all(r["status"] == "FINISHED" for r in results)
        nodes = {r["hardware"]["ray_node_id"] for r in results}
        assert len(nodes) == 2, "the sweep should use both nodes"
    finally:
        cluster.shutdown()


def test_a_trial_on_a_dead_node_is_run_again_on_another(tmp_path):
    """The node running a trial dies (its raylet is killed): the driver runs the trial again on
    the surviving node and records both attempts, in result.json and on the MLflow run."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    from tests.conftest import search_runs

    # The head offers no CPUs, so trials land on the two worker nodes, which can be killed.
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0})
    proc = None
    try:
        workers = [cluster.add_node(num_cpus=1, num_gpus=0) for _ in range(2)]
        cluster.wait_for_nodes()
        store = f"sqlite:///{tmp_path}/mlflow.db"
        cmd = [
            sys.executable,
            "-m",
            "orchestrator",
            "engine=sleep",
            "engine.seconds=8",
            "platform=gpu",
            "platform.cpus_per_trial=1",
            f"cluster.address={cluster.address}",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path}/multirun",
            "-m",
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        notes = []
        while not notes and time.monotonic() < deadline:
            notes = list((tmp_path / "multirun").glob("trials/*/attempts.jsonl"))
            time.sleep(0.5)
        assert notes, "the trial never started"
        node_id = json.loads(notes[0].read_text().splitlines()[0])["node_id"]
        ids = {n.node_id: n for n in workers}
        assert node_id in ids, (node_id, list(ids), cluster.head_node.node_id)
        victim = ids[node_id]
        cluster.remove_node(victim, allow_graceful=False)
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-4000:]
        assert "attempt 1 lost" in out and "1 FINISHED" in out, out[-4000:]
        result = json.loads(next((tmp_path / "multirun").glob("trials/*/result.json")).read_text())
        assert result["status"] == "FINISHED"
        first, second = result["attempts"]
        assert first["outcome"] == "LOST" and first["node_id"] == node_id
        assert second["outcome"] == "FINISHED" and second["node_id"] != node_id
        assert result["hardware"]["ray_node_id"] == second["node_id"]
        (run,) = [r for r in search_runs(store, "default") if r.data.tags.get("run_kind") == "trial"]
        assert run.data.metrics["attempts"] == 2 and node_id[:12] in run.data.tags["lost_attempts"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.shutdown()
