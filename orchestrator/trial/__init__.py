"""One trial: check, start its servers, run its load points, stop.

The parts, in the order a trial meets them:

* :mod:`~orchestrator.trial.plan`: can it run here, what it would do (dry run), are its input
  files readable, the result of a trial skipped before it was submitted;
* :mod:`~orchestrator.trial.servers`: ports, each server's GPUs and environment, starting the
  group (:class:`ServerGroup`), emptying caches, which trials can share one start;
* :mod:`~orchestrator.trial.points`: one load point measured: raw inputs, metrics (pure),
  verdict (pure), and the :class:`PointMeasurer` that gathers them around the point;
* :mod:`~orchestrator.trial.run`: :class:`TrialRun` sequences it all; the load points are fed
  forward (each result is sent to the schedule that chose the point: the capacity search's
  probes); :func:`run_trial` and :func:`run_trial_group` are the entry points.

``run_trial`` never talks to MLflow; it returns a :class:`TrialResult` and the driver logs it.
Every failure becomes a FAILED (or SKIPPED) result with the reason; the servers are stopped on
every exit path by their context managers.
"""

from orchestrator.trial.plan import check_feasible, check_inputs, plan_trial, skipped_result
from orchestrator.trial.points import (
    PointMeasurer,
    PointVerdict,
    RawPoint,
    judge_point,
    point_metrics,
    roofline_metrics,
    trial_metrics,
)
from orchestrator.trial.run import TrialRun, run_trial, run_trial_group
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
    "PointMeasurer",
    "RawPoint",
    "ServerGroup",
    "TrialRun",
    "PointVerdict",
    "check_feasible",
    "check_inputs",
    "describe_servers",
    "judge_point",
    "plan_trial",
    "point_metrics",
    "reset_caches",
    "roofline_metrics",
    "run_trial",
    "run_trial_group",
    "server_env",
    "server_gpus",
    "server_key",
    "shared_server_spec",
    "skipped_result",
    "trial_metrics",
]
