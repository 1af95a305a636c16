"""Reports of a sweep: per-lab plots and a summary table, from results or from MLflow alone.

python -m orchestrator.report experiment=chunked_prefill      # latest sweep, from MLflow
"""

from orchestrator.decide.trials import SweepData, TrialData
from orchestrator.report.build import best_configuration, build_report, summary_markdown
from orchestrator.tracking.runs import from_mlflow, from_results

__all__ = [
    "SweepData",
    "TrialData",
    "best_configuration",
    "build_report",
    "from_mlflow",
    "from_results",
    "summary_markdown",
]
