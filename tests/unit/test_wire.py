"""The client's own HTTP/1.1 (loadgen/wire.py) against servers that write exactly the bytes a
test chooses: chunk framing split anywhere, bodies with the headers, errors, closed connections."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.loadgen.client import Endpoint, HttpSession, PlannedRequest
from orchestrator.metrics.records import RequestRecord


def sse(*texts: str, done: bool = True) -> bytes:
    events = b"".join(
        b'data: {"choices": [{"index": 0, "text": "%s", "finish_reason": null}]}\n\n' % t.encode() for t in texts
    )
    return events + (b"data: [DONE]\n\n" if done else b"")


def chunked(body: bytes, sizes: list[int]) -> bytes:
    """``body`` in HTTP chunks of the given sizes (the rest in one), then the last chunk."""
    out, i = b"", 0
    for n in [*sizes, len(body)]:
        part = body[i : i + n]
        i += len(part)
        if part:
            out += b"%x\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


async def serve(answers, pieces: int = 1, gap_s: float = 0.0):
    """A server answering each request with the next of ``answers`` (bytes), written in
    ``pieces`` writes ``gap_s`` apart; a None answer closes the connection without a word, a
    ``("close", bytes)`` one closes it after those bytes."""
    queue = list(answers)
    seen = []

    async def handle(reader, writer):
        try:
            while queue:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    [x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")][0].split(b":")[1]
                )
                seen.append(head + await reader.readexactly(length))
                answer = queue.pop(0)
                if answer is None:
                    writer.close()
                    return
                close_after = isinstance(answer, tuple)  # ("close", bytes): those bytes, then close
                answer = answer[1] if close_after else answer
                step = max(1, -(-len(answer) // pieces))
                for i in range(0, len(answer), step):
                    writer.write(answer[i : i + step])
                    await writer.drain()
                    if gap_s:
                        await asyncio.sleep(gap_s)
                if close_after:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


async def one(port: int, session=None, req_id: int = 1) -> RequestRecord:
    own = session is None
    session = session or await HttpSession.open()
    try:
        req = PlannedRequest(req_id, "a", "hello", 1, 3)
        rec = RequestRecord(req_id, 0, "a", 0.0, 0.0, 1, 3)
        return await session.stream(Endpoint(f"http://127.0.0.1:{port}", "m", api_key="k"), req, rec, timeout_s=5)
    finally:
        if own:
            await session.close()


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("pieces", [1, 3, 17, 1000], ids=lambda n: f"{n} writes")
def test_a_stream_split_anywhere_reads_the_same(pieces):
    async def main():
        body = OK_HEAD + chunked(sse("a", "b", "c"), [5, 40, 1])
        server, port, seen = await serve([body], pieces=pieces, gap_s=0.001)
        async with server:
            rec = await one(port)
        return rec, seen

    rec, seen = asyncio.run(main())
    assert rec.ok and rec.chunk_tokens == [1, 1, 1] and rec.http_status == 200, rec.error
    head = seen[0].split(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /v1/completions HTTP/1.1") and "Authorization: Bearer k" in head
    assert "X-Request-Id: lab-1" in head and head.count("Content-Type") == 1


def test_body_with_the_headers_and_length_bodies_and_errors():
    async def main():
        whole = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(sse("x")) + sse("x")
        error = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nno room"
        server, port, _ = await serve([whole, error])
        async with server:
            session = await HttpSession.open()
            try:
                first = await one(port, session, 1)
                second = await one(port, session, 2)  # the same kept-alive connection
            finally:
                await session.close()
        return first, second

    first, second = asyncio.run(main())
    assert first.ok and first.chunk_tokens == [1]
    assert second.status == "error" and second.error == "HTTP 503: no room" and second.http_status == 503


def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_new_one():
    async def main():
        server, port, seen = await serve([None, OK_HEAD + chunked(sse("a"), [])])
        async with server:
            session = await HttpSession.open()
            try:
                await session.wire.open("127.0.0.1", port, 1)  # pooled, then closed by the server on use
                rec = await one(port, session)
            finally:
                await session.close()
        return rec, seen

    rec, seen = asyncio.run(main())
    assert rec.ok, rec.error
    assert len(seen) == 2  # sent twice: the first connection answered nothing


def test_a_stream_cut_short_is_an_error_not_a_hang():
    async def main():
        cut = OK_HEAD + chunked(sse("a", "b"), [])[:-5]  # no last chunk: then the server closes
        server, port, _ = await serve([("close", cut)])
        async with server:
            return await asyncio.wait_for(one(port), 10)

    rec = asyncio.run(main())
    assert rec.status == "error" and "connection lost" in (rec.error or "")
    assert rec.chunk_tokens == [1, 1]  # what arrived is kept


def test_what_the_review_found(caplog):
    """A bad event fails its request with the reader's own error (not a lost connection, no
    loop-level traceback); an interim 100 answer is skipped; the Host header has no credentials;
    no future is left with an exception nobody retrieved."""
    import gc
    import logging

    async def main():
        bad = OK_HEAD + chunked(b"data: [1]\n\n", [])
        cont = b"HTTP/1.1 100 Continue\r\n\r\n" + OK_HEAD + chunked(sse("a"), [])
        server, port, seen = await serve([bad, cont])
        async with server:
            session = await HttpSession.open()
            try:
                await session.wire.open("127.0.0.1", port, 3)  # two of them never used
                req = PlannedRequest(1, "a", "hello", 1, 3)
                endpoint = Endpoint(f"http://user:secret@127.0.0.1:{port}", "m")
                first = await session.stream(endpoint, req, RequestRecord(1, 0, "a", 0.0, 0.0, 1, 3))
                second = await one(port, session, 2)
            finally:
                await session.close()
            await asyncio.sleep(0.05)
        return first, second, seen

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        first, second, seen = asyncio.run(main())
        gc.collect()
    assert first.status == "error" and first.error.startswith("ValueError: unexpected SSE payload"), first.error
    assert second.ok and second.http_status == 200, second.error
    assert b"Host: 127.0.0.1:" in seen[0] and b"secret" not in seen[0]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage() or "Fatal error" in r.getMessage()]


def test_the_request_timeout_covers_the_connection():
    async def main():
        req = PlannedRequest(1, "a", "hello", 1, 3)
        rec = RequestRecord(1, 0, "a", 0.0, 0.0, 1, 3)
        session = await HttpSession.open()
        try:
            # an address that drops packets (or is unreachable here): never a hang past the timeout
            return await asyncio.wait_for(
                session.stream(Endpoint("http://10.255.255.1:81", "m"), req, rec, timeout_s=0.5), 5
            )
        finally:
            await session.close()

    rec = asyncio.run(main())
    assert rec.status == "error" and rec.done_s - rec.sent_s < 2


def test_the_aiohttp_path_reads_what_the_wire_reads():
    """HTTPS endpoints go through aiohttp (_stream_aiohttp): the same answer reads the same."""
    from orchestrator.loadgen.api import API_PATHS, DELTAS
    from orchestrator.loadgen.client import _Exchange, _stream_aiohttp
    from orchestrator.loadgen.sse import SseStream

    async def main():
        answer = OK_HEAD + chunked(sse("a", "b", "c"), [5, 40, 1])
        server, port, _ = await serve([answer, answer], pieces=7, gap_s=0.001)
        async with server:
            session = await HttpSession.open()
            try:
                by_wire = await one(port, session, 1)
                rec = RequestRecord(2, 0, "a", 0.0, 0.0, 1, 3)
                endpoint = Endpoint(f"http://127.0.0.1:{port}", "m")
                url = endpoint.base_url + API_PATHS["completions"]
                headers = {**endpoint.headers(), "X-Request-Id": "lab-2"}
                exchange = _Exchange(b"{}", headers, rec, SseStream(rec, DELTAS["completions"], None))
                await _stream_aiohttp(session.http, url, exchange, 5)
            finally:
                await session.close()
        return by_wire, rec

    by_wire, by_aiohttp = asyncio.run(main())
    assert by_wire.ok and by_aiohttp.status == by_wire.status and by_aiohttp.http_status == 200
    assert by_aiohttp.chunk_tokens == by_wire.chunk_tokens == [1, 1, 1]


def test_an_answer_that_is_not_http_fails_its_request_by_the_parser():
    """The framing is llhttp's (httptools): a bad status line or chunk size is the request's error."""

    async def main():
        server, port, _ = await serve([b"SPDY/9 200 OK\r\n\r\n", OK_HEAD + b"zz\r\nabc\r\n"])
        async with server:
            first = await asyncio.wait_for(one(port), 10)
            second = await asyncio.wait_for(one(port, req_id=2), 10)
        return first, second

    first, second = asyncio.run(main())
    for rec in (first, second):
        assert rec.status == "error" and "bad HTTP answer" in (rec.error or ""), rec.error
