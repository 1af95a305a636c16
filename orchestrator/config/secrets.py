"""Recognising secrets by name or shape, so they never reach logs, params or artifacts."""

from __future__ import annotations

import re

# Names like HF_TOKEN, --hf-token, VLLM_API_KEY, api_key, AWS_SECRET_ACCESS_KEY, password.
# "tokens" (e.g. max_num_batched_tokens) is a count, not a secret.
_SECRET_NAME = re.compile(r"(api[_-]?key|(^|[_\-.])(access_)?token$|secret|passw(or)?d|credential|authorization)", re.I)
# Values that look like well-known token formats, wherever they appear in free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|ghp_[A-Za-z0-9]{8,})")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.strip("-")))


def redact_text(text: str) -> str:
    """Hide token-looking substrings (``hf_...``, ``sk-...``, ``ghp_...``) in free text."""
    return _SECRET_VALUE.sub(REDACTED, text)
