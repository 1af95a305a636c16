"""One sweep across two Ray nodes on this machine (Ray's own multi-node test cluster: a head
and a second raylet), driven by `python -m orchestrator ... cluster.address=...`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_sweep_runs_on_both_nodes(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    try:
        cluster.add_node(num_cpus=1, num_gpus=0)
        cluster.wait_for_nodes()
        cmd = [sys.executable, "-m", "orchestrator", "engine=sleep", "engine.seconds=3", "seed=0,1,2,3",
               "platform=gpu", "platform.cpus_per_trial=1", f"cluster.address={cluster.address}",
               f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.sweep.dir={tmp_path}/multirun", "-m"]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "4 FINISHED" in p.stdout
        results = [json.loads(f.read_text()) for f in (tmp_path / "multirun").glob("trials/*/result.json")]
        assert len(results) == 4 and all(r["status"] == "FINISHED" for r in results)
        nodes = {r["hardware"]["ray_node_id"] for r in results}
        assert len(nodes) == 2, "the sweep should use both nodes"
    finally:
        cluster.shutdown()
