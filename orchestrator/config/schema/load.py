"""How a workload's load is offered: one load point's arrival setting (:class:`LoadPointSpec`:
closed-loop concurrency, an open-loop rate or a replayed trace), the per-request latency
objectives (:class:`SLOSpec`) and the SLO capacity search whose probes are load points
(:class:`CapacitySpec`). The workload itself is in :mod:`.workload`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from .base import ArrivalKind, PositiveShare, StrictModel

TraceFormat = Literal["auto", "plain", "mooncake", "azure", "bailian"]


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` streams, each sending its next request when its last one ends."""

    concurrency: int


@dataclass(frozen=True)
class OpenLoop:
    """Requests on their own instants, ``rate`` per second (``inf``: all at once) by the
    ``arrival`` process, the rate raised from 0 over ``ramp_up_s``; ``max_concurrency`` caps
    those in flight."""

    rate: float
    arrival: ArrivalKind
    burstiness: float
    ramp_up_s: float
    max_concurrency: int | None


@dataclass(frozen=True)
class TraceReplay:
    """A trace file's own arrivals and lengths: the slice from ``start_s`` of its clock, the clock
    stretched by ``time_scale``, lengths divided by ``length_scale``."""

    path: str
    format: TraceFormat
    block_tokens: int | None
    start_s: float
    time_scale: float
    length_scale: float
    max_context_tokens: int | None
    over_context: Literal["truncate", "drop"]


PointLoad = ClosedLoop | OpenLoop | TraceReplay  # a load point's arrivals, one kind each (LoadPointSpec.load)


class LoadPointSpec(StrictModel):
    """One arrival setting: closed-loop ``concurrency``, open-loop ``rate`` (req/s), or a ``trace``.

    ``rate`` may be ``inf`` (everything at once). With ``rate``: ``arrival`` picks the process,
    ``max_concurrency`` caps requests in flight without ever sending faster than the rate,
    ``ramp_up_s`` raises the rate linearly from 0 over that time. A ``trace`` (a file:
    ``trace_format`` plain, mooncake, azure or bailian; auto tells them apart) replays its own arrivals
    and lengths, its clock stretched by ``time_scale``, from ``trace_start_s`` of its own clock;
    ``length_scale`` divides every length and the prefix block size together (the sharing
    structure is kept); a request longer than ``max_context_tokens`` (prompt + output) is cut
    to fit or dropped (``over_context``). ``num_requests`` / ``duration_s`` end the slice. A
    bailian trace's follower is sent after its parent's reply, its prompt the conversation so far.
    """

    concurrency: PositiveInt | None = None
    rate: PositiveFloat | None = None
    trace: str | None = None
    arrival: ArrivalKind = "poisson"
    burstiness: PositiveFloat = Field(default=1.0, description="gamma shape; <1 burstier, >1 smoother")
    max_concurrency: PositiveInt | None = None
    ramp_up_s: float = Field(default=0.0, ge=0.0)
    time_scale: PositiveFloat = 1.0
    trace_format: TraceFormat = "auto"
    trace_block_tokens: PositiveInt | None = Field(
        default=None, description="tokens per hash_ids block (default: mooncake 512, bailian 16)"
    )
    trace_start_s: float = Field(default=0.0, ge=0.0, description="where the slice starts, on the trace's own clock")
    length_scale: float = Field(default=1.0, ge=1.0, description="divides lengths and the prefix block size")
    max_context_tokens: PositiveInt | None = Field(
        default=None, description="prompt + output cap of a replayed request"
    )
    over_context: Literal["truncate", "drop"] = "truncate"
    num_requests: PositiveInt | None = None
    duration_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _one_arrival(self) -> LoadPointSpec:
        if sum(x is not None for x in (self.concurrency, self.rate, self.trace)) != 1:
            raise ValueError("a load point needs exactly one of 'concurrency', 'rate' or 'trace'")
        if self.rate is None and (self.max_concurrency is not None or self.ramp_up_s):
            raise ValueError("'max_concurrency' and 'ramp_up_s' apply to 'rate' points only")
        if self.rate is None and self.arrival != "poisson":
            raise ValueError(
                "'arrival' applies to 'rate' points only (a concurrency point is a closed loop, "
                "a trace replays its own timestamps)"
            )
        if self.trace is None:
            replay = {
                "time_scale": self.time_scale != 1,
                "trace_format": self.trace_format != "auto",
                "trace_block_tokens": self.trace_block_tokens is not None,
                "trace_start_s": self.trace_start_s != 0,
                "length_scale": self.length_scale != 1,
                "max_context_tokens": self.max_context_tokens is not None,
                "over_context": self.over_context != "truncate",
            }
            if any(replay.values()):
                raise ValueError(f"{', '.join(repr(k) for k, v in replay.items() if v)}: apply to 'trace' points only")
        return self

    @model_validator(mode="after")
    def _burstiness_of_gamma(self) -> LoadPointSpec:
        if self.burstiness != 1 and self.arrival != "gamma":
            raise ValueError(
                f"'burstiness' shapes gamma arrivals only (arrival is '{self.arrival}'): set arrival: gamma"
            )
        return self

    @property
    def load(self) -> PointLoad:
        """The point's arrivals as one typed kind (the validator leaves exactly one set): code
        matches on it rather than asking which field is set."""
        if self.concurrency is not None:
            return ClosedLoop(self.concurrency)
        if self.trace is not None:
            return TraceReplay(
                self.trace,
                self.trace_format,
                self.trace_block_tokens,
                self.trace_start_s,
                self.time_scale,
                self.length_scale,
                self.max_context_tokens,
                self.over_context,
            )
        assert self.rate is not None
        return OpenLoop(self.rate, self.arrival, self.burstiness, self.ramp_up_s, self.max_concurrency)

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        if self.trace is not None:
            return "trace" if self.time_scale == 1 else f"trace_x{self.time_scale:g}"
        return f"r{self.rate:g}"


class SLOSpec(StrictModel):
    """Per-request latency objectives; a request meeting all set ones counts toward goodput."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


SLO_METRIC = re.compile(
    r"^(?:(?P<cls>[A-Za-z0-9_.-]+)/)?(?:ttft|tpot|itl|e2e|itl_worst)_ms_(?:mean|p50|p90|p95|p99|max)$"
)


class CapacitySpec(StrictModel):
    """Search each trial's running server for the highest load at which ``slo`` holds.

    Probes are ordinary load points (``point`` holds their other fields: arrival, stop, cap),
    at a request ``rate`` or a ``concurrency`` (``knob``): from ``start``, multiplied by
    ``growth`` while the SLOs hold and divided while they do not (within ``low``..``high``),
    then bisected until the bracket is narrower than ``precision`` of its top, or
    ``max_probes`` or ``time_budget_s`` are spent. A rate probe also fails when the server
    completes fewer than ``min_sustained`` of the offered requests per second (its queue grows).
    A probe whose SLO metric's 95% interval within the run straddles its limit is indeterminate:
    it runs again with fresh requests, up to ``runs`` times, judged on the requests of all its
    runs together, before it decides the bracket.
    """

    knob: Literal["rate", "concurrency"] = "rate"
    slo: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="metric -> highest allowed value, e.g. ttft_ms_p99: 2000 or "
        "short/itl_ms_p99: 300 (a request class's metric)",
    )
    min_goodput_fraction: PositiveShare | None = Field(
        default=None, description="goodput (workload.slo) >= this share of completions"
    )
    start: PositiveFloat = 1.0
    low: PositiveFloat | None = Field(default=None, description="lowest probe; default start / 16 (rate) or 1")
    high: PositiveFloat = 64.0
    growth: float = Field(default=2.0, gt=1.0)
    precision: float = Field(default=0.1, gt=0.0, lt=1.0)
    max_probes: PositiveInt = 8
    time_budget_s: PositiveFloat | None = None
    min_sustained: PositiveShare = 0.9
    runs: PositiveInt = Field(
        default=3, description="the most runs of a probe too close to an SLO to tell (1: every probe decides at once)"
    )
    point: dict[str, Any] = Field(default_factory=dict, description="other LoadPointSpec fields of every probe")

    @model_validator(mode="after")
    def _valid(self) -> CapacitySpec:
        if not self.slo and self.min_goodput_fraction is None:
            raise ValueError("capacity: set slo (metric -> limit) and/or min_goodput_fraction")
        bad = [k for k in self.slo if not SLO_METRIC.match(k)]
        if bad:
            raise ValueError(
                f"capacity.slo: {', '.join(bad)}: expected [<class>/]<ttft|tpot|itl|e2e|itl_worst>"
                "_ms_<mean|p50|p90|p95|p99|max>"
            )
        for key in ("rate", "concurrency", "trace"):
            if key in self.point:
                raise ValueError(f"capacity.point: '{key}' is set by the search (knob), not in point")
        if self.knob == "concurrency" and self.point.get("max_concurrency") is not None:
            raise ValueError("capacity.point.max_concurrency applies to rate probes only")
        self.probe(self.start)  # the template must make a valid point
        if self.lowest > self.start or self.start > self.high:
            raise ValueError(
                f"capacity: expected low <= start <= high, got {self.lowest:g}, {self.start:g}, {self.high:g}"
            )
        return self

    @property
    def lowest(self) -> float:
        if self.low is not None:
            return self.low
        return 1.0 if self.knob == "concurrency" else self.start / 16

    def probe(self, value: float) -> LoadPointSpec:
        """The load point of a probe at ``value`` (req/s, or streams)."""
        setting: Any = int(value) if self.knob == "concurrency" else value
        return LoadPointSpec.model_validate({**self.point, self.knob: setting})
