"""Recognising secrets by name or shape, so they never reach logs, params or artifacts."""

from __future__ import annotations

import re
from typing import Any

# Names like HF_TOKEN, --hf-token, VLLM_API_KEY, api_key, AWS_SECRET_ACCESS_KEY, password.
# "tokens" (e.g. max_num_batched_tokens) is a count, not a secret.
_SECRET_NAME = re.compile(r"(api[_-]?key|(^|[_\-.])(access_)?token$|secret|passw(or)?d|credential|authorization)", re.I)
# Values that look like well-known token formats, wherever they appear in free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|ghp_[A-Za-z0-9]{8,})")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """A name that holds a secret. ``api_key_env`` names the variable that holds one: not a secret."""
    name = name.strip("-")
    return bool(_SECRET_NAME.search(name)) and not name.lower().endswith(("_env", "-env"))


def redact_text(text: str) -> str:
    """Hide token-looking substrings (``hf_...``, ``sk-...``, ``ghp_...``) in free text."""
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: list[str]) -> list[str]:
    """Hide the value after flags such as ``--api-key`` / ``--hf-token`` (and ``--flag=value`` forms)."""
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("--") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(redact_text(arg))
    return out


def redact_override(override: str) -> str:
    """``engine.env.HF_TOKEN=abc`` -> ``engine.env.HF_TOKEN=***`` (Hydra override strings)."""
    key, sep, value = override.partition("=")
    if sep and is_secret_name(key.lstrip("+~").split(".")[-1]):
        return f"{key}={REDACTED}"
    return redact_text(override)


def redact_mapping(value: Any, key: str = "") -> Any:
    """A copy of nested data with secret-named keys hidden and argv-like lists redacted."""
    if key and is_secret_name(key) and value is not None:  # an unset one is shown unset
        return REDACTED
    if isinstance(value, dict):
        return {k: redact_mapping(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (str, int, float)) for v in value):
            return redact_argv([str(v) for v in value]) if any(isinstance(v, str) for v in value) else list(value)
        return [redact_mapping(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
