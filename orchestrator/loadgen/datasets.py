"""Request sources read from files: ShareGPT conversations (arrival traces: :mod:`orchestrator.loadgen.traces`).

Checked before anything starts (:func:`load_sharegpt`): a missing or malformed file is a
:class:`ConfigError` naming the file and the reason; malformed entries inside an otherwise good
ShareGPT file are counted and reported.
"""

from __future__ import annotations

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
