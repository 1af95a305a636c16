"""Turning nested configs into MLflow params: flattened keys, legal characters, secrets hidden."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.config.secrets import REDACTED, is_secret_name, redact_text

_BAD_KEY_CHARS = re.compile(r"[^\w./\- ]")
MAX_KEY = 250
MAX_VALUE = 6000


def sanitize_key(key: str) -> str:
    """An MLflow-legal key: ``[/\\w.\\- ]`` only, at most 250 characters (``:`` becomes ``_``)."""
    return _BAD_KEY_CHARS.sub("_", key)[:MAX_KEY]


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"engine": {"block_size": 32}}`` -> ``{"engine.block_size": "32"}``; secrets hidden.

    Lists and empty mappings become JSON; a key that looks like a secret has its value hidden.
    """
    out: dict[str, str] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, full + "."))
            continue
        if is_secret_name(str(key)) and value is not None:  # an unset secret shows as null
            text = REDACTED
        elif isinstance(value, (list, tuple, Mapping)):
            text = json.dumps(value, sort_keys=True, default=str)
        else:
            text = "null" if value is None else str(value)
        out[sanitize_key(full)] = truncate(redact_text(text), MAX_VALUE)
    return out
