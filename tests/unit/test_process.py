"""Server process lifecycle: health wait, fail-fast start, group stop, watchdog on owner death."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.config.errors import ServerCrashedError, ServerStartError
from orchestrator.engines import shm
from orchestrator.engines.ports import free_port, port_is_free
from orchestrator.engines.process import ServerProcess, group_alive, interrupts_stop_servers, running_groups

FAKE = str(Path(__file__).resolve().parents[1] / "fake_engine.py")


def server(tmp_path, *flags, grace=3.0):
    port = free_port()
    return ServerProcess(
        [sys.executable, FAKE, str(port), *flags],
        dict(os.environ),
        tmp_path / "server.log",
        f"http://127.0.0.1:{port}/health",
        stop_grace_s=grace,
    )


def test_start_healthy_and_stop_whole_group(tmp_path):
    s = server(tmp_path, "--spawn-child")
    with s:
        startup = s.wait_healthy(20)
        assert startup >= 0
        children = psutil.Process(s.pid).children(recursive=True)
        assert children, "the fake engine should have spawned a child"
        pgid = s.pid
    assert not group_alive(pgid)
    assert all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children)


def test_exit_during_startup_fails_fast_with_log_tail(tmp_path):
    s = server(tmp_path, "--exit-at-start")
    t0 = time.monotonic()
    with s, pytest.raises(ServerStartError) as err:
        s.wait_healthy(120)
    assert time.monotonic() - t0 < 10, "must not wait for the timeout"
    assert "exited with code 3" in str(err.value)
    assert "No common block size" in str(err.value)


def test_startup_timeout(tmp_path):
    s = server(tmp_path, "--start-delay", "30")
    with s, pytest.raises(ServerStartError, match="not healthy after"):
        s.wait_healthy(1.5)


def test_kill_escalates_when_term_ignored(tmp_path):
    s = server(tmp_path, "--ignore-term", "--spawn-child", grace=1.0)
    with s:
        s.wait_healthy(20)
        pgid = s.pid
    assert not group_alive(pgid)


def test_what_outlives_its_leader_is_killed_without_the_full_grace(tmp_path):
    """The leader (vLLM's API server, which stops its own engine core) exits on TERM; a child that
    does not (an engine core orphaned mid-shutdown) is KILLed ORPHAN_GRACE_S later, not after
    the full grace (30 s here)."""
    s = server(tmp_path, "--spawn-child", "--child-ignores-term", grace=30.0)
    with s:
        s.wait_healthy(20)
        pgid = s.pid
        t0 = time.monotonic()
    took = time.monotonic() - t0
    assert not group_alive(pgid)
    assert took < 20, f"stop waited {took:.1f} s for the orphaned child (the full grace is 30 s)"


def test_an_interrupt_terms_the_running_servers_before_anything_unwinds(tmp_path):
    """SIGINT (Ctrl-C, or Ray cancelling a task) inside interrupts_stop_servers: the servers'
    groups get TERM in the handler itself, before the code above them unwinds to their stop()."""
    before = signal.getsignal(signal.SIGINT)  # ignored when pytest runs in a background job
    s = server(tmp_path, "--spawn-child", grace=30.0)
    s.start()
    try:
        s.wait_healthy(20)
        pgid = s.pid
        with pytest.raises(KeyboardInterrupt), interrupts_stop_servers():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # never reached: the handler raises
        assert _wait_group_gone(pgid, 10), "the interrupt did not TERM the running server"
    finally:
        s.stop()
    assert signal.getsignal(signal.SIGINT) is before  # restored, whatever it was


def test_a_second_interrupt_during_the_stop_kills_the_group_at_once(tmp_path):
    """A second Ctrl-C while stop() waits out the grace of a server that ignores TERM: the group is
    KILLed then, not left running (its owner, a Ray worker, may live on), and the interrupt goes on."""
    s = server(tmp_path, "--ignore-term", "--spawn-child", grace=60.0)
    s.start()
    s.wait_healthy(20)
    pgid = s.pid
    again = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_stop_servers():
            again.start()
            s.stop()
    finally:
        again.cancel()
        s.stop()
    assert not group_alive(pgid)
    assert time.monotonic() - t0 < 30, "the stop waited out the grace after the interrupt"
    assert s.pid not in running_groups()


def test_an_interrupt_just_after_the_server_started_stops_it(tmp_path, monkeypatch):
    """Ctrl-C lands wherever the main thread is: right after the server's Popen, before its
    watchdog started, the server was left running with nothing to stop it."""
    s = server(tmp_path, "--spawn-child")
    s.nice = 1
    started: list[int] = []
    folders: list[str | None] = []

    def interrupted(which: int, pid: int, value: int) -> None:
        started.append(pid)
        folders.append(s._rpc_dir)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "setpriority", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert started and _wait_group_gone(started[0], 10), "the server outlived the interrupt"
    assert folders[0] is not None and not Path(folders[0]).exists()  # its IPC folder removed too


def test_crash_detected(tmp_path):
    s = server(tmp_path, "--die-after", "1.0")
    with s:
        s.wait_healthy(20)
        time.sleep(2.0)
        with pytest.raises(ServerCrashedError, match="died"):
            s.check_alive()


def test_a_server_killed_while_its_health_is_asked_is_reported_by_its_exit_code(tmp_path, monkeypatch):
    """SIGKILL a moment before the check: the process has not been reaped at the first look, its
    health check then fails; the exit code it has by then is the reason given, not the health."""
    s = server(tmp_path)
    with s:
        s.wait_healthy(20)
        asked = s._health_after_retries

        def killed_meanwhile(tries: int = 3) -> int | None:
            os.kill(s.pid, signal.SIGKILL)
            s.proc.wait(10)
            return asked(1)

        monkeypatch.setattr(s, "_health_after_retries", killed_meanwhile)
        with pytest.raises(ServerCrashedError, match=r"died \(exit code -9\)"):
            s.check_alive()


def test_argv_must_be_a_list(tmp_path):
    with pytest.raises(TypeError):
        ServerProcess("python -m x", {}, tmp_path / "l", "http://x")


def _owner_with_server(tmp_path, port, flags=("--spawn-child",)):
    owner_code = textwrap.dedent(f"""
        import os, sys, time
        from orchestrator.engines.process import ServerProcess
        s = ServerProcess([sys.executable, {FAKE!r}, "{port}", *{list(flags)!r}], dict(os.environ),
                          __import__("pathlib").Path({str(tmp_path / "o.log")!r}), "http://127.0.0.1:{port}/health")
        s.start(); s.wait_healthy(20)
        print(s.pid, flush=True)
        time.sleep(600)
    """)
    return subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)


def _wait_group_gone(pgid, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.2)
    return not group_alive(pgid)


@pytest.mark.parametrize("also_kill_leader", [False, True], ids=["owner", "owner-and-leader"])
def test_watchdog_kills_server_group_when_owner_is_killed(tmp_path, also_kill_leader):
    """Owner SIGKILLed and not reaped (a zombie); with also_kill_leader, the server's leader is
    SIGKILLed too, as a Ray worker's exit does to its direct children: the rest of the group
    (here the fake engine's child; in vLLM the EngineCore) must still be stopped."""
    port = free_port()
    owner = _owner_with_server(tmp_path, port)
    try:
        pgid = int(owner.stdout.readline())
        members = [p.pid for p in psutil.Process(pgid).children(recursive=True)]
        assert group_alive(pgid) and members
        owner.send_signal(signal.SIGKILL)  # no cleanup runs in the owner; we do not reap it yet
        if also_kill_leader:
            os.kill(pgid, signal.SIGKILL)
        assert _wait_group_gone(pgid), "watchdog did not stop the orphaned server group"
        assert port_is_free("127.0.0.1", port)
    finally:
        owner.kill()
        owner.wait(10)


def test_clean_stop_leaves_no_watchdog(tmp_path):
    s = server(tmp_path)
    with s:
        s.wait_healthy(20)
        pgid = s.pid
    deadline = time.monotonic() + 5

    def watchdogs():
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if "orchestrator.engines.watchdog" in " ".join(p.info["cmdline"] or [])
            and str(pgid) in " ".join(p.info["cmdline"] or [])
        ]

    while time.monotonic() < deadline and watchdogs():
        time.sleep(0.2)
    assert not watchdogs()


def test_error_lines_find_root_cause_above_the_tail(tmp_path):
    from orchestrator.config.logs import error_lines, explain

    log = tmp_path / "server.log"
    lines = [
        "(APIServer pid=1) WARNING 11-22 09:22:48 [x.py:1] failed to raise ulimit: `OSError: [Errno 24]` may follow",
        "(Worker pid=7) ERROR 11-22 09:23:13 [multiproc_executor.py:1063] Traceback (most recent call last):",
        "(Worker pid=7) ERROR 11-22 09:23:13 [multiproc_executor.py:1063] ValueError: No common block size for 16.",
        *[f'  File "x.py", line {i}, in f' for i in range(100)],
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    log.write_text("\n".join(lines) + "\n")
    assert error_lines(log) == [
        "ValueError: No common block size for 16.",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    text = explain(log)
    assert text.index("No common block size") < text.index("last log lines")


def test_watchdog_owner_check_survives_a_clock_step(monkeypatch):
    """A stepped wall clock (VM restore, NTP) moves psutil's boot time; the owner must still
    be recognised, or the watchdog kills a healthy server (seen here mid-start)."""
    import os

    import psutil
    import psutil._pslinux as pslinux

    from orchestrator.engines.watchdog import owner_alive, started_at

    me = psutil.Process(os.getpid())
    t0 = started_at(me)
    real = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real() + 7.0)
    assert owner_alive(os.getpid(), t0)
    assert not owner_alive(os.getpid(), t0 + 1.0)  # a recycled pid still is not the owner


def test_an_engine_that_dies_under_a_live_server_is_named(tmp_path):
    """vLLM's API process outlives its engine (it answers 500 and /health 503): check_alive
    names the death and the engine's own root cause, not the wrapper lines after it."""
    port = free_port()
    s = ServerProcess(
        [sys.executable, FAKE, str(port), "--engine-dies-after", "1.5"],
        dict(os.environ),
        tmp_path / "server.log",
        f"http://127.0.0.1:{port}/health",
        fatal_log_markers=("EngineCore encountered a fatal error", "EngineDeadError"),
    )
    with s:
        s.wait_healthy(20)
        s.check_alive()  # alive and healthy
        time.sleep(2.5)
        assert s.proc.poll() is None  # the process lives on
        with pytest.raises(ServerCrashedError) as err:
            s.check_alive()
    first = str(err.value).splitlines()[0]
    assert "the engine died (its log says 'EngineCore encountered a fatal error')" in first, first
    assert first.endswith("AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"), first


def test_a_failing_health_check_alone_is_a_death_too(tmp_path):
    port = free_port()
    s = ServerProcess(
        [sys.executable, FAKE, str(port), "--engine-dies-after", "1.0", "--quietly"],
        dict(os.environ),
        tmp_path / "server.log",
        f"http://127.0.0.1:{port}/health",
    )
    with s:
        s.wait_healthy(20)
        time.sleep(1.5)
        with pytest.raises(ServerCrashedError, match=r"its health check answers HTTP 503"):
            s.check_alive()


def _segment_named_in(log_path, timeout=20.0, what="shm"):
    """What the fake engine said it made (``shm NAME``, ``ipc PATH``) in its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines() if log_path.exists() else []:
            if line.startswith(f"{what} "):
                return line.split()[1]
        time.sleep(0.1)
    raise AssertionError(f"no {what!r} line in {log_path}")


def _orphan_segment():
    """A segment nobody maps and no resource tracker will unlink: a leftover from before."""
    from multiprocessing import resource_tracker, shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    seg.close()
    return seg


@pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("attached", [False, True], ids=["left", "still-mapped-elsewhere"])
def test_the_segments_a_killed_server_left_in_dev_shm_are_removed(tmp_path, caplog, attached):
    """A server that ignores TERM is KILLed with its process group, Python's resource tracker
    included, so its shared-memory segment stays (as vLLM's MessageQueue buffers did, 29 of them
    here). stop() removes it, unless a live process outside the group still maps it; an orphan
    the server never held stays."""
    from multiprocessing import resource_tracker, shared_memory

    older = _orphan_segment()
    outside = None
    try:
        s = server(tmp_path, "--ignore-term", "--shm", grace=1.0)
        with caplog.at_level("WARNING"), s:
            s.wait_healthy(20)
            left = _segment_named_in(s.log_path)
            if attached:  # this process maps the server's segment too
                outside = shared_memory.SharedMemory(name=left)
                resource_tracker.unregister(outside._name, "shared_memory")  # type: ignore[attr-defined]
        assert (shm.SHM_DIR / older.name).exists()
        if attached:
            assert (shm.SHM_DIR / left).exists() and "shared-memory segment" not in caplog.text
        else:
            assert not (shm.SHM_DIR / left).exists()
            assert f"removed 1 shared-memory segment(s) left in /dev/shm ({left};" in caplog.text
    finally:
        older.unlink()
        if outside is not None:
            outside.close()
            outside.unlink()


@pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm")
def test_the_watchdog_removes_what_the_group_it_killed_left(tmp_path):
    port = free_port()
    owner = _owner_with_server(tmp_path, port, flags=("--ignore-term", "--shm"))
    try:
        pgid = int(owner.stdout.readline())
        left = _segment_named_in(tmp_path / "o.log")
        owner.send_signal(signal.SIGKILL)
        assert _wait_group_gone(pgid, timeout=30), "watchdog did not stop the orphaned server group"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (shm.SHM_DIR / left).exists():
            time.sleep(0.2)
        assert not (shm.SHM_DIR / left).exists()
    finally:
        owner.kill()
        owner.wait(10)


def test_a_server_binds_its_ipc_sockets_in_a_folder_of_its_own_removed_when_it_stops(tmp_path):
    """vLLM binds ZeroMQ ipc:// sockets in $VLLM_RPC_BASE_PATH (the system temp folder by
    default) and a killed process leaves them there. Each server gets a folder of its own, gone
    once the server is, after a KILL too; a folder the user set is the user's and stays."""
    import tempfile

    s = server(tmp_path, "--ipc", "--ignore-term", grace=1.0)
    with s:
        s.wait_healthy(20)
        sock = Path(_segment_named_in(s.log_path, what="ipc"))
        assert sock.parent.parent == Path(tempfile.gettempdir()) and sock.parent.name.startswith("il-rpc-")
        assert sock.exists() and len(str(sock)) < 100
    assert not sock.parent.exists()

    # a short path, as a user's would be: an ipc:// socket's path has at most 107 bytes, and a
    # test's tmp_path under pytest-xdist comes near that already
    mine = Path(tempfile.mkdtemp(prefix="rpc-"))
    port = free_port()
    env = dict(os.environ, VLLM_RPC_BASE_PATH=str(mine))
    with ServerProcess(
        [sys.executable, FAKE, str(port), "--ipc"], env, tmp_path / "b.log", f"http://127.0.0.1:{port}/health"
    ) as b:
        b.wait_healthy(20)
        assert Path(_segment_named_in(b.log_path, what="ipc")).parent == mine
    assert mine.is_dir()
    shutil.rmtree(mine)


def test_the_watchdog_removes_the_ipc_folder_of_the_group_it_killed(tmp_path):
    port = free_port()
    owner = _owner_with_server(tmp_path, port, flags=("--ignore-term", "--ipc"))
    try:
        pgid = int(owner.stdout.readline())
        folder = Path(_segment_named_in(tmp_path / "o.log", what="ipc")).parent
        owner.send_signal(signal.SIGKILL)
        assert _wait_group_gone(pgid, timeout=30), "watchdog did not stop the orphaned server group"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and folder.exists():
            time.sleep(0.2)
        assert not folder.exists()
    finally:
        owner.kill()
        owner.wait(10)


def test_free_ports_come_from_below_the_ephemeral_range_and_are_bindable():
    """A port we hand a server is one the kernel never gives a bind(0) or an outgoing connection,
    so a server started a minute later (a router behind its replicas) still finds it free."""
    from orchestrator.engines.ports import _ephemeral_range

    low = _ephemeral_range()[0]
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p < low for p in ports), ports
    assert all(port_is_free("127.0.0.1", p) for p in ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        assert held.getsockname()[1] >= low  # what bind(0) gives: the range we stay out of


def test_a_server_started_through_srun_gets_a_step_name_of_its_own():
    """Behind ``engine.launch_prefix=[srun, ...]`` the server's step is named, so a step whose srun
    was KILLed can be found and cancelled (tests/slurm has the real Slurm); any other argv is as is."""
    from orchestrator.engines.process import slurm_step_argv

    argv, name = slurm_step_argv(["/usr/bin/srun", "--overlap", "python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert name and name.startswith("il-server-")
    assert argv == [
        "/usr/bin/srun",
        f"--job-name={name}",
        "--overlap",
        "python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert slurm_step_argv(["python3", "-m", "x", "srun"]) == (["python3", "-m", "x", "srun"], None)
    assert slurm_step_argv(["apptainer", "exec", "img", "srun"])[1] is None
