"""OmegaConf resolvers our configs use (``${project_root:}``). Registered before Hydra composes."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
