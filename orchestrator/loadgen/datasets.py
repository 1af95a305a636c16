"""Request sources read from files: ShareGPT conversations and arrival traces.

Both are checked before anything starts (:func:`check_sharegpt`, :func:`load_trace`): a
missing or malformed file is a :class:`ConfigError` naming the file and the reason;
malformed entries inside an otherwise good ShareGPT file are counted and reported.
"""

from __future__ import annotations

import csv
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.errors import ConfigError


@dataclass(frozen=True)
class Conversation:
    """The first user turn of a ShareGPT conversation and the first reply to it."""

    prompt: str
    reply: str


@dataclass(frozen=True)
class ShareGPT:
    conversations: tuple[Conversation, ...]
    malformed: int  # entries skipped: not a dict, no conversations, no human turn followed by a reply


@functools.lru_cache(maxsize=4)
def load_sharegpt(path: str) -> ShareGPT:
    """Parse a ShareGPT JSON file (a list of ``{"conversations": [{"from", "value"}, ...]}``)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"sharegpt dataset: file '{p}' does not exist")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"sharegpt dataset '{p}': not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ConfigError(f"sharegpt dataset '{p}': expected a JSON list of conversations, got {type(data).__name__}")
    good: list[Conversation] = []
    malformed = 0
    for entry in data:
        conv = _first_exchange(entry)
        if conv is None:
            malformed += 1
        else:
            good.append(conv)
    if not good:
        raise ConfigError(f"sharegpt dataset '{p}': none of its {len(data)} entries has a human turn and a reply")
    return ShareGPT(tuple(good), malformed)


def _first_exchange(entry: object) -> Conversation | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        return None
    turns = entry["conversations"]
    for a, b in zip(turns, turns[1:]):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return None
        if a.get("from") in ("human", "user") and b.get("from") in ("gpt", "assistant", "chatgpt", "bard"):
            prompt, reply = a.get("value"), b.get("value")
            if isinstance(prompt, str) and isinstance(reply, str) and prompt.strip() and reply.strip():
                return Conversation(prompt, reply)
            return None
    return None


@dataclass(frozen=True)
class TraceRow:
    timestamp_s: float
    input_tokens: int
    output_tokens: int


@functools.lru_cache(maxsize=8)
def load_trace(path: str) -> tuple[TraceRow, ...]:
    """Rows of a trace file (JSONL or CSV with ``timestamp,input_tokens,output_tokens``), by time.

    Timestamps are seconds; they are made relative to the first row.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"trace: file '{p}' does not exist")
    rows: list[TraceRow] = []
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() == ".csv":
            records = list(csv.DictReader(text.splitlines()))
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        for i, r in enumerate(records):
            row = TraceRow(float(r["timestamp"]), int(r["input_tokens"]), int(r["output_tokens"]))
            if row.input_tokens < 1 or row.output_tokens < 1 or row.timestamp_s < 0:
                raise ValueError(f"row {i + 1}: lengths must be >= 1 and timestamp >= 0")
            rows.append(row)
    except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"trace '{p}': {exc}; expected JSONL or CSV rows with timestamp, input_tokens, output_tokens"
        ) from None
    if not rows:
        raise ConfigError(f"trace '{p}': no rows")
    rows.sort(key=lambda r: r.timestamp_s)
    t0 = rows[0].timestamp_s
    return tuple(TraceRow(r.timestamp_s - t0, r.input_tokens, r.output_tokens) for r in rows)
