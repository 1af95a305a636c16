"""Model resolution: turn a :class:`ModelSpec` into a local directory (or hub id) an engine can serve."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ModelSpec
from orchestrator.models.tiny import default_cache_dir, ensure_tiny_model, tiny_dir_name


def resolve_model(spec: ModelSpec, build: bool = True) -> str:
    """Local path (or hub id) of the model weights; builds ``tiny_random`` on first use.

    With ``build=False`` nothing is built or checked: the path it would have (for plans).
    """
    if spec.source in ("tiny_random", "tiny_trained"):
        assert spec.tiny is not None  # schema guarantees it
        if not build:
            root = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
            return str(root / tiny_dir_name(spec.tiny))
        return str(ensure_tiny_model(spec.tiny, spec.cache_dir))
    if not build:
        return str(spec.path)
    if spec.source == "path":
        path = Path(str(spec.path)).expanduser()
        if not (path / "config.json").exists():
            raise ConfigError(f"model.path: '{path}' is not a model directory (no config.json)")
        return str(path)
    return str(spec.path)


def resolve_tokenizer(spec: ModelSpec, model_path: str) -> str:
    return spec.tokenizer or model_path


__all__ = ["ensure_tiny_model", "resolve_model", "resolve_tokenizer"]
