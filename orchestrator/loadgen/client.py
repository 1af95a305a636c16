"""The streaming client: one SSE/timing loop; per-API payload and delta functions.

Every content chunk's arrival instant is recorded with the number of output tokens it
carries (from the server's continuous usage stats when present, so multi-token chunks
count right). Errors become records with ``status="error"``, never exceptions.

The body is read as it comes off the socket, not line by line: one clock reading per read,
however many events it holds. Plain-HTTP endpoints go through the client's own HTTP/1.1
(:mod:`orchestrator.loadgen.wire`), which hands each read to the stream's reader where the socket
delivers it; HTTPS ones through aiohttp (``readany``: everything buffered since the last read). A read that holds several token chunks is a coalesced read: the chunks are stamped with
the same instant (the first ones arrived earlier, unseen), so their gaps say nothing about the
server; each record counts them (``coalesced_chunks``) and a point where too many chunks came so
says its ITL is the client's (``validity.max_coalesced_share``). Kernel receive timestamps
(``SO_TIMESTAMPNS``) would date each segment, but asyncio's transports read with ``recv_into``,
which drops them.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import aiohttp

from orchestrator.loadgen.wire import WireError, WireSession
from orchestrator.metrics.records import STATUS_ERROR, RequestRecord

_loads: Callable[[bytes], Any]
try:  # ~4x faster per chunk than json (a dependency; json is the fallback)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

now = time.perf_counter  # monotonic, high resolution


@dataclass(frozen=True)
class Endpoint:
    """What the load generator needs from a server: a URL and a model name. Nothing engine-specific."""

    base_url: str
    model: str
    api_key: str | None = None  # sent as a bearer header; never logged

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


@dataclass(frozen=True)
class Turn:
    """A later user turn of a conversation, planned in advance (its reply is not)."""

    request_id: int
    text: str
    input_tokens: int  # new tokens of this turn (the resent history comes on top)
    output_tokens: int


@dataclass(frozen=True)
class PlannedRequest:
    """One request, or the first turn of a conversation when ``turns`` is not empty.

    ``history`` holds the (role, text) messages resent before ``prompt``: a later turn is
    sent as the conversation so far (user turns and the server's actual replies) plus its
    own text.
    """

    request_id: int
    request_class: str
    prompt: str
    input_tokens: int
    output_tokens: int
    turns: tuple[Turn, ...] = ()
    think_time_s: float = 0.0
    history: tuple[tuple[str, str], ...] = ()

    def messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.history] + [{"role": "user", "content": self.prompt}]

    def full_prompt(self) -> str:
        """The completions prompt: history and this turn, one message per line."""
        return "\n".join([c for _, c in self.history] + [self.prompt])


def completions_payload(
    endpoint: Endpoint, req: PlannedRequest, ignore_eos: bool, usage_per_chunk: bool = False
) -> dict[str, Any]:
    options: dict[str, bool] = {"include_usage": True}
    if usage_per_chunk:  # vLLM extension; costs the server work on every token
        options["continuous_usage_stats"] = True
    return {
        "model": endpoint.model,
        "prompt": req.full_prompt() if req.history else req.prompt,
        "max_tokens": req.output_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": options,
        "ignore_eos": ignore_eos,
    }


def completions_delta(chunk: dict[str, Any]) -> str | None:
    """Text of a completions chunk, or None if it carries no choice (e.g. the final usage chunk)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    return choices[0].get("text") or ""


def chat_payload(
    endpoint: Endpoint, req: PlannedRequest, ignore_eos: bool, usage_per_chunk: bool = False
) -> dict[str, Any]:
    payload = completions_payload(endpoint, req, ignore_eos, usage_per_chunk)
    del payload["prompt"], payload["max_tokens"]
    payload["messages"] = req.messages()
    payload["max_completion_tokens"] = req.output_tokens
    return payload


def chat_delta(chunk: dict[str, Any]) -> str | None:
    """Content of a chat chunk's delta, or None if it carries no choice (the final usage chunk)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or ""


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


_WIRES: weakref.WeakKeyDictionary[aiohttp.ClientSession, WireSession] = weakref.WeakKeyDictionary()


def wire_of(session: aiohttp.ClientSession) -> WireSession:
    """The plain-HTTP connections that go with an aiohttp session (streams to http:// endpoints)."""
    wire = _WIRES.get(session)
    if wire is None:
        wire = _WIRES[session] = WireSession()
    return wire


async def close_session(session: aiohttp.ClientSession) -> None:
    wire = _WIRES.pop(session, None)
    if wire is not None:
        wire.close()
    await session.close()


async def prewarm(session: aiohttp.ClientSession, endpoint: Endpoint, connections: int) -> None:
    """Open ``connections`` keep-alive connections before a point, so connection set-up is not
    measured as TTFT. Any answer (even 404/401) leaves a pooled connection behind."""
    url = urlsplit(endpoint.base_url)
    if url.scheme == "http" and url.hostname:
        try:
            await wire_of(session).open(url.hostname, url.port or 80, connections)
        except OSError:  # best effort, as below
            pass
        return

    async def one() -> None:
        try:
            async with session.get(
                endpoint.base_url + "/v1/models", headers=endpoint.headers(), timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                await resp.read()
        except Exception:  # best effort: a refused warm-up changes nothing about the measurement
            pass

    await asyncio.gather(*(one() for _ in range(connections)))


API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PAYLOADS = {"completions": completions_payload, "chat": chat_payload}
DELTAS = {"completions": completions_delta, "chat": chat_delta}


async def stream_request(
    session: aiohttp.ClientSession,
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
    stream = _Stream(record, DELTAS[api], text_out)
    record.sent_s = now()  # refined by trace_config() once the body is on the wire
    parts = urlsplit(url)
    try:
        if parts.scheme == "http" and parts.hostname:
            await _stream_wire(wire_of(session), parts, endpoint, req, record, body, stream, timeout_s)
        else:
            await _stream_aiohttp(session, url, endpoint, req, record, body, stream, timeout_s)
    except asyncio.CancelledError:
        record.status, record.error = STATUS_ERROR, "cancelled"
        raise
    except Exception as exc:  # any failure of one request is data about that request, never a crash
        record.status, record.error = STATUS_ERROR, f"{type(exc).__name__}: {exc}"[:500]
    finally:
        record.done_s = now()
    return record


async def _stream_aiohttp(
    session: aiohttp.ClientSession,
    url: str,
    endpoint: Endpoint,
    req: PlannedRequest,
    record: RequestRecord,
    body: bytes,
    stream: _Stream,
    timeout_s: float,
) -> None:
    """One streaming request through aiohttp (HTTPS endpoints): each ``readany`` (everything
    buffered since the last read) reaches ``stream`` with one instant."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {**endpoint.headers(), "X-Request-Id": f"lab-{req.request_id}"}
    async with session.post(
        url, data=body, headers=headers, timeout=timeout, trace_request_ctx={"record": record}
    ) as resp:
        record.http_status = resp.status
        if resp.status != 200:
            answer = (await resp.text())[:500]
            record.status, record.error = STATUS_ERROR, f"HTTP {resp.status}: {answer}"
            return
        while data := await resp.content.readany():  # read to the end: the connection goes back to the pool
            stream.feed(now(), data)
        stream.end()


async def _stream_wire(
    wire: WireSession,
    url: SplitResult,
    endpoint: Endpoint,
    req: PlannedRequest,
    record: RequestRecord,
    body: bytes,
    stream: _Stream,
    timeout_s: float,
) -> None:
    """One streaming request over the client's own HTTP/1.1 (:mod:`orchestrator.loadgen.wire`):
    the body's lines reach ``stream`` from the protocol's ``data_received``, one instant per read."""
    host, port = url.hostname or "", url.port or 80
    headers = {"Content-Type": "application/json", **endpoint.headers(), "X-Request-Id": f"lab-{req.request_id}"}
    target = url.path + (f"?{url.query}" if url.query else "")
    name = f"[{host}]" if ":" in host else host  # never the URL's user:password
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {name}{f':{url.port}' if url.port else ''}\r\n"
        f"Content-Length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    ).encode("latin-1")
    deadline = now() + timeout_s
    try:
        async with asyncio.timeout(timeout_s):  # the connection's set-up too
            await _send_and_read(wire, host, port, head + body, record, stream, deadline)
    except TimeoutError:
        raise TimeoutError(f"no complete answer within workload.request_timeout_s ({timeout_s:g} s)") from None


async def _send_and_read(
    wire: WireSession,
    host: str,
    port: int,
    request: bytes,
    record: RequestRecord,
    stream: _Stream,
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


class _Stream:
    """One response's server-sent events, read into its record: a token count and an arrival
    time per chunk that carried tokens, the usage the server reported, errors."""

    __slots__ = ("closing_s", "completion_tokens", "delta_of", "record", "rest", "saw_done", "text_out")

    def __init__(
        self, record: RequestRecord, delta_of: Callable[[dict[str, Any]], str | None], text_out: list[str] | None
    ) -> None:
        self.record, self.delta_of, self.text_out = record, delta_of, text_out
        self.completion_tokens = 0
        self.saw_done = False
        self.closing_s: float | None = None  # time of a skipped empty closing chunk (see below)
        self.rest = b""  # an incomplete line, waiting for the rest of it

    def feed(self, t: float, data: bytes) -> None:
        """The bytes of one read of the body, at ``t``: its complete lines are read."""
        lines = (self.rest + data if self.rest else data).split(b"\n")
        self.rest = lines.pop()
        if lines:
            self.read(t, lines)

    def read(self, t: float, lines: list[bytes]) -> None:
        """The complete lines of one read at ``t``; token chunks beyond the first of a read are
        counted as coalesced."""
        before = len(self.record.chunk_times_s)
        for raw in lines:
            if raw.startswith(b"data:"):
                self.line(t, raw)
        more = len(self.record.chunk_times_s) - before - 1
        if more > 0:
            self.record.coalesced_chunks += more

    def line(self, t: float, raw: bytes) -> None:
        """One line of the stream, read at ``t``."""
        line = raw.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.saw_done = True
            return
        chunk = _loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"unexpected SSE payload: {data[:100]!r}")
        record = self.record
        if "error" in chunk and not chunk.get("choices"):
            record.status, record.error = STATUS_ERROR, str(chunk["error"])[:500]
            return
        usage = chunk.get("usage") or {}
        text = self.delta_of(chunk)
        if text and self.text_out is not None:
            self.text_out.append(text)
        new_total = usage.get("completion_tokens")
        if text is None:  # usage-only chunk
            if new_total is not None:
                record.output_tokens = int(new_total)
            if usage.get("prompt_tokens") is not None:
                record.prompt_tokens = int(usage["prompt_tokens"])
            return
        if new_total is not None:
            n = int(new_total) - self.completion_tokens
            self.completion_tokens = int(new_total)
            if n <= 0 and not text:
                return
        else:
            # No per-chunk usage: a chunk is one token, as vLLM's own client counts it (text may
            # be empty while a multi-byte character is incomplete), except an empty closing chunk
            # that only carries the finish reason (SGLang). vLLM also sends its last token with
            # the finish reason, and its text is empty when that token is a partial UTF-8 byte:
            # the final usage decides in end().
            if not text and chunk["choices"][0].get("finish_reason"):
                self.closing_s = t
                return
            n = 1
        record.chunk_times_s.append(t)
        record.chunk_tokens.append(max(n, 0))
        if usage.get("prompt_tokens") is not None:
            record.prompt_tokens = int(usage["prompt_tokens"])

    def end(self) -> None:
        """The stream is over: was it complete, and did the closing chunk carry a token?"""
        if self.rest:  # a last line without its newline
            self.read(now(), [self.rest])
            self.rest = b""
        record = self.record
        if not self.saw_done and record.status != STATUS_ERROR:
            record.status, record.error = STATUS_ERROR, "stream ended without [DONE]"
        if (
            self.closing_s is not None
            and record.output_tokens is not None
            and record.output_tokens > sum(record.chunk_tokens)
        ):
            record.chunk_times_s.append(self.closing_s)  # the closing chunk carried a token
            record.chunk_tokens.append(1)
        if record.output_tokens is None and self.completion_tokens:
            record.output_tokens = self.completion_tokens
        if not record.chunk_times_s and record.status != STATUS_ERROR:
            record.status, record.error = STATUS_ERROR, "stream ended without any output token"
