"""The MLflow UI shows a sweep: a real `mlflow server`, a real sweep logged to it over HTTP, and
the experiment's page rendered by headless Chromium, driven over the DevTools protocol.

Needs Debian's `chromium` package (`apt-get install -y chromium`); skipped without it.
Screenshots are kept in test-artifacts/ at the repo root.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
EXPERIMENT = "ui_test"
# As root, and on a machine whose network is closed: no sandbox, and none of Chromium's own
# background connections (they are refused and slow it down).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
    "--remote-debugging-port=0",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group `proc` leads, wait for all of it, SIGKILL what is left."""
    pgid = proc.pid  # started with start_new_session=True: its own group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@pytest.fixture
def mlflow_server(tmp_path):
    """URL of a fresh `mlflow server` (sqlite store, artifacts proxied over HTTP) on a free port."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "mlflow_server.log"
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path}/mlflow.db",
        # Runs of new experiments get mlflow-artifacts:/ URIs: clients upload through the server,
        # which stores the files here.
        "--serve-artifacts",
        "--artifacts-destination",
        str(tmp_path / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # No background job runner: it is 8 more Python processes, and nothing here uses it.
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode}:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy after 120 s:\n{_tail(log_path)}")
            time.sleep(0.5)
        yield url
    finally:
        _stop_group(proc)


class _Page:
    """The few DevTools-protocol calls the test needs, over aiohttp's websocket client."""

    def __init__(self, ws):
        self.ws = ws
        self.last_id = 0

    async def send(self, method: str, **params):
        self.last_id += 1
        await self.ws.send_json({"id": self.last_id, "method": method, "params": params})
        while True:  # skip events: no domain is enabled, so there are few
            msg = await self.ws.receive_json(timeout=60)
            if msg.get("id") == self.last_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def eval(self, expression: str):
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait_for(self, expression: str, what: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = await self.eval("document.body ? document.body.innerText : ''")
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what}; the page shows:\n{(text or '')[:3000]}"
                )
            await asyncio.sleep(0.5)

    async def screenshot(self, path: Path) -> None:
        r = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(r["data"]))


@pytest.fixture
def chromium(tmp_path):
    """The DevTools HTTP port of a headless Chromium with a new empty profile."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    log_path = tmp_path / "chromium.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port_file = profile / "DevToolsActivePort"  # written once DevTools listens
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                pytest.fail(f"chromium exited with {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.fail(f"chromium DevTools not up after 60 s:\n{_tail(log_path)}")
            time.sleep(0.2)
        yield int(port_file.read_text().split()[0])
    finally:
        _stop_group(proc)


def _js_text_has(names: list[str], root: str = "document.body") -> str:
    """JS: does the innerText of `root` contain every one of `names`?"""
    return (
        f"(() => {{ const r = {root}; const t = r ? r.innerText : ''; "
        f"return {json.dumps(names)}.every(n => t.includes(n)); }})()"
    )


async def _check_ui(
    devtools_port: int, url: str, experiment_id: str, parent_id: str, children: list[str], printed_link: str
) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as r:
            targets = await r.json()
        page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with http.ws_connect(page_ws, max_msg_size=0) as ws:
            page = _Page(ws)

            # 0. The link the sweep prints opens the runs table, not MLflow 3's empty GenAI overview.
            parent_link = f"document.querySelector('a[href$=\"/runs/{parent_id}\"]')"
            await page.send("Page.navigate", url=printed_link)
            await page.wait_for(f"!!{parent_link}", "the runs table when the experiment opens")
            # 1. The experiment's runs table. Child runs are collapsed under their parent run:
            #    expand the parent's row (the button in its Run Name cell).
            await page.send("Page.navigate", url=f"{url}/#/experiments/{experiment_id}/runs")
            await page.wait_for(f"!!{parent_link}", "the sweep's parent run in the runs table")
            grid = "document.querySelector('[role=grid]')"
            if not await page.eval(_js_text_has(children, grid)):
                clicked = await page.eval(
                    f"(() => {{ const a = {parent_link}; const cell = a && a.closest('[role=gridcell]');"
                    " const b = cell && cell.querySelector('button'); if (b) b.click(); return !!b; })()"
                )
                assert clicked, "no expand button in the parent run's row"
            await page.wait_for(_js_text_has(children, grid), f"child runs {children} in the experiment's runs table")
            await asyncio.sleep(1)  # let the expanded rows finish their layout
            await page.screenshot(ARTIFACTS / "mlflow_ui.png")

            # 2. The parent run's page lists its child runs by name.
            await page.send("Page.navigate", url=f"{url}/#/experiments/{experiment_id}/runs/{parent_id}")
            await page.wait_for(
                _js_text_has(["Child runs", *children]), f"child runs {children} on the parent run's page"
            )
            await asyncio.sleep(1)
            await page.screenshot(ARTIFACTS / "mlflow_ui_parent_run.png")


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium"
)
def test_sweep_child_runs_are_listed_in_the_mlflow_ui(tmp_path, mlflow_server, chromium):
    from mlflow.tracking import MlflowClient

    # A cheap sweep (sleep engine, no engine server) logged to the server over HTTP.
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "engine=sleep",
        "engine.seconds=0.5",
        "seed=0,1,2",
        f"tracking.uri={mlflow_server}",
        f"tracking.experiment_name={EXPERIMENT}",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "-m",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "3 FINISHED" in p.stdout, p.stdout[-3000:]

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None, f"no experiment {EXPERIMENT!r} on {mlflow_server}"
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("run_kind") == "trial"]
    assert len(parents) == 1 and len(trials) == 3, [(r.info.run_name, r.data.tags.get("run_kind")) for r in runs]
    parent = parents[0]
    assert all(t.data.tags.get("mlflow.parentRunId") == parent.info.run_id for t in trials)
    assert all(t.info.status == "FINISHED" for t in trials)
    children = sorted(t.info.run_name for t in trials)
    assert all(n.startswith("trial-") for n in children), children
    # Artifacts went through the server into its --artifacts-destination.
    assert client.list_artifacts(trials[0].info.run_id), "no artifacts logged through the server"

    ARTIFACTS.mkdir(exist_ok=True)
    printed = [x for x in p.stdout.splitlines() if x.startswith("MLflow UI: ")]
    assert printed and printed[-1].endswith(f"#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning")
    link = printed[-1].removeprefix("MLflow UI: ")
    asyncio.run(_check_ui(chromium, mlflow_server, exp.experiment_id, parent.info.run_id, children, link))
    assert (ARTIFACTS / "mlflow_ui.png").stat().st_size > 10_000
