"""Prometheus scrapes of an engine's ``/metrics``: parse, then turn two scrapes into deltas, and
a histogram's bucket deltas into percentiles (:func:`server_latency`: linear inside a bucket, as
Prometheus' ``histogram_quantile``; the bucket's width is the resolution).

The caller passes a map from neutral names to (family, kind); nothing here knows engines.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.config.metric_keys import SERVER_QUANTILES

Sample = dict[str, float]  # sample name (e.g. "vllm:x_total") -> value summed over label sets


class MetricRef(Protocol):
    family: str
    kind: str


def parse(text: str) -> Sample:
    """Sum every sample over its label sets (one engine may expose several label sets)."""
    out: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # a histogram's buckets stay apart by their bound: ``name_bucket{le="0.25"}``
            name = f'{s.name}{{le="{s.labels["le"]}"}}' if s.name.endswith("_bucket") and "le" in s.labels else s.name
            out[name] = out.get(name, 0.0) + float(s.value)
    return out


def scrape(url: str, timeout_s: float = 5.0, families: Iterable[str] | None = None) -> Sample:
    """Scrape and parse; with ``families``, only the lines of those families are parsed.

    A full parse of vLLM's page (~1700 lines) takes ~55 ms of GIL-holding Python; sampling
    it every half second during a point stalled the load generator's event loop. Filtering
    to the few wanted families first makes periodic sampling cheap.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode("utf-8", errors="replace")
    if families is not None:
        text = only_families(text, families)
    return parse(text)


def only_families(text: str, families: Iterable[str]) -> str:
    """The lines of ``text`` that belong to the given metric families (samples and metadata)."""
    wanted = tuple(families)
    keep = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line
        if name.startswith(wanted):
            base = name.split("{", 1)[0].split(" ", 1)[0]
            if base in wanted or any(base == f + suffix for f in wanted for suffix in _SUFFIXES):
                keep.append(line)
    return "\n".join(keep) + "\n"


_SUFFIXES = ("_total", "_created", "_count", "_sum", "_bucket")


def counter(sample: Sample, family: str) -> float | None:
    """A counter's value (``family_total`` or ``family``), summed over its label sets."""
    for name in (family + "_total", family):
        if name in sample:
            return sample[name]
    return None


def gauge(sample: Sample, family: str) -> float | None:
    return sample.get(family)


def deltas(before: Sample, after: Sample, metric_map: Mapping[str, Any]) -> dict[str, float]:
    """Counter deltas and histogram means between two scrapes, under neutral names.

    Also derives ``prefix_cache_hit_rate`` (vLLM: hits over queries; SGLang: cached over prompt
    tokens) and ``spec_decode_acceptance_rate`` when their counters exist. Histograms give ``<name>_mean`` in the histogram's own unit, latency
    histograms (seconds, no unit in their name) ``<name>_s_mean``.
    """
    out: dict[str, float] = {}
    for name, ref in metric_map.items():
        if ref.kind == "counter":
            a, b = counter(before, ref.family), counter(after, ref.family)
            if a is not None and b is not None:
                out[name] = b - a
        elif ref.kind in ("histogram", "latency"):
            s0, s1 = before.get(ref.family + "_sum"), after.get(ref.family + "_sum")
            c0, c1 = before.get(ref.family + "_count"), after.get(ref.family + "_count")
            if None not in (s0, s1, c0, c1) and c1 - c0 > 0:  # type: ignore[operator]
                # a "latency" histogram's name carries no unit: its mean is in seconds (``ttft_s_mean``);
                # its buckets make percentiles (latency_buckets). A mean from sum / count is exact.
                key = name + ("_s_mean" if ref.kind == "latency" else "_mean")
                out[key] = (s1 - s0) / (c1 - c0)  # type: ignore[operator]
    if out.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0.0) / out["prefix_cache_queries"]
    elif "cached_tokens" in out and out.get("prompt_tokens"):  # SGLang: prompt tokens its radix cache served
        out["prefix_cache_hit_rate"] = out["cached_tokens"] / out["prompt_tokens"]
    if out.get("spec_decode_draft_tokens"):
        out["spec_decode_acceptance_rate"] = (
            out.get("spec_decode_accepted_tokens", 0.0) / out["spec_decode_draft_tokens"]
        )
    return out


def latency_buckets(
    before: Sample, after: Sample, metric_map: Mapping[str, Any]
) -> dict[str, list[tuple[float, float]]]:
    """Per ``latency`` histogram of ``metric_map``: its (upper bound, cumulative count) bucket
    deltas between two scrapes, bounds in the histogram's unit; histograms without a new
    observation are left out. A bucket missing from a scrape ``before`` is new since (a labelled
    series appears at its first observation); an empty ``before`` (the scrape failed) says
    nothing of where the point began: no percentiles, not the server's whole life as the point's."""
    out: dict[str, list[tuple[float, float]]] = {}
    if not before:
        return out
    for name, ref in metric_map.items():
        if ref.kind != "latency":
            continue
        prefix = ref.family + '_bucket{le="'
        pairs = []
        for key, value in after.items():
            if key.startswith(prefix):
                pairs.append((float(key[len(prefix) : -2]), value - before.get(key, 0.0)))
        if pairs and max(c for _, c in pairs) > 0:
            out[name] = sorted(pairs)
    return out


@dataclass(frozen=True)
class Quantile:
    value: float
    low: float  # the sample quantile lies in [low, high]: the buckets of the order statistics it is made of
    high: float

    @property
    def resolution(self) -> float:
        return self.high - self.low


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> Quantile | None:
    """The q-quantile of a histogram given as (upper bound, cumulative count) pairs: linear
    inside its bucket (Prometheus' histogram_quantile), None without observations.

    ``low``/``high`` bound the sample quantile a client computes from the same N values
    (numpy's: between the order statistics floor and ceil of (N-1)q): from the lower edge of
    the bucket holding the first to the upper edge of the bucket holding the second. A rank
    that lands on a bucket's edge (half the requests at most 500 ms) leaves the median
    anywhere up to the next edge."""
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return None
    total = pairs[-1][1]
    rank = q * total
    value = None
    low, below = 0.0, 0.0
    for le, cum in pairs:
        if cum >= rank and cum > below:
            value = low if math.isinf(le) else low + (le - low) * (rank - below) / (cum - below)
            break
        low, below = le, cum
    if value is None:
        return None
    n = round(total)
    first, second = math.floor((n - 1) * q) + 1, math.ceil((n - 1) * q) + 1
    return Quantile(value, _bucket_of(first, pairs)[0], _bucket_of(second, pairs)[1])


def _bucket_of(k: int, pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(lower, upper) edge of the bucket that holds the k-th smallest observation."""
    low = 0.0
    for le, cum in pairs:
        if cum >= k:
            return low, le
        low = le
    return low, math.inf


def server_latency(bucket_deltas: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, float]:
    """``server_<name>_ms_p50/p99`` (and ``..._res_ms``, the width of the bucket the value lies
    in) from each histogram's bucket deltas over the point, in seconds."""
    out: dict[str, float] = {}
    for name, buckets in bucket_deltas.items():
        for q in SERVER_QUANTILES:
            found = histogram_quantile(q / 100, buckets)
            if found is None:
                continue
            out[f"server_{name}_ms_p{q}"] = found.value * 1e3
            out[f"server_{name}_ms_p{q}_res_ms"] = found.resolution * 1e3
            out[f"server_{name}_ms_p{q}_low"] = found.low * 1e3
            out[f"server_{name}_ms_p{q}_high"] = found.high * 1e3
    return out
