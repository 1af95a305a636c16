"""OmegaConf resolvers our configs use (``${project_root:}``). Registered before Hydra composes."""

from __future__ import annotations

from orchestrator.config.paths import PROJECT_ROOT


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
