"""Every read of the MLflow store, and the one place that knows its run layout (tags such as
``trial_hash`` / ``trial_status`` / ``sweep_run_id``, the ``points.csv`` and
``records.parquet`` artifacts, the parent run's ``report/``): a sweep's trials with their
parameters, per-point metrics and (on demand) raw records, from the driver's results or from
MLflow alone (:func:`from_results`, :func:`from_mlflow`), finished trials read back for a
search (:func:`finished_trial_data`). :class:`~orchestrator.tracking.MlflowTracker` writes."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ExpectationSpec, ObjectiveSpec
from orchestrator.decide.trials import Point, SweepData, TrialData, told_apart
from orchestrator.metrics.diagnosis.findings import LoggedDiagnosis
from orchestrator.metrics.result import TIMELINE_FILE, TrialResult
from orchestrator.tracking.mlflow_tracker import result_id, trial_params

log = logging.getLogger(__name__)


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _file_reader(path: Path | None) -> Callable[[], bytes | None]:
    return lambda: path.read_bytes() if path is not None and path.is_file() else None


def from_results(
    results: list[TrialResult],
    experiment: str,
    sweep_run_id: str | None = None,
    objective: ObjectiveSpec | None = None,
    trial_dirs: dict[str, Path] | None = None,
    expect: list[ExpectationSpec] | None = None,
) -> SweepData:
    """Report data from the driver's own results (no MLflow needed); ``trial_dirs`` (``result_id``
    -> the trial's folder) is where their timelines were drawn."""
    trials = []
    dirs = trial_dirs or {}
    for r in results:
        points = []
        for p in r.points:
            points.append(
                Point(
                    p.index,
                    p.label,
                    dict(p.setting),
                    p.flat_metrics(),
                    "; ".join(p.invalid_reasons),
                    LoggedDiagnosis.of(p.diagnosis),
                )
            )
        params = trial_params(r)  # the very params MLflow gets: a report reads the same either way
        parquet = r.records_parquet

        def load(parquet: bytes = parquet) -> Any:
            if not parquet:
                return None
            import pyarrow.parquet as pq

            return pq.read_table(io.BytesIO(parquet))

        trials.append(
            TrialData(
                name=r.variant or f"trial-{r.trial_hash[:8]}",
                status=r.status,
                params=params,
                metrics=dict(r.metrics),
                points=points,
                trial_hash=r.trial_hash,
                records=load,
                telemetry=dict(r.telemetry),
                timeline=_file_reader(dirs[result_id(r)] / TIMELINE_FILE if result_id(r) in dirs else None),
                error=r.error or "",
                round=_round_of(r.spec.get("run")),
            )
        )
    repeats = {r.trial_hash: r.repeat_of for r in results if r.repeat_of}
    folded = told_apart(fold_repeats(trials, repeats))
    return SweepData(experiment, folded, "results", sweep_run_id, objective, list(expect or []))


def fold_repeats(trials: list[TrialData], repeat_of: dict[str, str]) -> list[TrialData]:
    """A race's later runs (``repeat_of``: their hash -> their first run's) become the ``runs``
    of their configuration's first run, in order; one whose first run is not here stays a trial."""
    firsts = {t.trial_hash: t for t in trials if t.trial_hash not in repeat_of}
    out = []
    for t in trials:
        first = firsts.get(repeat_of.get(t.trial_hash, ""))
        if first is not None:
            first.runs.append(t)
        else:
            out.append(t)
    return out


def parse_points_csv(text: str) -> list[Point]:
    """The ``points.csv`` artifact of a trial run back into points."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return []
    header, out = rows[0], []
    for row in rows[1:]:
        values = dict(zip(header, row))
        words = ("point", "label", "setting", "invalid_reasons", "diagnosis")
        metrics = {k: float(v) for k, v in values.items() if k not in words and v != ""}
        out.append(
            Point(
                int(values["point"]),
                values["label"],
                json.loads(values["setting"] or "{}"),
                metrics,
                values.get("invalid_reasons", ""),
                LoggedDiagnosis.of(json.loads(values.get("diagnosis") or "{}")),
            )
        )
    return out


def from_mlflow(uri: str, experiment: str, sweep_run_id: str | None = None) -> SweepData:
    """Report data from MLflow alone: the sweep's parent run (the latest sweep of the
    experiment unless ``sweep_run_id``), its trial runs, their params and points.csv."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        known = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
        raise LookupError(f"no MLflow experiment {experiment!r} at {uri} (experiments: {known})")
    if sweep_run_id is None:
        sweeps = client.search_runs(
            [exp.experiment_id],
            filter_string="tags.run_kind = 'sweep'",
            order_by=["attributes.start_time DESC"],
            max_results=50,
        )
        for sweep in sweeps:  # the latest sweep that ran something (a resumed no-op logs none)
            if client.search_runs(
                [exp.experiment_id], f"tags.mlflow.parentRunId = '{sweep.info.run_id}'", max_results=1
            ):
                sweep_run_id = sweep.info.run_id
                break
        if sweep_run_id is None:
            raise LookupError(f"experiment {experiment!r} at {uri} has no sweep with trial runs")
    sweep_run = client.get_run(sweep_run_id).data
    logged = sweep_run.params.get("objective")
    objective = ObjectiveSpec.model_validate_json(logged) if logged else None
    runs = client.search_runs(
        [exp.experiment_id],
        f"tags.mlflow.parentRunId = '{sweep_run_id}'",
        order_by=["attributes.start_time ASC"],
        max_results=5000,
    )
    # a race's later runs are children of their trial's run, tagged with the sweep's
    repeats = client.search_runs(
        [exp.experiment_id],
        f"tags.run_kind = 'repeat' and tags.sweep_run_id = '{sweep_run_id}'",
        order_by=["attributes.start_time ASC"],
        max_results=5000,
    )
    with tempfile.TemporaryDirectory() as tmp:
        trials = [_trial_of_run(client, run, tmp) for run in [*runs, *repeats]]
        expect = _expect_of(client, sweep_run_id, tmp)
    repeat_of = {
        r.data.tags.get("trial_hash", ""): r.data.tags["repeat_of"] for r in repeats if "repeat_of" in r.data.tags
    }
    trials = told_apart(fold_repeats(trials, repeat_of))
    return SweepData(experiment, trials, f"mlflow:{uri} run {sweep_run_id}", sweep_run_id, objective, expect)


EXPECT_FILE = "expect.json"  # the lab's claims, beside the sweep's report (report/expect.json on its run)


def _expect_of(client: Any, sweep_run_id: str, tmp: str) -> list[ExpectationSpec]:
    try:
        local = client.download_artifacts(sweep_run_id, f"report/{EXPECT_FILE}", tmp)
    except Exception:  # a sweep logged before claims existed, or without any
        return []
    return [ExpectationSpec.model_validate(x) for x in json.loads(Path(local).read_text())]


def _trial_of_run(client: Any, run: Any, tmp: str) -> TrialData:
    """One trial run of MLflow as report data (points from its points.csv, records on demand)."""
    run_id = run.info.run_id
    points: list[Point] = []
    try:
        local = client.download_artifacts(run_id, "points.csv", tmp)
    except Exception:  # a skipped trial (or one that holds, sleep) has no points
        local = None
    if local is not None:
        try:
            points = parse_points_csv(Path(local).read_text())
        except (OSError, ValueError, KeyError) as exc:  # there, but unreadable: said, not taken for "no points"
            log.warning(
                "trial run %s (%s): its points.csv cannot be read (%s: %s); the report leaves its points out",
                run_id,
                run.data.tags.get("variant") or run.data.tags.get("trial_hash", "?"),
                type(exc).__name__,
                exc,
            )

    def load(run_id: str = run_id) -> Any:
        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory() as d:
            try:
                path = client.download_artifacts(run_id, "records.parquet", d)
            except Exception:
                return None
            return pq.read_table(path)

    def timeline(run_id: str = run_id) -> bytes | None:
        with tempfile.TemporaryDirectory() as d:
            try:
                return Path(client.download_artifacts(run_id, TIMELINE_FILE, d)).read_bytes()
            except Exception:  # a trial without points has none
                return None

    tags = run.data.tags
    return TrialData(
        name=tags.get("variant") or run.info.run_name or run_id[:8],
        status=tags.get("trial_status", "?"),
        params=dict(run.data.params),
        metrics={k: v for k, v in run.data.metrics.items() if "/" not in k},
        points=points,
        run_id=run_id,
        trial_hash=tags.get("trial_hash", ""),
        records=load,
        telemetry={k.removeprefix("telemetry."): v for k, v in tags.items() if k.startswith("telemetry.")},
        timeline=timeline,
        error=tags.get("error", ""),
        round=_round_of(tags.get("race_run", "0" if tags.get("run_kind") == "trial" else None)),
    )


def _round_of(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def finished_trial_data(uri: str, experiment: str, hashes: list[str]) -> dict[str, TrialData]:
    """The newest FINISHED trial run of each trial hash in ``hashes`` (a search feeds these
    back instead of measuring them again)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    out: dict[str, TrialData] = {}
    if exp is None:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        for h in dict.fromkeys(hashes):
            runs = client.search_runs(
                [exp.experiment_id],
                f"tags.trial_hash = '{h}' and tags.trial_status = 'FINISHED' and tags.run_kind = 'trial'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if runs:
                out[h] = _trial_of_run(client, runs[0], tmp)
    return out


def experiment_exists(uri: str, experiment: str) -> bool:
    """Whether the store at ``uri`` has an experiment of that name (a plan's history)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment) is not None
