"""A sweep's report: the lab's plots, the generic overview and ``summary.md`` (one table row
per trial and load point, and the fastest configuration that keeps its accuracy)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

from orchestrator.config.metric_keys import M
from orchestrator.decide.knobs import knob_effects
from orchestrator.decide.objective import value_of
from orchestrator.decide.trials import Point, SweepData, TrialData
from orchestrator.decide.verdict import decide
from orchestrator.report import expectations
from orchestrator.report.explain import limits_section, why_winner
from orchestrator.report.figures import frontier, generic
from orchestrator.report.plots import LAB_PLOTS
from orchestrator.tracking.runs import EXPECT_FILE

log = logging.getLogger(__name__)

COLUMNS = [
    (M.TTFT_MS_P50, "TTFT p50 (ms)"),
    (M.TTFT_MS_P99, "TTFT p99 (ms)"),
    (M.ITL_MS_P99, "ITL p99 (ms)"),
    (M.TPOT_MS_P50, "TPOT p50 (ms)"),
    (M.TOKENS_PER_SECOND, "output tok/s"),
    (M.GOODPUT, "goodput (req/s)"),
    (M.MEMORY_PEAK_GB, "memory peak (GB)"),
    (M.DECODE_FLOOR_RATIO, "TPOT / roofline floor"),
]


def build_report(data: SweepData, out: Path, accuracy_delta: float = 0.01) -> list[Path]:
    """Write the report's files into ``out``; returns them (PNGs first, then summary.md)."""
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    lab = LAB_PLOTS.get(data.experiment)
    builders = ([lab] if lab else []) + [generic]
    goal = data.objective
    if goal is not None and goal.frontier is not None:
        front = goal.frontier

        def pareto_plot(d: SweepData, o: Path) -> list[Path]:
            return frontier(d, o, front["minimize"], front["maximize"], lambda t, key: value_of(t, key, goal.at))

        builders.append(pareto_plot)
    for builder in builders:
        try:
            files += builder(data, out)
        except Exception as exc:  # one broken figure must not cost the others or the table
            log.warning("report: %s failed: %s", builder.__name__, exc)
    timelines = copy_timelines(data.trials, out)
    claims = []
    if data.expect:  # the lab's claims beside its report (a report rebuilt from MLflow reads them back)
        claims.append(out / EXPECT_FILE)
        claims[0].write_text(
            json.dumps([e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in data.expect], indent=1)
        )
    summary = out / "summary.md"
    summary.write_text(summary_markdown(data, [f.name for f in files], accuracy_delta, timelines))
    return files + list(timelines.values()) + claims + [summary]


TIMELINES_DIR = "timelines"


def copy_timelines(trials: list[TrialData], out: Path) -> dict[str, Path]:
    """Each trial's ``timeline.png`` (from its folder or its MLflow run) into the report's
    ``timelines/``, by trial name; trials without one are left out."""
    copied: dict[str, Path] = {}
    for t in trials:
        try:
            png = t.timeline()
        except Exception as exc:  # one unreadable timeline must not cost the report
            log.warning("report: the timeline of %s could not be read: %s", t.name, exc)
            continue
        if not png:
            continue
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", t.name).strip("_") or "trial"
        path = out / TIMELINES_DIR / (f"{stem}-{t.trial_hash[:8]}.png" if t.trial_hash else f"{stem}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        copied[t.name] = path
    return copied


def timelines_section(timelines: dict[str, Path]) -> list[str]:
    """Links to each trial's timeline in the report, and what the panels are."""
    if not timelines:
        return []
    lines = [
        "",
        "## Timelines",
        "",
        "One per trial, the load points shaded: requests in flight and completions (client), each "
        "request's TTFT and ITL, the engine's running/waiting requests and KV-cache usage, and the "
        "hardware (GPU power and utilisation, or the servers' CPU cores and RSS) on one time axis. "
        "docs/observability.md explains how to read them.",
        "",
    ]
    return lines + [f"- {name}: [{p.parent.name}/{p.name}]({p.parent.name}/{p.name})" for name, p in timelines.items()]


def _fmt(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return ""
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def best_configuration(
    trials: list[TrialData],
    metric: str = M.TOKENS_PER_SECOND,
    accuracy_key: str = M.ACCURACY,
    delta: float = 0.01,
    baseline: TrialData | None = None,
) -> tuple[TrialData | None, str]:
    """The trial with the highest ``metric`` at its heaviest load point whose accuracy is at
    least the baseline's minus ``delta`` (baseline: the first trial with an accuracy). Without
    accuracy scores, simply the fastest. Returns (trial, why)."""
    scored = [t for t in trials if t.points]
    if not scored:
        return None, "no finished trial with load points"

    def speed(t: TrialData) -> float:
        v = t.points[-1].metrics.get(metric, math.nan)
        return v if math.isfinite(v) else -math.inf

    with_acc = [t for t in scored if accuracy_key in t.metrics]
    if not with_acc:
        best = max(scored, key=speed)
        return best, f"highest {metric} at its heaviest load point (no accuracy scored)"
    base = baseline or with_acc[0]
    floor = base.metrics[accuracy_key] - delta
    ok = [t for t in with_acc if t.metrics[accuracy_key] >= floor]
    best = max(ok, key=speed)
    return best, (
        f"highest {metric} among trials with {accuracy_key} >= {floor:.3f} "
        f"(baseline {base.name} {base.metrics[accuracy_key]:.3f} - {delta})"
    )


DATASETS = {
    "random": "uniformly random token ids of exact length (prompts share no prefix)",
    "vllm_random": "runs of consecutive token ids from a random start, as `vllm bench serve --dataset-name "
    "random` builds them (on a small vocabulary they share leading blocks: prefix-cache hits)",
    "shared_prefix": "one of a few fixed prefixes, then random tokens",
    "sharegpt": "first user turns of a ShareGPT file",
    "multi_turn": "conversations; every turn resends the conversation so far",
}


def load_description(trials: list[TrialData]) -> list[str]:
    """How the load was generated, in words: what each kind of load point means (arrival
    semantics) and where each request class's prompts came from."""
    closed, trace = set(), set()
    rates: set[tuple[str, float, object]] = set()
    for t in trials:
        for p in t.points:
            s = p.setting
            if s.get("concurrency") is not None:
                closed.add(int(s["concurrency"]))
            elif s.get("trace"):
                trace.add((str(s["trace"]), str(s.get("trace_sha256", "?"))[:12]))
            elif s.get("rate") is not None:
                rates.add((str(s.get("arrival", "poisson")), float(s.get("burstiness", 1.0)), s.get("max_concurrency")))
    out = []
    if closed:
        out.append(
            "Concurrency points (`cN`) are closed loops: N streams, each sending its next request the moment "
            "its previous one completes, with no think time (as `vllm bench serve --max-concurrency N "
            "--request-rate inf`)."
        )
    for arrival, burst, cap in sorted(rates, key=str):
        shape = f"{arrival} arrivals" + (f" (gamma shape {burst:g})" if arrival == "gamma" or burst != 1.0 else "")
        out.append(
            f"Rate points (`rX`) are open loops: {shape} at X req/s, drawn before the point starts; a send "
            "never waits for a completion" + (f", at most {cap} in flight." if cap else ".")
        )
    if trace:
        files = ", ".join(f"`{Path(path).name}` (sha256 {sha})" for path, sha in sorted(trace))
        out.append(
            f"Trace points replay the trace file's own arrival times and lengths ({files}), scaled as their "
            "setting says (time_scale, length_scale, trace_start_s, max_context_tokens); a follower of a "
            "multi-turn trace is sent after its parent's reply."
        )
    classes: dict[str, set[str]] = {}
    for t in trials:
        for key, value in t.params.items():
            m = re.fullmatch(r"workload\.classes\.([^.]+)\.dataset", key)
            if m:
                classes.setdefault(m.group(1), set()).add(value)
    for cls, kinds in sorted(classes.items()):
        out.append(f"Prompts of class `{cls}`: " + "; ".join(f"{k}: {DATASETS.get(k, k)}" for k in sorted(kinds)) + ".")
        background = sorted(
            {
                (t.param(f"workload.classes.{cls}.rate"), t.param(f"workload.classes.{cls}.arrival"))
                for t in trials
                if t.param(f"workload.classes.{cls}.rate") is not None
            }
        )
        for rate, process in background:
            out.append(
                f"Class `{cls}` is background traffic: {process or 'poisson'} arrivals at {rate} req/s "
                "during every point, whatever the point's setting."
            )
    return out


HARDWARE_COLUMNS = [
    (M.TELEMETRY_SERVER_CPU_CORES_MEAN, "servers' CPU cores"),
    (M.TELEMETRY_SERVER_RSS_GB_MAX, "servers' RSS GB"),
    (M.TELEMETRY_GPU_POWER_W_MEAN, "GPU W"),
    (M.TELEMETRY_GPU_SM_UTIL_PCT_MEAN, "SM util %"),
    (M.JOULES_PER_OUTPUT_TOKEN, "J / output token"),
    (M.COST_PER_MTOK_OUTPUT, "$ / M output tok"),
    (M.COST_PER_MTOK_TOTAL, "$ / M tok (in+out)"),
]


def hardware_section(trials: list[TrialData]) -> list[str]:
    """What the hardware did at each trial's points, energy and cost per token, and how to read
    the per-trial timeline; columns nobody measured are left out, and why is said."""
    measured = [t for t in trials if any(k in p.metrics for p in t.points for k, _ in HARDWARE_COLUMNS)]
    if not measured:
        return []
    cols = [(k, h) for k, h in HARDWARE_COLUMNS if any(k in p.metrics for t in measured for p in t.points)]
    lines = [
        "",
        "## Hardware, energy and cost per point",
        "",
        "Each trial's MLflow run holds `timeline.png` (requests in flight, TTFT and ITL per request, the "
        "engine's running/waiting/KV usage and the hardware on one time axis, the load points shaded) and "
        "`telemetry.parquet` (rows of t, source, name, value on the records' clock); docs/observability.md "
        "explains each series.",
        "",
        *_point_table([(t, p) for t in measured for p in t.points], cols),
    ]
    estimated = [
        f"{t.name} {p.label}" for t in measured for p in t.points if p.metrics.get(M.ENERGY_FROM_COUNTER) == 0.0
    ]
    if estimated:
        lines += [
            "",
            "Energy ESTIMATED from power samples (no energy counter bracketed the window): "
            + ", ".join(estimated)
            + ". They integrate NVML's power as what it is (the mean over the second before each read on Ampere, "
            "GA100 excepted, and later; an instant reading on older GPUs, integrated as trapezoids). On the lent "
            "H200, over 1 s samples, the averages integrated that way were within 2% of the counter (-0.3% on a "
            "steady load, +1.7% on the 6 s decay after it, +0.1% on a 1.5 s burst), where trapezoids through the "
            "same averages read -9%, +49% and -34%. Instant readings as trapezoids (the H200's instant power field "
            "as a stand-in for an older GPU's reading) read -1% to +2%, +13% to +15% and -7% to -8% on those windows: "
            "compare them with care.",
        ]
    keys = ("energy", "price", "roofs")
    notes = {key: sorted({t.telemetry[key] for t in measured if key in t.telemetry}) for key in keys}
    for key, label in (("energy", "Energy"), ("price", "Price"), ("roofs", "Roofline roofs")):
        if notes[key]:
            lines += ["", f"{label}: " + " / ".join(notes[key]) + "."]
    return lines


REUSE_COLUMNS = (
    (M.TRACE_IDEAL_PREFIX_SHARE, "ideal prefix reuse (share of prompt tokens)"),
    (M.SERVER_PREFIX_CACHE_HIT_RATE, "server's prefix-cache hits (share)"),
    (M.PREFIX_REUSE_EFFICIENCY, "hits / ideal"),
    (M.TTFT_MS_P50, "TTFT p50 (ms)"),
    (M.TTFT_MS_P99, "TTFT p99 (ms)"),
    (M.TTFT_FROM_SCHEDULE_MS_P50, "TTFT from its scheduled send p50 (ms)"),
    (M.SEND_LAG_MS_P99, "send lag p99 (ms)"),
    (M.TRACE_REQUESTS_TRUNCATED, "requests cut to the context cap"),
    (M.TRACE_REQUESTS_DROPPED, "dropped"),
)


def reuse_section(trials: list[TrialData]) -> list[str]:
    """A replayed trace's prefix reuse per trial and point: what an infinite cache would reuse of
    the slice (its prefix blocks), what the server's prefix cache hit, their ratio, and the TTFT."""
    rows = [(t, p) for t in trials for p in t.points if M.TRACE_IDEAL_PREFIX_SHARE in p.metrics]
    if not rows:
        return []
    lines = [
        "",
        "## Prefix reuse on the replayed trace",
        "",
        "Ideal: the share of the slice's prompt tokens in blocks whose whole prefix came earlier in the "
        "slice (an infinite cache, cold at the point's start). Hits: the server's own counter over the "
        "point. Their ratio is the cache's efficiency on this traffic (a cache that keeps only whole KV "
        "blocks, evicts, or is off reuses less).",
        "",
        *_point_table(rows, REUSE_COLUMNS),
    ]
    return lines


def _point_table(rows: list[tuple[TrialData, Point]], cols: Sequence[tuple[str, str]]) -> list[str]:
    """A markdown table of a metric per column, a row per (trial, point)."""
    head = ["| trial | point | " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * (len(cols) + 2)]
    return head + [
        f"| {t.name} | {p.label} | " + " | ".join(_fmt(p.metrics.get(k)) for k, _ in cols) + " |" for t, p in rows
    ]


def summary_markdown(
    data: SweepData, figures: list[str], accuracy_delta: float = 0.01, timelines: dict[str, Path] | None = None
) -> str:
    varied = data.varied_params()
    lines = [
        f"# {data.experiment}: sweep report",
        "",
        f"Built {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} from {data.source}. "
        f"{len(data.trials)} trial(s): "
        + ", ".join(f"{sum(t.status == s for t in data.trials)} {s}" for s in sorted({t.status for t in data.trials})),
        "",
    ]
    load = load_description(data.trials)
    if load:
        lines += ["**How the load was generated.** " + " ".join(load), ""]
    lines += limits_section(data.finished)
    lines += [f"![{f}]({f})" for f in figures] + [""]
    has_acc = any(M.ACCURACY in t.metrics for t in data.trials)
    head = ["trial", "status", *varied, "point", *[c[1] for c in COLUMNS]] + ([M.ACCURACY] if has_acc else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in data.trials:
        params = [str(t.params.get(k, "")) for k in varied]
        acc = [_fmt(t.metrics.get(M.ACCURACY))] if has_acc else []
        if not t.points:
            lines.append("| " + " | ".join([t.name, t.status, *params, "", *[""] * len(COLUMNS), *acc]) + " |")
        for p in t.points:
            lines.append(
                "| "
                + " | ".join([t.name, t.status, *params, p.label, *[_fmt(p.metrics.get(k)) for k, _ in COLUMNS], *acc])
                + " |"
            )
    invalid = [(t, p) for t in data.trials for p in t.points if p.metrics.get(M.INVALID)]
    if invalid:  # a number read at such a point describes the client or another workload, not the server
        lines += ["", "**INVALID points** (not a measurement of the server under the planned workload):", ""]
        lines += [f"- {t.name} {p.label}: {p.invalid_reasons or 'invalid'}" for t, p in invalid]
    if data.objective is not None:
        verdict = decide(data.finished, data.objective)
        lines += ["", *verdict.lines, ""]
        explained = why_winner(verdict.best, data.finished, varied, data.objective, verdict.decision)
        lines += [*explained, ""] if explained else []
        lines += knob_effects(data.finished, varied, data.objective)
    else:
        best, why = best_configuration(data.finished, delta=accuracy_delta)
        lines += [
            "",
            f"**Best configuration:** {best.name if best else 'none'} ({why}; the experiment declares "
            "no `objective`, see README).",
        ]
    lines += ["", *expectations.section(expectations.check(data.expect, data.trials))] if data.expect else []
    lines += reuse_section(data.finished)
    lines += hardware_section(data.finished)
    lines += timelines_section(timelines or {})
    skipped = [t for t in data.trials if t.status != "FINISHED"]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(f"{t.name} {t.status}" for t in skipped) + "."]
    return "\n".join(lines) + "\n"
