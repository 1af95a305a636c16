"""Scheduling: trials as Ray tasks, the driver's sweep loop, and the Hydra launcher glue."""

from orchestrator.scheduling.jobs import TrialJob, prepare_jobs
from orchestrator.scheduling.preview import dry_run
from orchestrator.scheduling.sweep import run_sweep

__all__ = ["TrialJob", "dry_run", "prepare_jobs", "run_sweep"]
