"""Recognising secrets by name or shape, so they never reach logs, params or artifacts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Names like HF_TOKEN, --hf-token, VLLM_API_KEY, api_key, AWS_SECRET_ACCESS_KEY, password.
# "tokens" (e.g. max_num_batched_tokens) is a count, not a secret.
_SECRET_NAME = re.compile(r"(api[_-]?key|(^|[_\-.])(access_)?token$|secret|passw(or)?d|credential|authorization)", re.I)
# Values that look like well-known token formats, wherever they appear in free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|ghp_[A-Za-z0-9]{8,})")
# The password of a URL's user (https://user:PASSWORD@host, postgresql://user:PASSWORD@host/db).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)([^\s/]+)(@)")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """A name that holds a secret. ``api_key_env`` names the variable that holds one: not a secret."""
    name = name.strip("-")
    return bool(_SECRET_NAME.search(name)) and not name.lower().endswith(("_env", "-env"))


def redact_text(text: str) -> str:
    """Hide token-looking substrings (``hf_...``, ``sk-...``, ``ghp_...``) and the passwords of
    URLs (``https://user:***@host``, a tracking URI's) in free text."""
    return _URL_PASSWORD.sub(rf"\1{REDACTED}\3", _SECRET_VALUE.sub(REDACTED, text))


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


def secret_values(value: Any, key: str = "") -> set[str]:
    """The strings held under secret-named keys anywhere in nested data (``engine.env.HF_TOKEN``'s
    value), and the values of secret-named Hydra overrides (``+engine.env.HF_TOKEN=...``)."""
    found: set[str] = set()
    if key and is_secret_name(key) and isinstance(value, (str, int)) and not isinstance(value, bool):
        found.add(str(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            found |= secret_values(v, str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= secret_values(v)
    elif isinstance(value, str) and "=" in value:
        name, _, held = value.partition("=")
        if held and is_secret_name(name.lstrip("+~").split(".")[-1]):
            found.add(held)
    return found


def scrub_file(path: Path, secrets: set[str]) -> None:
    """Rewrite a file somebody else wrote (Hydra's ``multirun.yaml``, ``.hydra/*.yaml``) with each
    of ``secrets`` (4 characters or more) and every token-looking value hidden; a missing file is
    left missing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    scrubbed = text
    # the longer first (a secret inside a longer one); under 4 characters a value is no secret
    # worth the name and would hide every "1" or "yes" of the file
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        scrubbed = scrubbed.replace(secret, REDACTED)
    scrubbed = redact_text(scrubbed)
    if scrubbed != text:
        path.write_text(scrubbed)
