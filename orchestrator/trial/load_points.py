"""The order of a trial's load points: its fixed points, then (after the trial's last fixed
point) the probes of its SLO capacity search, each chosen from the result of the one before.
:class:`LoadPoints` is told each point's result (:meth:`LoadPoints.done`); it reads nothing of
the trial's own state."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.config.logs import Progress
from orchestrator.config.schema import CapacitySpec, LoadPointSpec
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.result import PointResult
from orchestrator.trial.capacity_probes import CapacityProbes

Step = tuple[LoadPointSpec, int, str | None]  # the point, its index in the trial, its label when not its own


class LoadPoints:
    """The points to measure in order: ``fixed`` (numbered from ``first``), then, with ``capacity``
    (given only when they are the trial's last fixed points), the search's probes."""

    def __init__(
        self,
        fixed: Sequence[LoadPointSpec],
        first: int,
        capacity: CapacitySpec | None,
        classes: list[str],
        say: Progress,
    ) -> None:
        self._fixed = list(fixed)
        self._next = first
        self._end_of_fixed = first + len(self._fixed)
        self._first = first
        self._search = (capacity, classes, say)
        self.capacity: CapacityProbes | None = None  # the search, once the fixed points are done
        self._pending: Step | None = None

    def next(self) -> Step | None:
        """The next point to measure (after the result of the one before was told), or None: none left."""
        assert self._pending is None, "the result of the last point was not told (LoadPoints.done)"
        index = self._next
        if index < self._end_of_fixed:
            step: Step = (self._fixed[index - self._first], index, None)
        elif (probes := self._probes()) is not None and (probe := probes.next()) is not None:
            step = (probe[0], index, probe[1])
        else:
            return None
        self._pending = step
        return step

    def _probes(self) -> CapacityProbes | None:
        """The capacity search, started when first asked for (after the fixed points)."""
        capacity, classes, say = self._search
        if self.capacity is None and capacity is not None:
            self.capacity = CapacityProbes(capacity, classes, say)
        return self.capacity

    def done(self, result: PointResult, records: Sequence[RequestRecord]) -> None:
        """The measured result of the point :meth:`next` gave, with its requests' records."""
        assert self._pending is not None, "no point is being measured"
        _, index, _ = self._pending
        self._pending = None
        self._next = index + 1
        if index >= self._end_of_fixed and self.capacity is not None:
            self.capacity.observe(result, [r for r in records if r.point == index])
