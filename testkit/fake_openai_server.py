"""A fake OpenAI-compatible streaming server: scripted TTFT/ITL, chunking, errors.

It keeps the truth: for every request (keyed by its ``X-Request-Id`` header) when it
arrived and when each chunk was actually written, so tests and benchmarks can compare what
a client measured with what happened. Use it in-process (tests) or as its own process
(benchmarks, so it does not share a GIL with the client):

    python -m testkit.fake_openai_server --port 8100 --ttft 0.02 --itl 0.01

``GET /truth`` returns the recorded truth as JSON; ``POST /truth/reset`` clears it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from testkit.fake_engine_model import EngineModel, EngineScript


@dataclass
class Script:
    ttft_s: float = 0.02
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    fail_every: int = 0  # every Nth request answers HTTP 500
    usage: bool = True
    # How the stream closes, as engines do it without per-chunk usage: "separate" sends an empty
    # chunk that only carries the finish reason (SGLang); "last_token" puts the finish reason on
    # the last token's chunk, whose text is empty (vLLM, when that token is a partial UTF-8 byte).
    closing: str = "none"
    ttft_per_in_flight_s: float = 0.0  # a latency curve: each other request in flight adds this to TTFT
    slots: int = 0  # > 0: at most this many requests generate at once, the others queue (a capacity)
    # > 0: the "engine" dies on that request, as vLLM's does under a live API server: every
    # completion from then on answers HTTP 500 (EngineDeadError) and /health answers 503.
    die_after: int = 0
    # Prompt tokens in usage: counted with this tokenizer (a model folder), times ``token_scale``
    # (2.0 plays a server whose tokenizer makes twice the tokens of ours); without a tokenizer the
    # fake does not know them and leaves prompt_tokens out of usage.
    tokenizer: str | None = None
    token_scale: float = 1.0
    served: tuple[str, ...] = ()  # names listed by GET /v1/models (none: 404, a gateway without it)
    tokenize_endpoint: bool = False  # POST /tokenize as vLLM's (needs a tokenizer)
    ignore_max_tokens: int = 0  # > 0: every stream has this many tokens, whatever was asked
    burst: int = 1  # > 1: chunks go out this many at a time, in one write (a server that batches its output)
    # A scripted engine (testkit/fake_engine_model.py): queueing for ``slots`` and KV, prefills that
    # stall every stream, preemptions, pauses; /metrics then answers vLLM's page of its state.
    engine: EngineScript | dict | None = None
    # > 0: each request's pace (its TTFT and ITL) times a log-normal factor of this sigma, drawn
    # afresh (unseeded): one configuration measures differently from run to run, as on a real machine
    jitter: float = 0.0
    # > 0: the whole server's pace times a log-normal factor of this sigma, drawn afresh every
    # ``drift_every_s``: the machine's state that changes between runs (what a race measures)
    drift: float = 0.0
    drift_every_s: float = 2.0


def usage_of(prompt_tokens: int | None, completion: int) -> dict[str, int]:
    usage = {"completion_tokens": completion}
    if prompt_tokens is not None:
        usage.update(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens + completion)
    return usage


@dataclass
class Truth:
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    arrivals: list[float] = field(default_factory=list)
    chunk_sent: list[float] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    by_request: dict[str, dict[str, object]] = field(default_factory=dict)


class FakeOpenAIServer:
    def __init__(self, script: Script | None = None, port: int = 0) -> None:
        self.script = script or Script()
        engine = self.script.engine
        if isinstance(engine, dict):  # from JSON (a server in its own process)
            engine = EngineScript(**{**engine, "pauses": tuple(tuple(p) for p in engine.get("pauses", ()))})
        self.model = EngineModel(engine, self.script.slots) if engine is not None else None
        self._slots: asyncio.Semaphore | None = None
        self.truth = Truth()
        self.port = port
        self._drift_at, self._drift_factor = -math.inf, 1.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._tok: Any = None
        if self.script.tokenizer:
            # the load generator's own loader: tokenizer.json through `tokenizers` where that is
            # what transformers would read (an isolated fake server starts in 0.5 s, not the 8 s
            # of importing transformers), transformers where it is not
            from orchestrator.loadgen.prompts import load_tokenizer

            self._tok = load_tokenizer(self.script.tokenizer)

    def _drift(self) -> float:
        """The server's pace factor now (``Script.drift``): redrawn every ``drift_every_s``."""
        if not self.script.drift:
            return 1.0
        now = time.monotonic()
        if now - self._drift_at >= self.script.drift_every_s:
            self._drift_at, self._drift_factor = now, math.exp(random.gauss(0.0, self.script.drift))
        return self._drift_factor

    def count_tokens(self, text: str) -> int | None:
        if self._tok is None:
            return None
        return round(len(self._tok.encode(text, add_special_tokens=False)) * self.script.token_scale)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.perf_counter()
        body = await request.json()
        t = self.truth
        t.requests += 1
        t.arrivals.append(arrival)
        t.paths.add(request.path)
        chat = request.path.endswith("/chat/completions")
        rid = request.headers.get("X-Request-Id", f"anon-{t.requests}")
        chunks: list[float] = []
        t.by_request[rid] = {"arrival": arrival, "chunks": chunks}
        if self._dead():
            return web.json_response(
                {
                    "error": {
                        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "type": "EngineDeadError",
                    }
                },
                status=500,
            )
        if self.script.fail_every and t.requests % self.script.fail_every == 0:
            return web.json_response({"error": {"message": "scripted failure"}}, status=500)
        t.by_request[rid]["kv_transfer_params"] = body.get("kv_transfer_params")
        t.by_request[rid]["stream"] = body.get("stream", False)
        if not body.get("stream", False):  # a non-streaming answer (a P/D proxy's prefill leg)
            await asyncio.sleep(self.script.ttft_s)
            answer: dict[str, object] = {
                "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
                answer["kv_transfer_params"] = {
                    "do_remote_prefill": True,
                    "remote_engine_id": f"fake-{self.port}",
                    "remote_block_ids": [0, 1],
                    "remote_host": "127.0.0.1",
                    "remote_port": self.port,
                }
            return web.json_response(answer)
        if self.model is not None:
            return await self._stream(request, body, arrival, rid, chunks, chat)
        if self.script.slots:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.script.slots)
            async with self._slots:  # queued until a slot frees: its wait counts in its TTFT
                return await self._stream(request, body, arrival, rid, chunks, chat)
        return await self._stream(request, body, arrival, rid, chunks, chat)

    async def _stream(
        self, request: web.Request, body: dict, arrival: float, rid: str, chunks: list[float], chat: bool
    ) -> web.StreamResponse:
        t = self.truth
        t.in_flight += 1
        t.max_in_flight = max(t.max_in_flight, t.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = int(body.get("max_completion_tokens" if chat else "max_tokens", 16) or 16)
            messages = body["messages"] if chat else [{"role": "user", "content": body.get("prompt", "")}]
            t.by_request[rid]["messages"] = messages
            counts = [self.count_tokens(str(m["content"])) for m in messages]
            prompt_tokens = None if None in counts else sum(c for c in counts if c is not None)
            if self.script.ignore_max_tokens:
                n = self.script.ignore_max_tokens
            model, number = self.model, t.requests
            need = 0
            if model is not None:  # queue for a slot and KV, then the prompt's prefill
                tokens = prompt_tokens if prompt_tokens is not None else len(str(messages[-1]["content"]).split())
                need = tokens + n
                queued = await model.admit(need)
                admitted = time.perf_counter()
                await model.prefill(tokens)
            # Deadlines from the arrival, not sleeps in a row: a late wake-up does not push
            # every later chunk back (the truth records when chunks really went out).
            start = max(arrival, time.perf_counter()) if self.script.slots or model is not None else arrival
            pace = math.exp(random.gauss(0.0, self.script.jitter)) if self.script.jitter else 1.0
            pace *= self._drift()
            due = start + pace * self.script.ttft_s + self.script.ttft_per_in_flight_s * (t.in_flight - 1)
            sent = 0
            pending: list[bytes] = []
            while sent < n:
                if model is not None:  # a prefill or a pause holds the engine: this stream stalls
                    if await model.step():
                        due = max(due, time.perf_counter())
                    if sent == n // 2 and sent and model.preempted(number):
                        model.preemptions += 1
                        await asyncio.sleep(model.script.preempt_s)
                        due = max(due, time.perf_counter())
                # never early: uvloop's timers run on a loop time cached at the start of the
                # iteration, so on a busy machine one sleep can end before its deadline
                while (delay := due - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                k = min(self.script.tokens_per_chunk, n - sent)
                text = "".join(f"<{rid}:{sent + j}>" for j in range(k))  # a reply tests can recognise
                sent += k
                last = sent >= n
                if last and self.script.closing == "last_token":
                    text = ""
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                finish = "length" if last and self.script.closing == "last_token" else None
                chunk = {"choices": [{**choice, "finish_reason": finish}]}
                if self.script.usage:
                    chunk["usage"] = usage_of(prompt_tokens, sent)
                now = time.perf_counter()  # when the chunk is handed to the socket: no client sees it earlier
                if model is not None:
                    model.generation_tokens += k
                    if not chunks:
                        model.hist["queue"].observe(queued)
                        model.hist["prefill"].observe(now - admitted)
                        model.hist["ttft"].observe(now - arrival)
                    else:
                        model.hist["itl"].observe(now - chunks[-1])
                chunks.append(now)
                t.chunk_sent.append(now)
                pending.append(f"data: {json.dumps(chunk)}\n\n".encode())
                if len(pending) >= self.script.burst or sent >= n:
                    await resp.write(b"".join(pending))
                    pending.clear()
                due += pace * self.script.itl_s
            if self.script.closing == "separate":
                empty = {"index": 0, "delta": {"content": ""}} if chat else {"index": 0, "text": ""}
                await resp.write(
                    f"data: {json.dumps({'choices': [{**empty, 'finish_reason': 'length'}]})}\n\n".encode()
                )
            final = {"choices": [], "usage": usage_of(prompt_tokens, sent)}
            await resp.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            if model is not None:
                model.hist["e2e"].observe(time.perf_counter() - arrival)
            return resp
        finally:
            t.in_flight -= 1
            if model is not None and need:
                await model.release(need)

    async def _models(self, request: web.Request) -> web.Response:
        if not self.script.served:
            return web.Response(status=404)
        return web.json_response({"object": "list", "data": [{"id": n, "object": "model"} for n in self.script.served]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self.script.tokenize_endpoint or self._tok is None:
            return web.Response(status=404)
        body = await request.json()
        return web.json_response({"count": self.count_tokens(body["prompt"]), "max_model_len": 4096})

    def _dead(self) -> bool:
        return bool(self.script.die_after) and self.truth.requests >= self.script.die_after

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503) if self._dead() else web.Response(text="ok")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.model is not None:
            return web.Response(text=self.model.metrics_page())
        return web.Response(text=f"# TYPE fake:requests counter\nfake:requests_total {self.truth.requests}\n")

    async def _get_truth(self, request: web.Request) -> web.Response:
        t = self.truth
        return web.json_response(
            {
                "max_in_flight": t.max_in_flight,
                "requests": t.requests,
                "paths": sorted(t.paths),
                "arrivals": t.arrivals,
                "chunk_sent": t.chunk_sent,
                "by_request": t.by_request,
            }
        )

    async def _reset_truth(self, request: web.Request) -> web.Response:
        self.truth = Truth()
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/truth", self._get_truth)
        app.router.add_post("/truth/reset", self._reset_truth)
        return app

    def start(self) -> FakeOpenAIServer:
        """Serve from a background thread (for tests in the same process)."""
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._runner = web.AppRunner(self.app(), access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)  # type: ignore[union-attr]
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeServerProcess:
    """The fake server in its own process (no GIL shared with the client being measured), started
    with ``args`` (``--ttft 0.02 --slots 8 ...``); ``url`` is its base URL. Benchmarks use it.
    ``command``: another server with the same interface (``--port N``, ``/health``, ``/truth``),
    e.g. ``benchmarks/truth_server.js`` under node."""

    START_TIMEOUT_S = 90.0

    def __init__(self, *args: str, command: Sequence[str] = ()) -> None:
        import subprocess
        import sys
        import tempfile
        import urllib.request
        from pathlib import Path

        from orchestrator.engines.ports import free_port

        self.port = free_port()  # below the ephemeral range: nothing takes it while the server imports
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [*(command or (sys.executable, "-m", "testkit.fake_openai_server")), "--port", str(self.port), *args],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        # A slow start (a tokenizer that needs transformers imports it: 7.5 s alone here, more
        # beside a busy test run; a 10 s bound once failed 4 cases) is waited for, or its exit.
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        self._err.seek(0)
        tail = self._err.read()[-2000:].decode(errors="replace")
        self.stop()
        raise RuntimeError(f"fake server did not start (exit {self.proc.returncode}): {tail}")

    def reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(self.url + "/truth/reset", method="POST"), timeout=10)

    def truth_json(self) -> dict[str, object]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/truth", timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._err.close()

    def __enter__(self) -> FakeServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class IsolatedFakeServer(FakeServerProcess):
    """:class:`FakeOpenAIServer`'s interface (``base_url``, ``truth``) on a server in its own
    process, for tests that judge the client's timing: an in-process server shares the client's
    GIL, so on a busy machine its writes wait for the client and the truth itself is late. Both
    processes stamp times with the same system-wide monotonic clock."""

    def __init__(self, script: Script | None = None) -> None:
        from dataclasses import asdict

        super().__init__("--script", json.dumps(asdict(script or Script())))

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def truth(self) -> Truth:
        data = self.truth_json()
        return Truth(
            max_in_flight=int(data["max_in_flight"]),  # type: ignore[call-overload]
            requests=int(data["requests"]),  # type: ignore[call-overload]
            arrivals=list(data["arrivals"]),  # type: ignore[call-overload]
            chunk_sent=list(data["chunk_sent"]),  # type: ignore[call-overload]
            paths=set(data["paths"]),  # type: ignore[call-overload]
            by_request=dict(data["by_request"]),  # type: ignore[call-overload]
        )

    def __enter__(self) -> IsolatedFakeServer:
        return self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft", type=float, default=0.02)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--slots", type=int, default=0, help="at most this many requests generate at once")
    ap.add_argument("--ttft-per-in-flight", type=float, default=0.0, help="TTFT added per other request in flight")
    ap.add_argument("--script", default=None, help="a whole Script as JSON (the other timing flags are ignored)")
    a = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    script = (
        Script(**{**json.loads(a.script), "served": tuple(json.loads(a.script).get("served", ()))})
        if a.script
        else Script(
            ttft_s=a.ttft,
            itl_s=a.itl,
            tokens_per_chunk=a.tokens_per_chunk,
            slots=a.slots,
            ttft_per_in_flight_s=a.ttft_per_in_flight,
        )
    )
    server = FakeOpenAIServer(script, a.port)
    web.run_app(server.app(), host="127.0.0.1", port=a.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
