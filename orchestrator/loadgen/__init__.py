"""Load generation: prompts, arrival schedules, the streaming client and the load-point runner.

It defines what it needs from a server (:class:`Endpoint`); engines never leak in here.
"""

from orchestrator.loadgen.client import Endpoint, PlannedRequest
from orchestrator.loadgen.plan import RequestPlanner
from orchestrator.loadgen.prompts import PromptFactory
from orchestrator.loadgen.runner import run_points

__all__ = ["Endpoint", "PlannedRequest", "PromptFactory", "RequestPlanner", "run_points"]
