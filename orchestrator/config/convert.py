"""Conversion of a composed Hydra config into typed :class:`TrialSpec` / :class:`SweepSettings`.

The experiment's overlays (``per_platform``, then ``variants``) and then the command line's keys
are applied first (:mod:`orchestrator.config.overlays`).

Every error names the offending key and what was expected, before anything starts.

Relative file paths in the config (model folders, tokenizers, datasets, traces, LMCache's disk
tier, engine interpreters) are made absolute here, against the directory the command runs in:
trials run in Ray workers and their tools (engines, lm-eval) in folders of their own, where a
relative path would name something else (:func:`absolute_paths`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from orchestrator.config.errors import ConfigError
from orchestrator.config.overlays import SETTINGS_KEYS, TRIAL_KEYS, apply_overlays, deep_merge, plain_copy
from orchestrator.config.schema import ClusterSpec, SweepSettings, TrackingSpec, TrialSpec

OVERLAY_KEYS = ("variants", "per_platform")
META_KEYS = ("sweeps",)  # read by Hydra's sweeper through interpolation, not by trials
TOP_LEVEL_KEYS = TRIAL_KEYS + SETTINGS_KEYS + OVERLAY_KEYS + META_KEYS


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of the config without Hydra's own node, interpolations resolved.

    Hydra's node is dropped before resolving, so this works outside a Hydra run too.
    """
    if isinstance(cfg, Mapping) and not hasattr(cfg, "_get_node"):
        data: dict[str, Any] = plain_copy(dict(cfg))
        data.pop("hydra", None)
        return data
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # omegaconf raises several types for bad interpolations
        raise ConfigError(f"config does not resolve: {exc}") from exc


def to_specs(cfg: Any, overrides: Sequence[str] = ()) -> tuple[TrialSpec, SweepSettings]:
    """Validate a composed config; raise :class:`ConfigError` naming every bad key. ``overrides``:
    the job's command line, whose keys win over the experiment's overlays."""
    # A plain dict is not copied here: the overlays and absolute_paths make new dicts.
    data = apply_overlays(dict(cfg) if type(cfg) is dict else config_to_dict(cfg), overrides)
    unknown = sorted(k for k in data if k not in TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_LEVEL_KEYS)}")
    data = absolute_paths(data)
    trial_data = {k: data[k] for k in TRIAL_KEYS if k in data}
    settings_data = {k: data[k] for k in SETTINGS_KEYS if k in data}
    trial = _share_sections(_validate(TrialSpec, trial_data), trial_data)
    settings = _validate(SweepSettings, settings_data)
    return trial, settings


_SECTIONS = ("engine", "model", "workload", "platform", "eval", "profile")
_shared: dict[tuple[str, str], BaseModel] = {}


def _share_sections(trial: TrialSpec, data: dict[str, Any]) -> TrialSpec:
    """The trial with each section (engine, model, workload, ...) made of the same input as an
    earlier trial's replaced by that trial's (equal, frozen) object: a sweep of 10,000 trials
    that differ in a seed or a knob keeps one workload, one model, one platform in memory."""
    update = {}
    for name in _SECTIONS:
        value = getattr(trial, name)
        if not isinstance(value, BaseModel):
            continue
        key = (name, json.dumps(data.get(name), default=repr))  # key order kept: classes are sent in it
        seen = _shared.setdefault(key, value)
        if seen is not value and seen == value:
            update[name] = seen
    if len(_shared) > 4096:  # a bound, not a cache policy: sections of trials far apart are not shared
        _shared.clear()
    return trial.model_copy(update=update) if update else trial


def _absolute(value: Any, cwd: str, only_if_exists: bool = False) -> Any:
    """``value`` as an absolute path (``~`` expanded) when it is a relative path string; with
    ``only_if_exists``, only when such a file or folder exists (else it is a hub id)."""
    if not isinstance(value, str) or not value or "://" in value:
        return value
    path = os.path.expanduser(value)
    if os.path.isabs(path):
        return os.path.normpath(path)
    full = os.path.normpath(os.path.join(cwd, path))
    if only_if_exists and not os.path.exists(full):
        return value
    return full


def hub_like(value: Any) -> bool:
    """A string that may be a hub id (``org/name``, ``gpt2``), not a path by its spelling
    (absolute, ``./``, ``../``, ``~``)."""
    return isinstance(value, str) and not value.startswith(("/", ".", "~")) and value.count("/") <= 1


def absolute_paths(data: dict[str, Any], cwd: str | None = None) -> dict[str, Any]:
    """A copy of the config with every local file path absolute (relative to ``cwd``, default
    the current directory: where the sweep was started; Hydra does not change it here)."""
    cwd = cwd or os.getcwd()
    out: dict[str, Any] = plain_copy(data)
    model = out.get("model")
    if isinstance(model, dict):
        hub = model.get("source") == "hub"
        if "path" in model and not hub:
            model["path"] = _absolute(model["path"], cwd)
        if "tokenizer" in model:  # a local folder, or a hub id where no such folder exists
            model["tokenizer"] = _absolute(model["tokenizer"], cwd, only_if_exists=hub_like(model["tokenizer"]))
        if "cache_dir" in model:
            model["cache_dir"] = _absolute(model["cache_dir"], cwd)
    workload = out.get("workload")
    if isinstance(workload, dict):
        for c in (workload.get("classes") or {}).values():
            if isinstance(c, dict) and c.get("path") is not None:
                c["path"] = _absolute(c["path"], cwd)
        for p in workload.get("load_points") or []:
            if isinstance(p, dict) and p.get("trace") is not None:
                p["trace"] = _absolute(p["trace"], cwd)
    engine = out.get("engine")
    if isinstance(engine, dict):
        if isinstance(engine.get("lmcache"), dict) and engine["lmcache"].get("local_disk") is not None:
            engine["lmcache"]["local_disk"] = _absolute(engine["lmcache"]["local_disk"], cwd)
        python = engine.get("python")
        if isinstance(python, str) and "/" in python and not engine.get("launch_prefix"):  # else inside a container
            engine["python"] = _absolute(python, cwd)
        for key in ("speculative_draft_model_path",):
            if engine.get(key) is not None:
                engine[key] = _absolute(engine[key], cwd, only_if_exists=True)
        draft = engine.get("speculative_config")
        if isinstance(draft, dict) and draft.get("model") is not None:
            draft["model"] = _absolute(draft["model"], cwd, only_if_exists=True)
    platform = out.get("platform")
    if isinstance(platform, dict) and platform.get("engine_envs") is not None:
        platform["engine_envs"] = _absolute(platform["engine_envs"], cwd)
    return out


def _validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(model, exc)) from None


def format_validation_error(model: type[BaseModel], exc: ValidationError) -> str:
    """One line per problem: ``key.path: what is wrong (allowed keys / expected values)``."""
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not str(p).startswith("function-after")]
        shown, parent = _walk(model, loc[:-1])
        path = ".".join([*shown, str(loc[-1])] if loc else shown) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = sorted(getattr(parent, "model_fields", {})) or ["(see docs/architecture.md)"]
            lines.append(f"{path}: unknown key; allowed keys here: {', '.join(allowed)}")
        elif err["type"] == "missing":
            lines.append(f"{path}: required key is missing")
        else:
            given = err.get("input")
            shown_input = "" if isinstance(given, (dict, list)) else f" (got {given!r})"
            message = err["msg"].removeprefix("Value error, ")
            # a check across sections names its keys itself: no "<root>:" before it
            lines.append(f"{message}{shown_input}" if path == "<root>" else f"{path}: {message}{shown_input}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _walk(model: type[BaseModel], loc: list[Any]) -> tuple[list[str], Any]:
    """Follow ``loc`` through the models: the user-facing path (union tags such as ``vllm``
    dropped) and the model found at its end (None if the walk leaves the models)."""
    shown: list[str] = []
    current: Any = model
    union: list[type[BaseModel]] = []
    for part in loc:
        if union:  # pydantic puts the discriminator's value in the location
            tagged = [m for m in union if m.model_fields.get("name") and m.model_fields["name"].default == part]
            union = []
            if tagged:
                current = tagged[0]
                continue
        shown.append(str(part))
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        models = _models_in(field.annotation) if field is not None else []
        if len(models) > 1:
            union, current = models, None
        else:
            current = models[0] if models else None
    return shown, current


def _dict_value(annotation: Any) -> tuple[bool, Any]:
    """Whether an annotation is a mapping (``dict[str, X] | None`` too), and its values' type."""
    if get_origin(annotation) in (dict, Mapping):
        args = get_args(annotation)
        return True, args[1] if len(args) == 2 else Any
    for arg in get_args(annotation):
        found, value = _dict_value(arg)
        if found:
            return found, value
    return False, None


def _key_in(models: Sequence[type[BaseModel]], parts: Sequence[str]) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    for model in models:
        field = model.model_fields.get(head)
        if field is None:
            continue
        if not rest:
            return True
        is_map, value = _dict_value(field.annotation)
        if is_map:  # the next part is a key of the mapping: free-form, or one of its models
            inner = _models_in(value)
            if not inner or _key_in(inner, rest[1:]):
                return True
            continue
        inner = _models_in(field.annotation)
        if inner and _key_in(inner, rest):
            return True
    return False


def is_config_key(path: str) -> bool:
    """Whether ``path`` names a key a trial's config can hold (any engine's), or one under a
    free-form mapping (``engine.speculative_config.num_speculative_tokens``): read from the
    schema, so a key set to null in every trial of a sweep, or in none of a search's batch, is one."""
    return _key_in([TrialSpec], path.split("."))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic model classes inside an annotation like ``X | None``, ``dict[str, X]``, ``A | B``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found += [m for m in _models_in(arg) if m not in found]
    return found


__all__ = [
    "ClusterSpec",
    "TrackingSpec",
    "absolute_paths",
    "apply_overlays",
    "config_to_dict",
    "deep_merge",
    "format_validation_error",
    "is_config_key",
    "to_specs",
]
