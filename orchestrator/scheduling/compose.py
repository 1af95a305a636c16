"""Every job's config of a sweep as Hydra composes it, at the cost of a dictionary update per job.

Hydra composes each job of a multirun from its defaults list: every config file merged again,
~0.1-0.2 s a job, 20 minutes for a grid of 10,000 trials. Most jobs of a sweep differ only in
values (``seed=3``, ``engine.block_size=32``), not in which config files they are made of.
:class:`SweepComposer` sorts each job's overrides into three kinds and pays for each kind once:

1. **structural** (a config group such as ``workload=long_short`` or ``+experiment=x``, Hydra's
   own keys, deletions, dict values, package overrides): Hydra composes the job's config from
   these alone (``load_sweep_config``), once per distinct set;
2. **interpolated** (a value that an interpolation of the config reads, e.g. ``platform.dtype``
   read by ``engine.dtype: ${platform.dtype}``, or a value that is an interpolation): applied
   by Hydra to a copy of (1) and resolved, once per distinct set;
3. **plain** values: set in the resolved dictionary of (2), per job. The first job of each
   shape (its plain keys and kinds) is also composed by Hydra from (2); that checks the keys
   exist, with Hydra's own error messages, and that the dictionary is the one Hydra makes
   (else every job of that shape takes Hydra's way).

Overrides whose keys overlap (``engine=...`` then ``engine.x=1``) are moved to the same kind so
they apply in the command line's order. A config or an override that reads Hydra's own node
(``${hydra:job.num}``) is composed by Hydra for every job, as before.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Sequence
from typing import Any

from orchestrator.config.convert import config_to_dict

log = logging.getLogger(__name__)

STRUCTURAL, INTERPOLATED, PLAIN = 0, 1, 2
ANY_KEY = "*"  # an interpolation whose inputs cannot be read from its text: every key may matter
# Resolvers that read no config key (a date, an environment variable, the project's folder);
# their arguments' own ${...} are read separately. Any other resolver may read any key.
KEYLESS_RESOLVERS = {"now", "oc.env", "project_root"}  # not oc.decode: what it decodes may interpolate
_INTERPOLATION = re.compile(r"\$\{\s*([^${}:,]*)(:?)")
_INDEX = re.compile(r"\[(\w+)\]")


def interpolation_inputs(text: str) -> set[str]:
    """The config keys an interpolation string reads: ``${a.b}`` -> ``a.b``; ``${x.${y}}`` ->
    ``x`` and ``y`` (the outer key is known only by its prefix); ``hydra`` for ``${hydra:...}``;
    :data:`ANY_KEY` for a relative key or a resolver that may read keys (``oc.select``)."""
    keys: set[str] = set()
    for m in _INTERPOLATION.finditer(text):
        name, is_resolver = m.group(1).strip(), m.group(2) == ":"
        if is_resolver:
            if name == "hydra":
                keys.add("hydra")
            elif name not in KEYLESS_RESOLVERS:
                keys.add(ANY_KEY)
        elif not name or name.startswith("."):
            keys.add(ANY_KEY)
        else:
            key = _INDEX.sub(r".\1", name).rstrip(".")  # a[0].b -> a.0.b, as overrides name it
            keys.add(ANY_KEY if "[" in key or "]" in key else key)
    return keys


def related(a: str, b: str) -> bool:
    """Two dotted keys name the same node or one holds the other."""
    return a == ANY_KEY or b == ANY_KEY or a == b or a.startswith(b + ".") or b.startswith(a + ".")


class _Base:
    """One structural composition: Hydra's config, the keys its interpolations read, and where
    its interpolations are."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.inputs, self.interpolated = _interpolations_of(cfg)


def _interpolations_of(cfg: Any) -> tuple[set[str], list[str]]:
    """(every key read by an interpolation of the config, the dotted paths of the interpolated
    nodes), Hydra's own node left out."""
    from omegaconf import DictConfig, ListConfig

    keys: set[str] = set()
    paths: list[str] = []
    stack = [(str(k), cfg._get_node(k)) for k in cfg if k != "hydra"]
    while stack:
        path, node = stack.pop()
        if node is None:
            continue
        if node._is_interpolation():
            keys |= interpolation_inputs(str(node._value()))
            paths.append(path)
        elif isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
            stack.extend((f"{path}.{k!s}", node._get_node(k)) for k in node)
        elif isinstance(node, ListConfig) and not node._is_none() and not node._is_missing():
            stack.extend((f"{path}.{i}", node._get_node(i)) for i in range(len(node)))
    return keys, paths


class _NeedsHydra(Exception):
    """This job is one the plain path cannot vouch for: Hydra composes it (and raises its error)."""


class SweepComposer:
    """Compose each job of a sweep from its overrides, as Hydra's ``load_sweep_config`` would
    (same config, same errors), reusing what jobs share. See the module's docstring."""

    def __init__(self, config_loader: Any, master_config: Any) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.loader = config_loader
        self.master = master_config
        self.parser = OverridesParser.create(config_loader=config_loader)
        self._parsed: dict[str, Any] = {}
        self._is_group: dict[str, bool] = {}
        self._bases: dict[tuple[str, ...], _Base] = {}
        self._resolved: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, Any]] = {}
        self._shapes: dict[Any, bool] = {}  # shape -> the plain path gives Hydra's dict
        self.counts = {"structural": 0, "interpolated": 0, "checked": 0, "by_hydra": 0, "plain": 0}

    def compose(self, overrides: Sequence[str], index: int = 0) -> tuple[dict[str, Any], Any]:
        """(the job's config as a plain dict, interpolations resolved, without Hydra's node;
        the Hydra config it was made from, shared by the jobs of one structural set).
        ``index`` is the job's number (``hydra.job.num``), read only by a config that asks."""
        parsed = [self._parse(line) for line in overrides]
        # What changes the composition itself, or a deletion whose check reads a value: Hydra.
        if any(o.key_or_group.startswith("hydra.searchpath") or (o.is_delete() and o.value()) for o in parsed):
            return self._by_hydra(list(overrides), index)
        base_key = tuple(o.input_line for o, k in zip(parsed, self._kinds(parsed, None)) if k == STRUCTURAL)
        base = self._base(base_key)
        inputs = set(base.inputs)
        for o in parsed:
            if "${" in (o.input_line or ""):
                inputs |= interpolation_inputs(o.input_line)
        if "hydra" in inputs or any(self._into_interpolation(o, base) for o in parsed):
            return self._by_hydra(list(overrides), index)
        kinds = self._kinds(parsed, inputs)
        mid = [o for o, k in zip(parsed, kinds) if k == INTERPOLATED]
        plain = [o for o, k in zip(parsed, kinds) if k == PLAIN]
        mid_key = tuple(o.input_line for o in mid)
        try:
            resolved = self._resolve(base, base_key, mid_key, mid)
            shape = (base_key, mid_key, tuple((o.key_or_group, o.type, isinstance(o.value(), list)) for o in plain))
            if shape not in self._shapes:
                self._shapes[shape] = self._check_shape(base, mid, plain, resolved)
            if not self._shapes[shape]:
                raise _NeedsHydra
            data = _with_values(resolved, plain)
        except _NeedsHydra:
            return self._by_hydra(list(overrides), index)
        self.counts["plain"] += 1
        return data, base.cfg

    @staticmethod
    def _into_interpolation(o: Any, base: _Base) -> bool:
        """The override reaches inside an interpolated node (its target changes in Hydra), or
        adds or deletes one (Hydra's check reads the interpolation's value)."""
        key = o.key_or_group
        for path in base.interpolated:
            if key.startswith(path + ".") or (key == path and (o.is_add() or o.is_delete())):
                return True
        return False

    # -- the three kinds ------------------------------------------------------------------

    def _parse(self, line: str) -> Any:
        o = self._parsed.get(line)
        if o is None:
            o = self._parsed[line] = self.parser.parse_overrides([line])[0]  # Hydra's parse errors
        return o

    def _group(self, key: str) -> bool:
        if key not in self._is_group:
            self._is_group[key] = bool(self.loader.repository.group_exists(key))
        return self._is_group[key]

    def _kinds(self, parsed: list[Any], inputs: set[str] | None) -> list[int]:
        """Each override's kind, given the keys that interpolations read (``inputs``); with
        ``inputs`` None only structural or not (to find the base)."""
        kinds, groups = [], []
        for o in parsed:
            value = o.value()
            group = self._group(o.key_or_group) and not isinstance(value, dict)
            groups.append(group)
            if group or o.is_hydra_override() or o.is_delete() or o.package is not None or isinstance(value, dict):
                kinds.append(STRUCTURAL)
            elif inputs is not None and (
                "${" in (o.input_line or "") or any(related(o.key_or_group, k) for k in inputs)
            ):
                kinds.append(INTERPOLATED)
            else:
                kinds.append(PLAIN)
        # Overlapping keys take the lowest kind of the two, so they apply in the given order
        # (config groups are not values: Hydra applies them first, whatever the order).
        changed = True
        while changed:
            changed = False
            for i, a in enumerate(parsed):
                for j in range(i + 1, len(parsed)):
                    b = parsed[j]
                    if groups[i] or groups[j] or kinds[i] == kinds[j]:
                        continue
                    if related(a.key_or_group, b.key_or_group):
                        kinds[i] = kinds[j] = min(kinds[i], kinds[j])
                        changed = True
        if inputs is None:
            return [STRUCTURAL if k == STRUCTURAL else PLAIN for k in kinds]
        return kinds

    def _base(self, key: tuple[str, ...]) -> _Base:
        base = self._bases.get(key)
        if base is None:
            self.counts["structural"] += 1
            base = self._bases[key] = _Base(self.loader.load_sweep_config(self.master, list(key)))
        return base

    def _resolve(
        self, base: _Base, base_key: tuple[str, ...], mid_key: tuple[str, ...], mid: list[Any]
    ) -> dict[str, Any]:
        key = (base_key, mid_key)
        resolved = self._resolved.get(key)
        if resolved is None:
            self.counts["interpolated"] += 1
            try:  # without the job's plain values an interpolation may not resolve: Hydra's way then
                resolved = _resolved_dict(_applied(base.cfg, mid))
            except Exception as exc:
                raise _NeedsHydra from exc
            self._resolved[key] = resolved
        return resolved

    def _check_shape(self, base: _Base, mid: list[Any], plain: list[Any], resolved: dict[str, Any]) -> bool:
        """Hydra applies this shape's overrides once (its errors are raised as they are); True
        when the plain path gives the same config."""
        self.counts["checked"] += 1
        by_hydra = _resolved_dict(_applied(base.cfg, [*mid, *plain]))
        same = by_hydra == _with_values(resolved, plain)
        if not same:
            log.debug("composing %s the plain way differs from Hydra's: Hydra composes these jobs", plain)
        return same

    def _by_hydra(self, overrides: list[str], index: int) -> tuple[dict[str, Any], Any]:
        from omegaconf import open_dict

        self.counts["by_hydra"] += 1
        cfg = self.loader.load_sweep_config(self.master, overrides)
        with open_dict(cfg):
            cfg.hydra.job.id = f"job{index}"
            cfg.hydra.job.num = index
        return _resolved_dict(cfg), cfg


def _applied(cfg: Any, overrides: list[Any]) -> Any:
    """A copy of Hydra's config with value overrides applied by Hydra itself."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    out = copy.deepcopy(cfg)
    OmegaConf.copy_cache(from_config=cfg, to_config=out)
    if overrides:
        ConfigLoaderImpl._apply_overrides_to_config(overrides, out)
    return out


def _resolved_dict(cfg: Any) -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)  # ${hydra:...} resolves against this job's config
    return config_to_dict(cfg)


def _with_values(resolved: dict[str, Any], plain: list[Any]) -> dict[str, Any]:
    """``resolved`` with each override's value set, as ``OmegaConf.update`` sets it after the
    checks of Hydra's ``_apply_overrides_to_config``; nodes on the way are copied, everything
    else is shared with ``resolved`` (never changed). Whatever Hydra would check differently
    (a missing key, a list index out of range, ``+`` on a value that is set) raises
    :class:`_NeedsHydra`: Hydra composes that job and raises its own error."""
    out = dict(resolved)
    for o in plain:
        add = o.is_add() or o.is_force_add()
        parts = o.key_or_group.split(".")
        node: Any = out
        for part in parts[:-1]:
            index = _index(node, part, add)
            child = node[index] if (isinstance(node, list) or index in node) else None
            if not add and not isinstance(child, (dict, list)):
                raise _NeedsHydra  # Hydra makes a map here and then fails or not: let it say
            child = list(child) if isinstance(child, list) else dict(child) if isinstance(child, dict) else {}
            node[index] = child
            node = child
        last = _index(node, parts[-1], add)
        value = o.value()
        if isinstance(node, dict) and last not in node and not add:
            raise _NeedsHydra  # "Could not override"
        existing = node.get(last) if isinstance(node, dict) else node[last]
        if o.is_add() and existing is not None and not isinstance(value, list):
            raise _NeedsHydra  # "Could not append to config. An item is already at ..."
        node[last] = copy.deepcopy(value)
    return out


def _index(node: Any, part: str, add: bool) -> Any:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise _NeedsHydra
        return int(part)
    return part
