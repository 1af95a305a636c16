"""A lab's workload sized from its engine's speed on this machine (the arithmetic; the
calibration is :mod:`orchestrator.trial.calibrate`'s, the sweep's use of it
:mod:`orchestrator.scheduling.sizing`'s).

The speed is two numbers measured on the lab's baseline server: one stream's decode step, and
the prefill time of a prompt as a line over its length (fixed part plus time per token, from the
TTFTs of two lengths). Attention makes long prefills cost more than the line says, so a prompt
sized from it prefills in at least the steps asked, not fewer."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.config.paths import cache_root, cached_entries
from orchestrator.config.schema import SizeRule

SPEED_CACHE = "engine-speed.json"  # under cache_root(): each server's speed, by speed key


@dataclass(frozen=True)
class EngineSpeed:
    """The lab's baseline server on this machine, measured (:mod:`orchestrator.trial.calibrate`)."""

    decode_step_ms: float  # one stream's median time between tokens
    prefill_ms_per_token: float  # the slope of TTFT over prompt length
    prefill_fixed_ms: float  # its intercept: a request's cost before its prompt's tokens
    probe_tokens: tuple[int, int]  # the prompt lengths measured
    machine: str
    engine: str
    model: str
    measured_at: float
    # other work on the machine while it was measured (cores; steal included): a busy machine's
    # numbers size the sweep that measured them but are not cached (calibrate.BUSY_CORES)
    other_cores: float = 0.0

    def prefill_ms(self, tokens: float) -> float:
        return self.prefill_fixed_ms + self.prefill_ms_per_token * tokens

    def describe(self) -> str:
        return (
            f"a decode step {self.decode_step_ms:.1f} ms, a prompt's prefill {self.prefill_fixed_ms:.0f} ms + "
            f"{self.prefill_ms_per_token:.3f} ms/token ({self.engine} on {self.machine})"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSpeed:
        return cls(**{**d, "probe_tokens": tuple(d["probe_tokens"])})


def latest_speed(machine: str | None = None, model: str | None = None) -> EngineSpeed | None:
    """The latest speed calibrated on ``machine`` of ``model`` (any, where None), from the cache;
    None: none yet."""
    try:
        speeds = [EngineSpeed.from_dict(d) for d in cached_entries(cache_root() / SPEED_CACHE).values()]
    except (KeyError, TypeError, ValueError):
        return None
    here = [s for s in speeds if machine in (None, s.machine) and model in (None, s.model)]
    return max(here, key=lambda s: s.measured_at, default=None)


@dataclass(frozen=True)
class Sized:
    """One key's value as a rule chose it, and why (printed, logged with the sweep)."""

    key: str
    value: float | int
    was: Any
    why: str


def _bounded(rule: SizeRule, value: float) -> float:
    if rule.min is not None:
        value = max(value, rule.min)
    if rule.max is not None:
        value = min(value, rule.max)
    return value


def _rounded(rule: SizeRule, value: float, up: bool) -> float | int:
    step = rule.round_to
    x = value / step  # float noise (0.8 / 0.05 = 16.000000000000004) must not move it a step
    n = math.ceil(x - 1e-9) if up else math.floor(x + 1e-9)
    out = max(n, 1) * step
    return int(out) if float(step).is_integer() else round(out, 6)


def choose(rules: list[SizeRule], speed: EngineSpeed, current: Callable[[str], Any]) -> list[Sized]:
    """Each rule's value, in order (a later rule reads an earlier one's choice through
    ``current``'s fallback: the values chosen so far win)."""
    chosen: dict[str, float | int] = {}

    def now(key: str) -> Any:
        return chosen[key] if key in chosen else current(key)

    out = []
    for rule in rules:
        if rule.prefill_steps is not None:
            want = rule.prefill_steps * speed.decode_step_ms
            raw = (want - speed.prefill_fixed_ms) / max(speed.prefill_ms_per_token, 1e-9)
            value = _rounded(rule, _bounded(rule, raw), up=True)
            if rule.max is not None and value > rule.max:
                value = _rounded(rule, rule.max, up=False)
            got = speed.prefill_ms(value) / speed.decode_step_ms
            why = f"a prefill of ~{got:.0f} decode steps here (asked {rule.prefill_steps:g})"
            if rule.max is not None and raw > rule.max:
                why += f"; {raw:.0f} tokens would be needed, capped at {rule.max:g}"
        elif rule.busy_share is not None:
            assert rule.tokens is not None  # the schema checks it
            tokens = float(now(rule.tokens))
            prefill_s = speed.prefill_ms(tokens) / 1000
            raw = rule.busy_share / prefill_s
            value = _rounded(rule, _bounded(rule, raw), up=False)
            why = (
                f"prompts of {tokens:.0f} tokens ({prefill_s * 1000:.0f} ms to prefill here) keep the server "
                f"prefilling {float(value) * prefill_s:.0%} of the time (asked at most {rule.busy_share:.0%})"
            )
        else:
            parts = [float(now(k)) for k in rule.fits or []]
            raw = sum(parts) + rule.margin
            value = _rounded(rule, _bounded(rule, raw), up=True)
            why = f"holds {' + '.join(f'{p:.0f}' for p in parts)} + {rule.margin}"
        if rule.why:
            why = f"{rule.why}: {why}"
        chosen[rule.set] = value
        out.append(Sized(rule.set, value, current(rule.set), why))
    return out
