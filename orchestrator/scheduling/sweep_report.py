"""What a sweep says about its results: a finished trial's one-line summary, the status table
it prints last, and its report (built, logged to the sweep's parent run, its verdict and the
lab's claims on the console)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config.logs import Progress
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec
from orchestrator.decide.race import OPEN
from orchestrator.metrics.result import TrialResult
from orchestrator.scheduling import outcome
from orchestrator.tracking import MlflowTracker

if TYPE_CHECKING:
    from orchestrator.decide.trials import SweepData
    from orchestrator.decide.verdict import Verdict


def point_summary(result: TrialResult) -> str:
    """The trial's last point in a few numbers (and its limiter), for its progress line."""
    if not result.points:
        return ""
    m = result.points[-1].metrics
    return (
        f"last point {result.points[-1].label}: ttft p50 {m.get(M.TTFT_MS_P50, float('nan')):.0f} ms, "
        f"itl p99 {m.get(M.ITL_MS_P99, float('nan')):.0f} ms, {m.get(M.TOKENS_PER_SECOND, 0):.0f} tok/s"
        + _limited(result)
    )


def _limited(result: TrialResult) -> str:
    """``; limited by <cause> (<confidence>)`` of the trial's last point, when it was diagnosed."""
    d = result.points[-1].diagnosis if result.points else {}
    if not d.get("limiter"):
        return ""
    return f"; limited by {d['limiter'].replace('_', ' ')} ({d.get('confidence', '?')})"


def status_table(results: list[TrialResult]) -> list[str]:
    """What worked on this cluster: one row per trial (variant, engine, status, what it
    measured or why not). The last thing a sweep prints (``gpu_smoke`` is read this way)."""
    if not results:
        return []
    rows = [("trial", "engine", "status", "measured / reason")]
    for r in sorted(results, key=lambda r: r.variant or r.trial_hash):
        if r.status == "FINISHED" and r.points:
            m = r.points[-1].metrics
            what = (
                f"{len(r.points)} point(s); last: {m.get(M.TOKENS_PER_SECOND, 0):.0f} tok/s, "
                f"ttft p50 {m.get(M.TTFT_MS_P50, float('nan')):.0f} ms" + _limited(r)
            )
        else:
            what = (r.error or "").splitlines()[0][:120] if r.error else ""
        rows.append((r.variant or r.trial_hash[:8], r.engine_version or "?", r.status, what))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + " | " + row[3] for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 20)
    return lines


def report_sweep(
    experiment: str,
    results: list[TrialResult],
    sweep_dir: Path,
    tracker: MlflowTracker | None,
    progress: Progress,
    objective: ObjectiveSpec | None = None,
    trial_dirs: dict[str, Path] | None = None,
    expect: list[ExpectationSpec] | None = None,
    run_ids: dict[str, str] | None = None,
) -> None:
    """The sweep's report (lab plots, summary.md, each trial's timeline): written to ``<sweep_dir>/report`` first,
    then logged to the sweep's parent run under ``report/``. A report failure costs nothing
    measured; ``python -m orchestrator.report experiment=NAME`` rebuilds it from MLflow."""
    if not any(r.points for r in results):
        if expect and results:  # nothing measured: each claim says why it cannot be checked here
            from orchestrator.report import from_results

            _say_expectations(from_results(results, experiment, expect=expect), progress)
        return
    try:
        from orchestrator.report import build_report, from_results

        data = from_results(results, experiment, objective=objective, trial_dirs=trial_dirs, expect=expect)
        if tracker is not None and tracker.parent_run_id and len(data.trials) < tracker.sweep_trial_count():
            from orchestrator.report import from_mlflow  # a search's batch: report on all its trials so far

            data = from_mlflow(tracker.uri, experiment, tracker.parent_run_id)
            data.objective, data.expect = objective, list(expect or [])
        files = build_report(data, sweep_dir / "report")
        progress(f"report: {len(files)} file(s) in {sweep_dir / 'report'}")
        verdict = _say_verdict(data, objective, progress)
        _say_expectations(data, progress)
        if verdict is not None and verdict.decision == OPEN and objective is not None and objective.most_runs > 1:
            outcome.note(outcome.UNDECIDED)
        if tracker is not None:
            tracker.log_sweep_files(files, "report", root=sweep_dir / "report")
            if verdict is not None and verdict.race is not None:
                _log_between_runs(tracker, data.finished, verdict.objective, run_ids or {})
            if verdict is not None:
                tracker.set_sweep_tags(
                    {
                        "verdict": verdict.best.name if verdict.best else "none",
                        "verdict_text": verdict.headline.replace("**", ""),
                        "verdict_decision": verdict.decision,
                        "verdict_confidence": f"{verdict.objective.confidence:g}"
                        if verdict.race is not None
                        else "not measured (one run each)",
                    }
                )
    except Exception as exc:
        progress(
            f"warning: the sweep report failed ({exc}); rebuild it with "
            f"`python -m orchestrator.report experiment={experiment}`"
        )


def _log_between_runs(
    tracker: MlflowTracker, trials: list[Any], objective: ObjectiveSpec, run_ids: dict[str, str]
) -> None:
    """On each raced trial's run: the objective's mean over its runs, how many, and the 95%
    t-interval between them (``<key>_ci95_low`` / ``_high``)."""
    from orchestrator.decide.objective import value_of

    for t in trials:
        v = value_of(t, objective.key, objective.at)
        run_id = run_ids.get(t.trial_hash)
        if not t.runs or v is None or run_id is None:
            continue
        key = objective.key.replace("/", ".")
        metrics = {f"{key}_runs_mean": v.value, f"{key}_runs": float(v.runs)}
        if v.ci95:
            metrics.update({f"{key}_ci95_low": v.value - v.ci95, f"{key}_ci95_high": v.value + v.ci95})
        tracker.log_run_metrics(run_id, metrics)


def _say_verdict(data: SweepData, objective: ObjectiveSpec | None, progress: Progress) -> Verdict | None:
    """The objective's verdict on the console, and why its winner won; without an objective, the
    report's fallback (the best configuration) said here too."""
    from orchestrator.decide.verdict import decide
    from orchestrator.report.build import best_configuration

    verdict = decide(data.finished, objective) if objective is not None else None
    if verdict is not None and objective is not None:
        for line in verdict.lines:
            progress(line.replace("**", ""))
        from orchestrator.report.explain import why_winner

        for line in why_winner(verdict.best, data.finished, data.varied_params(), objective, verdict.decision):
            if line:
                progress(line.replace("**", ""))
    else:  # no objective declared: the report's fallback, said here too
        best, why = best_configuration(data.finished)
        if best is not None:
            progress(f"Best configuration: {best.name} ({why}; the experiment declares no objective)")
    return verdict


def _say_expectations(data: Any, progress: Progress) -> None:
    """The lab's claims on the console: the tally, then each claim with its numbers or why not."""
    if not data.expect:
        return
    from orchestrator.report import expectations

    outcomes = expectations.check(data.expect, data.trials)
    progress(expectations.tally(outcomes))
    for claim in outcomes:
        progress(f"  {claim.line()}")
