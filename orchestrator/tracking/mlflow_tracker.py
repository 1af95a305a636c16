"""MLflow logging of a sweep: one parent run per sweep, one child run per trial.

Only the driver uses this (single writer). It logs from results already on disk, so a
tracking outage loses nothing: the same call replays a saved result later. Where the store is
(its URI, file, UI command) is :mod:`orchestrator.tracking.store`'s.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.config.metric_keys import M
from orchestrator.metrics.result import (
    ARTIFACT_DIR,
    RECORDS_FILE,
    RESULT_FILE,
    SERVER_LOG_FILE,
    TELEMETRY_FILE,
    TIMELINE_FILE,
    TrialResult,
)
from orchestrator.tracking.params import flatten_params, sanitize_key, truncate
from orchestrator.tracking.store import default_artifact_location

log = logging.getLogger(__name__)

MLFLOW_STATUS = {"FINISHED": "FINISHED", "FAILED": "FAILED", "SKIPPED": "KILLED"}
_PARAM_BATCH = 100
_METRIC_BATCH = 1000


# MLflow 3's UI opens an experiment without a kind on its GenAI overview (traces: 0); ours are
# model development: the runs table opens first (the kinds are in MLflow's UI code).
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_TAGS = {EXPERIMENT_KIND: "custom_model_development"}


class MlflowTracker:
    """Parent/child runs of one sweep in one MLflow experiment."""

    def __init__(self, uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            exp_id = self.client.create_experiment(
                experiment, artifact_location=default_artifact_location(uri, experiment), tags=EXPERIMENT_TAGS
            )
        else:
            exp_id = exp.experiment_id
            if exp.tags.get(EXPERIMENT_KIND) is None:  # made before the tag existed
                self.client.set_experiment_tag(exp_id, EXPERIMENT_KIND, EXPERIMENT_TAGS[EXPERIMENT_KIND])
        self.experiment_id = exp_id
        self.experiment = experiment
        self.parent_run_id: str | None = None

    def ui_path(self) -> str:
        """The experiment's runs table in the MLflow UI. MLflow 3.17's UI opens on its GenAI
        overview unless told ``workflowType=machine_learning`` (it keeps the choice in the
        browser); the experiment's kind tag alone does not switch it."""
        return f"#/experiments/{self.experiment_id}/runs?workflowType=machine_learning"

    def _runs(self, filter_string: str, newest_first: bool = False) -> Iterator[Any]:
        """Every run of this experiment matching ``filter_string``, page after page."""
        order = ["attributes.start_time DESC"] if newest_first else None
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string=filter_string, max_results=1000, page_token=token, order_by=order
            )
            yield from page
            token = page.token
            if not token:
                return

    def _finished_runs(self, hashes: Iterable[str], sweep_run_id: str | None = None) -> dict[str, Any]:
        """trial hash -> the latest FINISHED trial run of it in this experiment (in the sweep run
        ``sweep_run_id`` only, when given)."""
        wanted = set(hashes)
        found: dict[str, Any] = {}
        for run in self._runs("tags.trial_status = 'FINISHED'", newest_first=True):
            h = run.data.tags.get("trial_hash")
            if h in wanted and run.data.tags.get("run_kind", "trial") == "trial" and _in_sweep(run, sweep_run_id):
                found.setdefault(h, run)
        return found

    def finished_run_ids(self, hashes: Iterable[str], sweep_run_id: str | None = None) -> dict[str, str]:
        """trial hash -> run id of a FINISHED trial run already in this experiment (for resume), or
        in the sweep run ``sweep_run_id`` (a later batch of the same sweep)."""
        return {h: run.info.run_id for h, run in self._finished_runs(hashes, sweep_run_id).items()}

    def run_ids_of(self, hashes: Iterable[str]) -> list[str]:
        """The run ids of every trial or repeat run of these trial hashes in this experiment."""
        wanted = set(hashes)
        return [
            r.info.run_id for r in self._runs("tags.run_kind != 'sweep'") if r.data.tags.get("trial_hash") in wanted
        ]

    def finished_results(
        self, hashes: Iterable[str], sweep_run_id: str | None = None
    ) -> dict[str, tuple[str, TrialResult]]:
        """trial hash -> (run id, the result it logged) of the latest FINISHED run of each, a trial's
        or a race's repeat, read back from its ``result.json`` artifact (the measurements without
        the records): what a resumed sweep's race and verdict go on from (``sweep_run_id``: the
        runs of that sweep run only)."""
        wanted = set(hashes)
        found: dict[str, tuple[str, TrialResult]] = {}
        for run in self._runs("tags.trial_status = 'FINISHED'", newest_first=True):
            h = run.data.tags.get("trial_hash")
            if h not in wanted or h in found or not _in_sweep(run, sweep_run_id):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                path = self.client.download_artifacts(run.info.run_id, RESULT_FILE, tmp)
                found[h] = (run.info.run_id, TrialResult.model_validate_json(Path(path).read_text()))
        return found

    def finished_durations(self, hashes: Iterable[str]) -> dict[str, float]:
        """trial hash -> seconds its last FINISHED run took (for sweep plans)."""
        return {
            h: (run.info.end_time - run.info.start_time) / 1000
            for h, run in self._finished_runs(hashes).items()
            if run.info.end_time and run.info.start_time
        }

    def logged_result_ids(self) -> set[str]:
        """``result_id`` tags of every trial run in this experiment (replay skips those)."""
        return {r.data.tags["result_id"] for r in self._runs("tags.run_kind = 'trial'") if "result_id" in r.data.tags}

    def attach_sweep(self, sweep_dir: str) -> str | None:
        """Make the existing sweep run of ``sweep_dir`` (tag ``sweep_dir``) the parent of what is
        logged next; its run id, or None if there is none."""
        for run in self._runs("tags.run_kind = 'sweep'", newest_first=True):
            if run.data.tags.get("sweep_dir") == sweep_dir:
                self.parent_run_id = run.info.run_id
                return self.parent_run_id
        return None

    # -- sweep ----------------------------------------------------------------------

    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name, tags={**tags, "run_kind": "sweep"})
        self.parent_run_id = run.info.run_id
        self._log_params(self.parent_run_id, flatten_params(params))
        return self.parent_run_id

    def log_sweep_files(
        self, files: Iterable[Path], folder: str, run_id: str | None = None, root: Path | None = None
    ) -> None:
        """Attach files (the sweep's report) to the parent run, or to the sweep run ``run_id``
        (a report rebuilt later), under ``folder``; a file in a subfolder of ``root`` keeps it."""
        run_id = run_id or self.parent_run_id
        if not run_id:
            return
        for f in files:
            sub = f.parent.relative_to(root).as_posix() if root is not None and f.parent != root else ""
            self.client.log_artifact(run_id, str(f), f"{folder}/{sub}" if sub else folder)

    def sweep_trial_count(self) -> int:
        """Trial runs logged under the current sweep run."""
        if not self.parent_run_id:
            return 0
        return sum(1 for _ in self._runs(f"tags.mlflow.parentRunId = '{self.parent_run_id}'"))

    def set_sweep_tags(self, tags: Mapping[str, str]) -> None:
        """Tags on the parent run (the sweep's verdict)."""
        if self.parent_run_id:
            for k, v in tags.items():
                self.client.set_tag(self.parent_run_id, k, truncate(v, 5000))

    def end_sweep(self, counts: Mapping[str, int], status: str = "FINISHED") -> None:
        if self.parent_run_id is None:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = [Metric(f"trials_{k.lower().replace(' ', '_')}", float(v), ts, 0) for k, v in counts.items()]
        self.client.log_batch(self.parent_run_id, metrics=metrics)
        self.client.set_terminated(self.parent_run_id, status=status)

    # -- trial ----------------------------------------------------------------------

    def log_trial(self, result: TrialResult, trial_dir: Path, tags: Mapping[str, str] | None = None) -> str:
        """Create the trial's child run from a saved result; returns the run id."""
        run_tags = {
            "trial_hash": result.trial_hash,
            "result_id": result_id(result),
            "trial_status": result.status,
            "engine": str(result.spec.get("engine", {}).get("name", "")),
            "engine_version": result.engine_version or "unknown",
            "model": str(result.spec.get("model", {}).get("name", "")),
            "platform": str(result.spec.get("platform", {}).get("name", "")),
            "hardware": str(result.hardware.get("summary", "")),
            "variant": result.variant or "",
            "run_kind": "trial",
            **(tags or {}),
        }
        if self.parent_run_id and "mlflow.parentRunId" not in run_tags:  # a repeat names its trial's run
            run_tags["mlflow.parentRunId"] = self.parent_run_id
        if result.error:
            run_tags["error"] = truncate(result.error, 5000)
        lost = [a for a in result.attempts if a.get("outcome") == "LOST"]
        if lost:  # the trial was run again after losing its worker/node: say where and why
            run_tags["lost_attempts"] = truncate(
                "; ".join(
                    f"#{a['attempt']} node {str(a.get('node_id'))[:12]}: {str(a.get('error')).splitlines()[0][:200]}"
                    for a in lost
                ),
                5000,
            )
        if result.capacity.get("explanation"):  # the SLO capacity and the probe that bounds it, in words
            run_tags["slo_capacity"] = truncate(str(result.capacity["explanation"]), 5000)
        invalid = [p for p in result.points if p.metrics.get(M.INVALID)]
        if invalid:  # the client was the bottleneck, or the server got another workload than planned
            run_tags["invalid_points"] = ",".join(p.label for p in invalid)
            run_tags["invalid_reasons"] = truncate(
                " | ".join(f"{p.label}: {'; '.join(p.invalid_reasons) or 'invalid'}" for p in invalid), 5000
            )
        diagnosed = [p for p in result.points if p.diagnosis.get("headline")]
        if diagnosed:  # what limited each point, in words (metrics.diagnosis); the last fixed point's limiter
            run_tags["diagnosis"] = truncate(
                " | ".join(f"{p.label}: {p.diagnosis['headline']}" for p in diagnosed), 5000
            )
            fixed = [p for p in diagnosed if M.SLO_MET not in p.metrics] or diagnosed  # not a capacity probe
            run_tags["limiter"] = str(fixed[-1].diagnosis.get("limiter", ""))
        for key, note in result.telemetry.items():  # what the telemetry measured, or why not
            run_tags[f"telemetry.{key}"] = truncate(note, 5000)
        name = result.variant or f"trial-{result.trial_hash[:8]}"
        run = self.client.create_run(
            self.experiment_id, run_name=truncate(name, 250), tags=run_tags, start_time=int(result.started_at * 1000)
        )
        run_id = run.info.run_id
        self._log_params(run_id, trial_params(result))
        self._log_metrics(run_id, _metrics_of(result))
        self._log_artifacts(run_id, result, trial_dir)
        self.client.set_terminated(run_id, status=MLFLOW_STATUS[result.status], end_time=int(result.ended_at * 1000))
        return run_id

    # -- helpers --------------------------------------------------------------------

    def log_run_metrics(self, run_id: str, metrics: Mapping[str, float]) -> None:
        """More metrics on a trial's run after it was logged (a race's interval over its runs)."""
        self._log_metrics(run_id, [(k, v, 0) for k, v in metrics.items()])

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _PARAM_BATCH):
            self.client.log_batch(run_id, params=items[i : i + _PARAM_BATCH])

    def _log_metrics(self, run_id: str, metrics: Iterable[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(sanitize_key(k), float(v), ts, step) for k, v, step in metrics if math.isfinite(float(v))]
        for i in range(0, len(items), _METRIC_BATCH):
            self.client.log_batch(run_id, metrics=items[i : i + _METRIC_BATCH])

    def _log_artifacts(self, run_id: str, result: TrialResult, trial_dir: Path) -> None:
        for name in (RECORDS_FILE, TELEMETRY_FILE, TIMELINE_FILE, SERVER_LOG_FILE):
            path = trial_dir / name
            if path.exists():
                self.client.log_artifact(run_id, str(path))
        if (trial_dir / ARTIFACT_DIR).is_dir():  # profiler traces
            self.client.log_artifacts(run_id, str(trial_dir / ARTIFACT_DIR), ARTIFACT_DIR)
        if (trial_dir / "eval").is_dir():  # lm-eval's results and every question's answer (--log_samples)
            self.client.log_artifacts(run_id, str(trial_dir / "eval"), "eval")
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            (t / "trial_config.json").write_text(json.dumps(result.spec, indent=2, sort_keys=True))
            (t / "servers.json").write_text(json.dumps(result.servers, indent=2))
            (t / "points.csv").write_text(points_csv(result))
            (t / RESULT_FILE).write_text(json.dumps(result.summary_json(), indent=2, sort_keys=True))
            if result.error:
                (t / "error.txt").write_text(result.error)
            for f in sorted(t.iterdir()):
                self.client.log_artifact(run_id, str(f))


def _in_sweep(run: Any, sweep_run_id: str | None) -> bool:
    """Whether ``run`` (a trial's, or a race's repeat) was logged under the sweep run
    ``sweep_run_id`` (None: any sweep's). A trial's run is its child; a repeat is its first run's
    child and names its sweep in ``sweep_run_id``."""
    tags = run.data.tags
    return sweep_run_id is None or sweep_run_id in (tags.get("mlflow.parentRunId"), tags.get("sweep_run_id"))


def result_id(result: TrialResult) -> str:
    """Identity of one measured result (a trial hash runs many times; each run once)."""
    return f"{result.trial_hash}-{int(result.started_at * 1000)}"


def trial_params(result: TrialResult) -> dict[str, str]:
    """A trial run's params: its (redacted) spec flattened, with its variant and overrides."""
    spec = result.spec
    return flatten_params(
        {
            "variant": result.variant,
            "overrides": result.overrides,
            **{k: spec[k] for k in ("engine", "model", "workload", "platform", "seed") if k in spec},
        }
    )


def _metrics_of(result: TrialResult) -> list[tuple[str, float, int]]:
    """(key, value, step): per point with step = index, by point label and class, and per trial."""
    out: list[tuple[str, float, int]] = []
    for p in result.points:
        for k, v in p.metrics.items():
            out.append((k, v, p.index))
            out.append((f"{p.label}/{k}", v, 0))
        out.extend((k, v, p.index) for k, v in p.grouped_metrics().items())
    out.extend((k, v, 0) for k, v in result.metrics.items())
    slate = result.slate  # the clean slate the servers started on (waited for, memory and its baseline)
    out.extend((f"slate_{k}", float(v), 0) for k, v in slate.items() if isinstance(v, (int, float)) and k != "checked")
    if result.attempts:
        out.append(("attempts", float(len(result.attempts)), 0))
    return out


def points_csv(result: TrialResult) -> str:
    """The trial's points table: one row per load point, one column per metric, then one per
    request-class metric as ``<class>/<metric>`` (reports are rebuilt from this file)."""
    rows = []
    for p in result.points:
        rows.append(p.flat_metrics())
    keys = sorted({k for row in rows for k in row if "/" not in k}) + sorted(
        {k for row in rows for k in row if "/" in k}
    )
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["point", "label", "setting", "invalid_reasons", "diagnosis", *keys])
    for p, row in zip(result.points, rows):
        diagnosis = {k: v for k, v in p.diagnosis.items() if k != "stalls"}  # the stalls stay in result.json
        w.writerow(
            [
                p.index,
                p.label,
                json.dumps(p.setting, sort_keys=True),
                "; ".join(p.invalid_reasons),
                json.dumps(diagnosis, sort_keys=True) if diagnosis else "",
                *(row.get(k, "") for k in keys),
            ]
        )
    return buf.getvalue()


__all__ = [
    "MlflowTracker",
    "points_csv",
    "result_id",
    "trial_params",
]

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
