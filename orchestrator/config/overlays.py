"""The experiment's overlays and the command line's keys, applied to a composed config before it
is validated (:func:`apply_overlays`, called by :func:`orchestrator.config.convert.to_specs`), in
this order:

* ``per_platform.<platform.name>``: an experiment's scale for one platform (e.g. the CPU
  size of a GPU lab), so one experiment file carries both;
* ``variants.<variant>``: a named bundle of keys that a sweep selects with ``variant=NAME``
  (e.g. ``chunking_off`` = ``engine.enable_chunked_prefill: false``). A platform may give a
  variant a form of its own, ``per_platform.<platform.name>.variants.<variant>``, merged after
  the variant's keys (multi_lora's ``rank_64`` trains rank-64 tiny adapters on the CPU and
  raises the slots' rank over one's own adapters on a GPU).

A key set on the command line wins over both, as it wins over the experiment's file in Hydra
(``+experiment=chunked_prefill workload.num_requests=500`` runs 500 requests, though the CPU
overlay says 24); one that replaces a variant's own value is logged as a warning.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.config.errors import ConfigError

# The top-level keys of a trial and of a sweep's settings: what an overlay may set.
TRIAL_KEYS = ("experiment", "variant", "seed", "run", "engine", "model", "workload", "platform", "eval", "profile")
SETTINGS_KEYS = ("tracking", "cluster", "dry_run", "resume", "reuse_servers", "objective", "expect", "sizing")
log = logging.getLogger(__name__)


REPLACE = "_replace_"


_ATOMS = (str, int, float, bool, type(None))


def plain_copy(value: Any) -> Any:
    """A deep copy of config data (dicts, lists, scalars), ~10x faster than ``copy.deepcopy``
    (no memo: config data has no cycles); anything else is deep-copied the usual way."""
    if isinstance(value, _ATOMS):
        return value
    if type(value) is dict:
        return {k: plain_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [plain_copy(v) for v in value]
    return copy.deepcopy(value)


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``overlay`` merged in; nested mappings merge, other values replace.

    A mapping with ``_replace_: true`` replaces the node instead of merging into it (a
    variant that switches engine, e.g. ``engine: {_replace_: true, name: sglang}``, must not
    inherit the other engine's keys).
    """
    out = dict(base)  # nested values are copied below, or as they are merged into
    for key, value in overlay.items():
        if isinstance(value, Mapping) and value.get(REPLACE):
            out[key] = {k: plain_copy(v) for k, v in value.items() if k != REPLACE}
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = plain_copy(value)
    for key in base:
        if key not in overlay:
            out[key] = plain_copy(out[key])
    return out


def command_line_keys(overrides: Sequence[str], data: Mapping[str, Any]) -> list[tuple[list[str], bool]]:
    """The config keys a job's overrides set (``workload.num_requests=500``) or delete (``~key``),
    each as its path and whether it is deleted. Left out: a config group's choice
    (``workload=mooncake``: the group's file, which the overlays may scale), ``variant`` and
    ``experiment``, Hydra's own keys."""
    keys: list[tuple[list[str], bool]] = []
    for override in overrides:
        text = override.lstrip("+")
        deleted = text.startswith("~")
        key, _, value = text.lstrip("~").partition("=")
        key = key.strip()
        if not key or "/" in key or key.split(".")[0] in ("hydra", "variant", "experiment"):
            continue
        if "." not in key and isinstance(data.get(key), Mapping) and not value.lstrip().startswith("{"):
            continue  # group=option
        keys.append((key.split("."), deleted))
    return keys


def _at(data: Any, path: list[str]) -> tuple[bool, Any]:
    """(found, value) at ``path`` in nested dicts and lists (a list's index as digits)."""
    for part in path:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return False, None
    return True, data


def value_at(data: Any, dotted: str) -> Any:
    """The value at a dotted key (``workload.classes.long.input_tokens``), None where there is none."""
    return _at(data, dotted.split("."))[1]


def put_at(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set the value at a dotted key, making the mappings on the way as needed (:func:`_put`)."""
    _put(data, dotted.split("."), value)


def _put(data: dict[str, Any], path: list[str], value: Any, delete: bool = False) -> None:
    """Set (or delete) the value at ``path``, making the dicts on the way as needed."""
    node: Any = data
    for part in path[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise ConfigError(f"{'.'.join(path)}: set on the command line, but '{part}' is no mapping or list here")
    last = path[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        if not delete:
            node[int(last)] = value
    elif isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value
    else:
        raise ConfigError(f"{'.'.join(path)}: set on the command line, but its parent is no mapping or list here")


def _replaces(overlay: Any, path: list[str]) -> str | None:
    """The node on ``path`` (the path itself or a key above it) an overlay replaces whole
    (``_replace_: true``), or None."""
    node = overlay
    for i, part in enumerate(path):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
        if isinstance(node, Mapping) and node.get(REPLACE):
            return ".".join(path[: i + 1])
    return None


def _sets(overlay: Any, path: list[str]) -> bool:
    """Whether an overlay sets ``path``, a key above it or one below it."""
    node = overlay
    for part in path:
        if not isinstance(node, Mapping):
            return True  # the overlay sets a value above the path
        if part not in node:
            return False
        node = node[part]
    return True


def apply_overlays(data: dict[str, Any], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Apply ``per_platform``, then ``variants``, then the platform's form of the variant
    (``per_platform.<platform>.variants.<variant>``), then again what ``overrides`` (the job's
    command line) set; returns a new dict without the overlays."""
    typed = data
    data = dict(data)
    per_platform = data.pop("per_platform", None) or {}
    variants = data.pop("variants", None) or {}
    platform_name = (data.get("platform") or {}).get("name")
    data, forms = _merge_platform(data, per_platform, platform_name)
    variant = data.get("variant")
    if variant is not None:
        data = _merge_variant(data, variant, variants, forms, platform_name)
    applied = [per_platform.get(platform_name) if platform_name else None]
    applied += [variants.get(variant), forms.get(variant)] if variant is not None else []
    for path, deleted in command_line_keys(overrides, typed):
        found, value = _at(typed, path)
        if not deleted and not found:
            continue
        # an overlay that put another node there (another engine): the key was for the one it replaced
        replaced = next((r for o in applied if o and (r := _replaces(o, path))), None)
        if replaced is not None:
            log.warning(
                "%s: the command line's value is not applied to %s, whose %s replaces the node it was set in",
                ".".join(path),
                f"variant {variant}" if variant is not None else f"per_platform.{platform_name}",
                replaced,
            )
            continue
        now_found, now = _at(data, path)
        if now_found == (not deleted) and (deleted or now == value):
            continue
        if variant is not None and (_sets(variants.get(variant) or {}, path) or _sets(forms.get(variant) or {}, path)):
            log.warning(
                "%s: the command line's value replaces variant %s's (%s -> %s)",
                ".".join(path),
                variant,
                json.dumps(now, default=str),
                json.dumps(value, default=str),
            )
        _put(data, path, plain_copy(value), delete=deleted)
    return data


def _merge_platform(
    data: dict[str, Any], per_platform: Any, platform_name: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` with ``per_platform.<platform_name>`` merged in, and that overlay's own forms of the
    variants (its ``variants`` key, variant name -> overlay), which :func:`_merge_variant` merges."""
    forms: dict[str, Any] = {}  # per_platform.<platform>.variants: the platform's form of a variant
    if not isinstance(per_platform, Mapping):
        raise ConfigError(
            f"per_platform: expected a mapping of platform name -> overlay, got {type(per_platform).__name__}"
        )
    if platform_name in per_platform and per_platform[platform_name]:
        overlay = per_platform[platform_name]
        where = f"per_platform.{platform_name}"
        if isinstance(overlay, Mapping) and "variants" in overlay:
            overlay = dict(overlay)
            own = overlay.pop("variants") or {}
            if not isinstance(own, Mapping):
                raise ConfigError(
                    f"{where}.variants: expected a mapping of variant name -> overlay, got {type(own).__name__}"
                )
            forms = {str(name): form or {} for name, form in own.items()}
        _check_overlay(where, overlay)
        data = deep_merge(data, overlay)
    return data, forms


def _merge_variant(
    data: dict[str, Any], variant: Any, variants: Any, forms: dict[str, Any], platform_name: Any
) -> dict[str, Any]:
    """``data`` with ``variants.<variant>`` merged in, then the platform's form of it (``forms``)."""
    if variant not in variants and variant not in forms:
        allowed = ", ".join(sorted(set(variants) | set(forms))) or "(this experiment defines no variants)"
        raise ConfigError(f"variant: unknown value '{variant}'; expected one of: {allowed}")
    overlay = variants.get(variant) or {}
    _check_overlay(f"variants.{variant}", overlay)
    data = deep_merge(data, overlay)
    if variant in forms:  # after the variant: a platform's form overrides it, _replace_ included
        _check_overlay(f"per_platform.{platform_name}.variants.{variant}", forms[variant])
        data = deep_merge(data, forms[variant])
    return data


def _check_overlay(where: str, overlay: Any) -> None:
    if not isinstance(overlay, Mapping):
        raise ConfigError(f"{where}: expected a mapping of config keys, got {type(overlay).__name__}")
    bad = [k for k in overlay if k not in TRIAL_KEYS + SETTINGS_KEYS or k in ("variant", "experiment")]
    if bad:
        raise ConfigError(
            f"{where}: cannot set {', '.join(map(repr, bad))}; an overlay may set: "
            + ", ".join(k for k in TRIAL_KEYS + SETTINGS_KEYS if k not in ("variant", "experiment"))
        )
