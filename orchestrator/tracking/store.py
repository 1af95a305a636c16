"""Where a sweep's tracking store is and how to reach it: the project's own store
(:data:`DEFAULT_TRACKING_URI`), a ``sqlite:///`` store's file and its artifacts' folder, the
command that serves its UI, and whether a tracking server answers at all."""

from __future__ import annotations

import shlex
import socket
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.tracking.params import sanitize_key

# The project's own store (conf/tracking/sqlite.yaml), for commands run outside Hydra.
DEFAULT_TRACKING_URI = f"sqlite:///{Path(__file__).resolve().parents[2] / 'mlflow.db'}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (MLflow's store, Optuna's study), or None.

    ``sqlite:///rel/path.db`` is relative to the cwd, ``sqlite:////abs/path.db`` absolute
    (SQLAlchemy's convention, which MLflow and Optuna follow).
    """
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def ui_command(uri: str, port: int = 5000) -> str:
    """The command that serves the MLflow UI of the store at ``uri`` (this environment's
    ``mlflow`` where it is installed beside the running Python), for a user to paste."""
    venv_mlflow = Path(sys.executable).with_name("mlflow")
    return shlex.join(
        [str(venv_mlflow) if venv_mlflow.exists() else "mlflow", "ui", "--backend-store-uri", uri, "--port", str(port)]
    )


def server_answers(uri: str, timeout_s: float = 3.0) -> bool:
    """Whether the tracking server of an ``http(s)://`` URI accepts a connection within
    ``timeout_s`` (MLflow's own client retries an unreachable one for minutes); True for a store
    that is not a server."""
    if not uri.startswith(("http://", "https://")):
        return True
    u = urlparse(uri)
    if urllib.request.getproxies().get(u.scheme) and not urllib.request.proxy_bypass(u.hostname or ""):
        return True  # reached through a proxy: a direct connection tells nothing
    try:
        with socket.create_connection((u.hostname or "", u.port or (443 if u.scheme == "https" else 80)), timeout_s):
            return True
    except (OSError, ValueError):
        return False


def default_artifact_location(uri: str, experiment: str) -> str | None:
    """For a sqlite store, keep artifacts next to the database file (not in the cwd)."""
    db_path = sqlite_file(uri)
    if db_path is None:
        return None
    return (db_path.resolve().parent / "mlartifacts" / sanitize_key(experiment)).as_uri()
