"""The typed result of one trial, as returned by the worker and written to disk by the driver, and
what is gathered around one of its load points before any arithmetic (:class:`RawPoint`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.config.errors import DiskFullError
from orchestrator.config.metric_keys import M
from orchestrator.metrics import prometheus, telemetry
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import adapter_key

TrialStatus = Literal["FINISHED", "FAILED", "SKIPPED"]


@dataclass
class RawPoint:
    """What was gathered around one load point, before any arithmetic."""

    records: list[RequestRecord]
    client: dict[str, float]  # the client's own stats (CPU, loop lag; the worst process's)
    resources: dict[str, float]  # the resource monitor's summary (memory peak, engine gauges)
    before: prometheus.Sample  # the engines' counters and histograms before the point...
    after: prometheus.Sample  # ...and after it
    window: tuple[float, float] = (0.0, 0.0)  # the point's start and end, on the trial's clock
    rows: list[telemetry.Row] = field(default_factory=list)  # the trial's timeline so far
    foreign: dict[str, Any] | None = None  # the census: CPU used outside the trial over the point
    profiled: dict[str, float] = field(default_factory=dict)  # the profiler's window over it, when traced


class PointResult(BaseModel):
    """One load point: its setting, client-side metrics, server-side deltas, per-class latencies."""

    model_config = ConfigDict(extra="forbid")

    index: int
    label: str
    setting: dict[str, Any]
    metrics: dict[str, float] = Field(default_factory=dict)
    class_metrics: dict[str, dict[str, float]] = Field(default_factory=dict)
    adapter_metrics: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per LoRA adapter the requests named (workload.adapters); 'base': none"
    )
    invalid_reasons: list[str] = Field(default_factory=list, description="why the point is INVALID (empty: valid)")
    window: tuple[float, float] | None = Field(
        default=None, description="start and end of the point (the records' and telemetry's clock, seconds)"
    )
    diagnosis: dict[str, Any] = Field(
        default_factory=dict,
        description="what limited the point (metrics.diagnosis): limiter, confidence, words, findings, worst stalls",
    )

    def grouped_metrics(self) -> dict[str, float]:
        """Each request class's metrics as ``<class>/<metric>`` and each adapter's as
        ``adapter.<name>.<metric>``: the point's grouped numbers under their flat keys."""
        out = {f"{cls}/{k}": v for cls, m in self.class_metrics.items() for k, v in m.items()}
        out.update({adapter_key(name, k): v for name, m in self.adapter_metrics.items() for k, v in m.items()})
        return out

    def flat_metrics(self) -> dict[str, float]:
        """The point's metrics and its grouped ones (:meth:`grouped_metrics`) under one flat key each,
        as MLflow, ``points.csv`` and the report read them."""
        return {**self.metrics, **self.grouped_metrics()}

    def said(self, sent: int) -> str:
        """The point's console line (``sent``: the requests it sent, every repeat's)."""
        m, (t0, t1) = self.metrics, self.window or (0.0, 0.0)
        return (
            f"{int(m.get(M.COMPLETED, 0))}/{sent} ok in {t1 - t0:.1f}s, "
            f"ttft p50 {m.get(M.TTFT_MS_P50, float('nan')):.1f} ms, itl p99 {m.get(M.ITL_MS_P99, float('nan')):.1f} ms, "
            f"{m.get(M.TOKENS_PER_SECOND, 0):.0f} tok/s, client processes {m.get(M.CLIENT_PROCESSES, 1.0):.0f}"
        )


class TrialResult(BaseModel):
    """Everything a trial produced. ``records_parquet`` holds one row per request sent."""

    model_config = ConfigDict(extra="forbid")

    trial_hash: str
    experiment: str
    variant: str | None = None
    overrides: list[str] = Field(default_factory=list)
    spec: dict[str, Any]
    repeat_of: str | None = Field(
        default=None, description="a race's later run of a configuration: the trial hash of its first run"
    )
    status: TrialStatus
    error: str | None = None
    started_at: float
    ended_at: float
    engine_version: str | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    servers: list[dict[str, Any]] = Field(default_factory=list)
    slate: dict[str, Any] = Field(
        default_factory=dict, description="the machine before the servers started: leftovers waited for, baseline"
    )
    points: list[PointResult] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    attempts: list[dict[str, Any]] = Field(default_factory=list, description="one entry per Ray attempt")
    capacity: dict[str, Any] = Field(default_factory=dict, description="the SLO capacity search: probes, verdicts")
    telemetry: dict[str, str] = Field(
        default_factory=dict, description="what the telemetry measured or why not (gpu, energy, price)"
    )
    records_parquet: bytes = b""
    telemetry_parquet: bytes = b""
    artifacts: dict[str, bytes] = Field(
        default_factory=dict, description="more files by their path in the trial's folder (profile/ traces)"
    )
    server_log: str = ""

    def summary_json(self) -> dict[str, Any]:
        """The result without its bulky payloads (records, telemetry, log), for result files."""
        return self.model_dump(mode="json", exclude={"records_parquet", "telemetry_parquet", "artifacts", "server_log"})


RESULT_FILE = "result.json"
RECORDS_FILE = "records.parquet"
TELEMETRY_FILE = "telemetry.parquet"
TIMELINE_FILE = "timeline.png"
ARTIFACT_DIR = "profile"  # the trial's more files (artifacts) live under it
SERVER_LOG_FILE = "server.log"


def save_result(result: TrialResult, trial_dir: str | os.PathLike[str]) -> Path:
    """Write a result to ``trial_dir`` (result.json, records.parquet, telemetry.parquet, server.log,
    artifacts). All-or-nothing: every file is first written whole beside its place, then each is
    renamed into place, result.json last. When a write fails (a full disk: :class:`DiskFullError`)
    nothing in the folder has changed, so an earlier checkpoint there stays whole and consistent."""
    d = Path(trial_dir)
    d.mkdir(parents=True, exist_ok=True)
    files: list[tuple[Path, bytes]] = []
    if result.records_parquet:
        files.append((d / RECORDS_FILE, result.records_parquet))
    if result.telemetry_parquet:
        files.append((d / TELEMETRY_FILE, result.telemetry_parquet))
    for name, data in result.artifacts.items():
        path = (d / name).resolve()
        if not path.is_relative_to(d.resolve()):
            raise ValueError(f"artifact {name!r} is outside the trial's folder")
        files.append((path, data))
    if result.server_log:
        files.append((d / SERVER_LOG_FILE, result.server_log.encode()))
    files.append((d / RESULT_FILE, json.dumps(result.summary_json(), indent=2, sort_keys=True).encode()))
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            staged.append((_write_beside(path, data), path))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:  # renames need no space
        os.replace(tmp, path)
    return d


def load_result(trial_dir: str | os.PathLike[str]) -> TrialResult:
    """Read back what :func:`save_result` wrote."""
    d = Path(trial_dir)
    data = json.loads((d / RESULT_FILE).read_text())
    records = d / RECORDS_FILE
    log_file = d / SERVER_LOG_FILE
    telemetry = d / TELEMETRY_FILE
    data["records_parquet"] = records.read_bytes() if records.exists() else b""
    data["telemetry_parquet"] = telemetry.read_bytes() if telemetry.exists() else b""
    data["artifacts"] = {
        str(f.relative_to(d)): f.read_bytes() for f in sorted((d / ARTIFACT_DIR).rglob("*")) if f.is_file()
    }
    data["server_log"] = log_file.read_text(errors="replace") if log_file.exists() else ""
    return TrialResult.model_validate(data)


def _write_beside(path: Path, data: bytes) -> Path:
    """``data`` whole in ``<path>.tmp`` (synced), returned; a full filesystem is a
    :class:`DiskFullError` naming the file and the space it needed, and leaves no tmp file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a full disk can surface only here (delayed allocation)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(str(path), len(data), _free_bytes(path.parent)) from exc
        raise
    return tmp


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None
