"""What every sweep's figures share: headless matplotlib, the load axis of a sweep (rate or
concurrency), a knee and a Pareto frontier, plots per knob and per load point, and the generic
overview of any sweep. The lab figures (:mod:`orchestrator.report.plots`) are built from these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.metric_keys import M
from orchestrator.decide.objective import Value, between_runs, read_at
from orchestrator.decide.trials import Point, SweepData, TrialData


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path, name: str) -> Path:
    path = out / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def metric_of(point: Point, key: str) -> float:
    v = point.metrics.get(key)
    return float(v) if v is not None and math.isfinite(float(v)) else math.nan


def load_axis(trials: list[TrialData]) -> tuple[str, Callable[[Point], float], list[float], list[str]]:
    """x for load points: rate (req/s, inf drawn right of the largest finite rate) or
    concurrency; returns (axis label, x of a point, tick positions, tick labels)."""
    points = [p for t in trials for p in t.points]
    kind = "rate" if any("rate" in p.setting for p in points) else "concurrency"
    xs = [v for v in (p.x() for p in points) if v is not None]
    finite = sorted({v for v in xs if math.isfinite(v)})
    inf_at = (finite[-1] * 1.6 if finite else 1.0) if math.inf in xs else None

    def x(p: Point) -> float:
        v = p.x()
        if v is None:
            return float(p.index)
        return inf_at if v == math.inf and inf_at is not None else v

    ticks: list[float] = finite + ([inf_at] if inf_at is not None else [])
    labels = [f"{v:g}" for v in finite] + (["inf"] if inf_at is not None else [])
    label = "offered request rate (req/s)" if kind == "rate" else "concurrency (streams)"
    return label, x, ticks, labels


def point_between_runs(t: TrialData, label: str, key: str) -> tuple[float, float]:
    """A point's metric over the trial's runs (its first and a race's later ones): the mean and
    the 95% t-interval's half-width (0 for one run; nan when not measured)."""
    values = [
        v
        for run in (t, *t.runs)
        if (p := next((p for p in run.points if p.label == label), None)) is not None
        and math.isfinite(v := metric_of(p, key))
    ]
    return between_runs(values) if values else (math.nan, 0.0)


def raced(trials: list[TrialData]) -> bool:
    """Whether any trial ran more than once (its values are then means with intervals between runs)."""
    return any(t.runs for t in trials)


def draw(
    ax: Any, xs: Sequence[float], values: Sequence[tuple[float, float]], style: str, label: str, bars: bool
) -> None:
    """A line of (mean, 95% half-width) values; the half-widths as error bars when ``bars``
    (a plain line otherwise)."""
    ys = [m for m, _ in values]
    if bars:
        ax.errorbar(xs, ys, yerr=[h for _, h in values], fmt=style, capsize=3, label=label)
    else:
        ax.plot(xs, ys, style, label=label)


def mark_intervals(fig: Any, trials: list[TrialData]) -> None:
    """Say under the figure what its values and bars are: a race's means and intervals between
    runs, or one run each (no bars: run-to-run noise was not measured)."""
    words = (
        "values: mean over the race's runs; bars: 95% interval between runs"
        if raced(trials)
        else "one run each: no error bars (run-to-run noise not measured)"
    )
    fig.text(0.005, 0.005, words, fontsize=7, color="dimgrey", ha="left", va="bottom")


def plot_lines(
    ax: Any, trials: list[TrialData], key: str, x: Callable[[Point], float], style: str = "o-", suffix: str = ""
) -> None:
    """One line per trial over its load points; a raced trial's means with their intervals."""
    bars = raced(trials)
    for t in trials:
        pts = sorted(t.points, key=x)
        draw(
            ax,
            [x(p) for p in pts],
            [point_between_runs(t, p.label, key) for p in pts],
            style,
            f"{t.name}{suffix}",
            bars,
        )


def knee(trial: TrialData, ttft_factor: float = 2.0, rate_share: float = 0.7) -> Point | None:
    """The first load point past saturation: TTFT p50 more than ``ttft_factor`` x the lightest
    point's (requests queue), or completions below ``rate_share`` of the arrivals actually
    scheduled (the server cannot keep up). None if the trial never saturates. A finite
    sweep's tail (the last requests finishing after the last arrival) costs qps ~10-20%, so
    the share is well below 1."""
    pts = sorted((p for p in trial.points if p.x() is not None), key=lambda p: p.x() or 0.0)
    if not pts:
        return None
    base = metric_of(pts[0], M.TTFT_MS_P50)
    for p in pts:
        offered = metric_of(p, M.SCHEDULE_RATE)
        if not math.isfinite(offered):
            x = p.x()
            offered = x if x is not None and "rate" in p.setting else math.nan
        if math.isfinite(offered) and metric_of(p, M.QPS) < rate_share * offered:
            return p
        if metric_of(p, M.TTFT_MS_P50) > ttft_factor * base:
            return p
    return None


def pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Points not dominated by another (less memory and more throughput), by memory."""
    front: list[tuple[float, float, Any]] = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


def frontier_set(pts: list[tuple[Value, Value, str, bool]]) -> list[tuple[float, float, Any]]:
    """The Pareto frontier of (minimize, maximize, name, invalid) values: INVALID ones left out."""
    return pareto([(x.value, y.value, name) for x, y, name, invalid in pts if not invalid])


def frontier(
    data: SweepData, out: Path, minimize: str, maximize: str, value: Callable[[TrialData, str], Value | None]
) -> list[Path]:
    """Each finished trial at (``minimize``, ``maximize``), with its 95% interval between runs as
    error bars where a race measured one; a value read at an INVALID point drawn hollow and left
    out of the Pareto frontier (joined when it has two trials or more)."""
    pts = []
    for t in data.finished:
        x, y = value(t, minimize), value(t, maximize)
        if x is not None and y is not None:
            pts.append((x, y, t.name, read_at(t, x, M.INVALID) or read_at(t, y, M.INVALID)))
    if len(pts) < 2:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for x, y, name, invalid in pts:
        ax.errorbar(
            x.value,
            y.value,
            xerr=x.ci95 or None,
            yerr=y.ci95 or None,
            fmt="o",
            color="tab:blue",
            mfc="none" if invalid else "tab:blue",
            capsize=3,
        )
        ax.annotate(
            name + (" (INVALID)" if invalid else ""),
            (x.value, y.value),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    front = frontier_set(pts)
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="tab:red", label="Pareto frontier")
    elif front:
        ax.plot(front[0][0], front[0][1], "*", ms=14, color="tab:red", label="Pareto frontier (one trial dominates)")
    if any(invalid for *_, invalid in pts):
        ax.plot([], [], "o", mfc="none", color="tab:blue", label="read at an INVALID point (not in the frontier)")
    if any(x.ci95 or y.ci95 for x, y, *_ in pts):
        ax.plot([], [], "", color="none", label="bars: 95% interval between runs")
    ax.set_xlabel(f"{minimize} (lower is better)")
    ax.set_ylabel(f"{maximize} (higher is better)")
    ax.set_title(f"{data.experiment}: {maximize} vs {minimize}")
    ax.legend(fontsize=8)
    return [save_figure(fig, out, "frontier.png")]


def by_param(data: SweepData, out: Path, key: str, xlabel: str, name: str, title: str) -> list[Path]:
    plt = pyplot()
    trials = sorted((t for t in data.finished if t.num(key) is not None), key=lambda t: t.num(key) or 0.0)
    if not trials:
        return []
    labels = sorted({p.label for t in trials for p in t.points}, key=lambda s: (len(s), s))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label in labels:
        for ax, metric in zip(axes, (M.TTFT_MS_P50, M.TPOT_MS_P50, M.TOKENS_PER_SECOND)):
            at = [t for t in trials if any(p.label == label for p in t.points)]
            xs = [t.num(key) or 0.0 for t in at]
            draw(ax, xs, [point_between_runs(t, label, metric) for t in at], "o-", label, raced(trials))
    for ax, ylabel in zip(axes, ("TTFT p50 (ms)", "TPOT p50 (ms/token)", "output throughput (tokens/s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, title="load point")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    mark_intervals(fig, trials)
    return [save_figure(fig, out, name)]


def per_point(
    data: SweepData,
    out: Path,
    panels: list[tuple[str, str]],
    name: str,
    legend_title: str | None,
    title: str | None = None,
    log_first: bool = False,
) -> list[Path]:
    """One panel per metric against the load axis, one line per finished trial."""
    plt = pyplot()
    trials = data.finished
    if not trials or not any(t.points for t in trials):
        return []
    label, x, ticks, tick_labels = load_axis(trials)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5))
    for ax, (key, ylabel) in zip(axes, panels):
        plot_lines(ax, trials, key, x)
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        if ticks:
            ax.set_xticks(ticks, tick_labels)
        ax.legend(fontsize=7, title=legend_title)
        ax.grid(alpha=0.3)
    if log_first:
        axes[0].set_yscale("log")
    if title:
        fig.suptitle(title)
    mark_intervals(fig, trials)
    return [save_figure(fig, out, name)]


def generic(data: SweepData, out: Path) -> list[Path]:
    """Any sweep: TTFT p50, ITL p99 and throughput per load point, one line per trial."""
    return per_point(
        data,
        out,
        [
            (M.TTFT_MS_P50, "TTFT p50 (ms)"),
            (M.ITL_MS_P99, "ITL p99 (ms)"),
            (M.TOKENS_PER_SECOND, "output throughput (tokens/s)"),
        ],
        "overview.png",
        None,
        f"{data.experiment}: per load point",
    )
