"""A stand-in engine process for lifecycle tests: serves /health, can spawn a child, ignore
TERM, exit at start, or die later. ``python tests/fake_engine.py PORT [flags]``."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
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
    ap.add_argument("--die-after", type=float, default=None)
    ap.add_argument("--start-delay", type=float, default=0.0)
    a = ap.parse_args()
    print("fake engine starting", flush=True)
    if a.exit_at_start:
        print("ValueError: No common block size for 8", flush=True)
        sys.exit(3)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.spawn_child:
        cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
        if a.ignore_term:
            cmd = [sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
        subprocess.Popen(cmd)
    if a.die_after is not None:
        threading.Timer(a.die_after, lambda: __import__("os")._exit(9)).start()
    time.sleep(a.start_delay)
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
