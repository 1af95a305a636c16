"""The suite's leftover check counts this test run's engine processes only: an engine started
outside the run (a user's own `make demo` on the machine) neither fails the suite nor is
mistaken for ours, and an orphan of this run is still found."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import RUN_MARK_VAR, engine_processes

# argv that looks like a vLLM server to pgrep (the leftover check's pattern), doing nothing
LOOKALIKE = [sys.executable, "-c", "import time; time.sleep(60)", "vllm.entrypoints.openai.api_server"]


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(LOOKALIKE, env=env, start_new_session=True)
    time.sleep(0.3)
    return proc


def test_only_this_runs_engines_count():
    outside = {k: v for k, v in os.environ.items() if k != RUN_MARK_VAR}
    theirs, ours = _start(outside), _start(dict(os.environ))
    try:
        pids = {line.split()[0] for line in engine_processes()}
        assert str(ours.pid) in pids and str(theirs.pid) not in pids
    finally:
        for p in (theirs, ours):
            p.kill()
            p.wait()
    assert not {str(theirs.pid), str(ours.pid)} & {line.split()[0] for line in engine_processes()}


def test_every_process_of_a_servers_tree_counts_whatever_its_command():
    """A server's child (an engine core) counts by the owner mark it inherits, not its name."""
    from orchestrator.engines.process import SERVER_OWNER_ENV, owner_mark

    child = [sys.executable, "-c", "import time; time.sleep(60)"]  # nothing like an engine by name
    unmarked = subprocess.Popen(child, start_new_session=True)
    marked = subprocess.Popen(child, env={**os.environ, SERVER_OWNER_ENV: owner_mark()}, start_new_session=True)
    try:
        time.sleep(0.3)
        pids = {line.split()[0] for line in engine_processes()}
        assert str(marked.pid) in pids and str(unmarked.pid) not in pids
    finally:
        for p in (marked, unmarked):
            p.kill()
            p.wait()
    assert str(marked.pid) not in {line.split()[0] for line in engine_processes()}
