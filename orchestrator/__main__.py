"""Entry point: ``python -m orchestrator [+experiment=NAME] [overrides] [-m]`` (Hydra)."""

from __future__ import annotations

import sys

import hydra

from orchestrator.config.errors import OrchestratorError
from orchestrator.config.resolvers import register

register()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg) -> str:  # type: ignore[no-untyped-def]
    from orchestrator.scheduling.hydra_launch import run_single

    return run_single(cfg)


def cli() -> None:
    try:
        main()
    except OrchestratorError as exc:  # config mistakes: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: trials and servers are already stopped
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    cli()
