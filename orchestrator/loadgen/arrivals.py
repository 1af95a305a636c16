"""Arrival schedules: intended send offsets (seconds from the point's start) from a seeded generator.

Processes (all with mean gap ``1 / rate``):

* ``poisson``: exponential gaps (coefficient of variation 1);
* ``gamma``: gamma gaps with shape ``burstiness``; CV = 1/sqrt(burstiness), so values below 1
  are burstier than Poisson and values above 1 smoother (``burstiness=1`` is Poisson);
* ``constant``: evenly spaced.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

ArrivalKind = Literal["poisson", "gamma", "constant"]


def gaps(kind: ArrivalKind, rate: float, rng: np.random.Generator, n: int, burstiness: float = 1.0) -> np.ndarray:
    """``n`` inter-arrival gaps of the given process."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if kind == "poisson":
        return rng.exponential(1.0 / rate, n)
    if kind == "gamma":
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    if kind == "constant":
        return np.full(n, 1.0 / rate)
    raise ValueError(f"unknown arrival process {kind!r}; expected poisson, gamma or constant")


def ramp(t: float, ramp_up_s: float) -> float:
    """Map an offset of a constant-rate schedule onto one whose rate rises linearly from 0
    to the full rate over ``ramp_up_s`` (the arrival count up to t is rate * t^2 / 2R there)."""
    if t < ramp_up_s / 2:
        return math.sqrt(2 * ramp_up_s * t)
    return t + ramp_up_s / 2


def arrival_offsets(
    rate: float,
    rng: np.random.Generator,
    count: int | None = None,
    duration_s: float | None = None,
    kind: ArrivalKind = "poisson",
    burstiness: float = 1.0,
    ramp_up_s: float = 0.0,
) -> list[float]:
    """Offsets of ``count`` arrivals, or of all arrivals before ``duration_s``; with
    ``ramp_up_s``, the rate rises linearly from 0 to ``rate`` over that time (:func:`ramp`).

    The first arrival is at 0 so a point starts working at once; the rest follow the gaps.
    """
    offsets = _offsets(rate, rng, count, duration_s, kind, burstiness)
    return [ramp(t, ramp_up_s) for t in offsets] if ramp_up_s else offsets


def _offsets(
    rate: float,
    rng: np.random.Generator,
    count: int | None,
    duration_s: float | None,
    kind: ArrivalKind,
    burstiness: float,
) -> list[float]:
    if count is None and duration_s is None:
        raise ValueError("arrival_offsets needs count or duration_s")
    if math.isinf(rate):
        if count is None:
            raise ValueError("an infinite rate needs a request count")
        return [0.0] * count
    offsets = [0.0]
    t = 0.0
    batch = 256
    while count is None or len(offsets) < count:
        for g in gaps(kind, rate, rng, batch, burstiness):
            t += float(g)
            if duration_s is not None and t >= duration_s:
                return offsets
            offsets.append(t)
            if count is not None and len(offsets) >= count:
                return offsets
    return offsets


def weighted_choice(names: list[str], weights: list[float], rng: np.random.Generator, n: int) -> list[str]:
    """``n`` draws of ``names`` with probabilities proportional to ``weights``."""
    p = np.asarray(weights, dtype=float)
    p = p / p.sum()
    idx = rng.choice(len(names), size=n, p=p)
    return [names[i] for i in idx]
