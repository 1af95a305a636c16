"""One figure builder per lab (``LAB_PLOTS``); the generic one for any sweep and what they
share are in :mod:`orchestrator.report.figures`.

Every builder takes the sweep's data and an output folder and returns the PNGs it wrote.
Axes carry units; every line is labelled in a legend. matplotlib runs headless (Agg).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

from orchestrator.config.metric_keys import M
from orchestrator.decide.trials import Point, SweepData, TrialData
from orchestrator.report.figures import (
    by_param,
    draw,
    knee,
    load_axis,
    mark_intervals,
    metric_of,
    pareto,
    per_point,
    plot_lines,
    point_between_runs,
    pyplot,
    raced,
    save_figure,
)

Builder = Callable[[SweepData, Path], list[Path]]


def first_serving(data: SweepData, out: Path) -> list[Path]:
    """TTFT and ITL vs request rate, the saturation knee marked."""
    plt = pyplot()
    trials = data.finished
    label, x, ticks, tick_labels = load_axis(trials)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, title) in zip(axes, [("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)")]):
        plot_lines(ax, trials, f"{key}_p50", x, "o-", " p50")
        plot_lines(ax, trials, f"{key}_p99", x, "s--", " p99")
        ax.set_yscale("log")
        ax.set_ylabel(title + ", log scale")
        ax.set_title(f"{title.split(' ')[0]} vs request rate")
    plot_lines(axes[2], trials, M.TOKENS_PER_SECOND, x, "o-")
    axes[2].set_ylabel("output throughput (tokens/s)")
    axes[2].set_title("throughput vs request rate")
    for t in trials:
        k = knee(t)
        if k is not None:
            for ax in axes:
                ax.axvline(x(k), color="grey", linestyle=":", linewidth=1.2)
            axes[0].annotate(
                f"knee ({t.name}): {tick_labels[ticks.index(x(k))] if x(k) in ticks else x(k)}",
                (x(k), metric_of(k, M.TTFT_MS_P50)),
                textcoords="offset points",
                xytext=(-90, 12),
                fontsize=8,
                arrowprops={"arrowstyle": "->", "color": "grey"},
            )
    for ax in axes:
        ax.set_xlabel(label)
        ax.set_xticks(ticks, tick_labels)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    mark_intervals(fig, trials)
    return [save_figure(fig, out, "first_serving.png")]


def _budget(t: TrialData) -> tuple[float, str]:
    """Position and label of a chunked-prefill trial on the token-budget axis."""
    if t.param("engine.enable_chunked_prefill") == "False":
        return 0.0, "off"
    b = t.num("engine.max_num_batched_tokens")
    return (b, f"{b:g}") if b is not None else (-1.0, "default")


def chunked_prefill(data: SweepData, out: Path) -> list[Path]:
    """ITL p99 (short streams) and TTFT p99 (long prompts) vs token budget; ITL over time."""
    plt = pyplot()
    trials = sorted(data.finished, key=lambda t: _budget(t)[0])
    if not trials:
        return []
    positions = list(range(len(trials)))
    names = [_budget(t)[1] for t in trials]
    labels = sorted({p.label for t in trials for p in t.points}, key=lambda s: (len(s), s))
    classes = sorted({k.split("/")[0] for t in trials for p in t.points for k in p.metrics if "/" in k})
    short = "short" if "short" in classes else None
    long_ = "long" if "long" in classes else None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    bars = raced(trials)
    for label in labels:
        itl = [point_between_runs(t, label, f"{short}/{M.ITL_MS_P99}" if short else M.ITL_MS_P99) for t in trials]
        ttft = [point_between_runs(t, label, f"{long_}/{M.TTFT_MS_P99}" if long_ else M.TTFT_MS_P99) for t in trials]
        draw(axes[0], positions, itl, "o-", f"{label}: ITL p99" + (" (short streams)" if short else ""), bars)
        draw(axes[1], positions, ttft, "s-", f"{label}: TTFT p99" + (" (long prompts)" if long_ else ""), bars)
    mark_intervals(fig, trials)
    axes[0].set_ylabel("ITL p99 (ms)")
    axes[0].set_title("decode stalls vs chunk budget")
    axes[1].set_ylabel("TTFT p99 (ms)")
    axes[1].set_title("long-prompt TTFT vs chunk budget")
    for ax in axes:
        ax.set_xticks(positions, names)
        ax.set_xlabel("max_num_batched_tokens (token budget per step; off = no chunking)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    paths = [save_figure(fig, out, "chunked_prefill_budget.png")]
    over_time = _itl_over_time(trials, names, short, long_, out)
    return paths + ([over_time] if over_time else [])


def _itl_over_time(
    trials: list[TrialData], names: list[str], short: str | None, long_: str | None, out: Path
) -> Path | None:
    """Every inter-token gap of the short streams at the heaviest load point, against time,
    with the arrivals of long prompts marked: the stalls line up with them."""
    plt = pyplot()
    tables = [(t, n, t.records()) for t, n in zip(trials, names)]
    tables = [(t, n, tab) for t, n, tab in tables if tab is not None and tab.num_rows]
    if not tables:
        return None
    fig, axes = plt.subplots(len(tables), 1, figsize=(12, 2.3 * len(tables)), sharex=True, squeeze=False)
    for ax, (t, name, table) in zip(axes[:, 0], tables):
        rows = table.to_pylist()
        last = max(r["point"] for r in rows)
        rows = [r for r in rows if r["point"] == last]
        t0 = min(r["sent_s"] for r in rows)
        xs, ys = [], []
        for r in rows:
            if short and r["request_class"] != short:
                continue
            chunks = r["chunk_times_s"] or []
            for a, b in zip(chunks, chunks[1:]):
                xs.append(b - t0)
                ys.append((b - a) * 1000)
        ax.scatter(xs, ys, s=4, alpha=0.6, label=f"ITL of {short or 'all'} requests")
        for i, r in enumerate(r for r in rows if long_ and r["request_class"] == long_):
            ax.axvline(
                r["sent_s"] - t0, color="red", alpha=0.35, linewidth=0.8, label="long prompt sent" if i == 0 else None
            )
        ax.set_yscale("log")
        ax.set_ylabel("ITL (ms)")
        ax.set_title(f"budget {name}, point {next((p.label for p in t.points if p.index == last), last)}", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since the load point started (s)")
    return save_figure(fig, out, "chunked_prefill_itl_over_time.png")


def prefix_caching(data: SweepData, out: Path) -> list[Path]:
    """TTFT vs shared-prefix length, caching on and off (server hit rate annotated)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[str, list[tuple[float, tuple[float, float], float]]] = {}
    for t in data.finished:
        on = t.param("engine.enable_prefix_caching") != "False"
        prefix = t.num("workload.classes.main.prefix_tokens", 0.0) or 0.0
        p = t.points[-1] if t.points else None
        if p is None:
            continue
        groups.setdefault("prefix caching on" if on else "prefix caching off", []).append(
            (
                prefix,
                point_between_runs(t, p.label, M.TTFT_MS_P50),
                point_between_runs(t, p.label, M.SERVER_PREFIX_CACHE_HIT_RATE)[0],
            )
        )
    for name, pts in sorted(groups.items()):
        pts.sort(key=lambda q: q[0])
        draw(ax, [q[0] for q in pts], [q[1] for q in pts], "o-", name, raced(data.finished))
        for prefix, (ttft, _), hit in pts:
            if math.isfinite(hit):
                ax.annotate(f"hit {hit:.0%}", (prefix, ttft), textcoords="offset points", xytext=(4, 6), fontsize=8)
    mark_intervals(fig, data.finished)
    ax.set_xlabel("shared prefix length (tokens)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_yscale("log")
    ax.set_title("TTFT vs shared-prefix length")
    ax.legend()
    ax.grid(alpha=0.3)
    return [save_figure(fig, out, "prefix_caching.png")]


def speculative_decoding(data: SweepData, out: Path) -> list[Path]:
    """Acceptance rate vs k; latency vs achieved QPS."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    trials = data.finished
    labels = sorted({p.label for t in trials for p in t.points}, key=lambda s: (len(s), s))
    bars = raced(trials)
    for label in labels:
        pts = []
        for t in trials:
            k = t.num("engine.speculative_config.num_speculative_tokens")
            if k and any(p.label == label for p in t.points):
                pts.append((k, point_between_runs(t, label, M.SERVER_SPEC_DECODE_ACCEPTANCE_RATE)))
        pts.sort(key=lambda q: q[0])
        draw(axes[0], [q[0] for q in pts], [q[1] for q in pts], "o-", label, bars)
    axes[0].set_xlabel("speculative tokens per step (k)")
    axes[0].set_ylabel("draft acceptance rate (accepted / proposed)")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("acceptance vs k")
    for t in trials:
        by_qps = sorted(t.points, key=lambda p: point_between_runs(t, p.label, M.QPS)[0])
        draw(
            axes[1],
            [point_between_runs(t, p.label, M.QPS)[0] for p in by_qps],
            [point_between_runs(t, p.label, M.TPOT_MS_P50) for p in by_qps],
            "o-",
            t.name,
            bars,
        )
    mark_intervals(fig, trials)
    axes[1].set_xlabel("achieved throughput (requests/s)")
    axes[1].set_ylabel("TPOT p50 (ms/token)")
    axes[1].set_title("latency vs QPS")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return [save_figure(fig, out, "speculative_decoding.png")]


def quantization(data: SweepData, out: Path) -> list[Path]:
    """Memory vs throughput, labelled by accuracy when the sweep scored it; Pareto front."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    bars = raced(data.finished)
    measured = [
        (
            t.metrics.get(M.MEMORY_PEAK_GB_MAX, math.nan),
            point_between_runs(t, t.points[-1].label, M.TOKENS_PER_SECOND) if t.points else (math.nan, 0.0),
            t,
        )
        for t in data.finished
    ]
    measured = [q for q in measured if math.isfinite(q[0]) and math.isfinite(q[1][0])]
    for mem, (tps, half), t in measured:
        acc = t.metrics.get(M.ACCURACY)
        if bars:
            ax.errorbar([mem], [tps], yerr=[half], fmt="o", capsize=3)
        else:
            ax.scatter([mem], [tps], s=40)
        ax.annotate(
            t.name + (f" (acc {acc:.3f})" if acc is not None else ""),
            (mem, tps),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    pts = [(mem, tps, t) for mem, (tps, _), t in measured]
    mark_intervals(fig, data.finished)
    front = pareto(pts)
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", linewidth=1, label="Pareto front")
        ax.legend()
    ax.set_xlabel("peak memory (GB)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title("memory vs throughput")
    ax.grid(alpha=0.3)
    return [save_figure(fig, out, "quantization.png")]


def _lora_label(t: TrialData) -> str:
    """A multi-LoRA trial on the x axis: its name, the adapters in flight and the batch's slots."""
    active, slots = t.num("workload.adapters.active"), t.num("engine.max_loras")
    words = [f"{active:g} active" if active is not None else "", f"{slots:g} slots" if slots is not None else ""]
    return t.name + "".join(f"\n{w}" for w in words if w)


def _adapter_mean(p: Point, metric: str) -> float:
    """The mean over a point's adapters (not the base model) of ``adapter.<name>.<metric>``."""
    values = [
        v
        for k, v in p.metrics.items()
        if k.startswith("adapter.") and k.endswith(f".{metric}") and not k.startswith("adapter.base.")
    ]
    return sum(values) / len(values) if values else math.nan


def multi_lora(data: SweepData, out: Path) -> list[Path]:
    """Throughput and TTFT per trial (adapters in flight against the batch's slots), and each
    trial's cold adapter start (an adapter's first request) against its warm requests."""
    plt = pyplot()
    trials = [t for t in data.finished if t.points]
    if not trials:
        return []
    xs = list(range(len(trials)))
    bars = raced(trials)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.6))
    heaviest = [t.points[-1].label for t in trials]
    tps = [point_between_runs(t, at, M.TOKENS_PER_SECOND) for t, at in zip(trials, heaviest, strict=True)]
    ttft99 = [point_between_runs(t, at, M.TTFT_MS_P99) for t, at in zip(trials, heaviest, strict=True)]
    ttft50 = [point_between_runs(t, at, M.TTFT_MS_P50) for t, at in zip(trials, heaviest, strict=True)]
    axes[0].bar(xs, [m for m, _ in tps], yerr=[h for _, h in tps] if bars else None, capsize=3)
    axes[0].set_ylabel("output throughput (tokens/s)")
    axes[0].set_title("throughput as adapters outnumber the slots")
    draw(axes[1], xs, ttft99, "s--", "TTFT p99", bars)
    draw(axes[1], xs, ttft50, "o-", "TTFT p50", bars)
    axes[1].set_ylabel("TTFT (ms)")
    axes[1].set_title("waiting for an adapter slot shows in TTFT")
    cold = [_adapter_mean(t.points[-1], M.FIRST_TTFT_MS) for t in trials]
    warm = [_adapter_mean(t.points[-1], M.WARM_TTFT_MS_P50) for t in trials]
    width = 0.38
    axes[2].bar([x - width / 2 for x in xs], cold, width, label="an adapter's first request (cold)")
    axes[2].bar([x + width / 2 for x in xs], warm, width, label="its other requests (warm, p50)")
    axes[2].set_ylabel("TTFT (ms), mean over the adapters")
    axes[2].set_title("cold vs warm adapter")
    axes[2].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(xs, [_lora_label(t) for t in trials], fontsize=7, rotation=35, ha="right")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    mark_intervals(fig, trials)
    return [save_figure(fig, out, "multi_lora.png")]


LAB_PLOTS: dict[str, Builder] = {
    "first_serving": first_serving,
    "chunked_prefill": chunked_prefill,
    "prefix_caching": prefix_caching,
    "speculative_decoding": speculative_decoding,
    "quantization": quantization,
    # one knob on the x axis: latency and throughput at each load point
    "tensor_parallel": partial(
        by_param,
        key="engine.tensor_parallel_size",
        xlabel="tensor parallel size (GPUs or CPU ranks)",
        name="tensor_parallel.png",
        title="latency and throughput vs tensor parallelism",
    ),
    "disaggregated_pd": partial(
        by_param,
        key="workload.classes.main.input_tokens",
        xlabel="input length (tokens)",
        name="disaggregated_pd.png",
        title="TTFT (includes the KV transfer under P/D) vs input length",
    ),
    # TTFT, TPOT and throughput against load, one line per workload
    "serving_workloads": partial(
        per_point,
        panels=[
            (M.TTFT_MS_P50, "TTFT p50 (ms)"),
            (M.TPOT_MS_P50, "TPOT p50 (ms/token)"),
            (M.TOKENS_PER_SECOND, "output throughput (tokens/s)"),
        ],
        name="serving_workloads.png",
        legend_title="workload",
        log_first=True,
    ),
    "multi_lora": multi_lora,
}
