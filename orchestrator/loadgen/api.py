"""What the client sends: the server it talks to (:class:`Endpoint`), the requests it plans
(:class:`PlannedRequest`, with the later turns of a conversation) and, per OpenAI API, the
request body and the text of a streamed chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """What the load generator needs from a server: a URL and a model name. Nothing engine-specific."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer header; never logged

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


@dataclass(frozen=True)
class Turn:
    """A later user turn of a conversation, planned in advance (its reply is not).

    It follows the reply to ``parent`` (an index into the conversation's turns, -1 for its
    first request; None: the turn before it), ``think_time_s`` after that reply or, with
    ``at_s``, at that offset of the point's clock if the reply came before it (a replayed
    trace's follower)."""

    request_id: int
    text: str
    input_tokens: int  # new tokens of this turn (the resent history comes on top)
    output_tokens: int
    parent: int | None = None
    at_s: float | None = None


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
    model: str | None = None  # the LoRA adapter (or model) this request names; None: the endpoint's model

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
        "model": req.model or endpoint.model,
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


API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PAYLOADS = {"completions": completions_payload, "chat": chat_payload}
DELTAS = {"completions": completions_delta, "chat": chat_delta}
