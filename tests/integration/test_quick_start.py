"""The way to a sweep's first request (benchmarks/quick_start measures it): what waits for MLflow."""

from __future__ import annotations

import time

import pytest

from testkit.fake_openai_server import FakeOpenAIServer, Script
from tests.conftest import search_runs

pytestmark = pytest.mark.measures


@pytest.mark.parametrize("resume", [False, True])
def test_only_resume_makes_the_first_trial_wait_for_mlflow(compose, tmp_path, monkeypatch, tiny_model_dir, resume):
    """resume=false: nothing is asked of MLflow before the trials start, so the first request
    goes out while the store is still opening (here: held open until a request arrives), and the
    sweep's run and the trial's still land in MLflow. resume=true: MLflow says which trials are
    FINISHED before any starts."""
    from orchestrator.config.convert import config_to_dict
    from orchestrator.scheduling import prepare_jobs, run_sweep, sweep_start

    opened = sweep_start._open_tracker
    seen: dict[str, bool] = {}
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:

        def slow_open(*args):
            deadline = time.monotonic() + (3.0 if resume else 120.0)
            while not srv.truth.arrivals and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["request_before_mlflow"] = bool(srv.truth.arrivals)
            return opened(*args)

        monkeypatch.setattr(sweep_start, "_open_tracker", slow_open)
        cfg = compose(
            [
                "engine=external",
                f"engine.url={srv.base_url}",
                "engine.metrics=none",
                f"model.tokenizer={tiny_model_dir}",
                "workload.load_points=[{concurrency:1}]",
                "workload.num_requests=2",
                "workload.warmup_requests=0",
                "platform.telemetry=false",
                f"resume={str(resume).lower()}",
                f"tracking.uri={store}",
            ]
        )
        results = run_sweep(prepare_jobs([([], config_to_dict(cfg))]), tmp_path / "sweep", "s")
    assert [r.status for r in results] == ["FINISHED"]
    assert seen["request_before_mlflow"] is not resume
    runs = search_runs(store, cfg.experiment)
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}  # the sweep's and the trial's
