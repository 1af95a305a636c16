"""What a trial knows to be secret (its config's tokens and keys, the server's API key), and the
raw logs it leaves in its folder with those hidden once their writers have stopped."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import TrialSpec
from orchestrator.config.secrets import scrub_file, secret_values
from orchestrator.engines import adapter_for

log = logging.getLogger(__name__)


def trial_secrets(spec: TrialSpec) -> set[str]:
    """What a trial knows to be secret: its config's (engine.env's tokens, a flag's key) and the
    server's API key read from ``engine.api_key_env``."""
    found = secret_values(spec.model_dump(mode="json"))
    with contextlib.suppress(ConfigError):  # an unset key variable fails the trial later, by name
        found |= {k for k in [adapter_for(spec.engine.name).api_key(spec)] if k}
    return found


def scrub_logs(folder: Path, secrets: set[str]) -> None:
    """The raw logs a trial leaves in ``folder`` (``*.log``: every server's, lm-eval's) with
    ``secrets`` hidden, once their writers have stopped."""
    for path in sorted(folder.glob("*.log")):
        _scrub(path, secrets)


def _scrub(path: Path, secrets: set[str]) -> None:
    """:func:`scrub_file`, which must not end what called it (a trial's result, a sweep): a file
    it cannot rewrite is said in a warning."""
    try:
        scrub_file(path, secrets)
    except OSError as exc:
        log.warning("could not hide the secrets in %s: %s", path, exc)
