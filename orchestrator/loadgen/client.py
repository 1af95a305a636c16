"""The streaming client's connections: :class:`HttpSession` owns both transports, the
client's own HTTP/1.1 for plain-HTTP endpoints (:mod:`orchestrator.loadgen.wire`, which hands each
read to the stream's reader where the socket delivers it) and aiohttp for HTTPS ones
(``readany``: everything buffered since the last read), opened and closed together.

What is sent is in :mod:`orchestrator.loadgen.api`, how the answer is read in
:mod:`orchestrator.loadgen.sse`. Errors become records with ``status="error"``, never
exceptions. Kernel receive timestamps (``SO_TIMESTAMPNS``) would date each segment, but asyncio's
transports read with ``recv_into``, which drops them: one instant per read is what a client sees.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import aiohttp

from orchestrator.loadgen.api import API_PATHS, DELTAS, PAYLOADS, Endpoint, PlannedRequest, Turn
from orchestrator.loadgen.sse import SseStream
from orchestrator.loadgen.wire import WireError, WireSession
from orchestrator.metrics.records import STATUS_ERROR, RequestRecord

log = logging.getLogger(__name__)

__all__ = ["Endpoint", "HttpSession", "PlannedRequest", "Turn", "now"]

now = time.perf_counter  # monotonic, high resolution


def trace_config() -> aiohttp.TraceConfig:
    """Stamps ``sent_s`` when the request body has actually been written to the socket, so
    time spent queued inside the client (serialising, waiting for the loop) is not charged
    to the server's TTFT. It shows up as send lag instead."""

    async def on_chunk_sent(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        record = (ctx.trace_request_ctx or {}).get("record")
        if record is not None:
            record.sent_s = now()

    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(on_chunk_sent)
    return tc


class HttpSession:
    """The client's connections to its servers, on the event loop that opened them
    (:meth:`open`): pooled keep-alive connections of its own HTTP/1.1 for ``http://`` and an
    aiohttp session (unlimited pool, send instants stamped on the wire) for ``https://``."""

    def __init__(self, http: aiohttp.ClientSession, wire: WireSession) -> None:
        self.http, self.wire = http, wire

    @classmethod
    async def open(cls) -> HttpSession:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
        return cls(aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()]), WireSession())

    async def close(self) -> None:
        self.wire.close()
        await self.http.close()

    async def prewarm(self, endpoint: Endpoint, connections: int) -> None:
        """Open ``connections`` keep-alive connections before a point, so connection set-up is not
        measured as TTFT. Any answer (even 404/401) leaves a pooled connection behind."""
        url = urlsplit(endpoint.base_url)
        if url.scheme == "http" and url.hostname:
            try:
                await self.wire.open(url.hostname, url.port or 80, connections)
            except OSError as exc:  # best effort: the first requests then open their own (in their TTFT)
                log.warning("could not open %d connection(s) ahead of the point: %s", connections, exc)
            return

        async def one() -> None:
            try:
                async with self.http.get(
                    endpoint.base_url + "/v1/models",
                    headers=endpoint.headers(),
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    await resp.read()
            except Exception as exc:  # best effort: a refused warm-up changes nothing about the measurement
                log.debug("warm-up request to %s/v1/models: %s", endpoint.base_url, exc)

        await asyncio.gather(*(one() for _ in range(connections)))

    async def connect_ahead(self, endpoint: Endpoint, connections: int, at: float) -> None:
        """Have ``connections`` idle keep-alive connections that can still be used at ``at`` (a
        ``now()`` instant a little ahead: sends the point will make then), opening what is
        missing now. Plain HTTP only: aiohttp (HTTPS) keeps its own pool."""
        url = urlsplit(endpoint.base_url)
        if url.scheme == "http" and url.hostname and connections > 0:
            try:
                await self.wire.open(url.hostname, url.port or 80, connections, at)
            except OSError:  # the send will open its own and say what failed
                pass

    async def stream(
        self,
        endpoint: Endpoint,
        req: PlannedRequest,
        record: RequestRecord,
        api: str = "completions",
        ignore_eos: bool = True,
        timeout_s: float = 300.0,
        usage_per_chunk: bool = False,
        text_out: list[str] | None = None,
    ) -> RequestRecord:
        """Send one streaming request; fill ``record`` (``sent_s`` is set here) and return it.

        ``text_out``, when given, receives the streamed text (a conversation resends it)."""
        url = endpoint.base_url + API_PATHS[api]
        body = json.dumps(PAYLOADS[api](endpoint, req, ignore_eos, usage_per_chunk)).encode()
        stream = SseStream(record, DELTAS[api], text_out)
        record.sent_s = now()  # refined by trace_config() once the body is on the wire
        parts = urlsplit(url)
        exchange = _Exchange(body, {**endpoint.headers(), "X-Request-Id": f"lab-{req.request_id}"}, record, stream)
        try:
            if parts.scheme == "http" and parts.hostname:
                await _stream_wire(self.wire, parts, exchange, timeout_s)
            else:
                await _stream_aiohttp(self.http, url, exchange, timeout_s)
        except asyncio.CancelledError:
            record.status, record.error = STATUS_ERROR, "cancelled"
            raise
        except Exception as exc:  # any failure of one request is data about that request, never a crash
            record.status, record.error = STATUS_ERROR, f"{type(exc).__name__}: {exc}"[:500]
        finally:
            record.done_s = now()
        return record


@dataclass(frozen=True)
class _Exchange:
    """One request's body and headers, and where its answer goes."""

    body: bytes
    headers: dict[str, str]  # the endpoint's and the request id
    record: RequestRecord
    stream: SseStream


async def _stream_aiohttp(session: aiohttp.ClientSession, url: str, x: _Exchange, timeout_s: float) -> None:
    """One streaming request through aiohttp (HTTPS endpoints): each ``readany`` (everything
    buffered since the last read) reaches ``x.stream`` with one instant."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    record = x.record
    async with session.post(
        url, data=x.body, headers=x.headers, timeout=timeout, trace_request_ctx={"record": record}
    ) as resp:
        record.http_status = resp.status
        if resp.status != 200:
            answer = (await resp.text())[:500]
            record.status, record.error = STATUS_ERROR, f"HTTP {resp.status}: {answer}"
            return
        while data := await resp.content.readany():  # read to the end: the connection goes back to the pool
            x.stream.feed(now(), data)
        x.stream.end()


async def _stream_wire(wire: WireSession, url: SplitResult, x: _Exchange, timeout_s: float) -> None:
    """One streaming request over the client's own HTTP/1.1 (:mod:`orchestrator.loadgen.wire`):
    the body's lines reach ``x.stream`` from the protocol's ``data_received``, one instant per read."""
    host, port = url.hostname or "", url.port or 80
    headers = {"Content-Type": "application/json", **x.headers}
    target = url.path + (f"?{url.query}" if url.query else "")
    name = f"[{host}]" if ":" in host else host  # never the URL's user:password
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {name}{f':{url.port}' if url.port else ''}\r\n"
        f"Content-Length: {len(x.body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    ).encode("latin-1")
    deadline = now() + timeout_s
    try:
        async with asyncio.timeout(timeout_s):  # the connection's set-up too
            await _send_and_read(wire, host, port, head + x.body, x.record, x.stream, deadline)
    except TimeoutError:
        raise TimeoutError(f"no complete answer within workload.request_timeout_s ({timeout_s:g} s)") from None


async def _send_and_read(
    wire: WireSession,
    host: str,
    port: int,
    request: bytes,
    record: RequestRecord,
    stream: SseStream,
    deadline: float,
) -> None:
    for attempt in range(2):
        conn, pooled = await wire.acquire(host, port)
        reuse = False
        try:
            conn.send(request)
            record.sent_s = now()  # the request is in the socket
            try:
                status, _ = await asyncio.wait_for(conn.head, max(deadline - now(), 0.001))
            except WireError:
                if pooled and attempt == 0 and conn.lost_on_arrival():
                    continue  # the server had closed the idle connection: once more on a new one
                raise
            record.http_status = status
            if status != 200:
                answer: list[bytes] = []

                def keep(t: float, data: bytes, into: list[bytes] = answer) -> None:
                    into.append(data)

                conn.read_body(keep)
                reuse = await asyncio.wait_for(conn.done, max(deadline - now(), 0.001))
                text = b"".join(answer).decode(errors="replace")[:500]
                record.status, record.error = STATUS_ERROR, f"HTTP {status}: {text}"
                return
            conn.read_body(stream.feed)
            reuse = await asyncio.wait_for(conn.done, max(deadline - now(), 0.001))
            stream.end()
            return
        finally:
            wire.release(host, port, conn, reuse)
