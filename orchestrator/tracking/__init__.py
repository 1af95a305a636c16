"""MLflow tracking: parent run per sweep, child run per trial, params, metrics and artifacts."""

from orchestrator.tracking.mlflow_tracker import MlflowTracker, points_csv, result_id
from orchestrator.tracking.params import flatten_params, sanitize_key
from orchestrator.tracking.store import server_answers, sqlite_file, ui_command

__all__ = [
    "MlflowTracker",
    "flatten_params",
    "points_csv",
    "result_id",
    "sanitize_key",
    "server_answers",
    "sqlite_file",
    "ui_command",
]
