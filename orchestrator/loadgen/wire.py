"""The streaming client's own HTTP/1.1 for plain-HTTP endpoints: each response's body is parsed
where the socket hands it over (``data_received``), without waking a task per chunk.

Through aiohttp every token chunk woke the request's task: the protocol fed the payload queue,
resolved its waiter, and the task read the queue back under a timer context, about a third of
the client's CPU per token (docs/benchmarks.md, "peers"). Here one read of the socket is one
call: its bytes are un-chunked and handed to the stream's reader with one instant, and the
request's task wakes twice, for the status line and for the end of the body.

The answer's framing (status line, headers, chunked or sized bodies) is parsed by ``httptools``
(llhttp, the parser uvicorn serves with), fed from ``data_received``; its callbacks collect the
read's body pieces, which reach the reader as one piece with the read's instant.

Keep-alive connections are pooled per host and port; a pooled connection the server closed
while idle is retried once on a new one when nothing of the answer arrived. HTTPS endpoints keep
using aiohttp.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import httptools

now = time.perf_counter  # the client's clock (loadgen.client.now)

# A pooled connection idle longer than this is not reused: servers close idle keep-alive
# connections (uvicorn after 5 s), and a POST on one they are closing may be lost or, worse,
# reach them and be sent again.
IDLE_REUSE_S = 4.0
# A request is sent again on a new connection only when its pooled connection was lost this soon
# after the send with nothing answered: the server had closed it before the request arrived.
RETRY_WITHIN_S = 0.05


class WireError(Exception):
    """The connection failed or the answer was not HTTP as expected."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.transport: Any = None  # asyncio's or uvloop's (not an asyncio.Transport subclass)
        self.lost = False
        self.lost_at: float | None = None
        self.idle_since = self.sent_at = now()
        self._reset()

    def _reset(self) -> None:
        self.head: asyncio.Future[tuple[int, dict[str, str]]] = self.loop.create_future()
        self.done: asyncio.Future[bool] = self.loop.create_future()
        self.reader: Callable[[float, bytes], None] | None = None
        self.pending: list[tuple[float, bytes]] = []  # body read before a reader was set
        self.parser = httptools.HttpResponseParser(self)
        self.state = "head"  # head, body, close (a body that ends with the connection), end
        self.keep_alive = True
        self.received = 0  # bytes of this answer
        self._headers: dict[str, str] = {}
        self._interim = False  # parsing a 1xx answer (100 Continue): the real one follows
        self._body: list[bytes] = []  # the body pieces of the read being parsed

    # asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.lost_at = True, now()
        if self.state == "close" and exc is None:  # a body that ends with the connection
            self.state = "end"
            self._finish(False)
            return
        self._fail(WireError(f"connection lost{f': {exc}' if exc else ''} ({self.received} bytes of the answer)"))

    def _fail(self, exc: BaseException) -> None:
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting (an unused or abandoned connection)

    def data_received(self, data: bytes) -> None:
        t = now()
        self.received += len(data)
        try:
            if self.state == "end":
                raise WireError("bytes after the end of the answer")
            self.parser.feed_data(data)
            if self._body:
                body = b"".join(self._body)
                self._body.clear()
                if self.reader is not None:
                    self.reader(t, body)
                else:
                    self.pending.append((t, body))
        except Exception as exc:  # a bad answer, or a stream its reader cannot read: this request fails so
            self._fail(exc if not isinstance(exc, httptools.HttpParserError) else WireError(f"bad HTTP answer: {exc}"))
            self.abort()
            return
        if self.state == "end":
            self._finish(self.keep_alive)

    # httptools' callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._interim = True
            return
        headers = self._headers
        self.keep_alive = self.parser.should_keep_alive()
        framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        if framed or status in (204, 304):
            self.state = "body"
        else:  # the body ends with the connection
            self.state, self.keep_alive = "close", False
        if not self.head.done():
            self.head.set_result((status, headers))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.state = "end"

    def _finish(self, keep_alive: bool) -> None:
        if not self.done.done():
            self.done.set_result(keep_alive)

    # use ---------------------------------------------------------------------------------------

    def read_body(self, reader: Callable[[float, bytes], None]) -> None:
        """Hand the answer's body to ``reader`` (what came with the headers first, with its instant)."""
        self.reader = reader
        pending, self.pending = self.pending, []
        for t, data in pending:
            reader(t, data)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.sent_at = now()
        self.transport.write(data)

    def lost_on_arrival(self) -> bool:
        """Lost just after a request was sent on it, nothing answered: closed by the server
        before the request arrived (safe to send it again on a new connection)."""
        return self.received == 0 and self.lost_at is not None and self.lost_at - self.sent_at < RETRY_WITHIN_S

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()


class WireSession:
    """Keep-alive connections per (host, port), for the streaming client."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._all: set[_Conn] = set()

    async def _new(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, host, port)
        self._all.add(conn)
        return conn

    async def acquire(self, host: str, port: int) -> tuple[_Conn, bool]:
        """(a connection, whether it was pooled)."""
        idle = self._idle.get((host, port), [])
        while idle:
            conn = idle.pop()
            fresh = now() - conn.idle_since < IDLE_REUSE_S
            if fresh and not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
            conn.abort()
            self._all.discard(conn)
        return await self._new(host, port), False

    def release(self, host: str, port: int, conn: _Conn, reuse: bool) -> None:
        if reuse and not conn.lost:
            conn.idle_since = now()
            self._idle.setdefault((host, port), []).append(conn)
        else:
            conn.abort()
            self._all.discard(conn)

    async def open(self, host: str, port: int, n: int, at: float | None = None) -> None:
        """Have at least ``n`` idle connections to (host, port) that :meth:`acquire` will still
        reuse at ``at`` (a ``now()`` instant; default now): connection set-up is not TTFT, nor
        send lag. Idle ones that will be too old by then are closed."""
        idle = self._idle.setdefault((host, port), [])
        when = now() if at is None else max(at, now())
        keep = [c for c in idle if not c.lost and when - c.idle_since < IDLE_REUSE_S]
        for conn in set(idle).difference(keep):
            conn.abort()
        idle[:] = keep
        self._all = {c for c in self._all if not c.lost}
        missing = n - len(idle)
        if missing > 0:
            conns = await asyncio.gather(*(self._new(host, port) for _ in range(missing)), return_exceptions=True)
            idle.extend(c for c in conns if isinstance(c, _Conn))

    def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
