"""One timeline per trial: the client, the engine and the hardware on one time axis.

Four panels share the records' clock (seconds from the trial's first point), each load point
shaded and labelled: requests in flight and completions per second (client); every request's
TTFT and mean ITL, and each point's worst stalls marked by their cause (the diagnosis); the engine's running and waiting requests, its preemptions, its KV-cache
usage and the prefix-cache hit rate of each scrape interval; the
hardware (GPU power and SM utilisation, or the servers' and machine's CPU cores and the
servers' RSS). A stall, the queue behind it and the power at that instant line up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.metrics.records import parquet_bytes_to_table, table_to_records
from orchestrator.metrics.result import TIMELINE_FILE, TrialResult
from orchestrator.metrics.telemetry import Row, ratio_of_deltas, rows_from_parquet, series
from orchestrator.report.figures import pyplot, save_figure


def timeline_figure(result: TrialResult, out_dir: Path) -> Path | None:
    """``timeline.png`` of a trial in ``out_dir``; None for a trial without measured points."""
    windows = [(p.label, p.window) for p in result.points if p.window is not None]
    if not windows or not result.records_parquet:
        return None
    records = table_to_records(parquet_bytes_to_table(result.records_parquet))
    rows = rows_from_parquet(result.telemetry_parquet)
    origin = min(w[0] for _, w in windows)
    plt = pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    _client(axes[0], records, origin)
    _latency(axes[1], records, origin)
    _stalls(axes[1], [s for p in result.points for s in p.diagnosis.get("stalls", [])], origin)
    _engine(axes[2], rows, origin)
    _hardware(axes[3], rows, origin)
    for ax in axes:
        for k, (_label, (t0, t1)) in enumerate(windows):
            ax.axvspan(t0 - origin, t1 - origin, color="tab:gray", alpha=0.08 if k % 2 else 0.16, linewidth=0)
    for label, (t0, t1) in windows:
        axes[0].annotate(
            label,
            ((t0 + t1) / 2 - origin, 1.0),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    axes[-1].set_xlabel("time since the first load point started (s)")
    fig.suptitle(f"{result.variant or result.trial_hash[:8]}: client, engine and hardware", y=1.0)
    return save_figure(fig, out_dir, TIMELINE_FILE)


def _client(ax: Any, records: list[Any], origin: float) -> None:
    sent = sorted(r.sent_s - origin for r in records)
    done = sorted(r.done_s - origin for r in records if r.done_s is not None)
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in done])
    xs, ys, level = [], [], 0
    for t, d in events:
        xs.append(t)
        level += d
        ys.append(level)
    ax.step(xs, ys, where="post", color="tab:blue", label="requests in flight")
    ax.set_ylabel("in flight")
    if done:
        width = max(1.0, (done[-1] - done[0]) / 60)
        bins = [done[0] + i * width for i in range(int((done[-1] - done[0]) / width) + 2)]
        twin = ax.twinx()
        twin.hist(done, bins=bins, color="tab:green", alpha=0.35, weights=[1 / width] * len(done))
        twin.set_ylabel("completions / s", color="tab:green")
    ax.legend(loc="upper left", fontsize=8)


def _latency(ax: Any, records: list[Any], origin: float) -> None:
    firsts = [(r.chunk_times_s[0] - origin, (r.chunk_times_s[0] - r.sent_s) * 1e3) for r in records if r.chunk_times_s]
    itls = [
        (r.chunk_times_s[-1] - origin, (r.chunk_times_s[-1] - r.chunk_times_s[0]) / (len(r.chunk_times_s) - 1) * 1e3)
        for r in records
        if len(r.chunk_times_s) > 1
    ]
    if firsts:
        ax.scatter(*zip(*firsts), s=6, color="tab:red", label="TTFT of a request (at its first token)")
    if itls:
        ax.scatter(*zip(*itls), s=6, color="tab:purple", label="mean ITL of a request (at its end)")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend(loc="upper left", fontsize=8)


# A stall's cause (metrics.stalls) and how it is drawn on the latency panel.
STALL_STYLE = {
    "prefill": ("tab:orange", "v", "stall: another request's prefill"),
    "preemption": ("tab:red", "X", "stall: a preemption"),
    "client_read": ("tab:gray", "s", "stall: the client read late"),
    "unattributed": ("black", "d", "stall: unattributed"),
}


def _stalls(ax: Any, stalls: list[dict[str, Any]], origin: float) -> None:
    """Each kept stall (a point's worst) at its start, its gap in ms, marked by its cause."""
    for cause, (color, marker, label) in STALL_STYLE.items():
        mine = [(float(s["t"]) - origin, float(s["gap_ms"])) for s in stalls if s.get("cause") == cause]
        if mine:
            ax.scatter(*zip(*mine), s=28, color=color, marker=marker, label=label, zorder=3)
    if stalls:
        ax.legend(loc="upper left", fontsize=7)


def _engine(ax: Any, rows: list[Row], origin: float) -> None:
    drawn = False
    for name, color in (("requests_running", "tab:blue"), ("requests_waiting", "tab:orange")):
        ts, vs = series(rows, "engine", name)
        if ts:
            ax.plot([t - origin for t in ts], vs, color=color, label=name.replace("_", " "))
            drawn = True
    ts, vs = series(rows, "engine", "preemptions")
    moved = [t for k, t in enumerate(ts[1:], 1) if vs[k] > vs[k - 1]]  # a scrape interval with preemptions
    if moved:
        ax.plot([t - origin for t in moved], [0.0] * len(moved), "x", color="tab:red", label="preemptions")
        drawn = True
    kv_t, kv_v = series(rows, "engine", "kv_cache_usage")
    hit_t, hit_v = ratio_of_deltas(rows, "engine", "prefix_cache_hits", "prefix_cache_queries")
    if kv_t or hit_t:
        twin = ax.twinx()
        twin.plot([t - origin for t in kv_t], [v * 100 for v in kv_v], color="tab:brown", linestyle="--")
        if hit_t:
            twin.plot([t - origin for t in hit_t], [v * 100 for v in hit_v], color="tab:green", linestyle=":")
        twin.set_ylabel("KV used -- / prefix hits .. (%)", color="tab:brown")
    ax.set_ylabel("engine: requests")
    if drawn:
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no engine gauges (not scraped)", transform=ax.transAxes, ha="center", fontsize=9)


def _hardware(ax: Any, rows: list[Row], origin: float) -> None:
    gpus = sorted({s for _, s, _, _ in rows if s.startswith("gpu")})
    if gpus:
        for g in gpus:
            ts, vs = series(rows, g, "power_w")
            ax.plot([t - origin for t in ts], vs, label=f"{g} power (W)")
        twin = ax.twinx()
        for g in gpus:
            ts, vs = series(rows, g, "sm_util_pct")
            twin.plot([t - origin for t in ts], vs, linestyle=":", label=f"{g} SM util (%)")
        twin.set_ylabel("SM utilisation (%)")
        ax.set_ylabel("power (W)")
    else:
        for source, color in (("servers", "tab:blue"), ("machine", "tab:gray")):
            ts, vs = series(rows, source, "cpu_cores")
            if ts:
                ax.plot([t - origin for t in ts], vs, color=color, label=f"{source}: CPU cores busy")
        ts, vs = series(rows, "servers", "rss_gb")
        if ts:
            twin = ax.twinx()
            twin.plot([t - origin for t in ts], vs, color="tab:green", linestyle="--")
            twin.set_ylabel("servers' RSS (GB)", color="tab:green")
        ax.set_ylabel("CPU cores")
    if not rows or not ax.get_lines():
        ax.text(0.5, 0.5, "no telemetry (platform.telemetry=false)", transform=ax.transAxes, ha="center", fontsize=9)
    else:
        ax.legend(loc="upper left", fontsize=8)
