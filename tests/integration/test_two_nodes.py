"""One sweep across two Ray nodes on this machine (Ray's own multi-node test cluster: a head
and a second raylet), driven by `python -m orchestrator ... cluster.address=...`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_trial_on_a_dead_node_is_run_again_on_another(tmp_path):
    """(First: a cluster of its own, whose node it kills.) The node running a trial dies (its raylet is killed): the driver runs the trial again on
    the surviving node and records both attempts, in result.json and on the MLflow run."""
    from ray import cluster_utils

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


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """One two-node Ray cluster on this machine (1 CPU each) for the module's tests, this process
    connected to it; its address."""
    import ray
    from ray import cluster_utils

    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    try:
        cluster.add_node(num_cpus=1, num_gpus=0)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_sweep_runs_on_both_nodes(two_nodes, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=sleep",
        "engine.seconds=3",
        "seed=0,1,2,3",
        "platform=gpu",
        "platform.cpus_per_trial=1",
        f"cluster.address={two_nodes}",
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


@pytest.mark.parametrize(
    ("nodes", "streams", "cores"),
    # asked for; auto: 256 streams need 2 client processes, 1 core here; one stream: one node sends
    [(2, 8, 1), ("auto", 256, 1), (2, 1, 1)],
    ids=["client_nodes=2", "client_nodes=auto", "fewer streams than nodes"],
)
def test_a_point_is_sent_from_two_nodes_on_one_clock(two_nodes, tiny_model_dir, nodes, streams, cores):
    """workload.client_nodes=2 on a two-node Ray cluster (both on this machine): the point's
    streams are dealt to this node and a shard on the other, which measures its clock's offset
    (here ~0, both being this machine's clock) and starts on the same instant; the records merge
    onto this node's clock and each matches the server's own truth."""
    import numpy as np

    from orchestrator.config.schema import WorkloadSpec
    from orchestrator.loadgen import Endpoint, run_each
    from orchestrator.loadgen.prompts import prompt_factory
    from testkit.fake_openai_server import IsolatedFakeServer, Script

    w = WorkloadSpec.model_validate(
        {
            "name": "nodes",
            "client_nodes": nodes,
            "warmup_requests": 1,
            "classes": {"a": {"input_tokens": 16, "output_tokens": 8}},
            "load_points": [{"concurrency": streams}],
            "num_requests": 4 * streams,
        }
    )
    with IsolatedFakeServer(Script(ttft_s=0.02, itl_s=0.01)) as srv:
        runs = run_each(Endpoint(srv.base_url, "m"), w, prompt_factory(str(tiny_model_dir)), 0, client_cores=cores)
        truth = srv.truth.by_request
    records, stats = [r for run in runs for r in run.records], {i: run.client for i, run in enumerate(runs)}
    assert len(records) == 4 * streams and all(r.ok for r in records)
    assert len({r.request_id for r in records}) == 4 * streams
    st = stats[0]
    used = 2.0 if streams > 1 else 1.0
    assert st["client_nodes"] == used and st["client_processes"] == used
    assert st["client_clock_offset_ms_max"] < 5.0 and st["client_clock_uncertainty_ms_max"] < 50.0
    # Every request, from either node, read each chunk after the server wrote it and soon after.
    for r in records:
        sent = truth[f"lab-{r.request_id}"]["chunks"]
        delays = np.array(r.chunk_times_s) - np.array(sent)
        assert delays.min() > -0.005 and delays.max() < 0.5
    assert max(r.sent_s for r in records) - min(r.sent_s for r in records) < 5.0


def test_shards_of_a_closed_loop_that_outruns_its_plan_get_more_requests(two_nodes, tiny_model_dir):
    """A duration-bounded closed loop on two nodes whose plan (32 requests a stream) runs out
    in a fraction of the duration: the shard on the other node takes further requests from the
    trial's pool, made by the trial's one planner; no stream ends early, ids stay unique."""

    from orchestrator.config.schema import WorkloadSpec
    from orchestrator.loadgen import Endpoint, run_each
    from orchestrator.loadgen.prompts import prompt_factory
    from testkit.fake_openai_server import IsolatedFakeServer, Script

    w = WorkloadSpec.model_validate(
        {
            "name": "nodes",
            "client_nodes": 2,
            "warmup_requests": 0,
            "classes": {"a": {"input_tokens": 8, "output_tokens": 1}},
            "load_points": [{"concurrency": 4, "duration_s": 3.0}],
        }
    )
    with IsolatedFakeServer(Script(ttft_s=0.001, itl_s=0.0)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, prompt_factory(str(tiny_model_dir)), 0, client_cores=1)
    records, stats = run.records, run.client
    planned = 32 * 4
    assert stats["client_requests_past_plan"] > 0, f"{len(records)} requests: the plan did not run out"
    assert len(records) == planned + stats["client_requests_past_plan"]
    assert all(r.ok for r in records)
    assert len({r.request_id for r in records}) == len(records)
    assert stats["client_nodes"] == 2 and stats["client_streams_ended_early"] == 0
    span = max(r.intended_send_s for r in records) - min(r.intended_send_s for r in records)
    assert span > 2.0, f"the last request was sent {span:.2f} s in: streams stopped early"
