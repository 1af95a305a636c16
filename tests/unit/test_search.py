"""hydra/sweeper=optuna end to end on the fake server: ask/tell, infeasible and repeated trials, resume."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest

from testkit.fake_openai_server import FakeOpenAIServer, Script
from tests.conftest import ROOT

pytestmark = pytest.mark.measures


def search(tmp_path, url, *extra, n_trials=3, objective="{maximize:tokens_per_second}"):
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=external",
        f"engine.url={url}",
        "engine.metrics=none",
        "hydra/sweeper=optuna",
        f"hydra.sweeper.n_trials={n_trials}",
        # in a folder not made yet: the search makes it, as MLflow does its store's (a raw
        # "unable to open database file" traceback before)
        f"hydra.sweeper.storage=sqlite:///{tmp_path}/studies/optuna.db",
        "hydra.sweeper.study_name=s",
        "workload.load_points=[{concurrency:2}]",
        "workload.num_requests=4",
        "workload.warmup_requests=0,1",
        f"objective={objective}",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.sweep.dir={tmp_path}/multirun",
        *extra,
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_search_tells_every_trial_feeds_back_repeats_and_resumes(tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        out = search(tmp_path, srv.base_url)
        # 2 choices, 3 trials: one configuration was asked twice and read back, not re-measured
        assert "searching workload.warmup_requests (2) for maximize tokens_per_second" in out
        assert out.count("optuna: trial ") == 3 and "optuna: best trial" in out
        assert "already FINISHED" in out
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/optuna.db")
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
        # a search cut short: a trial asked and never told is asked again first, then the study goes on
        study.ask({"workload.warmup_requests": optuna.distributions.CategoricalDistribution(["0", "1"])})
        out = search(tmp_path, srv.base_url, n_trials=5)
        assert "3 of 5 trial(s) done, 1 interrupted one(s) asked again" in out
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/optuna.db")
    assert [t.state.name for t in study.trials].count("COMPLETE") == 5


def test_search_reports_constraint_misses_as_failed(tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        out = search(
            tmp_path, srv.base_url, n_trials=2, objective="{maximize:tokens_per_second,subject_to:{ttft_ms_p50:1}}"
        )
    assert "not counted (ttft_ms_p50" in out and "no trial met the objective's constraints" in out


def test_two_objective_search_ends_with_the_pareto_set(tmp_path, tiny_model_dir):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        out = search(
            tmp_path,
            srv.base_url,
            "hydra.sweeper.multi_objective=true",
            "hydra.sweeper.sampler=nsga2",
            n_trials=2,
            objective="{maximize:tokens_per_second,frontier:{maximize:tokens_per_second,minimize:ttft_ms_p50}}",
        )
    assert "for maximize tokens_per_second, minimize ttft_ms_p50" in out
    assert "optuna: Pareto trial" in out


def test_search_needs_choices_and_an_objective(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "hydra/sweeper=optuna", "engine.block_size=32", "-m"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and "nothing to search" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "hydra/sweeper=optuna", "engine.block_size=32,64", "-m"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and "needs an objective" in p.stderr


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_dry_run_reads_the_study_and_writes_nothing(tmp_path, tiny_model_dir):
    # its trials, told DRY_RUN to the stored study, counted as done: the real search after it ran none
    db = tmp_path / "studies" / "optuna.db"
    out = search(tmp_path, "http://127.0.0.1:9", "dry_run=true", n_trials=2)
    assert "(dry run: read, not written): 0 of 2 trial(s) done" in out and "planned (dry run)" in out
    assert not db.exists() and not db.parent.exists()  # a store not made yet is not made by a plan
    db.parent.mkdir()
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}", direction="maximize")
    study.tell(study.ask({"workload.warmup_requests": optuna.distributions.CategoricalDistribution(["0", "1"])}), 1.0)
    before = db.read_bytes()
    out = search(tmp_path, "http://127.0.0.1:9", "dry_run=true", n_trials=2)
    assert "1 of 2 trial(s) done" in out and out.count("planned (dry run)") == 1, out
    assert db.read_bytes() == before


def test_the_batches_of_a_search_share_one_ray_stopped_at_the_end_on_every_path():
    import ray

    from orchestrator.config.schema import ClusterSpec
    from orchestrator.scheduling.ray_exec import init_ray, ray_kept_between_sweeps

    assert not ray.is_initialized()
    with pytest.raises(KeyboardInterrupt), ray_kept_between_sweeps():
        first = init_ray(ClusterSpec(num_cpus=1))
        first.shutdown()  # the first batch's sweep ends
        assert ray.is_initialized() and first.started_here
        second = init_ray(ClusterSpec(num_cpus=1))  # the next batch finds it up
        assert not second.started_here
        second.shutdown()
        assert ray.is_initialized()
        raise KeyboardInterrupt  # Ctrl-C in a batch
    assert not ray.is_initialized()
