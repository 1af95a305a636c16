"""The clean slate before a trial's servers start: leftovers of earlier trials are told from
running servers by their owner mark, port holders and memory above the baseline are named, the
wait is bounded, and a trial on a dirty machine fails naming what is left instead of measuring."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.config import to_specs
from orchestrator.config.schema import SlateSpec
from orchestrator.engines.ports import free_port, port_is_free
from orchestrator.engines.process import SERVER_OWNER_ENV, ServerProcess, owner_mark
from orchestrator.trial import machine as machine_mod
from orchestrator.trial import run_trial
from orchestrator.trial import slate as slate_mod
from orchestrator.trial.machine import Leftover, engine_processes, port_holders
from orchestrator.trial.slate import DirtySlateError, Reading

pytestmark = pytest.mark.measures

FAKE = str(Path(__file__).resolve().parents[1] / "fake_engine.py")


def start_marked(mark: str | None, *args: str, port: int | None = None) -> subprocess.Popen[bytes]:
    """A stand-in engine (with a child, as vLLM's API server has its engine core) carrying ``mark``."""
    env = dict(os.environ)
    if mark is not None:
        env[SERVER_OWNER_ENV] = mark
    proc = subprocess.Popen(
        [sys.executable, FAKE, str(port or free_port()), "--spawn-child", *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not psutil.Process(proc.pid).children():
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(10)


def dead_owner_mark() -> str:
    """The mark of a worker that has exited (a process that ran and was reaped)."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    mark = owner_mark(owner.pid)
    owner.wait()
    return mark


def leftover_pids() -> set[int]:
    return {x.pid for x in engine_processes()[0] if x.pid is not None}


def test_a_server_whose_worker_has_exited_is_a_leftover_with_its_children():
    proc = start_marked(dead_owner_mark())
    try:
        child = psutil.Process(proc.pid).children()[0].pid
        found = {x.pid: x for x in engine_processes()[0]}
        assert {proc.pid, child} <= set(found)  # the forked engine core carries the mark too
        assert "fake_engine.py" in found[proc.pid].command and found[proc.pid].memory_gb
        assert "whose worker (pid" in found[proc.pid].why and "has exited" in found[proc.pid].why
    finally:
        stop(proc)
    assert proc.pid not in leftover_pids()


def test_the_mark_survives_a_process_title(tmp_path):
    """setproctitle (SGLang's processes, engine cores) writes the title over the environment
    unless SPT_NOENV is set, which ServerProcess sets for every server: the mark stays readable."""
    code = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore ' + 'x' * 200); time.sleep(60)"
    port = free_port()
    server = ServerProcess(
        [sys.executable, "-c", code], dict(os.environ), tmp_path / "s.log", f"http://127.0.0.1:{port}/health"
    )
    server.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "VLLM::" not in " ".join(psutil.Process(server.pid).cmdline()):
            time.sleep(0.05)
        assert "VLLM::EngineCore" in " ".join(psutil.Process(server.pid).cmdline())
        assert SERVER_OWNER_ENV in psutil.Process(server.pid).environ()
    finally:
        server.stop()


def test_this_workers_running_servers_are_not_leftovers_and_its_stopped_ones_are(tmp_path):
    port = free_port()
    server = ServerProcess(
        [sys.executable, FAKE, str(port), "--spawn-child"],
        dict(os.environ),
        tmp_path / "s.log",
        f"http://127.0.0.1:{port}/health",
    )
    with server:
        server.wait_healthy(20)
        assert server.pid not in leftover_pids()
        assert engine_processes()[1] > 0  # its memory is a running server's, not the baseline's
    # a server this worker started without the ServerProcess that tracks it: alive after its "stop"
    proc = start_marked(owner_mark())
    try:
        found = {x.pid: x for x in engine_processes()[0]}
        assert "alive after its stop" in found[proc.pid].why
    finally:
        stop(proc)


def test_a_concurrent_trials_running_server_is_not_a_leftover():
    other_worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = start_marked(owner_mark(other_worker.pid))
        try:
            assert proc.pid not in leftover_pids()
        finally:
            stop(proc)
    finally:
        other_worker.kill()
        other_worker.wait()


def test_a_port_holder_is_named():
    port = free_port()
    proc = start_marked(None, port=port)
    try:
        deadline = time.monotonic() + 20
        holders: list[Leftover] = []
        while time.monotonic() < deadline and not holders:
            holders = port_holders("127.0.0.1", port)
            time.sleep(0.1)
        assert [h.pid for h in holders] == [proc.pid]
        assert "fake_engine.py" in holders[0].command and f"holds port {port}" in holders[0].why
    finally:
        stop(proc)
    assert port_holders("127.0.0.1", port) == []


class Scripted:
    """A scripted machine: the readings in order (the last one repeats), on a clock that only
    moves when the check sleeps."""

    def __init__(self, *readings: Reading) -> None:
        self.readings, self.now, self.said = list(readings), 0.0, []

    def look(self) -> Reading:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def sleep(self, s: float) -> None:
        self.now += s


LEFT = Leftover(4242, "python -m vllm.entrypoints.openai.api_server", 1.5, "a server process of an earlier trial")


def check(compose, machine: Scripted, *overrides: str) -> dict:
    spec, _ = to_specs(compose(["engine.port=18765", *overrides]))
    return slate_mod.wait_for_clean_slate(
        spec, [], machine.said.append, machine.look, lambda: machine.now, machine.sleep
    )


@pytest.fixture(autouse=True)
def fresh_baseline(monkeypatch):
    monkeypatch.setattr(slate_mod, "_BASELINE", {})


def test_the_check_waits_for_a_leftover_to_go_and_records_the_wait(compose):
    machine = Scripted(Reading([LEFT], 3.0), Reading([LEFT], 3.0), Reading([], 1.0))
    out = check(compose, machine)
    assert out["checked"] and out["waited_s"] == pytest.approx(1.0)  # two polls of 0.5 s
    assert out["cpu_mem_used_gb"] == 1.0 and out["cpu_mem_baseline_gb"] == 1.0
    assert machine.said[0].startswith("waiting up to 60s for a clean slate: pid 4242 (python -m vllm")
    assert machine.said[-1] == "clean slate after 1.0s"


def test_a_leftover_that_stays_fails_the_check_after_the_bound_naming_it(compose):
    machine = Scripted(Reading([LEFT], 1.0))
    with pytest.raises(DirtySlateError) as err:
        check(compose, machine, "platform.slate.wait_s=5")
    msg = str(err.value)
    assert "not a clean slate after 5 s (platform.slate.wait_s=5)" in msg
    assert "pid 4242 (python -m vllm.entrypoints.openai.api_server, 1.50 GB): a server process" in msg
    assert "Stop what is left, or set platform.slate.check=false" in msg  # not ours: no "safe to kill"
    assert machine.now == pytest.approx(5.0)


def test_the_baseline_is_not_lowered_while_another_trials_server_runs():
    base: dict[str, float] = {}
    slate_mod.settle_baseline(Reading([], 4.0), base)
    slate_mod.settle_baseline(Reading([], 1.0, others_running=3), base)  # their memory is left out, roughly
    assert base["cpu"] == 4.0
    slate_mod.settle_baseline(Reading([], 3.0), base)
    assert base["cpu"] == 3.0


def test_memory_above_the_baseline_is_dirty_and_a_clean_reading_lowers_the_baseline(compose):
    check(compose, Scripted(Reading([], 4.0)))  # the worker's first clean reading: the baseline
    assert check(compose, Scripted(Reading([], 3.0)))["cpu_mem_baseline_gb"] == 3.0  # lowered
    with pytest.raises(
        DirtySlateError, match=r"memory in use is 6.50 GB, more than its idle baseline 3.00 GB \+ 2.00 GB"
    ):
        check(compose, Scripted(Reading([], 6.5)), "platform.slate.wait_s=1", "platform.slate.memory_margin_gb=2")
    assert check(compose, Scripted(Reading([], 4.9)), "platform.slate.memory_margin_gb=2")["waited_s"] == 0


def test_gpu_memory_above_its_idle_reading_is_dirty():
    spec = SlateSpec(gpu_memory_margin_gb=0.5)
    base: dict[str, float] = {}
    slate_mod.settle_baseline(Reading([], 1.0, {"0": 0.4}), base)
    assert slate_mod.problems(Reading([], 1.0, {"0": 0.8}), spec, base) == []
    assert slate_mod.problems(Reading([], 1.0, {"0": 20.0}), spec, base) == [
        "GPU 0 has 20.00 GB in use, more than its idle baseline 0.40 GB + 0.50 GB (platform.slate.gpu_memory_margin_gb)"
    ]


def test_no_nvml_is_a_note_not_a_failure():
    used, leftovers, note = machine_mod.gpu_reading(["0"])
    assert (used, leftovers) == ({}, []) and note and note.startswith("not checked: NVML unavailable")


def test_the_check_off_or_an_external_server_reads_nothing(compose):
    machine = Scripted(Reading([LEFT], 1.0))
    assert check(compose, machine, "platform.slate.check=false") == {"checked": False}
    spec, _ = to_specs(compose(["engine=external", "engine.url=http://127.0.0.1:9"]))
    assert slate_mod.wait_for_clean_slate(spec, [], print, machine.look) == {"checked": False}


def test_a_server_left_running_on_the_next_trials_port_fails_that_trial_before_it_measures(compose, tmp_path):
    """A server of an 'earlier trial' left running on purpose (its worker gone), holding the next
    trial's port: the trial waits its bound, then fails naming the leftover, starting nothing."""
    port = free_port()
    left = start_marked(dead_owner_mark(), port=port)
    try:
        spec, _ = to_specs(compose([f"engine.port={port}", "platform.slate.wait_s=2"]))
        said: list[str] = []
        result = run_trial(spec, tmp_path, progress=said.append)
    finally:
        stop(left)
    assert result.status == "FAILED" and result.error
    assert result.error.startswith("DirtySlateError: not a clean slate after 2 s")
    assert f"pid {left.pid} (" in result.error and "fake_engine.py" in result.error
    assert f"holds port {port}" in result.error and "whose worker (pid" in result.error
    assert "(a server of an earlier trial is safe to kill)" in result.error
    assert not result.servers and not result.points  # nothing started, nothing measured
    assert not list(tmp_path.glob("server*.log"))
    assert any("waiting up to 2s for a clean slate" in line for line in said)


def start_unmarked_engine(port: int, mark: str | None = None) -> subprocess.Popen[bytes]:
    """The stand-in engine with a vLLM server's command line, started by somebody else (no owner
    mark unless ``mark``): ``... vllm.entrypoints.openai.api_server PORT``."""
    env = dict(os.environ)
    env.pop(SERVER_OWNER_ENV, None)
    if mark is not None:
        env[SERVER_OWNER_ENV] = mark
    code = f"import sys, runpy; sys.argv = [{FAKE!r}, *sys.argv[2:]]; runpy.run_path({FAKE!r}, run_name='__main__')"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "vllm.entrypoints.openai.api_server", str(port), "--spawn-child"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        psutil.Process(proc.pid).children() and not port_is_free("127.0.0.1", port)
    ):
        time.sleep(0.05)
    return proc


def test_an_engine_server_somebody_else_started_is_named_with_its_port_memory_and_cpu():
    port = free_port()
    other = start_unmarked_engine(port)
    try:
        found = [x for x in machine_mod.unmarked_engines() if x.pid == other.pid]
        ours = start_unmarked_engine(free_port(), mark=owner_mark())  # a server of ours: not "somebody else's"
        try:
            mine = [x for x in machine_mod.unmarked_engines() if x.pid == ours.pid]
        finally:
            stop(ours)
    finally:
        stop(other)
    assert len(found) == 1 and not mine  # one entry for the server, not one per process of it
    x = found[0]
    assert "fake_engine.py" in x.command and x.memory_gb and x.memory_gb > 0
    assert f"listening on port {port}" in x.why and "cores on average since it started" in x.why
    assert "platform.slate.other_engines=ignore" in x.why and not x.ours


def test_a_trial_beside_somebody_elses_engine_server_fails_naming_it_unless_told_to_ignore(compose, tmp_path):
    """Issue 33: a trial started beside a running vLLM server this sweep did not start (on
    another port) used to FINISH without a word; now it waits, then fails naming it."""
    other = start_unmarked_engine(free_port())
    try:
        spec, _ = to_specs(compose(["platform.slate.wait_s=1"]))
        result = run_trial(spec, tmp_path, progress=lambda _: None)
        ignore, _ = to_specs(compose(["platform.slate.other_engines=ignore"]))
        reading = slate_mod.wait_for_clean_slate(ignore, [], lambda _: None)
    finally:
        stop(other)
    assert result.status == "FAILED" and result.error.startswith("DirtySlateError: not a clean slate after 1 s")
    assert f"pid {other.pid} (" in result.error and "an engine server this sweep did not start" in result.error
    assert not result.points
    assert reading["checked"] is True
