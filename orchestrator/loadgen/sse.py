"""What comes back: one streamed response's server-sent events read into its record, as the
socket hands them over (one instant per read: :class:`SseStream`).

Every content chunk's arrival instant is recorded with the number of output tokens it carries
(from the server's continuous usage stats when present, so multi-token chunks count right). A
read that holds several token chunks is a coalesced read: the chunks are stamped with the same
instant (the first ones arrived earlier, unseen), so their gaps say nothing about the server;
each record counts them (``coalesced_chunks``) and a point where too many chunks came so says its
ITL is the client's (``validity.max_coalesced_share``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from orchestrator.metrics.records import STATUS_ERROR, RequestRecord

_loads: Callable[[bytes], Any]
try:  # ~4x faster per chunk than json (a dependency; json is the fallback)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

now = time.perf_counter  # the client's clock (loadgen.client.now)


class SseStream:
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
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if cached is not None:  # vLLM with --enable-prompt-tokens-details: this prompt's prefix-cache hits
                record.cached_tokens = int(cached)
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
