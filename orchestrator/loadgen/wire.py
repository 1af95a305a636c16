"""The streaming client's own HTTP/1.1 for plain-HTTP endpoints: each response's body is parsed
where the socket hands it over (``data_received``), without waking a task per chunk.

Through aiohttp every token chunk woke the request's task: the protocol fed the payload queue,
resolved its waiter, and the task read the queue back under a timer context, about a third of
the client's CPU per token (docs/benchmarks.md, "peers"). Here one read of the socket is one
call: its bytes are un-chunked and handed to the stream's reader with one instant, and the
request's task wakes twice, for the status line and for the end of the body.

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

now = time.perf_counter  # the client's clock (loadgen.client.now)

MAX_HEADER_BYTES = 65536
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
        self.on_body: Callable[[float, bytes], None] | None = None
        self.pending: list[tuple[float, bytes]] = []  # body read before a reader was set
        self.buf = b""
        self.state = "head"  # head, size, data, crlf, trailer, length, close, end
        self.remaining = 0
        self.keep_alive = True
        self.received = 0  # bytes of this answer

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
        buf = self.buf + data if self.buf else data
        body: list[bytes] = []
        try:
            self.buf = self._parse(buf, body)
            if body:
                if self.on_body is not None:
                    self.on_body(t, b"".join(body))
                else:
                    self.pending.append((t, b"".join(body)))
        except Exception as exc:  # a bad answer, or a stream its reader cannot read: this request fails so
            self._fail(exc)
            self.abort()
            return
        if self.state == "end":
            self._finish(self.keep_alive)

    # parsing ---------------------------------------------------------------------------------

    def _parse(self, buf: bytes, body: list[bytes]) -> bytes:
        while buf:
            state = self.state
            if state == "head":
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise WireError("HTTP headers too long")
                    return buf
                self._head(buf[:end].decode("latin-1"))
                buf = buf[end + 4 :]
            elif state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    return buf
                try:
                    size = int(buf[:end].split(b";", 1)[0], 16)
                except ValueError:
                    raise WireError(f"bad chunk size {buf[:end][:40]!r}") from None
                buf = buf[end + 2 :]
                self.remaining, self.state = size, ("data" if size else "trailer")
            elif state in ("data", "length"):  # a chunk's payload, or a body of known length
                take = buf[: self.remaining]
                body.append(take)
                self.remaining -= len(take)
                buf = buf[len(take) :]
                if not self.remaining:
                    self.state = "crlf" if state == "data" else "end"
            elif state == "crlf":
                if len(buf) < 2:
                    return buf
                buf, self.state = buf[2:], "size"
            elif state == "trailer":
                end = buf.find(b"\r\n")
                if end < 0:
                    return buf
                buf, line = buf[end + 2 :], buf[:end]
                if not line:
                    self.state = "end"
            elif state == "close":
                body.append(buf)
                buf = b""
            else:  # "end": bytes after the answer (none expected)
                raise WireError("bytes after the end of the answer")
        return buf

    def _head(self, text: str) -> None:
        lines = text.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise WireError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise WireError(f"bad status line {lines[0][:80]!r}") from None
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        self.keep_alive = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        if status in (204, 304):
            self.state = "end"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "size"
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise WireError(f"bad Content-Length {headers['content-length'][:40]!r}") from None
            self.state = "length" if self.remaining else "end"
        else:
            self.state, self.keep_alive = "close", False
        if not self.head.done():
            self.head.set_result((status, headers))

    def _finish(self, keep_alive: bool) -> None:
        if not self.done.done():
            self.done.set_result(keep_alive)

    # use ---------------------------------------------------------------------------------------

    def read_body(self, reader: Callable[[float, bytes], None]) -> None:
        """Hand the answer's body to ``reader`` (what came with the headers first, with its instant)."""
        self.on_body = reader
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

    async def open(self, host: str, port: int, n: int) -> None:
        """Have at least ``n`` idle connections to (host, port) (connection set-up is not TTFT)."""
        idle = self._idle.setdefault((host, port), [])
        idle[:] = [c for c in idle if not c.lost and now() - c.idle_since < IDLE_REUSE_S]
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
