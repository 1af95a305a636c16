"""Shared fixtures: config composition, the tiny model, process-table checks."""

from __future__ import annotations

import copy
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.resolvers import register

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENGINE_PATTERN = "vllm.entrypoints|VLLM::|sglang.launch_server"
# Every process this test run starts inherits this mark (servers, Ray workers, CLI subprocesses,
# and an orphan reparented to init still carries it): the leftover check counts only those, so a
# user's own `make demo` on the same machine neither fails the suite nor hides our leftovers.
RUN_MARK_VAR = "INFERENCE_LAB_TEST_RUN"
RUN_MARK = os.environ.setdefault(RUN_MARK_VAR, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")

register()


_COMPOSED: dict[tuple[str, ...], Any] = {}


def compose_config(overrides: list[str] | None = None):
    """The composed DictConfig of ``overrides``, as `python -m orchestrator` would see it.

    Composing is pure in the overrides and conf/ (interpolations such as ``${oc.env:...}``
    resolve when read, not here), and Hydra takes 0.3-0.5 s per compose where a copy takes
    13 ms: each distinct list is composed once per test session, and every caller gets its own
    deep copy to change as it likes."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    key = tuple(overrides or [])
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            _COMPOSED[key] = hydra_compose("config", overrides=list(key))
    return copy.deepcopy(_COMPOSED[key])


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
