"""Placement on fake GPUs: a local Ray with 4 logical GPUs runs TP and P/D trials through the
product's scheduler (``run_jobs``); a probe in place of the trial body records what each
server of each trial would get. Two trials running at once never share a GPU, and within a
trial each server gets its own slots of the trial's GPUs."""

from __future__ import annotations

import time

import pytest

from orchestrator.config import to_specs
from orchestrator.engines import LaunchContext

pytestmark = pytest.mark.timeout(300)


def probe_trial(spec_json: str, workdir: str, overrides: list[str]) -> dict:
    """Holds its GPUs until another probe runs beside it (a trial on fewer than the cluster's 4
    GPUs, while some probe has yet to finish; at most 30 s) and reports the servers' CUDA_VISIBLE_DEVICES, as the real trial would
    compute them (same adapter launches, same server_env). A fixed hold of 1.5 s once ran every
    probe alone in CI: each Ray worker took longer than that to start on a loaded machine."""
    import itertools
    from pathlib import Path

    import ray

    from orchestrator.config.schema import TrialSpec
    from orchestrator.engines import adapter_for
    from orchestrator.metrics.result import TrialResult
    from orchestrator.trial import describe_servers, server_env

    gpu_ids = [int(g) for g in ray.get_gpu_ids()]
    spec = TrialSpec.model_validate_json(spec_json)
    ports = itertools.count(20000)
    launches = adapter_for(spec.engine.name).launches(
        spec, LaunchContext("/models/x", 8000, lambda: next(ports), workdir)
    )
    servers = describe_servers(launches, gpu_ids)
    for s, launch in zip(servers, launches):
        s["env_cuda"] = server_env(launch, gpu_ids).get("CUDA_VISIBLE_DEVICES")
    t0 = time.time()
    mark = Path(f"{workdir}.running")  # beside the other probes' (their workdirs share a parent)
    expected = int((mark.parent / "probes.expected").read_text())
    mark.touch()
    try:
        while len(gpu_ids) < 4 and time.time() - t0 < 30:
            if any(m != mark for m in mark.parent.glob("*.running")):
                break  # another probe holds its GPUs now: the two overlap
            if len(list(mark.parent.glob("*.done"))) >= expected - 1:
                break  # every other probe has finished: none is left to meet
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        mark.unlink()
        Path(f"{workdir}.done").touch()
    return TrialResult(
        trial_hash="x" * 16,
        experiment=spec.experiment,
        variant=spec.variant,
        overrides=overrides,
        spec={},
        status="FINISHED",
        started_at=t0,
        ended_at=time.time(),
        servers=servers,
        hardware={"gpu_ids": gpu_ids},
    ).model_dump()


@pytest.fixture(scope="module")
def fake_gpu_ray():
    import ray

    # address="local": a Ray of its own, as the product starts one (a plain ray.init() joins a
    # cluster another test process started)
    ray.init(
        address="local", num_cpus=8, num_gpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False
    )
    yield ray
    ray.shutdown()


def test_tp_and_pd_trials_get_distinct_gpus(fake_gpu_ray, compose, tmp_path):
    from orchestrator.scheduling.jobs import TrialJob
    from orchestrator.scheduling.ray_exec import cluster_gpus, run_jobs

    assert cluster_gpus() == 4
    settings = None
    jobs = []
    cases = [
        ["engine.tensor_parallel_size=2"],
        ["engine.disaggregation={connector:NixlConnector,prefill_tp:1,decode_tp:1}"],
        ["engine.tensor_parallel_size=1"],
        ["engine=sglang", "engine.disaggregation={connector:mooncake,prefill_tp:1,decode_tp:2}"],
        ["engine.tensor_parallel_size=4"],
        ["engine.tensor_parallel_size=1", "seed=1"],
    ]
    for i, overrides in enumerate(cases):
        spec, settings = to_specs(compose(["platform=gpu", "platform.cpus_per_trial=1", *overrides]))
        jobs.append(TrialJob(i, overrides, spec, settings))
    (tmp_path / "probes.expected").write_text(str(len(jobs)))
    results = {job.index: r for job, r in run_jobs(jobs, lambda j: str(tmp_path / str(j.index)), None, probe_trial)}
    assert sorted(results) == list(range(len(cases)))
    for job in jobs:
        r = results[job.index]
        assert r.status == "FINISHED", r.error
        gpus = r.hardware["gpu_ids"]
        assert len(gpus) == job.spec.engine.num_gpus
        assert len(set(gpus)) == len(gpus)
        seen: list[int] = []
        for server in r.servers:
            mine = [int(g) for g in server["cuda_visible_devices"].split(",") if g]
            assert server["env_cuda"] == server["cuda_visible_devices"]
            assert set(mine) <= set(gpus)
            assert not set(mine) & set(seen), "two servers of one trial share a GPU"
            seen += mine
            if server["name"] in ("proxy", "router"):
                assert mine == []
        assert sorted(seen) == sorted(gpus), "every GPU of the trial goes to one of its servers"
    by_name = {s["name"]: s for s in results[1].servers}
    assert len(by_name["prefill"]["cuda_visible_devices"].split(",")) == 1
    assert len(results[3].servers[1]["cuda_visible_devices"].split(",")) == 2  # SGLang decode, TP 2
    # trials that ran at the same time never shared a GPU
    items = list(results.values())
    for a in items:
        for b in items:
            if a is b:
                continue
            overlap = a.started_at < b.ended_at and b.started_at < a.ended_at
            if overlap:
                assert not set(a.hardware["gpu_ids"]) & set(b.hardware["gpu_ids"])
    assert any(a.started_at < b.ended_at and b.started_at < a.ended_at for a in items for b in items if a is not b), (
        "the probe should have run some trials concurrently"
    )


def test_sleep_trials_of_mixed_sizes_never_share_a_gpu(fake_gpu_ray, compose, tmp_path):
    """The sleep trial kind through the real trial body: 1-, 2- and 4-GPU trials on 4 GPUs."""
    from orchestrator.scheduling.jobs import TrialJob
    from orchestrator.scheduling.ray_exec import run_jobs

    jobs = []
    for i, gpus in enumerate([1, 2, 4, 1, 2, 1, 1, 4, 2, 1]):
        overrides = [
            "engine=sleep",
            f"engine.gpus={gpus}",
            "engine.seconds=0.6",
            "platform=gpu",
            "platform.cpus_per_trial=0.5",
            f"seed={i}",
        ]
        spec, settings = to_specs(compose(overrides))
        jobs.append(TrialJob(i, overrides, spec, settings))
    results = [r for _, r in run_jobs(jobs, lambda j: str(tmp_path / str(j.index)), None)]
    assert len(results) == 10 and all(r.status == "FINISHED" for r in results), [r.error for r in results]
    for r in results:
        assert len(r.hardware["gpu_ids"]) == r.spec["engine"]["gpus"]
        assert r.metrics["held_s"] >= 0.6
    for a in results:
        for b in results:
            if a is not b and a.started_at < b.ended_at and b.started_at < a.ended_at:
                assert not set(a.hardware["gpu_ids"]) & set(b.hardware["gpu_ids"])
