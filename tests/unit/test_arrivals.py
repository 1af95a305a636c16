"""Arrival schedules: statistics over a fixed seed, determinism, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.loadgen.arrivals import poisson_offsets, weighted_choice


def test_poisson_mean_and_cv():
    offsets = poisson_offsets(4.0, np.random.default_rng(7), count=20_000)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV = 1
    assert offsets[0] == 0.0


def test_poisson_duration_bound():
    offsets = poisson_offsets(10.0, np.random.default_rng(1), duration_s=5.0)
    assert all(o < 5.0 for o in offsets)
    assert len(offsets) == pytest.approx(50, abs=20)


def test_same_seed_same_schedule():
    a = poisson_offsets(3.0, np.random.default_rng(42), count=100)
    b = poisson_offsets(3.0, np.random.default_rng(42), count=100)
    assert a == b


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_bad_rate(rate):
    with pytest.raises(ValueError, match="rate must be > 0"):
        poisson_offsets(rate, np.random.default_rng(0), count=3)


def test_weighted_choice_proportions():
    names = weighted_choice(["a", "b"], [3.0, 1.0], np.random.default_rng(0), 8000)
    assert names.count("a") / len(names) == pytest.approx(0.75, abs=0.02)
