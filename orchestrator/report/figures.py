"""What every sweep's figures share: headless matplotlib, the load axis of a sweep (rate or
concurrency), a knee and a Pareto frontier, plots per knob and per load point, and the generic
overview of any sweep. The lab figures (:mod:`orchestrator.report.plots`) are built from these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.tracking.runs import Point, SweepData, TrialData


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


def plot_lines(
    ax: Any, trials: list[TrialData], key: str, x: Callable[[Point], float], style: str = "o-", suffix: str = ""
) -> None:
    for t in trials:
        pts = sorted(t.points, key=x)
        ax.plot([x(p) for p in pts], [metric_of(p, key) for p in pts], style, label=f"{t.name}{suffix}")


def knee(trial: TrialData, ttft_factor: float = 2.0, rate_share: float = 0.7) -> Point | None:
    """The first load point past saturation: TTFT p50 more than ``ttft_factor`` x the lightest
    point's (requests queue), or completions below ``rate_share`` of the arrivals actually
    scheduled (the server cannot keep up). None if the trial never saturates. A finite
    sweep's tail (the last requests finishing after the last arrival) costs qps ~10-20%, so
    the share is well below 1."""
    pts = sorted((p for p in trial.points if p.x() is not None), key=lambda p: p.x() or 0.0)
    if not pts:
        return None
    base = metric_of(pts[0], "ttft_ms_p50")
    for p in pts:
        offered = metric_of(p, "schedule_rate")
        if not math.isfinite(offered):
            x = p.x()
            offered = x if x is not None and "rate" in p.setting else math.nan
        if math.isfinite(offered) and metric_of(p, "qps") < rate_share * offered:
            return p
        if metric_of(p, "ttft_ms_p50") > ttft_factor * base:
            return p
    return None


def pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Points not dominated by another (less memory and more throughput), by memory."""
    front: list[tuple[float, float, Any]] = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


def frontier(
    data: SweepData, out: Path, minimize: str, maximize: str, value: Callable[[TrialData, str], float | None]
) -> list[Path]:
    """Each finished trial at (``minimize``, ``maximize``); the Pareto frontier joined."""
    pts = [
        (x, y, t.name)
        for t in data.finished
        if (x := value(t, minimize)) is not None and (y := value(t, maximize)) is not None
    ]
    if len(pts) < 2:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for x, y, name in pts:
        ax.plot(x, y, "o", color="tab:blue")
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = pareto(pts)
    ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="tab:red", label="Pareto frontier")
    ax.set_xlabel(f"{minimize} (lower is better)")
    ax.set_ylabel(f"{maximize} (higher is better)")
    ax.set_title(f"{data.experiment}: {maximize} vs {minimize}")
    ax.legend()
    return [save_figure(fig, out, "frontier.png")]


def by_param(data: SweepData, out: Path, key: str, xlabel: str, name: str, title: str) -> list[Path]:
    plt = pyplot()
    trials = sorted((t for t in data.finished if t.num(key) is not None), key=lambda t: t.num(key) or 0.0)
    if not trials:
        return []
    labels = sorted({p.label for t in trials for p in t.points}, key=lambda s: (len(s), s))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label in labels:
        for ax, metric in zip(axes, ("ttft_ms_p50", "tpot_ms_p50", "tokens_per_second")):
            xs, ys = [], []
            for t in trials:
                p = next((p for p in t.points if p.label == label), None)
                if p is not None:
                    xs.append(t.num(key))
                    ys.append(metric_of(p, metric))
            ax.plot(xs, ys, "o-", label=label)
    for ax, ylabel in zip(axes, ("TTFT p50 (ms)", "TPOT p50 (ms/token)", "output throughput (tokens/s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, title="load point")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
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
    return [save_figure(fig, out, name)]


def generic(data: SweepData, out: Path) -> list[Path]:
    """Any sweep: TTFT p50, ITL p99 and throughput per load point, one line per trial."""
    return per_point(
        data,
        out,
        [
            ("ttft_ms_p50", "TTFT p50 (ms)"),
            ("itl_ms_p99", "ITL p99 (ms)"),
            ("tokens_per_second", "output throughput (tokens/s)"),
        ],
        "overview.png",
        None,
        f"{data.experiment}: per load point",
    )
