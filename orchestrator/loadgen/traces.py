"""Arrival traces read from files, checked before anything starts, and what their prompts share.

Formats (``trace_format``; ``auto`` tells them apart by the file's columns or first record):

* ``plain``: JSONL or CSV rows of ``timestamp`` (seconds), ``input_tokens``, ``output_tokens``.
* ``mooncake``: the FAST'25 Mooncake JSONL: ``timestamp`` (milliseconds), ``input_length``,
  ``output_length``, ``hash_ids`` (the prompt as 512-token blocks; equal ids are equal blocks).
* ``azure``: the Azure LLM inference trace CSV: ``TIMESTAMP`` (a date and time),
  ``ContextTokens``, ``GeneratedTokens``.
* ``bailian``: Alibaba Bailian's multi-turn JSONL: ``chat_id``, ``parent_chat_id`` (-1 for the
  first turn of a conversation), ``timestamp`` (seconds), ``input_length`` (the whole prompt,
  the conversation so far included), ``output_length``, ``turn``, ``hash_ids`` (blocks of
  ``block_tokens``, 16 in the published traces). A child is sent after its parent's reply.

A bad line is a :class:`ConfigError` naming the file, the line and the field. Timestamps are
made relative to the first arrival. :func:`ideal_reuse` counts the prefix blocks a request
shares with an earlier request's prefix, as an infinite prefix cache would reuse them.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from orchestrator.config.errors import ConfigError
from orchestrator.config.metric_keys import M

TraceFormat = Literal["auto", "plain", "mooncake", "azure", "bailian"]
MOONCAKE_BLOCK_TOKENS = 512
BAILIAN_BLOCK_TOKENS = 16  # the published Bailian traces' block size (qwen_trace*_blksz_16)
BLOCK_TOKENS = {"mooncake": MOONCAKE_BLOCK_TOKENS, "bailian": BAILIAN_BLOCK_TOKENS}

_COLUMNS: dict[str, tuple[str, str, str]] = {  # timestamp, input, output
    "plain": ("timestamp", M.INPUT_TOKENS, M.OUTPUT_TOKENS),  # the same words as the metrics
    "bailian": ("chat_id", "parent_chat_id", "timestamp"),  # told apart by these; lengths as mooncake
    "mooncake": ("timestamp", "input_length", "output_length"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}


@dataclass(frozen=True)
class TraceRow:
    timestamp_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # the prompt's prefix blocks (mooncake ``hash_ids``): equal ids, equal blocks
    chat_id: int | None = None  # bailian: this request's id
    parent: int | None = None  # bailian: the chat_id whose reply this request follows (None: a first turn)


@dataclass(frozen=True)
class Trace:
    """A trace file's rows by time, what it is and how to find it again."""

    path: str
    format: str
    sha256: str  # of the file's bytes: the run records which trace it replayed
    rows: tuple[TraceRow, ...]
    block_tokens: int | None = None  # tokens per block of ``TraceRow.blocks`` (mooncake: 512)
    notes: tuple[str, ...] = field(default=())

    @property
    def conversations(self) -> int:
        """First turns (every request, for a trace without parents)."""
        return sum(1 for r in self.rows if r.parent is None)


@functools.lru_cache(maxsize=8)
def read_trace(path: str, fmt: TraceFormat = "auto", block_tokens: int | None = None) -> Trace:
    """The rows of a trace file, checked; see the module's docstring for the formats.
    ``block_tokens`` is the size of a ``hash_ids`` block (default: the format's own)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"trace: file '{p}' does not exist")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"trace '{p}': not UTF-8 text ({exc})") from None
    is_csv = p.suffix.lower() == ".csv"
    records = _csv_records(p, text) if is_csv else _jsonl_records(p, text)
    if not records:
        raise ConfigError(f"trace '{p}': no rows")
    kind = _detect(p, records[0][1], is_csv) if fmt == "auto" else fmt
    block = block_tokens or BLOCK_TOKENS.get(kind)
    rows = [_row(p, line, r, kind, block) for line, r in records]
    if kind == "bailian":
        _check_parents(p, [line for line, _ in records], rows)
    rows.sort(key=lambda r: r.timestamp_s)
    t0 = rows[0].timestamp_s
    rows = [replace(r, timestamp_s=r.timestamp_s - t0) for r in rows]
    return Trace(str(p), kind, hashlib.sha256(data).hexdigest(), tuple(rows), block)


def _check_parents(p: Path, lines: list[int], rows: list[TraceRow]) -> None:
    """Every chat_id once; every parent an earlier request of the file."""
    when: dict[int, float] = {}
    for line, r in zip(lines, rows):
        assert r.chat_id is not None
        if r.chat_id in when:
            raise ConfigError(f"trace '{p}' line {line}: field 'chat_id': {r.chat_id} appears twice")
        when[r.chat_id] = r.timestamp_s
    for line, r in zip(lines, rows):
        if r.parent is None:
            continue
        if r.parent not in when:
            raise ConfigError(
                f"trace '{p}' line {line}: field 'parent_chat_id': {r.parent} is no request's chat_id "
                "(-1 marks a first turn)"
            )
        if when[r.parent] > r.timestamp_s:
            raise ConfigError(
                f"trace '{p}' line {line}: field 'timestamp': {r.timestamp_s:g} is before its parent "
                f"{r.parent}'s ({when[r.parent]:g}); a reply cannot come before its question"
            )


def _csv_records(p: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines())
    return [(i + 2, dict(r)) for i, r in enumerate(reader)]  # line 1 is the header


def _jsonl_records(p: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"trace '{p}' line {i}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise ConfigError(f"trace '{p}' line {i}: expected a JSON object, got {type(record).__name__}")
        out.append((i, record))
    return out


def _detect(p: Path, first: dict[str, Any], is_csv: bool) -> str:
    for kind in ("bailian", "mooncake", "azure", "plain"):
        if all(c in first for c in _COLUMNS[kind]):
            return kind
    expected = "; ".join(f"{k}: {', '.join(c)}" for k, c in _COLUMNS.items())
    raise ConfigError(
        f"trace '{p}': {'its header' if is_csv else 'its first record'} has {', '.join(map(str, first)) or 'nothing'}; "
        f"expected the fields of one format ({expected})"
    )


def _row(p: Path, line: int, r: dict[str, Any], kind: str, block: int | None) -> TraceRow:
    ts_key, in_key, out_key = _COLUMNS["mooncake" if kind == "bailian" else kind]
    where = f"trace '{p}' line {line}"

    def whole(key: str, least: int) -> int:
        value = r.get(key)
        try:
            n = int(value) if not isinstance(value, bool) else None  # type: ignore[arg-type]
        except (TypeError, ValueError):
            n = None
        if n is None or n < least or (isinstance(value, float) and value != n):
            raise ConfigError(f"{where}: field '{key}': expected a whole number >= {least}, got {value!r}")
        return n

    if kind == "azure":
        timestamp = _azure_time(where, ts_key, r.get(ts_key))
    else:
        value = r.get(ts_key)
        try:
            timestamp = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: field '{ts_key}': expected a number >= 0, got {value!r}") from None
        if not timestamp >= 0:
            raise ConfigError(f"{where}: field '{ts_key}': expected a number >= 0, got {value!r}")
        if kind == "mooncake":
            timestamp /= 1000.0  # milliseconds
    blocks: tuple[int, ...] = ()
    if block is not None:
        ids = r.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in ids):
            raise ConfigError(f"{where}: field 'hash_ids': expected a list of whole numbers, got {ids!r}")
        blocks = tuple(ids)
    chat = parent = None
    if kind == "bailian":
        chat, parent = whole("chat_id", 0), _parent(where, r.get("parent_chat_id"))
    row = TraceRow(timestamp, whole(in_key, 1), whole(out_key, 1), blocks, chat, parent)
    if block is not None and len(blocks) != -(-row.input_tokens // block):
        raise ConfigError(
            f"{where}: field 'hash_ids': {len(blocks)} blocks for {row.input_tokens} input tokens "
            f"(expected {-(-row.input_tokens // block)} of {block}; set trace_block_tokens if the "
            "trace's blocks are another size)"
        )
    return row


def _parent(where: str, value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= -1:
        return None if value == -1 else value
    raise ConfigError(f"{where}: field 'parent_chat_id': expected a chat_id or -1 (a first turn), got {value!r}")


def _azure_time(where: str, key: str, value: Any) -> float:
    """Seconds since the epoch of an Azure trace's ``2023-11-16 18:15:46.6805900`` (any digits
    of fraction), or a plain number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value or "").strip()
    try:
        return float(text)
    except ValueError:
        pass
    base, _, frac = text.partition(".")
    try:
        stamp = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
        fraction = float(f"0.{frac}") if frac else 0.0
    except ValueError:
        raise ConfigError(
            f"{where}: field '{key}': expected a time like 2023-11-16 18:15:46.68, got {value!r}"
        ) from None
    return stamp.timestamp() + fraction


@dataclass(frozen=True)
class Slice:
    """The rows a point replays: from ``start_s`` of the trace's clock (rebased to 0), lengths
    and block size divided by ``length_scale``, cut or dropped at the context cap."""

    rows: tuple[TraceRow, ...]
    block_tokens: int | None
    truncated: int  # requests cut to fit max_context_tokens
    dropped: int  # requests left out for it (and their followers)
    rooted: int = 0  # followers whose parent came before the slice: sent as first turns


def replay_slice(
    trace: Trace,
    start_s: float = 0.0,
    length_scale: float = 1.0,
    max_context: int | None = None,
    over_context: str = "truncate",
    num_requests: int | None = None,
    duration_s: float | None = None,
    time_scale: float = 1.0,
) -> Slice:
    """The slice of ``trace`` a point replays (``duration_s`` on the replay's clock, after
    ``time_scale``; ``num_requests`` counts the requests kept). A follower (bailian) whose
    parent is not replayed, because it came before the slice or was dropped, is sent as a first
    turn (``rooted``); one over the context cap is dropped, never cut (its prompt is the
    conversation so far)."""
    block = max(1, round(trace.block_tokens / length_scale)) if trace.block_tokens else None
    rows: list[TraceRow] = []
    kept: set[int] = set()
    truncated = dropped = rooted = 0
    for r in trace.rows:
        if r.timestamp_s < start_s:
            continue
        t = r.timestamp_s - start_s
        if duration_s is not None and t * time_scale >= duration_s:
            break
        n_in, n_out = max(1, round(r.input_tokens / length_scale)), max(1, round(r.output_tokens / length_scale))
        blocks = r.blocks
        if block is not None and blocks:  # as many blocks as before: the sharing structure kept
            n_in = min(max(n_in, (len(blocks) - 1) * block + 1), len(blocks) * block)
        if max_context is not None and n_in + n_out > max_context:
            if over_context == "drop" or max_context < 2 or r.parent is not None:
                dropped += 1
                continue
            truncated += 1
            n_out = min(n_out, max_context - 1)
            n_in = max_context - n_out
            if block is not None and blocks:
                blocks = blocks[: -(-n_in // block)]
        parent = r.parent
        if parent is not None and parent not in kept:
            parent, rooted = None, rooted + 1
        rows.append(TraceRow(t, n_in, n_out, blocks, r.chat_id, parent))
        if r.chat_id is not None:
            kept.add(r.chat_id)
        if num_requests is not None and len(rows) >= num_requests:
            break
    return Slice(tuple(rows), block, truncated, dropped, rooted)


def reusable_tokens(rows: Sequence[TraceRow], block_tokens: int) -> tuple[int, int]:
    """(prompt tokens an infinite prefix cache would reuse, prompt tokens) over ``rows`` in
    order: :func:`ideal_reuse`'s blocks, each counted by the tokens it holds (a last block is
    partial)."""
    trie: dict[tuple[int, int], int] = {}
    reused = total = 0
    for r in rows:
        before = ideal_reuse([r.blocks], trie).reusable
        reused += min(before * block_tokens, r.input_tokens)
        total += r.input_tokens
    return reused, total


@dataclass(frozen=True)
class Reuse:
    """What an infinite prefix cache would reuse: blocks that extend a prefix seen before."""

    blocks: int  # blocks of every request
    reusable: int  # of them, blocks whose whole prefix up to and including them came earlier

    @property
    def share(self) -> float:
        return self.reusable / self.blocks if self.blocks else 0.0


def ideal_reuse(requests: Iterable[Sequence[int]], seen: dict[tuple[int, int], int] | None = None) -> Reuse:
    """The trace's ideal prefix reuse, in arrival order: block ``i`` of a request is reusable
    when blocks ``0..i`` are the first blocks of an earlier request (a prefix cache keys a block
    by its content and everything before it). ``seen`` carries the prefixes over from earlier
    requests (the points before, on a server whose cache was not reset)."""
    trie = {} if seen is None else seen
    total = reusable = 0
    for blocks in requests:
        node, hit = 0, True
        for b in blocks:
            total += 1
            child = trie.get((node, b))
            if hit and child is not None:
                reusable += 1
                node = child
                continue
            hit = False
            if child is None:
                child = trie[(node, b)] = len(trie) + 1
            node = child
    return Reuse(total, reusable)


def slice_metrics(cut: Slice) -> dict[str, float]:
    """What a replayed slice is: requests cut or dropped at the context cap, and (a trace with
    prefix blocks) the share of prompt tokens an infinite prefix cache would reuse."""
    out = {M.TRACE_REQUESTS_TRUNCATED: float(cut.truncated), M.TRACE_REQUESTS_DROPPED: float(cut.dropped)}
    if any(r.chat_id is not None for r in cut.rows):
        out[M.TRACE_CONVERSATIONS] = float(sum(1 for r in cut.rows if r.parent is None))
        out[M.TRACE_FOLLOWERS_ROOTED] = float(cut.rooted)
    if cut.block_tokens and any(r.blocks for r in cut.rows):
        reused, total = reusable_tokens(cut.rows, cut.block_tokens)
        out[M.TRACE_BLOCK_TOKENS] = float(cut.block_tokens)
        out[M.TRACE_IDEAL_PREFIX_SHARE] = reused / total if total else 0.0
    return out
