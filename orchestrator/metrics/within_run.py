"""How precisely one run measured a latency statistic: a bootstrap over the point's requests.

The interval within a run answers "with these requests, how far could the p99 be off?": the
requests are resampled with replacement (a whole request at a time, its inter-token gaps with
it, so the gaps of one request stay together), the statistic is recomputed on each resample,
and the 2.5th and 97.5th percentiles of those are ``<key>_within95_low`` / ``_high``. It does
not see what changes from one run to the next (a server's start, the machine's other work, the
drawn requests): that is the interval between runs (:mod:`orchestrator.decide.objective`), and the
only one a verdict may call the uncertainty of its answer.

Statistics are read as the inverted empirical CDF of the resample (the smallest value with at
least q of the weight at or below it); the point's own number uses linear interpolation
(:func:`orchestrator.metrics.summary.distribution`), so with few requests the interval can
sit a little beside it. With fewer than :data:`LEAST` requests no interval is given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from orchestrator.config.metric_keys import WITHIN95, M
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import HEADLINE_LATENCIES, RequestLatency, latency_of

HEADLINE = (*HEADLINE_LATENCIES, M.E2E_MS_P99)
LOW, HIGH = WITHIN95
LEAST = 10  # requests: fewer give no interval
RESAMPLES = 400
BLOCK = 25  # resamples weighed at once (their weights are resamples x values)
BINNED = 20_000  # more values than this (inter-token gaps): quantiles from BINS bins of equal count
BINS = 2048

_KEY = re.compile(r"^(?:(?P<cls>[^/]+)/)?(?P<lat>ttft|tpot|itl|e2e|itl_worst)_ms_(?P<stat>mean|max|p\d+)$")


def within_run(
    records: Sequence[RequestRecord], keys: Iterable[str] = HEADLINE, seed: int = 0, resamples: int = RESAMPLES
) -> dict[str, float]:
    """``<key>_within95_low`` and ``_high`` for each latency ``key`` (``[<class>/]<ttft|tpot|itl|
    e2e|itl_worst>_ms_<mean|max|pNN>``); a key whose requests are fewer than :data:`LEAST` is
    left out. The same ``seed`` draws the same resamples."""
    out: dict[str, float] = {}
    lats: dict[str | None, list[RequestLatency]] = {}
    for key in keys:
        parsed = _KEY.match(key)
        if parsed is None:
            raise ValueError(f"within_run: {key!r} is not a latency statistic ([<class>/]<latency>_ms_<stat>)")
        cls, lat, stat = parsed.group("cls", "lat", "stat")
        if cls not in lats:
            chosen = [r for r in records if cls is None or r.request_class == cls]
            lats[cls] = [x for x in (latency_of(r) for r in chosen) if x is not None]
        interval = _interval(lats[cls], lat, stat, np.random.default_rng(seed), resamples)
        if interval is not None:
            out[key + LOW], out[key + HIGH] = interval
    return out


def _values(lats: Sequence[RequestLatency], lat: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The statistic's values, the request each belongs to (an index into ``lats``), and the
    number of requests they come from."""
    if lat == "itl":
        gaps = [(g, i) for i, x in enumerate(lats) for g in x.itl_ms]
        return np.array([g for g, _ in gaps]), np.array([i for _, i in gaps], dtype=np.int64), len(lats)
    if lat == "itl_worst":
        pairs = [(max(x.itl_ms), i) for i, x in enumerate(lats) if x.itl_ms]
    elif lat == "tpot":
        pairs = [(x.tpot_ms, i) for i, x in enumerate(lats) if x.tpot_ms is not None]
    else:
        pairs = [(getattr(x, f"{lat}_ms"), i) for i, x in enumerate(lats)]
    return np.array([v for v, _ in pairs]), np.array([i for _, i in pairs], dtype=np.int64), len(pairs)


def _interval(
    lats: Sequence[RequestLatency], lat: str, stat: str, rng: np.random.Generator, resamples: int
) -> tuple[float, float] | None:
    values, owner, n = _values(lats, lat)
    if n < LEAST or len(values) == 0:
        return None
    order = np.argsort(values, kind="stable")
    values, owner = values[order], owner[order]
    draws = rng.integers(0, len(lats), size=(resamples, len(lats)))
    counts = np.zeros(draws.shape, dtype=np.float64)
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1.0)  # how often each request was drawn
    if len(values) > BINNED and stat.startswith("p"):
        est = _binned_quantile(values, owner, len(lats), counts, float(stat[1:]) / 100.0)
    else:
        est = np.concatenate(
            [_weighted(values, counts[b : b + BLOCK][:, owner], stat) for b in range(0, resamples, BLOCK)]
        )
    est = est[np.isfinite(est)]
    if len(est) == 0:
        return None
    low, high = np.percentile(est, [2.5, 97.5])
    return float(low), float(high)


def _weighted(values: np.ndarray, weights: np.ndarray, stat: str) -> np.ndarray:
    """The statistic of each row's weighting of the sorted ``values`` (NaN for a row of no weight)."""
    total = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if stat == "mean":
            return np.asarray((weights @ values) / total)
        if stat == "max":
            last = weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
            return np.where(total > 0, values[last], np.nan)
        q = float(stat[1:]) / 100.0
        cum = np.cumsum(weights, axis=1)
        at = np.argmax(cum >= q * total[:, None] - 1e-9, axis=1)
        return np.where(total > 0, values[at], np.nan)


def _binned_quantile(values: np.ndarray, owner: np.ndarray, requests: int, counts: np.ndarray, q: float) -> np.ndarray:
    """The q-quantile of each resample of many values (inter-token gaps): the sorted values cut
    into :data:`BINS` bins of equal count, each request's values counted per bin, the resamples'
    bin counts one product; the answer is read in the bin where the resample's CDF reaches q, as
    if its weight lay evenly over the bin's values (off by at most 1/BINS of the distribution,
    far inside a p99's interval)."""
    bins = np.minimum(np.arange(len(values)) * BINS // len(values), BINS - 1)
    per_request = np.zeros((requests, BINS))
    np.add.at(per_request, (owner, bins), 1.0)
    weights = counts @ per_request  # resamples x bins
    total = weights.sum(axis=1)
    cum = np.cumsum(weights, axis=1)
    at = np.argmax(cum >= q * total[:, None] - 1e-9, axis=1)
    rows = np.arange(len(at))
    before = cum[rows, at] - weights[rows, at]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip((q * total - before) / weights[rows, at], 0.0, 1.0)  # how far into the bin
    first = np.searchsorted(bins, np.arange(BINS), side="left")  # each bin's first (smallest) value
    size = np.bincount(bins, minlength=BINS)
    index = first[at] + np.ceil(share * size[at]).astype(np.int64) - 1
    return np.where(total > 0, values[np.clip(index, first[at], first[at] + size[at] - 1)], np.nan)
