"""Arrival schedules: statistics over a fixed seed, determinism, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.loadgen.arrivals import arrival_offsets, weighted_choice


def cv(offsets):
    g = np.diff(offsets)
    return g.mean(), g.std() / g.mean()


def test_poisson_mean_and_cv():
    offsets = arrival_offsets(4.0, np.random.default_rng(7), count=20_000)
    mean, c = cv(offsets)
    assert mean == pytest.approx(0.25, rel=0.03)
    assert c == pytest.approx(1.0, rel=0.03)  # exponential: CV = 1
    assert offsets[0] == 0.0 and len(offsets) == 20_000


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_mean_and_cv(burstiness):
    offsets = arrival_offsets(2.0, np.random.default_rng(3), count=20_000, kind="gamma", burstiness=burstiness)
    mean, c = cv(offsets)
    assert mean == pytest.approx(0.5, rel=0.04)
    assert c == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_constant_is_evenly_spaced():
    offsets = arrival_offsets(0.4, np.random.default_rng(0), duration_s=10.0, kind="constant")
    assert offsets == pytest.approx([0.0, 2.5, 5.0, 7.5])


def test_duration_bound():
    offsets = arrival_offsets(10.0, np.random.default_rng(1), duration_s=5.0)
    assert all(o < 5.0 for o in offsets)
    assert len(offsets) == pytest.approx(50, abs=20)


def test_count_and_duration_forms_share_a_prefix():
    by_duration = arrival_offsets(3.0, np.random.default_rng(9), duration_s=20.0)
    by_count = arrival_offsets(3.0, np.random.default_rng(9), count=len(by_duration))
    assert by_count == by_duration


def test_same_seed_same_schedule():
    a = arrival_offsets(3.0, np.random.default_rng(42), count=100, kind="gamma", burstiness=0.5)
    b = arrival_offsets(3.0, np.random.default_rng(42), count=100, kind="gamma", burstiness=0.5)
    assert a == b


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_bad_rate(rate):
    with pytest.raises(ValueError, match="rate must be > 0"):
        arrival_offsets(rate, np.random.default_rng(0), count=3)


def test_bad_kind_and_missing_stop():
    with pytest.raises(ValueError, match="unknown arrival process"):
        arrival_offsets(1.0, np.random.default_rng(0), count=3, kind="uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs count or duration_s"):
        arrival_offsets(1.0, np.random.default_rng(0))


def test_weighted_choice_proportions():
    names = weighted_choice(["a", "b"], [3.0, 1.0], np.random.default_rng(0), 8000)
    assert names.count("a") / len(names) == pytest.approx(0.75, abs=0.02)
