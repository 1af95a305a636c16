"""Which trials may share a server start: identical servers, differing only in workload."""

from __future__ import annotations

from orchestrator.config import to_specs
from orchestrator.scheduling.jobs import TrialJob
from orchestrator.scheduling.ray_exec import group_jobs
from orchestrator.trial import server_key


def _spec(compose, *overrides):
    return to_specs(compose(list(overrides)))[0]


def test_workload_and_seed_differences_share_a_server(compose):
    base = server_key(_spec(compose))
    assert base is not None
    assert server_key(_spec(compose, "workload=long_short")) == base
    assert server_key(_spec(compose, "seed=7", "workload.num_requests=3")) == base
    # the cache-reset flag does not change the server: a shared server always has the endpoint on
    assert server_key(_spec(compose, "engine.reset_cache_between_points=true")) == base
    # how the trial observes the server (telemetry, monitor, price) is not the server
    observed = ("platform.telemetry=false", "platform.telemetry_interval_s=0.2", "platform.price_per_hour=0.3")
    assert server_key(_spec(compose, *observed, "platform.monitor_interval_s=2")) == base


def test_server_differences_do_not(compose):
    base = server_key(_spec(compose))
    for o in (
        "engine.max_num_seqs=4",
        "engine.block_size=64",
        "engine.enable_prefix_caching=false",
        "engine.seed=3",
        "engine=sglang",
        "platform.server_nice=3",  # the servers' niceness is theirs
        "platform=gpu",
    ):
        assert server_key(_spec(compose, o)) != base, o


def test_unshareable_trials(compose):
    assert server_key(_spec(compose, "engine=sleep")) is None
    assert server_key(_spec(compose, "engine.restart_between_points=true")) is None


def test_group_jobs_keeps_order_and_groups_by_key(compose):
    spec, settings = to_specs(compose())
    jobs = [TrialJob(i, [], spec, settings) for i in range(5)]
    keys = {0: "a", 1: "b", 2: "a", 3: None, 4: "b"}
    units = group_jobs(jobs, lambda j: keys[j.index])
    assert [[j.index for j in u] for u in units] == [[0, 2], [1, 4], [3]]
    assert [[j.index for j in u] for u in group_jobs(jobs, None)] == [[0], [1], [2], [3], [4]]


def test_a_shared_server_that_died_between_trials_leaves_the_rest_to_their_own_servers(compose, tmp_path, monkeypatch):
    """The check before each later trial of a group (alive, cache emptied) finds the server dead:
    the trials left run on servers of their own, none fails for it."""
    from orchestrator.config.errors import ServerCrashedError
    from orchestrator.metrics.result import TrialResult
    from orchestrator.trial import group as group_mod
    from orchestrator.trial.run import TrialRun

    class DeadAfterFirst:
        def ready(self, how):
            raise ServerCrashedError("server died (exit code -9)")

    measured, alone = [], []
    monkeypatch.setattr(TrialRun, "start_shared", lambda self, stack: DeadAfterFirst())
    monkeypatch.setattr(TrialRun, "measure", lambda self, shared=None: measured.append(self.spec.seed))

    def own_server(spec, workdir, overrides, gpus, progress):
        alone.append(spec.seed)
        return TrialResult.model_construct(status="FINISHED")

    monkeypatch.setattr(group_mod, "run_trial", own_server)
    specs = [to_specs(compose([f"seed={i}"]))[0] for i in range(3)]
    lines: list[str] = []
    results = group_mod.run_trial_group([(s, tmp_path / str(s.seed), []) for s in specs], progress=lines.append)
    assert measured == [0] and alone == [1, 2] and len(results) == 3
    assert any("died between trials" in line for line in lines), lines
