"""Where the checkout is: the folder holding ``conf/``, ``orchestrator/`` and the Makefile."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
