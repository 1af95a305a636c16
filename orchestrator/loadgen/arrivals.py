"""Arrival schedules: intended send offsets (seconds from the point's start) from a seeded generator."""

from __future__ import annotations

import numpy as np


def poisson_offsets(
    rate: float, rng: np.random.Generator, count: int | None = None, duration_s: float | None = None
) -> list[float]:
    """Offsets of a Poisson process of ``rate`` req/s: ``count`` arrivals, or all before ``duration_s``.

    The first arrival is at 0 so a point starts working at once; the rest follow exponential gaps.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if count is None and duration_s is None:
        raise ValueError("poisson_offsets needs count or duration_s")
    offsets = [0.0]
    t = 0.0
    while True:
        if count is not None and len(offsets) >= count:
            break
        t += float(rng.exponential(1.0 / rate))
        if duration_s is not None and t >= duration_s:
            break
        offsets.append(t)
    return offsets


def weighted_choice(names: list[str], weights: list[float], rng: np.random.Generator, n: int) -> list[str]:
    """``n`` draws of ``names`` with probabilities proportional to ``weights``."""
    p = np.asarray(weights, dtype=float)
    p = p / p.sum()
    idx = rng.choice(len(names), size=n, p=p)
    return [names[i] for i in idx]
