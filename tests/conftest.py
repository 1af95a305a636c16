"""Shared fixtures: config composition, the tiny model, process-table checks; and the suite's two
rules of running: with ``CI`` set, a test that would skip fails instead, as does a module skipped
while collected and a test marked ``xfail`` (CI runs every test or says what it lacks), and a test
beside another (pytest-xdist's workers) must not measure a load point (mark it ``measures``: it
then runs alone)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.config.resolvers import register
from testkit.compose import compose_config

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENGINE_PATTERN = "vllm.entrypoints|VLLM::|sglang.launch_server"
# Every process this test run starts inherits this mark (servers, Ray workers, CLI subprocesses,
# and an orphan reparented to init still carries it): the leftover check counts only those, so a
# user's own `make demo` on the same machine neither fails the suite nor hides our leftovers.
RUN_MARK_VAR = "INFERENCE_LAB_TEST_RUN"
RUN_MARK = os.environ.setdefault(RUN_MARK_VAR, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")

register()
pytest_plugins = ["pytester"]  # tests/unit/test_ci_rules.py runs pytest inside a test


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, as CI services and ``.ci/run`` set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip is a failure naming what was missing: a test whose prerequisite CI lacks (not
    root, no slurm binaries, no chromium, a module `make install` should have installed) must not
    pass by not running; nor does a test marked to fail (``xfail``: fix it or remove it; an
    unexpected pass fails everywhere, ``xfail_strict`` in pyproject.toml). Outside CI the skip and
    the expected failure stay, with their reasons (``-ra`` lists them)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        if hasattr(report, "wasxfail"):
            report.outcome = "failed"
            report.longrepr = f"marked xfail, and CI runs no test that is expected to fail: {report.wasxfail}"
        else:
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, which must run it: {_reason(report)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """In CI a module skipped while it is collected (``pytest.importorskip``, ``pytest.skip(...,
    allow_module_level=True)``) is a collection error naming what was missing: its tests would
    otherwise vanish from the run without a line."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: skipped in CI while collected, which must run it: {_reason(report)}"


@pytest.fixture(autouse=True)
def _no_driver_left_named(monkeypatch):
    """A test that starts Ray in this process names it the sweep's driver in its environment
    (``scheduling.ray_exec.init_ray``): restored after it, so that a later test in the same
    process does not take its own children for a sweep's."""
    from orchestrator.metrics.census import DRIVER_ENV

    if DRIVER_ENV in os.environ:
        monkeypatch.setenv(DRIVER_ENV, os.environ[DRIVER_ENV])
    else:
        monkeypatch.delenv(DRIVER_ENV, raising=False)
    yield


def _beside_another() -> bool:
    """Whether this test runs beside another one (a pytest-xdist worker of several)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


@pytest.fixture(autouse=True)
def _measures_only_alone(request, monkeypatch):
    """A load point is judged by its census, which counts every other process's CPU as foreign:
    beside another test's it would be INVALID, or pass by chance. A test that measures one is
    marked ``measures`` (or ``integration``) and runs alone; one that is not marked and measures
    anyway fails here, where it runs beside another (in-process: the sender; through the CLI: the
    records it left in its folder)."""
    marked = request.node.get_closest_marker("measures") or request.node.get_closest_marker("integration")
    if marked or not _beside_another():
        yield
        return
    from orchestrator.loadgen.sender import PointSender

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{request.node.nodeid} sends a load point beside another test: mark it "
            "`pytest.mark.measures` so that it runs alone (tests/conftest.py)"
        )

    monkeypatch.setattr(PointSender, "run", refuse)
    yield
    folder = request.node.funcargs.get("tmp_path")
    measured = [p for p in folder.rglob("result.json") if _measured(p)] if folder is not None else []
    assert not measured, (
        f"{request.node.nodeid} measured a load point beside another test ({measured[0]}): mark it "
        "`pytest.mark.measures` so that it runs alone (tests/conftest.py)"
    )


def _measured(result_json: Path) -> bool:
    """Whether a trial's result.json holds a point that was measured (its census ran: only a real
    point has one, a result a test makes up has none)."""
    import json

    from orchestrator.config.metric_keys import M

    try:
        points = json.loads(result_json.read_text()).get("points") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(M.FOREIGN_CPU_CORES in (p.get("metrics") or {}) for p in points if isinstance(p, dict))


@pytest.fixture
def compose():
    """compose(overrides) -> the composed DictConfig (:func:`compose_config`)."""
    return compose_config


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from orchestrator.config.schema import TinyModelSpec
    from orchestrator.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelSpec())


def _environ(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return []


def _of_this_run(pid: str) -> bool:
    """Whether the process carries this test run's mark in its environment (an unreadable one,
    another user's, does not)."""
    return f"{RUN_MARK_VAR}={RUN_MARK}".encode() in _environ(pid)


def engine_processes() -> list[str]:
    """Engine processes of this test run still running, as "pid command" lines: every process of
    a server's tree (it carries the server's owner mark, whatever its command: an engine core, a
    worker, a fake engine's child), and anything that looks like an engine by its command line.
    Zombies waiting for init to reap them hold nothing; engines started outside this run are not
    ours to judge."""
    import psutil

    from orchestrator.engines.process import SERVER_OWNER_ENV

    owner = f"{SERVER_OWNER_ENV}=".encode()
    by_command = subprocess.run(["pgrep", "-f", ENGINE_PATTERN], capture_output=True, text=True).stdout.split()
    out = []
    for proc in psutil.process_iter():
        pid = str(proc.pid)
        if proc.pid == os.getpid():
            continue
        env = _environ(pid)
        if f"{RUN_MARK_VAR}={RUN_MARK}".encode() not in env:
            continue
        if pid not in by_command and not any(e.startswith(owner) for e in env):
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        if "pgrep" not in cmd:
            out.append(f"{pid} {cmd}")
    return out


def _describe(pid: int) -> str:
    """pid, parent, process group, session, state and command of one process (for a leftover)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            parent = proc.ppid()
            state, cmd = proc.status(), " ".join(proc.cmdline())[:160]
        try:
            parent_cmd = " ".join(psutil.Process(parent).cmdline())[:80]
        except psutil.Error:
            parent_cmd = "?"
        return (
            f"pid {pid} ppid {parent} ({parent_cmd}) pgid {os.getpgid(pid)} sid {os.getsid(pid)} state {state}: {cmd}"
        )
    except (psutil.Error, OSError) as exc:
        return f"pid {pid}: gone while described ({exc})"


def wait_no_engines(seconds: float) -> float:
    """Wait until no engine process of this run is left; the seconds it took. If some are
    left after ``seconds``, fail with each leftover's parent, group, session and state, and
    when each of the others went (the record of a lingering engine core, issue 23)."""
    t0 = time.monotonic()
    gone: dict[str, float] = {}
    seen: set[str] = set()
    while True:
        now = {line.split()[0] for line in engine_processes()}
        for pid in seen - now:
            gone.setdefault(pid, time.monotonic() - t0)
        seen |= now
        if not now:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= seconds:
            break
        time.sleep(0.2)
    lines = [_describe(int(pid)) for pid in sorted(now)]
    went = ", ".join(f"{pid} after {s:.1f} s" for pid, s in sorted(gone.items(), key=lambda x: x[1])) or "none"
    pytest.fail(f"engine processes still running after {seconds:.0f} s:\n" + "\n".join(lines) + f"\nexited: {went}")


def search_runs(store: str, experiment: str) -> list:
    """All runs of an experiment in a tracking store, as mlflow Run objects."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {store}"
    return list(client.search_runs([exp.experiment_id], max_results=1000))
