"""A stand-in engine process for lifecycle tests: serves /health, can spawn a child, ignore
TERM, exit at start, die later, or have its "engine" die later while the HTTP side lives on
(``--engine-dies-after S``: vLLM's log lines, then /health answers 503; with
``--quietly``, no log line). ``python tests/fake_engine.py PORT [flags]``."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENGINE_DEAD = threading.Event()
# What vLLM 0.32's CPU server logged when its engine died on a missing kernel (trimmed).
DEATH_LOG = """\
(Worker pid=7) ERROR 11-24 01:47:48 [multiproc_executor.py:1063] AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'
(EngineCore pid=5) ERROR 11-24 01:47:48 [core.py:1512] EngineCore encountered a fatal error.
(APIServer pid=3) ERROR 11-24 01:47:48 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self.send_response(503 if ENGINE_DEAD.is_set() else 200)
        else:
            self.send_response(404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--exit-at-start", action="store_true")
    ap.add_argument("--spawn-child", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--child-ignores-term", action="store_true", help="only the child (an engine core) ignores TERM")
    ap.add_argument("--die-after", type=float, default=None)
    ap.add_argument("--start-delay", type=float, default=0.0)
    ap.add_argument("--engine-dies-after", type=float, default=None)
    ap.add_argument("--quietly", action="store_true")
    ap.add_argument("--shm", action="store_true", help="create a shared-memory segment, as vLLM's executor does")
    ap.add_argument("--ipc", action="store_true", help="bind a socket in $VLLM_RPC_BASE_PATH, as vLLM's processes do")
    a = ap.parse_args()
    print("fake engine starting", flush=True)
    if a.shm:  # registered with Python's resource tracker, which unlinks it unless KILLed too
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=4 << 20)
        assert segment.buf is not None
        segment.buf[: 1 << 20] = b"x" * (1 << 20)
        print(f"shm {segment.name}", flush=True)
    if a.ipc:  # a ZeroMQ ipc:// endpoint is a unix socket file, left behind when the process is killed
        import os
        import socket
        import uuid

        ipc = socket.socket(socket.AF_UNIX)
        ipc.bind(os.path.join(os.environ["VLLM_RPC_BASE_PATH"], str(uuid.uuid4())))
        print(f"ipc {ipc.getsockname()}", flush=True)
    if a.exit_at_start:
        print("ValueError: No common block size for 8", flush=True)
        sys.exit(3)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.spawn_child:
        cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
        if a.ignore_term or a.child_ignores_term:
            cmd = [
                sys.executable,
                "-c",
                "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
            ]
        subprocess.Popen(cmd)
    if a.die_after is not None:
        threading.Timer(a.die_after, lambda: __import__("os")._exit(9)).start()
    if a.engine_dies_after is not None:

        def engine_dies() -> None:
            if not a.quietly:
                print(DEATH_LOG, flush=True)
            ENGINE_DEAD.set()

        threading.Timer(a.engine_dies_after, engine_dies).start()
    time.sleep(a.start_delay)
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
