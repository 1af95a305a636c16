"""A profiler trace of one load point's window (``profile``): the engine servers start with
their profiler configured (:func:`with_profiler`), and :class:`ProfileWindow` brackets a window
of the chosen point with their start/stop endpoints; :func:`collect_traces` gathers the files."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ProfileSpec, TrialSpec
from orchestrator.engines import EngineAdapter, ServerLaunch
from orchestrator.engines.base import Profiler
from orchestrator.engines.nsys import REPORT_SUFFIX, check_in_container
from orchestrator.metrics.result import ARTIFACT_DIR

log = logging.getLogger(__name__)

TRACE_DIR = ARTIFACT_DIR  # "profile": in the trial's folder, and the artifact folder of its run
# traces, vLLM's op tables, Nsight Systems reports
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json.gz", "profiler_out.txt", REPORT_SUFFIX)


def profiled_launches(
    adapter: EngineAdapter, spec: TrialSpec, trace_dir: str, launches: list[ServerLaunch]
) -> tuple[list[ServerLaunch], Profiler | None]:
    """The launches with the engine's profiler configured on every engine server (not a router
    or proxy in front), when the trial is profiled. Nothing is started or created."""
    if spec.profile is None:
        return launches, None
    profiler = adapter.profiler(spec, trace_dir)
    if profiler is None:
        raise ConfigError(f"profile: engine '{spec.engine.name}' cannot be profiled by us")
    return [_profiled(x, profiler, spec) if x.argv and not x.in_front else x for x in launches], profiler


def with_profiler(
    adapter: EngineAdapter, spec: TrialSpec, workdir: Path, launches: list[ServerLaunch]
) -> tuple[list[ServerLaunch], Profiler | None]:
    """:func:`profiled_launches` into the trial's ``profile/`` folder, which is created; nsys
    behind a launch prefix is asked for there first, before any server starts."""
    trace_dir = workdir / TRACE_DIR
    launches, profiler = profiled_launches(adapter, spec, str(trace_dir), launches)
    if profiler is not None:
        check_in_container(spec)
        trace_dir.mkdir(parents=True, exist_ok=True)
    return launches, profiler


def _profiled(launch: ServerLaunch, profiler: Profiler, spec: TrialSpec) -> ServerLaunch:
    """One engine server with the profiler's arguments and environment, and its wrapper (nsys)
    between the launch prefix and the interpreter."""
    argv = [*launch.argv, *profiler.argv]
    if profiler.wrapper is not None:
        launched = spec.engine.launched
        head = len(launched.launch_prefix) if launched is not None else 0
        argv = [*argv[:head], *profiler.wrapper(launch.name), *argv[head:]]
    return dataclasses.replace(
        launch,
        argv=argv,
        env={**launch.env, **dict(profiler.env)},
        stop_grace_s=profiler.stop_grace_s if profiler.stop_grace_s is not None else launch.stop_grace_s,
    )


class ProfileWindow:
    """Starts the trace ``start_after_s`` into the point on every engine server and stops it
    ``duration_s`` later, or when the point ends first (:meth:`finish`)."""

    def __init__(
        self,
        spec: ProfileSpec,
        profiler: Profiler,
        urls: list[str],
        api_key: str | None,
        say: Progress,
    ) -> None:
        self.spec, self.profiler, self.urls, self.api_key, self.say = spec, profiler, urls, api_key, say
        self.started_s: float | None = None
        self.stopped_s: float | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="profile-window", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _call(self, endpoint: tuple[str, dict[str, Any] | None]) -> None:
        path, body = endpoint
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for url in self.urls:
            data = json.dumps(body).encode() if body is not None else b""
            req = urllib.request.Request(url + path, data=data, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=300) as resp:  # stopping writes the trace: slow
                resp.read()

    def _run(self) -> None:
        if self._cancel.wait(self.spec.start_after_s):
            return
        with self._lock:
            try:
                self._call(self.profiler.start)
            except OSError as exc:
                self.say(f"profile: could not start the trace: {exc}")
                return
            self.started_s = time.perf_counter()
            self.say(f"profile: tracing for up to {self.spec.duration_s:g} s")
        self._cancel.wait(self.spec.duration_s)
        self._stop()

    def _stop(self) -> None:
        with self._lock:
            if self.started_s is None or self.stopped_s is not None:
                return
            self.stopped_s = time.perf_counter()  # the traced window ends here; writing the trace takes longer
            try:
                self._call(self.profiler.stop)
            except OSError as exc:
                self.say(f"profile: could not stop the trace: {exc}")

    def cancel(self) -> None:
        """The point failed: a trace not yet started never starts, one running stops now (its
        thread asks the servers to stop it and ends; nobody waits for it)."""
        self._cancel.set()

    def finish(self) -> dict[str, float]:
        """The point is over: stop a trace still running; the point's profile metrics."""
        self._cancel.set()
        self._thread.join(timeout=600)
        self._stop()
        out = {M.PROFILED: 1.0}
        if not self.spec.in_verdict:
            out[M.PROFILED_EXCLUDED] = 1.0  # the profiler slowed it: the verdict does not read it
        if self.started_s is not None and self.stopped_s is not None:
            out[M.PROFILE_WINDOW_S] = self.stopped_s - self.started_s
        return out


def collect_traces(workdir: Path) -> dict[str, bytes]:
    """Trace files written in the trial's ``profile/`` folder, by their path under the trial."""
    folder = workdir / TRACE_DIR
    if not folder.is_dir():
        return {}
    return {
        f"{TRACE_DIR}/{f.relative_to(folder)}": f.read_bytes()
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
    }
