"""Where the checkout is (the folder holding ``conf/``, ``orchestrator/`` and the Makefile), and
where the product keeps what it learnt about this machine (``INFERENCE_LAB_CACHE``, default
``~/.cache/inference-lab``: tiny models, roofs, engine speeds, races' noise)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """The folder of the product's caches on this machine."""
    return Path(os.environ.get("INFERENCE_LAB_CACHE") or "~/.cache/inference-lab").expanduser()


def cached_entries(path: Path) -> dict[str, Any]:
    """Every entry of the JSON cache ``path``; empty where the file is missing or not a cache."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def cached_entry(path: Path, key: str) -> Any:
    """The entry ``key`` of the JSON cache ``path``; None where the file, or the key, is missing."""
    return cached_entries(path).get(key)


def keep_entry(path: Path, key: str, value: Any, most: int | None = None) -> None:
    """Add ``key`` to the JSON cache ``path`` (written whole to a temporary file, then moved into
    place: a reader never sees half a file), keeping the ``most`` latest entries."""
    known = cached_entries(path)
    known.pop(key, None)
    known[key] = value
    if most is not None:
        known = dict(list(known.items())[-most:])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    with os.fdopen(fd, "w") as f:
        json.dump(known, f, indent=1)
    os.replace(tmp, path)
