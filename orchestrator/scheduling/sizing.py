"""A lab's workload sized to this machine before its sweep (the experiment's ``sizing``).

The baseline trial (the sweep's first) says which rules apply on its platform
(``per_platform.cpu.sizing`` in a lab's file). Its server's speed here is read from the cache or
calibrated now (:mod:`orchestrator.trial.calibrate`, ~30 s, before any trial; never in a dry run,
which shows the written sizes when nothing is cached), each rule's value is chosen from it
(:func:`orchestrator.perf.sizing.choose`), and every job of the sweep gets those values as part
of its platform's overlay, so a key the command line sets still wins (and is not sized at all:
the line says so). The values and why are printed, kept in ``<sweep>/sizing.json`` and logged
with the sweep's parameters; each trial's config holds them like any other key."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from orchestrator.config.convert import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.logs import Progress
from orchestrator.config.overlays import command_line_keys, plain_copy, put_at, value_at
from orchestrator.config.schema import TrialSpec
from orchestrator.engines import adapter_for
from orchestrator.engines.process import interrupts_stop_servers
from orchestrator.perf.sizing import EngineSpeed, Sized, choose
from orchestrator.trial.calibrate import cached_speed, engine_speed, one_server, speed_key

log = logging.getLogger(__name__)

Configs = list[tuple[list[str], dict[str, Any]]]


def _user_keys(configs: Configs) -> set[str]:
    """The keys the command line sets (a platform's overlay's keys as the key they set)."""
    keys = set()
    for overrides, data in configs:
        for path, _ in command_line_keys(overrides, data):
            if path[0] == "per_platform" and len(path) > 2:
                path = path[2:]
            keys.add(".".join(path))
    return keys


def _set_by_user(key: str, user: set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in user)


_SAID: dict[Progress, set[str]] = {}  # the lines each console was told: a tuner's or a search's launches size alike


def size_sweep(configs: Configs, sweep_dir: Path, say: Progress) -> tuple[Configs, dict[str, str]]:
    """``configs`` with the baseline's sizing applied to every job, and the sweep parameters that
    record it (empty when the experiment sizes nothing). A line said already to ``say`` (a
    tuner's next step, a search's next batch) is not said again."""
    if not configs:
        return configs, {}
    said = _SAID.setdefault(say, set())

    def say_once(line: str) -> None:
        if line not in said:
            said.add(line)
            say(line)

    overrides, data = configs[0]
    trial, settings = to_specs(data, overrides)
    sizing = settings.sizing
    if sizing is None:
        return configs, {}
    user = _user_keys(configs)
    rules = [r for r in sizing.rules if not _set_by_user(r.set, user)]
    for r in sizing.rules:
        if r not in rules:
            say_once(f"sizing: {r.set} is set on the command line: not sized")
    if not rules:
        return configs, {}
    found = _speed(trial, settings.dry_run, sizing.probe_tokens, sweep_dir, say_once)
    if found is None:
        return configs, {}
    speed, fresh = found
    resolved = trial.model_dump(mode="json")
    age = "measured now" if fresh else f"cached {(time.time() - speed.measured_at) / 3600:.1f} h ago"
    say_once(f"sizing: {age}: {speed.describe()}")

    chosen = choose(rules, speed, lambda key: value_at(resolved, key))
    for s in chosen:
        say_once(f"sizing: {s.key} {s.was} -> {s.value} ({s.why})")
    platform = trial.platform.name
    out: Configs = []
    for job_overrides, job_data in configs:
        job_data = plain_copy(job_data)
        job_data["per_platform"] = job_data.get("per_platform") or {}  # null: no overlay yet
        job_data["per_platform"][platform] = job_data["per_platform"].get(platform) or {}
        for s in chosen:
            put_at(job_data, f"per_platform.{platform}.{s.key}", s.value)
        out.append((job_overrides, job_data))
    _record(sweep_dir, speed, chosen)
    params = {f"sizing.{s.key}": str(s.value) for s in chosen}
    params["sizing.speed"] = speed.describe()
    return out, params


def _speed(
    trial: TrialSpec, dry_run: object, probe_tokens: tuple[int, int], sweep_dir: Path, say: Progress
) -> tuple[EngineSpeed, bool] | None:
    """The baseline server's speed here and whether it was measured now: cached, else calibrated
    (never in a dry run); None, said, where it cannot be had and the lab keeps its written sizes."""
    if trial.platform.name != "cpu":  # the driver is not always a GPU node: nothing to calibrate on
        say(
            f"sizing: calibrated on the CPU platform only (this sweep runs on {trial.platform.name}): the lab keeps its written sizes"
        )
        return None
    alone = one_server(trial)  # what is calibrated: a P/D pair's or a router's engine as one server
    why_not = adapter_for(trial.engine.name).unsupported(alone)
    if why_not is not None:
        say(f"sizing: the baseline cannot run here ({why_not}): the lab keeps its written sizes")
        return None
    limit = getattr(trial.engine, "max_model_len", None)
    low, high = probe_tokens
    if limit is not None and high > limit - 8:
        high = max(limit - 8, low + 1)
    probes = (low, high)
    if dry_run:
        speed = cached_speed(speed_key(alone, probes)[0])
        if speed is None:
            say(
                "sizing: this machine is not calibrated yet (a real run measures it first, ~30 s); shown at the written sizes"
            )
            return None
        return speed, False
    try:
        with interrupts_stop_servers():  # SIGTERM or Ctrl-C: the calibration's server goes down too
            return engine_speed(trial, sweep_dir / "calibration", probes, say)
    except (ConfigError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the lab still runs, as written, and says so
        say(f"sizing: the calibration failed ({type(exc).__name__}: {exc}); the lab keeps its written sizes")
        log.debug("calibration failed", exc_info=True)
        return None


def _record(sweep_dir: Path, speed: EngineSpeed, chosen: list[Sized]) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "speed": speed.as_dict(),
        "sized": [{"key": s.key, "value": s.value, "was": s.was, "why": s.why} for s in chosen],
    }
    (sweep_dir / "sizing.json").write_text(json.dumps(body, indent=1, default=str))
