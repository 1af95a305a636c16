"""A Ctrl-C while a local Ray starts (orchestrator.scheduling.ray_exec.init_ray): Ray is let finish
its start and then stopped whole, and the interrupt goes on; the real Ray and a real signal are
tests/faults/test_faults.py::test_ctrl_c_while_ray_starts_leaves_no_ray_process."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.config.schema import ClusterSpec
from orchestrator.metrics.census import DRIVER_ENV
from orchestrator.scheduling import ray_exec


@pytest.fixture(autouse=True)
def _driver_env(monkeypatch) -> None:
    """init_ray marks this process as the driver and sets Ray's logging variables: undone after."""
    for key in (DRIVER_ENV, "RAY_DEDUP_LOGS", "RAY_COLOR_PREFIX", "RAY_worker_niceness"):
        monkeypatch.delenv(key, raising=False)


def test_an_interrupt_during_the_start_stops_ray_once_started_then_goes_on(monkeypatch) -> None:
    import ray

    calls: list[str] = []

    def init(**kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C midway: the start goes on to its end
        calls.append("started")

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("stopped"))
    with pytest.raises(KeyboardInterrupt, match="while Ray was starting"):
        ray_exec.init_ray(ClusterSpec())
    assert calls == ["started", "stopped"]
    assert signal.getsignal(signal.SIGINT) is before  # the handler the driver had, back


def test_a_second_interrupt_during_the_start_stops_at_once(monkeypatch) -> None:
    import ray

    def init(**kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # insisting: a start that hangs can still be stopped
        raise AssertionError("not reached")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        ray_exec.init_ray(ClusterSpec())
