"""MLflow logging into a real sqlite store: parent/child runs, stepped metrics, artifacts, status."""

from __future__ import annotations

import time

import mlflow
import pytest

from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult, TrialResult, load_result, save_result
from orchestrator.tracking import MlflowTracker
from tests.conftest import search_runs


def result(status="FINISHED", error=None, variant="v1"):
    recs = [RequestRecord(i, 0, "a", 0.0, 0.0, 8, 4, [0.1, 0.2], [1, 1], 0.2, 8, 2) for i in range(3)]
    now = time.time()
    return TrialResult(
        trial_hash="abc123",
        experiment="exp",
        variant=variant,
        overrides=[f"variant={variant}"],
        spec={
            "engine": {"name": "vllm", "max_num_batched_tokens": 256, "env": {"HF_TOKEN": "hf_secretsecret"}},
            "model": {"name": "tiny"},
            "platform": {"name": "cpu"},
            "workload": {"name": "w"},
            "seed": 0,
        },
        status=status,
        error=error,
        started_at=now - 5,
        ended_at=now,
        engine_version="vllm==0",
        hardware={"summary": "cpu:2x test"},
        slate={"checked": True, "waited_s": 1.5, "cpu_mem_used_gb": 3.2, "cpu_mem_baseline_gb": 3.0},
        points=[
            PointResult(
                index=i,
                label=f"c{i + 1}",
                setting={"concurrency": i + 1},
                metrics={"ttft_ms_p50": 10.0 * (i + 1), "qps": 1.0 + i},
            )
            for i in range(2)
        ],
        metrics={"startup_s": 30.0},
        records_parquet=records_to_parquet_bytes(recs),
        server_log="log line\n",
    )


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_parent_and_children(tmp_path, store):
    tracker = MlflowTracker(store, "exp")
    parent = tracker.start_sweep("sweep1", {"num_trials": 2}, {"git_commit": "x"})
    ok_dir = save_result(result(), tmp_path / "t0")
    fail = result("FAILED", "ServerStartError: boom\nlast log lines", "v2")
    fail_dir = save_result(fail, tmp_path / "t1")
    run_ok = tracker.log_trial(load_result(ok_dir), ok_dir)
    run_fail = tracker.log_trial(load_result(fail_dir), fail_dir)
    tracker.end_sweep({"FINISHED": 1, "FAILED": 1})

    client = mlflow.tracking.MlflowClient(store)
    runs = search_runs(store, "exp")
    assert len(runs) == 3
    ok = client.get_run(run_ok)
    assert ok.info.status == "FINISHED"
    assert ok.data.tags["mlflow.parentRunId"] == parent
    assert ok.data.tags["trial_hash"] == "abc123"
    assert ok.data.params["engine.max_num_batched_tokens"] == "256"
    assert ok.data.params["engine.env.HF_TOKEN"] == "***"
    assert ok.data.metrics["ttft_ms_p50"] == 20.0  # latest step
    history = client.get_metric_history(run_ok, "ttft_ms_p50")
    assert sorted((m.step, m.value) for m in history) == [(0, 10.0), (1, 20.0)]
    assert ok.data.metrics["c1/ttft_ms_p50"] == 10.0
    # the clean slate the server started on: how long it waited, the memory and its baseline
    assert {k: v for k, v in ok.data.metrics.items() if k.startswith("slate_")} == {
        "slate_waited_s": 1.5,
        "slate_cpu_mem_used_gb": 3.2,
        "slate_cpu_mem_baseline_gb": 3.0,
    }
    artifacts = {a.path for a in client.list_artifacts(run_ok)}
    assert {"records.parquet", "server.log", "points.csv", "trial_config.json", "result.json"} <= artifacts
    bad = client.get_run(run_fail)
    assert bad.info.status == "FAILED"
    assert "boom" in bad.data.tags["error"]
    assert client.get_run(parent).data.metrics["trials_failed"] == 1.0


def test_save_and_load_roundtrip(tmp_path):
    r = result()
    assert load_result(save_result(r, tmp_path / "x")) == r


def test_artifacts_next_to_sqlite_db(tmp_path, store):
    tracker = MlflowTracker(store, "exp2")
    exp = tracker.client.get_experiment(tracker.experiment_id)
    assert exp.artifact_location.startswith((tmp_path / "mlartifacts").as_uri())


def test_finished_trials_for_resume_and_plans(tmp_path, store):
    tracker = MlflowTracker(store, "exp")
    ok_dir = save_result(result(), tmp_path / "t0")
    tracker.log_trial(load_result(ok_dir), ok_dir)
    failed = result("FAILED", "boom").model_copy(update={"trial_hash": "def456"})
    fail_dir = save_result(failed, tmp_path / "t1")
    tracker.log_trial(load_result(fail_dir), fail_dir)
    assert set(tracker.finished_run_ids(["abc123", "def456", "nope"])) == {"abc123"}  # failed ones run again
    durations = tracker.finished_durations(["abc123", "def456"])
    assert list(durations) == ["abc123"] and durations["abc123"] == pytest.approx(5.0, abs=0.01)


def test_sync_logs_what_mlflow_lacks_once(tmp_path):
    """Results on disk, MLflow empty: sync logs them all under one sweep run; again: nothing."""
    import time as _time

    from orchestrator.metrics.result import TrialResult, save_result
    from orchestrator.scheduling.sync import sync

    sweep = tmp_path / "sweep"
    for i in range(3):
        now = _time.time() + i
        r = TrialResult(
            trial_hash=f"{i:016d}", experiment="exp", spec={}, status="FINISHED", started_at=now, ended_at=now + 1
        )
        save_result(r, sweep / "trials" / f"{i:03d}-{r.trial_hash}")
    uri = f"sqlite:///{tmp_path}/m.db"
    lines: list[str] = []
    assert sync(sweep, uri, progress=lines.append) == (3, 0)
    assert sync(sweep, uri, progress=lines.append) == (0, 3)
    from tests.conftest import search_runs

    runs = search_runs(uri, "exp")
    trials = [r for r in runs if r.data.tags.get("run_kind") == "trial"]
    sweeps = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
    assert len(trials) == 3 and len(sweeps) == 1
    assert sweeps[0].data.tags["sweep_dir"] == str(sweep)
    assert all(t.data.tags["mlflow.parentRunId"] == sweeps[0].info.run_id for t in trials)


def test_experiments_open_on_the_runs_table(tmp_path):
    """MLflow 3's UI opens an experiment without a kind on its GenAI overview: ours say model
    development, also an experiment made before the tag existed."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    MlflowTracker(uri, "fresh")
    old = mlflow.tracking.MlflowClient(uri).create_experiment("older")
    MlflowTracker(uri, "older")
    client = mlflow.tracking.MlflowClient(uri)
    for name in ("fresh", "older"):
        assert client.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(old).name == "older"


def test_an_interrupt_before_mlflow_opens_leaves_no_sweep_run(tmp_path):
    """The sweep's parent run is made in the MLflow thread once the store is open; a Ctrl-C before
    then cancels it (no parent run left RUNNING), and a failure to make it costs only MLflow."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.scheduling.recorder import Recorder

    opening, made, lines = threading.Event(), [], []
    pool = ThreadPoolExecutor(1)
    pool.submit(opening.wait, 10)  # the store still opening
    record = Recorder(tmp_path, pool.submit(lambda: made.append(1)), "commit", 1, lines.append)
    assert record.tracker_if_open() is None and record.tracker is None
    opening.set()
    pool.shutdown(wait=True)
    assert made == [] and "results are on disk only" in lines[0]

    def fails():
        raise RuntimeError("store gone")

    with ThreadPoolExecutor(1) as pool:
        record = Recorder(tmp_path, pool.submit(fails), "commit", 1, lines.append)
        assert record.tracker is None and record.tracker is None
    assert lines[1:] == ["warning: no MLflow sweep run (store gone); results are kept on disk only"]


def test_server_answers_tells_a_listening_server_from_none_at_once(monkeypatch):
    """A dry run asks a tracking server for earlier durations only when it answers: MLflow's client
    retries an unreachable one for minutes. A store that is no server always 'answers', and so
    does one reached through a proxy (a direct connection tells nothing of it)."""
    import socket

    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)

    from orchestrator.tracking import server_answers

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert server_answers(f"http://127.0.0.1:{port}")
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        assert not server_answers(f"http://127.0.0.1:{closed.getsockname()[1]}", timeout_s=2.0)
    assert server_answers("sqlite:////nonexistent/mlflow.db")
    assert not server_answers("http://:badport")
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "")
    assert server_answers("http://mlflow.internal:5000")


def test_ui_command_serves_the_store_it_names():
    """The sweep's last lines say how to open its store's UI: the command names that store."""
    import shlex

    from orchestrator.tracking import ui_command

    argv = shlex.split(ui_command("sqlite:////tmp/my results/mlflow.db"))
    assert argv[0].endswith("mlflow") and argv[1:] == [
        "ui",
        "--backend-store-uri",
        "sqlite:////tmp/my results/mlflow.db",
        "--port",
        "5000",
    ]


def test_an_unreadable_points_csv_is_said_not_taken_for_no_points(tmp_path, caplog):
    """Reading a sweep back from MLflow: a trial run without points.csv has no points (skipped);
    one whose points.csv is there but cannot be parsed is named in a warning (the report had
    silently treated it as a trial that measured nothing)."""
    from types import SimpleNamespace

    from orchestrator.tracking.runs import _trial_of_run

    class Store:  # what the read-back asks of MLflow's client: one artifact by its path
        def __init__(self, text: str | None) -> None:
            self.text = text

        def download_artifacts(self, run_id: str, path: str, dest: str) -> str:
            if self.text is None or path != "points.csv":
                raise OSError(f"no artifact {path}")
            out = tmp_path / f"{run_id}-{path}"
            out.write_text(self.text)
            return str(out)

    run = SimpleNamespace(
        info=SimpleNamespace(run_id="r1", status="FINISHED"),
        data=SimpleNamespace(tags={"variant": "budget_256", "trial_hash": "abc"}, params={}, metrics={}),
    )
    with caplog.at_level("WARNING"):
        trial = _trial_of_run(Store("point,label,setting\nnot-a-number,c4,{}\n"), run, str(tmp_path))
    assert trial.points == []
    assert "trial run r1 (budget_256): its points.csv cannot be read (ValueError" in caplog.text
    caplog.clear()
    assert _trial_of_run(Store(None), run, str(tmp_path)).points == [] and caplog.text == ""


def test_a_later_batch_reads_back_only_its_own_sweeps_runs(tmp_path, store):
    """Finished runs by trial hash, of any sweep (resume) or of one sweep run (a later batch of the
    same sweep: a tuning's next step reads back what its earlier steps measured, not what an
    earlier command did); a race's repeat counts as its sweep's through its ``sweep_run_id``."""
    tracker = MlflowTracker(store, "exp")
    earlier = tracker.start_sweep("earlier command", {}, {})
    d = save_result(result(), tmp_path / "t0")
    old_run = tracker.log_trial(load_result(d), d)
    this = tracker.start_sweep("this command", {}, {})
    assert tracker.finished_run_ids(["abc123"]) == {"abc123": old_run}
    assert tracker.finished_run_ids(["abc123"], this) == {}  # measured by another command only
    assert set(tracker.finished_results(["abc123"])) == {"abc123"}
    assert tracker.finished_results(["abc123"], this) == {}
    again = tracker.log_trial(load_result(d), d)  # this sweep measures it too
    assert tracker.finished_run_ids(["abc123"], this) == {"abc123": again}
    assert tracker.finished_run_ids(["abc123"], earlier) == {"abc123": old_run}
    rep = result().model_copy(update={"trial_hash": "rep1", "repeat_of": "abc123"})
    rd = save_result(rep, tmp_path / "t1")
    tracker.log_trial(load_result(rd), rd, {"run_kind": "repeat", "sweep_run_id": this, "mlflow.parentRunId": again})
    assert set(tracker.finished_results(["rep1"], this)) == {"rep1"}
    assert tracker.finished_results(["rep1"], earlier) == {}
