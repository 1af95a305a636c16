"""A load point's plan: every request and arrival instant, drawn before the point's clock starts.

Foreground classes follow the point's arrival setting (closed-loop ``concurrency``, Poisson or
other ``rate`` processes, a trace); background classes (with a ``rate`` of their own) arrive on
their own process for as long as the foreground is sending.

Every random draw comes from a generator seeded by (seed, point, stream), so a point's
requests do not depend on how earlier points went, and every variant of a sweep sees the
same requests. Prompts and arrival times are made before the point's clock starts, so the
client's own tokenizer work never delays a send or the reading of a stream.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.config.errors import LoadError
from orchestrator.config.schema import ClosedLoop, LoadPointSpec, OpenLoop, RequestClass, TraceReplay, WorkloadSpec
from orchestrator.loadgen.arrivals import arrival_offsets, weighted_choice
from orchestrator.loadgen.client import PlannedRequest, Turn
from orchestrator.loadgen.datasets import load_sharegpt
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.traces import Slice, TraceRow, read_trace, replay_slice, slice_metrics

# Background traffic is planned this far ahead when the point has no duration of its own.
BACKGROUND_HORIZON_S = 300.0
# Caps on requests planned ahead (a closed loop bounded by duration, or a background class).
MAX_PLANNED = 4096

FOREGROUND_PLAN, FOREGROUND_ARRIVALS = 0, 1  # stream ids; background class i uses 2 + i
ADAPTER_DRAWS = 10_000  # the stream of the foreground's LoRA adapters; background class i's: + 1 + i


Seed = int | tuple[int, ...]


def repeat_seed(seed: Seed, repeat: int) -> Seed:
    """Repeat 0 keeps the point's own draws; later repeats get fresh requests (identical
    prompts would hit the prefix cache and measure something else)."""
    if repeat == 0:
        return seed
    return (*(seed if isinstance(seed, tuple) else (seed,)), 1000 + repeat)


def stream_rng(seed: Seed, point: int, stream: int) -> np.random.Generator:
    """The generator of one stream of draws of one point (point -1 = warmup)."""
    base = list(seed) if isinstance(seed, tuple) else [seed]
    return np.random.default_rng([*base, point + 1, stream])


class RequestPlanner:
    """Draws request lengths and prompts for a workload, from each class's dataset."""

    def __init__(self, workload: WorkloadSpec, factory: PromptFactory) -> None:
        self.workload = workload
        self.factory = factory
        self._ids = itertools.count()
        self.foreground = [n for n, c in workload.classes.items() if c.rate is None]
        self.background = [n for n, c in workload.classes.items() if c.rate is not None]
        self._prefixes: dict[tuple[str, int], str] = {}
        self._blocks: dict[tuple[int, int], str] = {}  # a trace's prefix blocks: (id, tokens) -> text

    @staticmethod
    def _length(n: int, ratio: float, rng: np.random.Generator) -> int:
        if ratio == 0:
            return n
        lo, hi = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
        return int(rng.integers(lo, hi + 1))

    def make(self, class_name: str, rng: np.random.Generator) -> PlannedRequest:
        c: RequestClass = self.workload.classes[class_name]
        if c.dataset == "sharegpt":
            prompt, n_in, n_out = self._sharegpt(c, rng)
        else:
            assert c.input_tokens is not None and c.output_tokens is not None
            n_in = self._length(c.input_tokens, c.range_ratio, rng)
            if c.output_tokens_choices:
                n_out = int(c.output_tokens_choices[int(rng.integers(len(c.output_tokens_choices)))])
            else:
                n_out = self._length(c.output_tokens, c.range_ratio, rng)
            if c.dataset == "vllm_random":
                prompt = self.factory.ramp_prompt(n_in, rng)
            else:
                prompt = self.factory.prompt(n_in, rng)
            if c.dataset == "shared_prefix":
                assert c.num_groups is not None and c.prefix_tokens is not None
                prompt = self._prefix(class_name, c, int(rng.integers(c.num_groups))) + prompt
                n_in += c.prefix_tokens
            if c.dataset == "multi_turn":
                assert c.turns is not None
                first = next(self._ids)
                turns = []
                for _ in range(c.turns - 1):
                    t_in = self._length(c.input_tokens, c.range_ratio, rng)
                    t_out = self._length(c.output_tokens, c.range_ratio, rng)
                    turns.append(Turn(next(self._ids), self.factory.prompt(t_in, rng), t_in, t_out))
                return PlannedRequest(first, class_name, prompt, n_in, n_out, tuple(turns), c.think_time_s)
        return PlannedRequest(next(self._ids), class_name, prompt, n_in, n_out)

    def make_sized(self, class_name: str, n_in: int, n_out: int, rng: np.random.Generator) -> PlannedRequest:
        """A random prompt of exactly ``n_in`` tokens (trace replay)."""
        return PlannedRequest(next(self._ids), class_name, self.factory.prompt(n_in, rng), n_in, n_out)

    def make_blocks(self, class_name: str, n_in: int, n_out: int, blocks: tuple[int, ...], size: int) -> PlannedRequest:
        """A prompt of ``n_in`` tokens made of a trace's prefix blocks of ``size`` tokens (the
        last one holds what is left): equal ids give the same text in every request, every point
        and every trial of the sweep, so a prefix cache sees exactly the trace's sharing. Each
        block ends in a newline, so the next one never merges into its last token."""
        parts, left = [], n_in
        for b in blocks:
            n = min(size, left)
            if n <= 0:
                break
            key = (b, n)
            if key not in self._blocks:
                rng = np.random.default_rng([self.workload.seed, 104729, b, n])
                self._blocks[key] = (self.factory.prompt(n - 1, rng) if n > 1 else "") + "\n"
            parts.append(self._blocks[key])
            left -= n
        return PlannedRequest(next(self._ids), class_name, "".join(parts), n_in, n_out)

    def replay(
        self, cut: Slice, time_scale: float, rng: np.random.Generator
    ) -> tuple[list[PlannedRequest], list[float]]:
        """A trace slice's requests and their send offsets. A follower (a row with a parent)
        becomes a turn of its first request's conversation: sent after its parent's reply, at
        its own instant if that is later, with the new tokens its prompt adds to the parent's
        prompt and reply."""
        size = cut.block_tokens
        firsts: list[tuple[float, PlannedRequest, list[Turn]]] = []
        where: dict[int, tuple[int, int]] = {}  # chat_id -> (conversation, turn index; -1 the first)
        rows: dict[int, TraceRow] = {}
        for r in cut.rows:
            at = r.timestamp_s * time_scale
            if r.parent is None:
                if size and r.blocks:
                    req = self.make_blocks("trace", r.input_tokens, r.output_tokens, r.blocks, size)
                else:
                    req = self.make_sized("trace", r.input_tokens, r.output_tokens, rng)
                firsts.append((at, req, []))
                node = (len(firsts) - 1, -1)
            else:
                conv, parent_node = where[r.parent]
                p = rows[r.parent]
                new = max(1, r.input_tokens - p.input_tokens - p.output_tokens)
                turns = firsts[conv][2]
                turns.append(
                    Turn(next(self._ids), self.factory.prompt(new, rng), new, r.output_tokens, parent_node, at)
                )
                node = (conv, len(turns) - 1)
            if r.chat_id is not None:
                where[r.chat_id], rows[r.chat_id] = node, r
        return [replace(req, turns=tuple(t)) for _, req, t in firsts], [at for at, _, _ in firsts]

    def _prefix(self, class_name: str, c: RequestClass, group: int) -> str:
        """The fixed prefix of a group: the same text in every point, ending in a newline so
        the suffix never merges into its last token."""
        key = (class_name, group)
        if key not in self._prefixes:
            assert c.prefix_tokens is not None
            rng = np.random.default_rng([self.workload.seed, 7919, group])
            self._prefixes[key] = self.factory.prompt(max(1, c.prefix_tokens - 1), rng) + "\n"
        return self._prefixes[key]

    def _sharegpt(self, c: RequestClass, rng: np.random.Generator) -> tuple[str, int, int]:
        assert c.path is not None
        convs = load_sharegpt(c.path).conversations
        for _ in range(1000):
            conv = convs[int(rng.integers(len(convs)))]
            n_in = self.factory.count(conv.prompt)
            if 1 <= n_in <= c.max_input_tokens:
                if c.output_tokens is not None:
                    n_out = self._length(c.output_tokens, c.range_ratio, rng)
                else:
                    n_out = min(max(1, self.factory.count(conv.reply)), c.max_output_tokens)
                return conv.prompt, n_in, n_out
        raise LoadError(f"sharegpt dataset '{c.path}': no prompt of at most {c.max_input_tokens} tokens found")

    def foreground_batch(self, n: int, rng: np.random.Generator) -> list[PlannedRequest]:
        weights = [self.workload.classes[c].weight for c in self.foreground]
        return [self.make(name, rng) for name in weighted_choice(self.foreground, weights, rng, n)]

    def with_adapters(self, requests: list[PlannedRequest], rng: np.random.Generator) -> list[PlannedRequest]:
        """``requests``, each naming the LoRA adapter ``workload.adapters`` draws for it from
        ``rng`` (a stream of its own: the prompts do not depend on the mix); as they are without."""
        mix = self.workload.adapters
        if mix is None or not requests:
            return requests
        choices: list[str | None] = [*mix.chosen(), *([None] if mix.include_base else [])]
        weights = np.asarray(mix.weights(len(choices)))
        drawn = rng.choice(len(choices), size=len(requests), p=weights / weights.sum())
        return [replace(req, model=choices[int(k)]) for req, k in zip(requests, drawn, strict=True)]


@dataclass
class PointPlan:
    """Everything one load point (one repeat) sends, drawn before its clock starts.

    Plain data: it can be split into shares and pickled to client processes
    (:meth:`split`). ``offsets`` is None for a closed loop (``concurrency`` streams).
    """

    index: int
    repeat: int
    foreground: list[PlannedRequest]
    offsets: list[float] | None
    concurrency: int | None
    max_concurrency: int | None
    min_gap_s: float
    background: list[list[tuple[float, PlannedRequest]]]
    duration_s: float | None
    extendable: bool  # a closed loop bounded by duration may make more requests on the fly
    planned: dict[str, float] = field(default_factory=dict)  # what the plan knows of the point (a trace's ideal reuse)

    def split(self, n: int) -> list[PointPlan]:
        """Shares for ``n`` client processes on one clock (fewer if there are fewer streams).

        Open loop: every n-th arrival of the one schedule, so together they send exactly
        the schedule. Closed loop: streams dealt round-robin, requests dealt by stream.
        A ``max_concurrency`` cap is divided, and each share keeps to its part of the rate.
        """
        if self.offsets is None:
            assert self.concurrency is not None
            n = max(1, min(n, self.concurrency))
            streams = [self.concurrency // n + (1 if i < self.concurrency % n else 0) for i in range(n)]
            fg: list[list[PlannedRequest]] = [[] for _ in range(n)]
            for j, req in enumerate(self.foreground):
                fg[(j % self.concurrency) % n].append(req)
            return [
                replace(self, foreground=fg[i], concurrency=streams[i], background=[b[i::n] for b in self.background])
                for i in range(n)
            ]
        cap = self.max_concurrency
        n = max(1, min(n, cap)) if cap else n
        return [
            replace(
                self,
                foreground=self.foreground[i::n],
                offsets=self.offsets[i::n],
                max_concurrency=(cap // n + (1 if i < cap % n else 0)) if cap else None,
                min_gap_s=self.min_gap_s * n,
                background=[b[i::n] for b in self.background],
            )
            for i in range(n)
        ]


def plan_point(
    workload: WorkloadSpec, point: LoadPointSpec, index: int, planner: RequestPlanner, seed: Seed, repeat: int = 0
) -> PointPlan:
    """Draw a point's requests and arrival instants from its own seeded streams."""
    num_requests, duration_s = workload.stop_of(point)
    fg_rng = stream_rng(seed, index, FOREGROUND_PLAN)
    offsets: list[float] | None = None  # None: closed loop
    planned: dict[str, float] = {}
    concurrency: int | None = None  # a closed loop's streams
    cap: int | None = None  # an open loop's most in flight
    min_gap_s = 0.0
    match point.load:
        case TraceReplay() as replay:
            cut = trace_slice(replay, num_requests, duration_s)
            foreground, offsets = planner.replay(cut, replay.time_scale, fg_rng)
            planned = slice_metrics(cut)
        case OpenLoop() as open_loop:
            # num_requests arrivals, or every arrival before duration_s (the plan's length follows)
            offsets = arrival_offsets(
                open_loop.rate,
                stream_rng(seed, index, FOREGROUND_ARRIVALS),
                num_requests,
                duration_s if num_requests is None else None,
                open_loop.arrival,
                open_loop.burstiness,
                open_loop.ramp_up_s or 0.0,
            )
            foreground = planner.foreground_batch(len(offsets), fg_rng)
            cap = open_loop.max_concurrency
            min_gap_s = 1.0 / open_loop.rate if cap else 0.0
        case ClosedLoop(concurrency=concurrency):
            count = num_requests if num_requests is not None else min(MAX_PLANNED, 32 * concurrency)
            foreground = planner.foreground_batch(count, fg_rng)
    foreground = planner.with_adapters(foreground, stream_rng(seed, index, ADAPTER_DRAWS))

    return PointPlan(
        index=index,
        repeat=repeat,
        foreground=foreground,
        offsets=offsets,
        concurrency=concurrency,
        max_concurrency=cap,
        min_gap_s=min_gap_s,
        background=background_plan(workload, planner, index, seed, duration_s),
        duration_s=duration_s,
        extendable=concurrency is not None and num_requests is None,
        planned=planned,
    )


def background_plan(
    workload: WorkloadSpec, planner: RequestPlanner, index: int, seed: Seed, duration_s: float | None
) -> list[list[tuple[float, PlannedRequest]]]:
    """Each background class's requests and instants, on its own process and seeded streams, for
    as long as the foreground may send (``duration_s``, else :data:`BACKGROUND_HORIZON_S`)."""
    background = []
    for i, name in enumerate(planner.background):
        c = workload.classes[name]
        assert c.rate is not None
        rng = stream_rng(seed, index, 2 + i)
        horizon = duration_s if duration_s is not None else BACKGROUND_HORIZON_S
        n = min(MAX_PLANNED, math.ceil(c.rate * horizon * 1.5) + 4)
        bg_offsets = arrival_offsets(c.rate, rng, n, horizon, c.arrival, c.burstiness)[1:]  # first one after a gap
        made = planner.with_adapters(
            [planner.make(name, rng) for _ in bg_offsets], stream_rng(seed, index, ADAPTER_DRAWS + 1 + i)
        )
        background.append(list(zip(bg_offsets, made, strict=True)))
    return background


def trace_slice(replay: TraceReplay, num_requests: int | None = None, duration_s: float | None = None) -> Slice:
    """The rows of a point's trace it replays (:func:`orchestrator.loadgen.traces.replay_slice`)."""
    return replay_slice(
        read_trace(replay.path, replay.format, replay.block_tokens),
        replay.start_s,
        replay.length_scale,
        replay.max_context_tokens,
        replay.over_context,
        num_requests,
        duration_s,
        replay.time_scale,
    )
