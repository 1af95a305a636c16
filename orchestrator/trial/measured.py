"""What one trial has measured so far (:class:`Measured`): its load points and their records,
its server starts, the SLO capacity search, the timeline, accuracy scores, and whether its
servers died; and the trial's metrics made from them. :class:`orchestrator.trial.run.TrialRun`
runs the trial and adds to it; a checkpoint and the final result read it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.errors import ServerCrashedError
from orchestrator.config.metric_keys import M
from orchestrator.config.schema import TrialSpec
from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult
from orchestrator.metrics.telemetry import Timeline
from orchestrator.perf.floors import trial_decode_floor
from orchestrator.trial.capacity_probes import CapacityProbes
from orchestrator.trial.points import trial_metrics

log = logging.getLogger(__name__)


@dataclass
class Measured:
    """A trial's measurements, in the order they were taken."""

    points: list[PointResult] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # start-up seconds of every server (group) start
    held: dict[str, float] = field(default_factory=dict)  # a trial kind without a server (sleep): its metrics
    scores: dict[str, float] = field(default_factory=dict)  # accuracy (lm-eval, adapters' scorer), adapters' load
    capacity: CapacityProbes | None = None  # the SLO capacity search, when the workload asks for one
    timeline: Timeline = field(default_factory=Timeline)  # telemetry and the engine's gauges, on the records' clock
    telemetry_notes: dict[str, str] = field(default_factory=dict)
    roof_note: str = ""  # the decode roofline's roofs and where they came from
    measuring: bool = False  # load points have run (a held trial has none)
    crash: ServerCrashedError | None = None  # the servers died: no point after it is measured

    def point(self, result: PointResult, records: list[RequestRecord], crash: ServerCrashedError | None) -> None:
        """One load point measured (``crash``: the servers died during it)."""
        self.records.extend(records)
        self.points.append(result)
        self.crash = crash or self.crash

    def metrics(self, spec: TrialSpec) -> tuple[dict[str, float], dict[str, Any]]:
        """The trial's own metrics: over its points, its starts, the floor at batch 1, its scores
        and the capacity search's outcome (a held trial: what it held); and the search's account."""
        capacity_metrics, account = self.capacity.outcome() if self.capacity else ({}, {})
        if not self.measuring:
            return dict(self.held), account
        return {
            **trial_metrics(self.points, self.starts[0] if self.starts else None),
            M.SERVER_STARTS: float(len(self.starts)),
            M.SERVER_REUSED: float(not self.starts),
            **floor_at_batch1(spec),
            **self.scores,
            **capacity_metrics,
        }, account

    def telemetry(self) -> dict[str, str]:
        return {**self.telemetry_notes, **({"roofs": self.roof_note} if self.roof_note else {})}

    def records_parquet(self) -> bytes:
        return records_to_parquet_bytes(self.records) if self.records else b""

    def telemetry_parquet(self) -> bytes:
        return self.timeline.to_parquet() if self.timeline.rows else b""


def floor_at_batch1(spec: TrialSpec) -> dict[str, float]:
    """The roofline floor of a decode step at batch 1, empty context (week 3's number)."""
    try:
        floor = trial_decode_floor(spec)
    except Exception as exc:  # unknown roofs: no floor, not a failure
        log.warning("decode floor: %s", exc)
        return {}
    return {M.DECODE_FLOOR_MS_BATCH1: floor.floor_ms} if floor else {}
