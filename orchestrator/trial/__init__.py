"""One trial: check, start its servers, run its load points, stop.

The parts, in the order a trial meets them:

* :mod:`~orchestrator.trial.plan`: can it run here, what it would do (dry run), are its input
  files readable, the result of a trial skipped before it was submitted;
* :mod:`~orchestrator.trial.servers`: ports, each server's GPUs and environment, starting the
  group (:class:`ServerGroup`), emptying caches, which trials can share one start;
* :mod:`~orchestrator.trial.points`: one load point measured: raw inputs, metrics (pure),
  verdict (pure), and the :class:`PointMeasurer` that gathers them around the point;
* :mod:`~orchestrator.trial.run`: :class:`TrialRun` sequences it all and owns the loop over the
  load points (each prepared and sent by the load session, measured around it; then the capacity
  search's probes, each chosen from the results before it); :func:`run_trial` is the entry point,
  :func:`~orchestrator.trial.group.run_trial_group` for trials sharing one server start.

``run_trial`` never talks to MLflow; it returns a :class:`TrialResult` and the driver logs it.
Every failure becomes a FAILED (or SKIPPED) result with the reason; the servers are stopped on
every exit path by their context managers.
"""

from orchestrator.trial.group import run_trial_group
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
