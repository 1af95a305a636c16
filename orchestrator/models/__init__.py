"""Model resolution: turn a :class:`ModelSpec` into a local directory (or hub id) an engine can serve."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.convert import hub_like
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


def resolve_adapters(spec: ModelSpec, build: bool = True) -> tuple[tuple[str, str], ...]:
    """(served name, folder) of every LoRA adapter of ``spec.model.lora``: one's own, then the
    tiny model's (trained on first use). With ``build=False`` nothing is built or checked."""
    if spec.lora is None:
        return ()
    from orchestrator.models.lora import (
        AdapterError,
        ensure_tiny_adapters,
        read_adapter,
        tiny_adapter_dir,
        tiny_adapter_name,
    )

    out: list[tuple[str, str]] = []
    for i, a in enumerate(spec.lora.adapters):
        path = Path(a.path).expanduser()
        if build:
            try:
                read_adapter(path)
            except AdapterError as e:
                raise ConfigError(f"model.lora.adapters[{i}] ({a.name}): {e}") from None
        out.append((a.name, str(path)))
    tiny = spec.lora.tiny
    if tiny is not None:
        assert spec.tiny is not None  # schema: tiny adapters need the tiny_trained base
        if build:
            out += [(name, str(path)) for name, path in ensure_tiny_adapters(spec)]
        else:
            out += [
                (tiny_adapter_name(k), str(tiny_adapter_dir(spec.tiny, tiny, k, spec.cache_dir)))
                for k in range(tiny.count)
            ]
    return tuple(out)


def resolve_tokenizer(spec: ModelSpec, model_path: str) -> str:
    return spec.tokenizer or model_path


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def check_hub_tokenizer(name: str, key: str = "model.tokenizer") -> None:
    """``name`` (the value of ``key``: ``model.tokenizer``, or ``model.path`` of a hub model that
    names no tokenizer of its own) is no local folder: it is a hub id, whose tokenizer must be in
    the local Hugging Face cache or be fetched now (not offline); else a ConfigError saying which
    and how to point at a local copy. A path by its spelling (``/``, ``./``, ``~``) must exist."""
    if not hub_like(name):
        raise ConfigError(f"{key}: '{name}' does not exist")
    try:
        import huggingface_hub
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of transformers
        raise ConfigError(f"{key}: '{name}' is no local folder, and huggingface_hub is not installed") from None
    if any(isinstance(try_to_load_from_cache(name, f), str) for f in TOKENIZER_FILES):
        return
    local = "point model.tokenizer at a local copy (a folder with tokenizer.json / tokenizer_config.json)"
    if key != "model.tokenizer":
        local += f" or {key} at a local snapshot of the model"
    where = f"{key}: '{name}' is no local folder, and as a hub id its tokenizer"
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"{where} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) while HF_HUB_OFFLINE "
            f"is set: download it first (`hf download {name}`) or {local}"
        )
    unreachable = hub_unreachable(constants.ENDPOINT)
    if unreachable:
        raise ConfigError(
            f"{where} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}), and the hub cannot be "
            f"reached from here ({unreachable}): download it where it can (`hf download {name}`) or {local}"
        )
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        for i, file in enumerate(TOKENIZER_FILES):  # a repo may have either one
            try:
                huggingface_hub.hf_hub_download(name, file)
                break
            except EntryNotFoundError as exc:  # the hub has no such file (not: it cannot be reached)
                if isinstance(exc, LocalEntryNotFoundError) or i == len(TOKENIZER_FILES) - 1:
                    raise
    except Exception as exc:  # not found, gated, or no network: say which, with the way out
        raise ConfigError(
            f"{where} could not be fetched "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): check the id and HF_TOKEN, "
            f"or {local}"
        ) from None


def hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at ``endpoint`` surely cannot be reached from here (its host name does not
    resolve), or None. huggingface_hub itself retried an unresolvable host for 24 s here, five
    warnings long, before its error. Behind a proxy (``HTTPS_PROXY``, ...) the proxy resolves the
    name: not judged here."""
    import socket
    import urllib.parse
    import urllib.request

    host = urllib.parse.urlparse(endpoint).hostname
    if not host or urllib.request.getproxies():
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        return f"{host} does not resolve: {exc}"
    return None


def check_hub_model(spec: ModelSpec) -> None:
    """A hub model (``model.source=hub``) that names no tokenizer of its own: the client reads the
    tokenizer from the model's hub id, which must be cached or reachable (:func:`check_hub_tokenizer`,
    naming ``model.path``). Checked before any server starts; an unreachable hub had let the engine
    start and fail on its download, or the client fail after it."""
    if spec.source == "hub" and not spec.tokenizer and spec.path and not Path(str(spec.path)).expanduser().exists():
        check_hub_tokenizer(str(spec.path), key="model.path")


__all__ = [
    "check_hub_model",
    "check_hub_tokenizer",
    "ensure_tiny_model",
    "hub_unreachable",
    "resolve_adapters",
    "resolve_model",
    "resolve_tokenizer",
]
