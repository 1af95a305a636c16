"""Load generation: prompts, arrival schedules, the streaming client and the load session a
trial drives point by point (:class:`LoadSession`).

It defines what it needs from a server (:class:`Endpoint`); engines never leak in here.
"""

from orchestrator.loadgen.client import Endpoint, PlannedRequest
from orchestrator.loadgen.plan import RequestPlanner
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.session import LoadSession, PointRun, run_each, run_points

__all__ = [
    "Endpoint",
    "LoadSession",
    "PlannedRequest",
    "PointRun",
    "PromptFactory",
    "RequestPlanner",
    "run_each",
    "run_points",
]
