"""Which windows of a trace this machine can replay as a valid point, said before measuring.

A window is ``duration_s`` of the replay's clock from ``start_s`` of the trace's, at a
``time_scale`` (the replay's clock is the trace's times ``time_scale``: 6 replays it at a sixth of
its speed), cut as a point cuts it (:func:`orchestrator.loadgen.traces.replay_slice`). Of each
window it tells:

* **its bursts**: requests due within :data:`BURST_S` of the first of them on the replay's clock
  are sent one after the other, about :data:`SEND_MS_PER_REQUEST` each (docs/runs/benchmarks.md#
  trace_send_lag: a burst of 10 at one instant went out over 1-3.4 ms on these 2-core machines),
  so the k-th of a burst goes out about ``k * SEND_MS_PER_REQUEST`` late. The p95 of those over
  the window, past the point's ``max_send_lag_ms_p95``, would make the point INVALID for its client;
* **its prefill load**: the prompt tokens due per second of replay times the server's prefill
  time per token (the calibration of :mod:`orchestrator.trial.calibrate`, cached per machine;
  decode is not counted, so it is a lower bound on the server's work):
  past :data:`LOAD_MAX` of the server's time the queue grows for the whole window;
* **its ideal prefix reuse**: the share of prompt tokens an infinite prefix cache would reuse
  (a trace with block ids), which is what the replay can say about a cache.

``python -m orchestrator.perf.trace_windows TRACE`` prints the windows that can be served,
the most reuse first, and why the others cannot."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema.load import TraceReplay
from orchestrator.loadgen.traces import Trace, TraceRow, read_trace, replay_slice, reusable_tokens
from orchestrator.perf.sizing import EngineSpeed, latest_speed

BURST_S = 0.005  # requests due this close together on the replay's clock are sent as one burst
SEND_MS_PER_REQUEST = 0.4  # the client's time per request of a burst (trace_send_lag: the slowest valid one's)
LOAD_MAX = 0.8  # the share of the server's time prefill may take before the queue only grows


@dataclass(frozen=True)
class Window:
    start_s: float  # on the trace's clock
    time_scale: float
    requests: int
    burst: int  # the most requests due within BURST_S of the first of them
    send_late_ms_p95: float  # the p95 of how late the client sends them, bursts sent one by one
    prompt_tokens: int
    prefill_load: float | None  # share of the server's time its prefills take (None: speed unknown)
    prefix_share: float | None  # ideal prefix reuse, prompt tokens (None: the trace has no blocks)
    why_not: tuple[str, ...]  # why this machine cannot serve it as a valid point; empty: it can


def send_lags(instants: Sequence[float], within_s: float = BURST_S) -> list[float]:
    """How late (ms) the client sends each request (instants sorted): the k-th of a burst (due
    within ``within_s`` of its first) k sends after the first."""
    lags, first = [], 0
    for i, t in enumerate(instants):
        if t - instants[first] > within_s:
            first = i
        lags.append((i - first) * SEND_MS_PER_REQUEST)
    return lags


def worst_burst(instants: Sequence[float], within_s: float = BURST_S) -> int:
    """The most requests of one burst (:func:`send_lags`' groups)."""
    return _burst_of(send_lags(instants, within_s))


def _burst_of(lags: Sequence[float]) -> int:
    """The most requests of one burst, from the send lags of :func:`send_lags`."""
    return round(max(lags, default=-SEND_MS_PER_REQUEST) / SEND_MS_PER_REQUEST) + 1


def judge(
    rows: Sequence[TraceRow],
    start_s: float,
    time_scale: float,
    duration_s: float,
    block_tokens: int | None,
    speed: EngineSpeed | None,
    max_send_lag_ms: float,
) -> Window:
    """One window: its burst, its prefill load, its reuse, and what stops a valid point."""
    lags = send_lags([r.timestamp_s * time_scale for r in rows])
    burst = _burst_of(lags)
    late = float(np.percentile(lags, 95)) if rows else 0.0
    tokens = sum(r.input_tokens for r in rows)
    load = None
    if speed is not None and duration_s > 0:
        load = sum(speed.prefill_ms(r.input_tokens) for r in rows) / 1e3 / duration_s
    share = None
    if block_tokens and any(r.blocks for r in rows):
        reused, total = reusable_tokens(rows, block_tokens)
        share = reused / total if total else 0.0
    why = []
    if late > max_send_lag_ms:
        why.append(
            f"a burst of {burst} requests at one instant: the client sends them ~{late:.0f} ms late at p95 "
            f"(> {max_send_lag_ms:g})"
        )
    if load is not None and load > LOAD_MAX:
        why.append(f"its prefills take {load:.0%} of the server's time (> {LOAD_MAX:.0%})")
    if not rows:
        why.append("no request in it")
    return Window(start_s, time_scale, len(rows), burst, late, tokens, load, share, tuple(why))


def windows(
    trace: Trace,
    duration_s: float,
    time_scales: Iterable[float] = (1.0,),
    step_s: float | None = None,
    length_scale: float = 1.0,
    max_context: int | None = None,
    speed: EngineSpeed | None = None,
    max_send_lag_ms: float = 10.0,
) -> list[Window]:
    """Every window of ``duration_s`` (replay clock) at each time scale, one every ``step_s`` of
    the trace's clock (default: back to back), cut as a point cuts it."""
    out = []
    end = trace.rows[-1].timestamp_s if trace.rows else 0.0
    for scale in time_scales:
        step = step_s or duration_s / scale  # default: the window's length on the trace's clock
        start = trace.rows[0].timestamp_s if trace.rows else 0.0
        while (end - start) * scale >= duration_s / 2:  # a window cut short by the trace's end is not one
            cut = replay_slice(trace, start, length_scale, max_context, duration_s=duration_s, time_scale=scale)
            span = min(duration_s, (end - start) * scale)  # on the replay's clock
            out.append(judge(cut.rows, start, scale, span, cut.block_tokens, speed, max_send_lag_ms))
            start += step
    return out


def ranked(found: Sequence[Window]) -> list[Window]:
    """Servable windows first, the most prefix reuse, then the most requests, first."""
    return sorted(found, key=lambda w: (bool(w.why_not), -(w.prefix_share or 0.0), -w.requests, w.start_s))


def table(found: Sequence[Window], top: int = 10) -> list[str]:
    """The best ``top`` windows as a text table, then how many cannot be served and why most often."""
    lines = ["start_s  time_scale  requests  burst  late_ms_p95  prefill_load  prefix_share  servable"]
    for w in ranked(found)[:top]:
        load = "?" if w.prefill_load is None else f"{w.prefill_load:.0%}"
        share = "-" if w.prefix_share is None else f"{w.prefix_share:.3f}"
        lines.append(
            f"{w.start_s:7.1f}  {w.time_scale:10g}  {w.requests:8d}  {w.burst:5d}  {w.send_late_ms_p95:11.1f}  "
            f"{load:>12}  {share:>12}  {_servable(w)}"
        )
    bad = [w for w in found if w.why_not]
    lines.append(f"{len(found) - len(bad)} of {len(found)} windows can be served as a valid point here")
    return lines


def slice_warning(
    trace: Trace,
    replay: TraceReplay,
    num_requests: int | None,
    duration_s: float | None,
    speed: EngineSpeed | None,
    max_send_lag_ms: float,
) -> str | None:
    """Said before a replay's point: why the slice it replays cannot be a valid point here, and a
    window that can (the same length, at this time scale or slower, the most reuse first); None
    where nothing stops it."""
    cut = replay_slice(
        trace, replay.start_s, replay.length_scale, replay.max_context_tokens, replay.over_context,
        num_requests, duration_s, replay.time_scale,
    )  # fmt: skip
    if not cut.rows:
        return None
    span = duration_s or max((cut.rows[-1].timestamp_s - cut.rows[0].timestamp_s) * replay.time_scale, 1.0)
    w = judge(cut.rows, replay.start_s, replay.time_scale, span, cut.block_tokens, speed, max_send_lag_ms)
    if not w.why_not:
        return None
    scales = [replay.time_scale * k for k in (1, 2, 4, 8)]
    found = windows(trace, span, scales, None, replay.length_scale, replay.max_context_tokens, speed, max_send_lag_ms)
    best = next((c for c in ranked(found) if not c.why_not), None)
    instead = (
        f"; a window this machine can serve: trace_start_s={best.start_s:g} time_scale={best.time_scale:g} "
        f"({best.requests} requests"
        + (f", ideal prefix reuse {best.prefix_share:.0%}" if best.prefix_share is not None else "")
        + ")"
        if best is not None
        else "; no window of this length can be served here at up to 8x this time scale"
    )
    return (
        f"its slice would make an INVALID point here: {'; '.join(w.why_not)}{instead} "
        f"(python -m orchestrator.perf.trace_windows {trace.path} --duration {span:g} lists them)"
    )


def _servable(w: Window) -> str:
    if w.why_not:
        return "; ".join(w.why_not)
    return "yes" if w.prefill_load is not None else "sent on time (its load not judged: no speed known)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.perf.trace_windows", description=__doc__)
    ap.add_argument("trace", help="the trace file (plain, Mooncake, Azure or Bailian; as workload.replay.trace)")
    ap.add_argument("--format", default="auto")
    ap.add_argument("--duration", type=float, default=60.0, help="a window's length on the replay's clock (s)")
    ap.add_argument("--time-scale", default="1", help="comma-separated time scales to try (6: a sixth of its speed)")
    ap.add_argument("--step", type=float, default=None, help="windows start this far apart (trace clock, s)")
    ap.add_argument("--length-scale", type=float, default=1.0)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--prefill-ms-per-token", type=float, default=None, help="else the latest calibration here")
    ap.add_argument("--max-send-lag-ms", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    try:
        trace = read_trace(args.trace, args.format)
        scales = [float(x) for x in args.time_scale.split(",")]
    except (OSError, ValueError, ConfigError) as exc:
        print(f"trace_windows: {exc}", file=sys.stderr)
        return 2
    speed = _speed(args.prefill_ms_per_token)
    said = "unknown (no calibration here: pass --prefill-ms-per-token)"
    if speed is not None:
        said = (
            speed.describe()
            if args.prefill_ms_per_token is None
            else f"prefill {speed.prefill_ms_per_token:g} ms/token (given)"
        )
    print(f"{args.trace}: {len(trace.rows)} requests; this machine's server: {said}")
    found = windows(
        trace, args.duration, scales, args.step, args.length_scale, args.max_context, speed, args.max_send_lag_ms
    )
    print("\n".join(table(found, args.top)))
    return 0


def _speed(prefill_ms_per_token: float | None) -> EngineSpeed | None:
    """The server's speed: as given, else the latest calibration on this machine."""
    if prefill_ms_per_token is not None:
        return EngineSpeed(0.0, prefill_ms_per_token, 0.0, (0, 0), "given", "", "", 0.0)
    return latest_speed()


if __name__ == "__main__":
    raise SystemExit(main())
