"""One trial: check, start its servers, run its load points, stop.

The parts, in the order a trial meets them:

* :mod:`~orchestrator.trial.admission`: can it run here, what it would do (dry run), are its input
  files readable, the result of a trial skipped before it was submitted;
* :mod:`~orchestrator.trial.servers`: ports, each server's GPUs and environment, starting the
  group (:class:`ServerGroup`), emptying caches, which trials can share one start;
* :mod:`~orchestrator.trial.points`: one load point measured: the :class:`PointMeasurer` of a
  running group gathers what a point's analysis needs around it (:class:`RawPoint`), then
  :func:`point_stages` makes its result from that alone, stage by stage (:class:`PointStages`:
  the client's summary and the servers' deltas, the hardware, the verdict of
  :mod:`orchestrator.metrics.fidelity`, the decode floor, the diagnosis), each stage from the
  ones before it, flattened to the metric keys once;
* :mod:`~orchestrator.trial.run`: :class:`TrialRun` sequences it all and owns the loop over the
  load points (each prepared and sent by the load session, measured around it; then the capacity
  search's probes, each chosen from the results before it); :func:`run_trial` is the entry point,
  :func:`~orchestrator.trial.group.run_trial_group` for trials sharing one server start.

``run_trial`` never talks to MLflow; it returns a :class:`TrialResult` and the driver logs it.
Every failure becomes a FAILED (or SKIPPED) result with the reason; the servers are stopped on
every exit path by their context managers.
"""

from orchestrator.metrics.result import RawPoint
from orchestrator.trial.admission import check_feasible, check_inputs, plan_trial, skipped_result
from orchestrator.trial.group import run_trial_group
from orchestrator.trial.measured_point import MeasuredStage, measured_stage
from orchestrator.trial.points import (
    PointMeasurer,
    PointStages,
    point_stages,
    trial_metrics,
)
from orchestrator.trial.run import TrialRun, run_trial
from orchestrator.trial.servers import (
    ServerGroup,
    describe_servers,
    reset_caches,
    server_env,
    server_gpus,
    server_key,
    shared_server_spec,
)

__all__ = [
    "MeasuredStage",
    "PointMeasurer",
    "PointStages",
    "RawPoint",
    "ServerGroup",
    "TrialRun",
    "check_feasible",
    "check_inputs",
    "describe_servers",
    "measured_stage",
    "plan_trial",
    "point_stages",
    "reset_caches",
    "run_trial",
    "run_trial_group",
    "server_env",
    "server_gpus",
    "server_key",
    "shared_server_spec",
    "skipped_result",
    "trial_metrics",
]
